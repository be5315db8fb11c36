"""What a replay would send (`outbox replay --dry-run`, the count it asks to have typed, the
TUI's preview) on a partitioned table with a partition an interrupted `outbox maintain` left
pending detach. While it is so the table leaves its rows out: the preview counted the others
only, or said that older messages were gone, and a replay then stopped at that partition (or
left its rows unsent without a word). The preview says what the replay says: which partition
is half detached, and to run `outbox maintain`, then the replay."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from helpers import outbox_on as outbox
from helpers import seed, wait_until_db
from test_tui import SIZE, _app, screen_text, until
from textual.widgets import Input

from outbox import Event, enqueue_many
from outbox.operations.replay import (
    HalfDetached,
    ReplayFilter,
    preview,
    resume_point,
    send_batch,
    start,
)
from outbox.partitions import FINISHED_NOTE, RETIRING_MARK, Layout
from outbox.runner import perform
from outbox.schema import migrate
from outbox.table import Table
from outbox.tui.screens.replay import ReplayScreen

TABLE = Table.parse("outbox")
Conn = psycopg.Connection[tuple[object, ...]]


def _delivered(conn: Conn) -> datetime:
    """Partitions of 100 ids, rows 1 to 250 done, noted finished by a run of `outbox
    maintain` (a run retires only what it noted): p0's created 3 hours before the database's
    now, p1's 2 hours before, p2's now. That now."""
    migrate(conn, TABLE, layout=Layout(100, 2))
    seed(conn, 250)
    conn.execute(
        "UPDATE outbox SET status = 'done', done_at = now(), created_at = now() - CASE"
        " WHEN id < 100 THEN interval '3 hours' WHEN id < 200 THEN interval '2 hours'"
        " ELSE interval '0 hours' END"
    )
    now = conn.execute("SELECT now()").fetchone()
    assert now is not None and isinstance(now[0], datetime)
    return now[0]


def _left_half_detached(dsn: str, conn: Conn, partition: str, *, by_run: bool = True) -> None:
    """What a run of `outbox maintain` cancelled in its DETACH ... CONCURRENTLY (while it
    waited for a transaction on the table) leaves: the partition pending detach, its note
    marked retiring as a run marks it before its detach (`by_run`; else a detach begun by
    hand, its comment as it was)."""
    if by_run:
        conn.execute(
            psycopg.sql.SQL("COMMENT ON TABLE {} IS {}").format(
                psycopg.sql.Identifier(partition),
                f"{FINISHED_NOTE}{datetime.now(UTC).isoformat()}{RETIRING_MARK}",
            )
        )
    with (
        psycopg.connect(dsn) as reader,
        psycopg.connect(dsn, autocommit=True) as detacher,
    ):
        reader.execute("SELECT count(*) FROM outbox")  # a transaction the detach waits for
        errors: list[BaseException] = []

        def detach() -> None:
            try:
                detacher.execute(f"ALTER TABLE outbox DETACH PARTITION {partition} CONCURRENTLY")
            except psycopg.Error as exc:
                errors.append(exc)

        detaching = threading.Thread(target=detach)
        detaching.start()
        wait_until_db(
            conn,
            f"EXISTS (SELECT FROM pg_inherits WHERE inhrelid = '{partition}'::regclass"
            " AND inhdetachpending)",
        )
        conn.execute("SELECT pg_cancel_backend(%s)", (detacher.info.backend_pid,))
        detaching.join(30)
        assert errors and isinstance(errors[0], psycopg.errors.QueryCanceled), errors
        reader.rollback()


def _dry_run(dsn: str, since: datetime, until: datetime):  # type: ignore[no-untyped-def]
    return outbox(
        dsn, "replay", "--since", since.isoformat(), "--until", until.isoformat(), "--dry-run"
    )


def _refusal(partition: str, then: str = "run this replay again") -> str:
    return (
        f"outbox: error: partition {partition} of table outbox is half detached (a run of "
        "outbox maintain was interrupted), so its rows cannot be read through the table; run "
        f"`outbox maintain --table outbox` to finish it, then {then}\n"
    )


def test_the_preview_of_a_window_across_a_half_detached_partition_says_so(empty_dsn: str):
    """p1 pending detach, the window holding p0, p1 and p2: the preview counted 150 messages
    (p0's and p2's), and the replay then stopped at p1. It says what to do instead, and once
    `outbox maintain` has finished the detach (the run had noted p1 finished: it drops it),
    counts what the table holds."""
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        now = _delivered(conn)
        noted = outbox(empty_dsn, "maintain", "--retention", "7d")
        assert "2 finished but within the retention" in noted.stdout, noted.stderr
        _left_half_detached(empty_dsn, conn, "outbox_p1")
        since, until = now - timedelta(hours=4), now + timedelta(minutes=1)

        refused = _dry_run(empty_dsn, since, until)
        assert (refused.returncode, refused.stdout) == (1, ""), refused
        assert refused.stderr == _refusal("outbox_p1")
        # Without --dry-run, nothing is sent: the same line, before the typed count.
        sending = outbox(
            empty_dsn, "replay", "--since", since.isoformat(), "--until", until.isoformat(),
            "--yes",
        )  # fmt: skip
        assert (sending.returncode, sending.stderr) == (1, _refusal("outbox_p1")), sending
        assert conn.execute("SELECT count(*) FROM outbox_actions").fetchone() == (0,)
        assert conn.execute("SELECT count(*) FROM outbox_p1 WHERE status = 'done'").fetchone() == (
            100,
        )

        finished = outbox(empty_dsn, "maintain", "--retention", "7d")
        assert finished.returncode == 0, finished.stderr
        after = _dry_run(empty_dsn, since, until)
        assert after.returncode == 0, after.stderr
        assert after.stdout.startswith("outbox: would send again 150 messages (ids 1 to 250; "), (
            after.stdout
        )


@pytest.mark.parametrize("partition", ["outbox_p0", "outbox_p1"])
def test_a_window_only_a_half_detached_partition_holds_is_not_said_gone(
    empty_dsn: str, partition: str
):
    """The window's rows are all in the partition pending detach: the table's lowest (the
    preview said the messages were gone, purged or dropped) or one between others (it said
    no message matched)."""
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        now = _delivered(conn)
        _left_half_detached(empty_dsn, conn, partition)
        hours = 3 if partition == "outbox_p0" else 2
        since = now - timedelta(hours=hours, minutes=30)
        until = now - timedelta(hours=hours - 1, minutes=30)
        refused = _dry_run(empty_dsn, since, until)
        assert (refused.returncode, refused.stdout) == (1, ""), refused
        assert refused.stderr == _refusal(partition)
        with pytest.raises(HalfDetached):
            perform(conn, preview(TABLE, ReplayFilter(since=since, until=until)))


def test_a_window_the_half_detached_partition_holds_nothing_of_is_previewed(empty_dsn: str):
    """p0 pending detach, the window holding p2's rows only (neither the rows of p0 nor its
    ids): the preview counts them, and the replay sends them."""
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        now = _delivered(conn)
        _left_half_detached(empty_dsn, conn, "outbox_p0")
        since, until = now - timedelta(minutes=30), now + timedelta(minutes=1)
        shown = _dry_run(empty_dsn, since, until)
        assert shown.returncode == 0, shown.stderr
        assert shown.stdout.startswith("outbox: would send again 51 messages (ids 200 to 250; ")
        sent = outbox(
            empty_dsn, "replay", "--since", since.isoformat(), "--until", until.isoformat(),
            "--yes",
        )  # fmt: skip
        assert sent.returncode == 0, sent.stderr
        assert "sent 51 messages again" in sent.stdout


async def test_the_tuis_done_screen_says_so_too(empty_dsn: str):
    """The TUI's screen of done messages (`o`) previews the same way: it shows the line, in
    place of a count that left p1's rows out, and has nothing to replay."""
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        _delivered(conn)
        _left_half_detached(empty_dsn, conn, "outbox_p1")
        app = _app(empty_dsn)
        async with app.run_test(size=SIZE) as pilot:
            await until(pilot, lambda: "dead" in screen_text(app), "the dashboard")
            screen = await done_screen(app, pilot)
            await until(pilot, lambda: "half detached" in screen_text(app), "the line")
            assert "partition outbox_p1 of table outbox is half" in screen_text(app)
            assert screen.preview is None
            await pilot.press("R")
            await until(pilot, lambda: "nothing to replay" in screen_text(app), "no replay")
        assert conn.execute("SELECT count(*) FROM outbox_actions").fetchone() == (0,)


def test_a_table_whose_name_holds_a_percent_sign_is_previewed_beside_a_half_detached_partition(
    empty_dsn: str,
):
    """Table `ev%t`, its p1 pending detach, a window of p2 alone: the preview reads p1 itself
    to see whether it holds a row of the window, and counts p2's rows. The partition named
    in a statement with parameters must not read as one (`%t`): it failed with
    `positional and named placeholders cannot be mixed`."""
    table = Table(None, "ev%t")
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        migrate(conn, table, layout=Layout(100, 2))
        with conn.transaction():
            enqueue_many(
                conn, [Event("order", "a", "Tested", {"n": i}) for i in range(250)], table=table
            )
        conn.execute(
            "UPDATE \"ev%t\" SET status = 'done', done_at = now(), created_at = now() - CASE"
            " WHEN id < 200 THEN interval '2 hours' ELSE interval '0 hours' END"
        )
        with psycopg.connect(empty_dsn) as reader, psycopg.connect(empty_dsn, autocommit=True) as d:
            reader.execute('SELECT count(*) FROM "ev%t"')  # a transaction the detach waits for
            detaching = threading.Thread(
                target=lambda: _cancelled(
                    d, 'ALTER TABLE "ev%t" DETACH PARTITION "ev%t_p1" CONCURRENTLY'
                )
            )
            detaching.start()
            wait_until_db(
                conn,
                "EXISTS (SELECT FROM pg_inherits WHERE inhrelid = '\"ev%t_p1\"'::regclass"
                " AND inhdetachpending)",
            )
            conn.execute("SELECT pg_cancel_backend(%s)", (d.info.backend_pid,))
            detaching.join(30)
            reader.rollback()
        now = conn.execute("SELECT now()").fetchone()
        assert now is not None
        since, until = now[0] - timedelta(minutes=30), now[0] + timedelta(minutes=1)
        shown = outbox(
            empty_dsn, "replay", "--table", "ev%t", "--since", since.isoformat(),
            "--until", until.isoformat(), "--dry-run",
        )  # fmt: skip
        assert shown.returncode == 0, shown.stderr
        assert shown.stdout.startswith("ev%t: would send again 51 messages (ids 200 to 250"), (
            shown.stdout
        )


def _cancelled(conn: Conn, statement: str) -> None:
    with pytest.raises(psycopg.errors.QueryCanceled):
        conn.execute(statement)


async def done_screen(app: Any, pilot: Any) -> ReplayScreen:
    """The TUI's screen of done messages (`o`), previewing the last 4 hours."""
    await pilot.press("o")
    await until(pilot, lambda: isinstance(app.screen, ReplayScreen), "the done screen")
    screen = app.screen
    assert isinstance(screen, ReplayScreen)
    screen.query_one("#since", Input).value = "4h"
    screen.load()
    return screen


def test_a_replay_stopped_at_a_half_detached_partition_says_how_to_go_on(empty_dsn: str):
    """A replay that recorded a batch, stopped at p1 pending detach: go on under the same
    number, once `outbox maintain` has finished p1 (read back with `--resume`, the same)."""
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        now = _delivered(conn)
        f = ReplayFilter(since=now - timedelta(hours=4), until=now + timedelta(minutes=1))
        progress = perform(conn, start(TABLE, perform(conn, preview(TABLE, f))))
        perform(conn, send_batch(TABLE, progress, batch=50), transaction=True)
        assert progress.batches == 1
        _left_half_detached(empty_dsn, conn, "outbox_p1")
        go_on = f"then go on with `outbox replay --table outbox --resume {progress.number}`"
        for replay in (progress, perform(conn, resume_point(TABLE, progress.number))):
            with pytest.raises(HalfDetached) as stopped:
                perform(conn, send_batch(TABLE, replay, batch=50), transaction=True)
            assert str(stopped.value).endswith(go_on), stopped.value
