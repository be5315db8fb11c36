"""`outbox replay`: the window found by id, the dry run, the typed confirmation, bounded
batches with one audit record each, resuming a stopped replay, and ordered mode's rule for
replayed messages with a real dispatcher."""

from __future__ import annotations

import asyncio
import os
import pty
import select
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
from helpers import (
    RUNNING,
    interrupted_on_a_locked_row,
    seed,
    serve_ordering,
    wait_until,
    wait_until_db,
)
from test_admin_cli import BASE_ENV, outbox
from workers import dispatching, settings

from outbox import Event, enqueue_many
from outbox.lease import claim, finalize
from outbox.models import Message, Outcome
from outbox.operations.replay import (
    CREATED_AT_SLACK,
    ReplayFilter,
    preview,
    send_batch,
    start,
    window,
)
from outbox.runner import perform
from outbox.worker.replica import Replica

T0 = datetime(2026, 3, 1, 14, 0, tzinfo=UTC)


def _delivered(conn, count: int, *, every: timedelta = timedelta(minutes=1), types=("A", "B")):
    """`count` done rows, one created every `every` from T0, event types taking turns; ids
    rise with created_at as they do for real."""
    events = [Event("order", f"agg-{i % 3}", types[i % len(types)], {"n": i}) for i in range(count)]
    with conn.transaction():
        ids = enqueue_many(conn, events)
    conn.execute(
        "UPDATE outbox SET status = 'done', done_at = now(), attempts = 1, "
        "created_at = %s + (id - %s) * %s::interval WHERE id = ANY(%s)",
        (T0, ids[0], every, ids),
    )
    return ids


def _snapshot(conn) -> list[tuple[Any, ...]]:
    return conn.execute(
        "SELECT id, status, attempts, replay, available_at, lease_version FROM outbox ORDER BY id"
    ).fetchall()


def _audit(conn) -> list[tuple[Any, ...]]:
    return conn.execute(
        "SELECT action, message_ids, filter, requested, count FROM outbox_actions ORDER BY id"
    ).fetchall()


def test_window_bounds_the_ids_with_a_few_probes_and_the_filter_is_exact(conn, table):
    ids = _delivered(conn, 300)  # 14:00 to 18:59
    f = ReplayFilter(since=T0 + timedelta(minutes=100), until=T0 + timedelta(minutes=110))
    found = perform(conn, window(table, f.since, f.until))
    # The slack widens it on each side, and no further.
    slack = int(CREATED_AT_SLACK / timedelta(minutes=1))
    assert found.first == ids[100 - slack] and found.past == ids[110 + slack]
    shown = perform(conn, preview(table, f))
    assert (shown.count, shown.first_id, shown.last_id) == (10, ids[100], ids[109])
    assert shown.by_type == {"A": 5, "B": 5}
    typed = perform(conn, preview(table, ReplayFilter(f.since, f.until, event_types=("B",))))
    assert typed.count == 5 and typed.by_type == {"B": 5}


def test_a_row_created_by_a_long_transaction_is_found_within_the_slack(conn, table):
    ids = _delivered(conn, 60)
    # Its transaction began 5 minutes before its id was drawn: created_at lags the ids.
    conn.execute(
        "UPDATE outbox SET created_at = created_at - interval '5 minutes' WHERE id = %s",
        (ids[40],),
    )
    f = ReplayFilter(since=T0 + timedelta(minutes=35), until=T0 + timedelta(minutes=36))
    shown = perform(conn, preview(table, f))
    assert (shown.count, shown.first_id, shown.last_id) == (2, ids[35], ids[40])


def test_dry_run_prints_counts_by_type_and_changes_nothing(conn, dsn):
    ids = _delivered(conn, 100)
    before, audit = _snapshot(conn), _audit(conn)
    since, until = (
        (T0 + timedelta(minutes=10)).isoformat(),
        (T0 + timedelta(minutes=30)).isoformat(),
    )
    result = outbox("replay", "--dsn", dsn, "--since", since, "--until", until, "--dry-run")
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        f"outbox: would send again 20 messages (ids {ids[10]} to {ids[29]}; done created "
        f"{since} to {until})",
        "  A  10",
        "  B  10",
    ]
    assert _snapshot(conn) == before and _audit(conn) == audit
    # A dry run draws no replay number either: the first replay is 1.
    assert conn.execute("SELECT last_value, is_called FROM outbox_replays").fetchone() == (1, False)


def test_a_window_whose_rows_only_miss_the_filter_says_nothing_of_retention(conn, dsn):
    """Nothing ever retired, a window reaching back before the oldest row finds rows that
    are not done, or of another type: no "older ones are gone", which blamed retention for
    a filter. Once the oldest rows are purged, the same window says they are gone."""
    ids = _delivered(conn, 10)
    conn.execute("UPDATE outbox SET status = 'pending', done_at = NULL WHERE id > %s", (ids[4],))
    since, until = (T0 - timedelta(days=1)).isoformat(), (T0 + timedelta(days=1)).isoformat()

    def dry_run(*filters: str) -> str:
        result = outbox("replay", "--dsn", dsn, "--since", since, "--until", until, "--dry-run",
                        *filters)  # fmt: skip
        assert result.returncode == 0, result.stderr
        return result.stdout

    assert dry_run("--event-type", "C") == (
        f"outbox: no message matches (done created {since} to {until}, type C)\n"
    )
    assert dry_run("--status", "dead") == (
        f"outbox: no message matches (dead created {since} to {until})\n"
    )
    conn.execute("DELETE FROM outbox WHERE id <= %s", (ids[4],))  # the done rows, purged
    assert "older ones are gone" in dry_run()


def test_without_a_terminal_yes_is_required(conn, dsn):
    _delivered(conn, 10)
    before = _snapshot(conn)
    result = outbox("replay", "--dsn", dsn, "--since", "2026-03-01T14:00:00Z", "--until", "1s")
    assert result.returncode == 2
    assert (
        result.stderr.count("\n") == 1 and "--yes is required without a terminal" in result.stderr
    )
    assert _snapshot(conn) == before


def test_bad_times_are_one_line_and_exit_2(dsn):
    for since, reason in (
        ("2026-03-01T14:00:00", "has no offset"),
        ("yesterday", "neither an ISO 8601 time nor a duration"),
    ):
        result = outbox("replay", "--dsn", dsn, "--since", since, "--until", "1h", "--dry-run")
        assert result.returncode == 2 and reason in result.stderr
        assert result.stderr.count("\n") == 1
    missing = outbox("replay", "--dsn", dsn, "--until", "1h", "--dry-run")
    assert missing.returncode == 2 and "--since is required" in missing.stderr
    empty = outbox("replay", "--dsn", dsn, "--since", "1h", "--until", "2h", "--dry-run")
    assert empty.returncode == 2 and "--until must be later than --since" in empty.stderr


def _on_terminal(args: list[str], answer: str) -> tuple[int, str]:
    """Run `outbox` with a pseudo-terminal as its stdin and stdout; type `answer` once it
    asks."""
    main, child = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "outbox", *args],
        stdin=child,
        stdout=child,
        stderr=child,
        env=BASE_ENV,
    )
    os.close(child)
    seen = b""
    answered = False
    while True:
        ready, _, _ = select.select([main], [], [], 60)
        assert ready, f"no output: {seen!r}"
        try:
            chunk = os.read(main, 4096)
        except OSError:  # the child closed the terminal
            break
        if not chunk:
            break
        seen += chunk
        if not answered and b"to confirm: " in seen:
            os.write(main, answer.encode() + b"\n")
            answered = True
    os.close(main)
    return proc.wait(timeout=60), seen.decode()


def test_the_typed_count_confirms_and_a_wrong_one_sends_nothing(conn, dsn):
    _delivered(conn, 30)
    window_args = ["replay", "--dsn", dsn, "--since", T0.isoformat(), "--until", "1s"]
    before = _snapshot(conn)
    code, seen = _on_terminal(window_args, "3")
    assert code == 1 and "type 30 to confirm" in seen and "nothing sent" in seen
    assert _snapshot(conn) == before and _audit(conn) == []
    code, seen = _on_terminal([*window_args, "--reason", "consumer bug"], "30")
    assert code == 0, seen
    assert "replay 1: sent 30 messages again in 1 batch (A 15, B 15)" in seen
    assert conn.execute(
        "SELECT count(*) FROM outbox WHERE status = 'pending' AND replay = 1 AND attempts = 0"
    ).fetchone() == (30,)


def test_batches_are_bounded_each_recorded_and_numbered(conn, dsn):
    ids = _delivered(conn, 50)
    args = ["replay", "--dsn", dsn, "--since", T0.isoformat(), "--until", "1s", "--yes"]
    result = outbox(*args, "--event-type", "A", "--batch", "7", "--reason", "bug 1432")
    assert result.returncode == 0, result.stderr
    assert result.stdout == "outbox: replay 1: sent 25 messages again in 4 batches (A 25)\n"
    records = _audit(conn)
    assert [(r[0], r[3], r[4]) for r in records] == [("replay", 7, 7)] * 3 + [("replay", 4, 4)]
    replayed = [i for r in records for i in r[1]]
    assert replayed == ids[0::2]  # the A's, each once, in id order
    first = records[0][2]
    assert first["replay"] == 1 and first["reason"] == "bug 1432"
    assert first["via"] == "outbox replay" and first["filter"]["event_types"] == ["A"]
    assert first["through_id"] == replayed[6]
    again = outbox(*args, "--status", "done", "--event-type", "B")
    assert again.stdout == "outbox: replay 2: sent 25 messages again in 1 batch (B 25)\n"


def test_a_stopped_replay_resumes_where_its_last_batch_ended(conn, dsn, table):
    ids = _delivered(conn, 40)
    f = ReplayFilter(since=T0, until=T0 + timedelta(hours=1))
    shown = perform(conn, preview(table, f))
    progress = perform(conn, start(table, shown))
    perform(conn, send_batch(table, progress, batch=15, actor="alice", reason="bug"))  # stopped
    # Meanwhile one of the first 15 was delivered again: a resume must not send it a third time.
    conn.execute("UPDATE outbox SET status = 'done' WHERE id = %s", (ids[0],))
    # What the replay keeps cannot be given again, nor a dry run asked of a resume (it sent).
    before = _snapshot(conn)
    for flags, refused in (
        (["--dry-run"], "drop --dry-run"),
        (["--status", "dead", "--yes"], "drop --status"),
        (["--limit", "5", "--yes"], "drop --limit"),
    ):
        wrong = outbox("replay", "--dsn", dsn, "--resume", str(progress.number), *flags)
        assert wrong.returncode == 2 and refused in wrong.stderr, wrong.stderr
        assert wrong.stderr.count("\n") == 1
    assert _snapshot(conn) == before
    result = outbox("replay", "--dsn", dsn, "--resume", str(progress.number), "--yes")
    assert result.returncode == 0, result.stderr
    assert f"going on from id {ids[15]}" in result.stdout
    assert "replay 1: sent 25 messages again" in result.stdout
    sent = [i for r in _audit(conn) for i in r[1]]
    assert sorted(sent) == ids and len(set(sent)) == 40
    assert {r[2]["reason"] for r in _audit(conn)} == {"bug"}  # the resumed batches' too
    assert conn.execute("SELECT status FROM outbox WHERE id = %s", (ids[0],)).fetchone() == (
        "done",
    )
    unknown = outbox("replay", "--dsn", dsn, "--resume", "9", "--yes")
    assert unknown.returncode == 1 and "replay 9 recorded no batch" in unknown.stderr
    mixed = outbox("replay", "--dsn", dsn, "--resume", "1", "--since", "1h", "--yes")
    assert mixed.returncode == 2 and "drop --since" in mixed.stderr
    # Not a reconcile's replay: `outbox reconcile --resume` names the command that goes on.
    inbox_args = ["--inbox-dsn", dsn, "--inbox-table", "outbox_inbox"]
    elsewhere = outbox("reconcile", "--dsn", dsn, *inbox_args, "--resume", "1", "--yes")
    assert elsewhere.returncode == 2
    assert elsewhere.stderr == (
        "outbox: error: --resume: replay 1 is an `outbox replay`: go on with `outbox replay "
        "--table outbox --resume 1`\n"
    )


def _stopped_while_waiting_on(conn, dsn: str, locked: int, *args: str) -> str:
    """`outbox replay *args`, Ctrl-C'd while a batch waits on a lock of row `locked` (that
    batch rolled back, those before it sent): what it printed on stderr."""
    code, stderr = interrupted_on_a_locked_row(
        conn, dsn, locked,
        [sys.executable, "-m", "outbox", "replay", "--dsn", dsn, "--yes", *args], env=BASE_ENV,
    )  # fmt: skip
    assert code == 130, stderr
    return stderr


def test_a_resumed_replay_keeps_its_batch_size_unless_given_another(conn, dsn):
    """The batch size is the replay's, kept with its window and filter: a resume without
    --batch goes on in the size it was started with, not the default; one with --batch takes
    that size, which a later resume keeps in turn."""
    ids = _delivered(conn, 60)
    stopped = _stopped_while_waiting_on(
        conn, dsn, ids[30], "--since", T0.isoformat(), "--until", "1s", "--batch", "7"
    )
    assert "replay 1: stopped after 28 messages (4 batches)" in stopped
    stopped = _stopped_while_waiting_on(conn, dsn, ids[45], "--resume", "1", "--batch", "3")
    assert "stopped after 15 messages (5 batches)" in stopped  # ids[28:43]
    # Run where a worker's settings are (its pod): their claim batch is not the replay's.
    result = outbox("replay", "--dsn", dsn, "--resume", "1", "--yes", env={"OUTBOX_BATCH": "25"})
    assert result.returncode == 0, result.stderr
    assert f"replay 1: going on from id {ids[43]} in batches of 3 (" in result.stdout
    sizes = [requested for _, _, _, requested, _ in _audit(conn)]
    assert sizes == [7] * 4 + [3] * 5 + [3] * 5 + [2]
    assert sorted(i for r in _audit(conn) for i in r[1]) == ids


def test_dead_messages_are_replayed_with_status_dead_only(conn, dsn):
    ids = _delivered(conn, 10)
    conn.execute("UPDATE outbox SET status = 'dead' WHERE id = ANY(%s)", (ids[:3],))
    result = outbox(
        "replay", "--dsn", dsn, "--since", T0.isoformat(), "--until", "1s", "--status", "dead",
        "--yes",
    )  # fmt: skip
    assert "sent 3 messages again" in result.stdout
    assert conn.execute(
        "SELECT array_agg(id ORDER BY id) FROM outbox WHERE status = 'pending'"
    ).fetchone() == (ids[:3],)


async def test_ordered_a_replay_waits_for_its_aggregates_message_in_flight(conn, dsn, table):
    """The rule, claim by claim: a replayed message is claimable once it is its aggregate's
    head and no later message of its aggregate is in flight."""
    serve_ordering(conn)
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as aconn:
        first = seed(conn, 2, aggregates=1)
        held = await claim(
            aconn, table, owner="t", batch=10, lease=timedelta(minutes=1), max_attempts=5,
            ordered=True,
        )  # fmt: skip
        assert [m.id for m in held] == first[:1]
        await finalize(aconn, table, [Outcome.done(held[0])])
        [second] = await claim(
            aconn, table, owner="t", batch=10, lease=timedelta(minutes=1), max_attempts=5,
            ordered=True,
        )  # fmt: skip
        assert second.id == first[1]  # in flight now
        f = ReplayFilter(since=T0 - timedelta(days=3650), until=T0 + timedelta(days=3650))
        shown = perform(conn, preview(table, f))
        progress = perform(conn, start(table, shown))
        perform(conn, send_batch(table, progress))  # the first message, back to pending
        for by_aggregate in (False, True):
            nothing = await claim(
                aconn, table, owner="t", batch=10, lease=timedelta(minutes=1), max_attempts=5,
                ordered=True, by_aggregate=by_aggregate,
            )  # fmt: skip
            assert nothing == []
        await finalize(aconn, table, [Outcome.done(second)])
        [again] = await claim(
            aconn, table, owner="t", batch=10, lease=timedelta(minutes=1), max_attempts=5,
            ordered=True,
        )  # fmt: skip
        assert (again.id, again.replay) == (first[0], 1)


class _Recorder:
    name = "recorder"

    def __init__(self) -> None:
        self.sent: list[Message] = []

    async def start(self) -> None: ...

    async def close(self) -> None: ...

    async def publish(self, message: Message) -> None:
        self.sent.append(message)
        await asyncio.sleep(0)


async def test_ordered_replays_go_in_original_order_before_the_aggregates_new_messages(
    conn, dsn, table
):
    """A real dispatcher, ordered: three aggregates delivered, a replay of all of them while
    each has a new message waiting; per aggregate the replays go out in their original
    order, then the new message, and nothing interleaves."""
    serve_ordering(conn)
    old = _delivered(conn, 12)  # agg-0, agg-1, agg-2, four each
    with conn.transaction():
        new = enqueue_many(conn, [Event("order", f"agg-{i}", "C", {"new": i}) for i in range(3)])
    f = ReplayFilter(since=T0, until=T0 + timedelta(hours=1))
    shown = perform(conn, preview(table, f))
    progress = perform(conn, start(table, shown))
    while not progress.finished:
        perform(conn, send_batch(table, progress, batch=5))
    recorder = _Recorder()
    replica = Replica(settings(dsn, ordering="aggregate", batch=4, concurrency=4), recorder)
    stop = asyncio.Event()
    task = asyncio.create_task(replica.run(stop), name="ordered replica")
    RUNNING.add(task)
    try:
        await wait_until(
            lambda: (
                conn.execute("SELECT count(*) FROM outbox WHERE status = 'done'").fetchone()
                == (15,)
            ),
            what="replays and new messages done",
        )
    finally:
        RUNNING.discard(task)
        stop.set()
        await asyncio.wait_for(task, timeout=60)
    for n in range(3):
        sent = [(m.id, m.replay) for m in recorder.sent if m.aggregate_id == f"agg-{n}"]
        assert sent == [*((i, 1) for i in old[n::3]), (new[n], None)]


def test_limit_and_aggregate_narrow_the_replay(conn, dsn):
    ids = _delivered(conn, 30)  # agg-0, agg-1, agg-2 in turn
    args = ["replay", "--dsn", dsn, "--since", T0.isoformat(), "--until", "1s", "--yes"]
    result = outbox(*args, "--aggregate-id", "agg-1", "--aggregate-type", "order", "--limit", "4")
    assert result.stdout == "outbox: replay 1: sent 4 messages again in 1 batch (A 2, B 2)\n"
    assert [i for r in _audit(conn) for i in r[1]] == ids[1::3][:4]
    other = outbox(*args, "--aggregate-type", "invoice", "--dry-run")
    assert other.stdout.startswith("outbox: no message matches")


def test_a_filter_matches_ordinary_text_a_line_shows_escaped_and_refuses_the_unsafe(conn, dsn):
    """A no-break space, a joiner, a mark, a private-use character are text a row may hold,
    and a filter must match them; only controls, bidirectional overrides and isolates, and
    lone surrogates are refused, each said for what it is."""
    ids = _delivered(conn, 6)
    odd = "order\xa01\u200d\u200f\ue000"
    conn.execute("UPDATE outbox SET aggregate_id = %s WHERE id = %s", (odd, ids[4]))
    args = ["replay", "--dsn", dsn, "--since", T0.isoformat(), "--until", "1s", "--dry-run"]
    found = outbox(*args, "--aggregate-id", odd)
    assert found.returncode == 0, found.stderr
    assert found.stdout.splitlines()[1:] == ["  A  1"]
    for text, said in (
        ("order\x1b[2J", r"holds a control character (\x1b)"),
        ("order\u202e1", r"holds a bidirectional embedding, override or isolate (\u202e)"),
    ):
        refused = outbox(*args, "--aggregate-id", text)
        assert refused.returncode == 2 and said in refused.stderr, refused.stderr
        assert refused.stderr.count("\n") == 1


def test_a_replay_killed_mid_way_resumes_and_sends_each_message_once(conn, dsn):
    """A real process, SIGKILLed between batches (or inside one): what it wrote is whole,
    and --resume sends the rest, none twice."""
    ids = _delivered(conn, 3000, every=timedelta(milliseconds=10))
    proc = subprocess.Popen(
        [sys.executable, "-m", "outbox", "replay", "--dsn", dsn, "--since", T0.isoformat(),
         "--until", "1s", "--yes", "--batch", "1"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=BASE_ENV,
    )  # fmt: skip
    try:
        wait_until_db(conn, "(SELECT count(*) FROM outbox_actions) >= 20")
    finally:
        proc.kill()
    assert proc.wait(timeout=30) == -9
    sent_before = [i for r in _audit(conn) for i in r[1]]
    assert 20 <= len(sent_before) < 3000
    result = outbox("replay", "--dsn", dsn, "--resume", "1", "--yes", "--batch", "500")
    assert result.returncode == 0, result.stderr
    sent = [i for r in _audit(conn) for i in r[1]]
    assert sorted(sent) == ids and len(sent) == len(set(sent))
    assert conn.execute("SELECT count(*) FROM outbox WHERE replay = 1").fetchone() == (3000,)


def test_reconcile_usage_errors_are_one_line_and_exit_2(dsn):
    window = ["--since", "1h", "--until", "0s", "--inbox-table", "outbox_inbox"]
    for args, reason in (
        ([*window], "--inbox-dsn"),
        ([*window, "--inbox-dsn", dsn, "--yes"], "--yes confirms --replay"),
        ([*window, "--inbox-dsn", dsn, "--replay"], "--yes is required without a terminal"),
        ([*window, "--inbox-dsn", dsn, "--resume", "3", "--yes"], "drop --since"),
        (["--inbox-table", "i", "--inbox-dsn", dsn, "--resume", "0", "--yes"], "--resume: 0"),
        (["--inbox-table", "i", "--inbox-dsn", dsn, "--resume", "3"], "--yes is required"),
    ):
        result = outbox("reconcile", "--dsn", dsn, *args)
        assert result.returncode == 2 and reason in result.stderr, result.stderr
        assert result.stderr.count("\n") == 1


async def test_a_replay_on_a_partitioned_table_reaches_back_to_old_partitions(empty_dsn):
    """Rows replayed in the oldest partitions, while a real replica serves a partitioned
    table whose claims look in a window of partitions: each is sent again, at once."""
    from outbox.partitions import Layout
    from outbox.schema import migrate
    from outbox.table import Table

    table = Table.parse("outbox")
    recorder = _Recorder()
    with psycopg.connect(empty_dsn, autocommit=True) as pconn:
        migrate(pconn, table, layout=Layout(100, 5))
        ids = seed(pconn, 420, aggregates=10)
        done = "SELECT count(*) FROM outbox WHERE status = 'done'"
        async with dispatching(settings(empty_dsn, batch=40), recorder):
            await wait_until(lambda: pconn.execute(done).fetchone() == (420,), what="delivered")
            old = ids[:150]  # the first two partitions
            pconn.execute("UPDATE outbox SET created_at = created_at - interval '1 day'")
            pconn.execute("UPDATE outbox SET created_at = %s WHERE id = ANY(%s)", (T0, old))
            f = ReplayFilter(since=T0, until=T0 + timedelta(minutes=1))
            progress = perform(pconn, start(table, perform(pconn, preview(table, f))))
            while not progress.finished:
                perform(pconn, send_batch(table, progress, batch=50))
            assert progress.sent == 150
            # Below the replica's claim window: the replay's NOTIFY has it read the window
            # again from the lowest partition, long before its next floor reading would
            # (outbox.claim_window.FLOOR_TTL, 30 s).
            await wait_until(
                lambda: pconn.execute(done).fetchone() == (420,), timeout=20, what="sent again"
            )
    again = sorted(m.id for m in recorder.sent if m.replay == 1)
    assert again == old


async def test_ordered_a_replay_below_a_workers_floor_goes_before_its_aggregates_next(empty_dsn):
    """A real replica, ordered, on a partitioned table: aggregate A's id 50 (partition 0) is
    done, its id 640 in flight elsewhere, its id 650 waiting behind it; the replica's claims
    look from partition 6 up (its floor). 50 is replayed: the replay's NOTIFY has the replica
    read its window again from the lowest partition, so once 640 is done, 650 waits behind
    50 (its earlier message, pending again) instead of going out first."""
    from outbox import lease
    from outbox.claim_window import ClaimWindow
    from outbox.partitions import Layout
    from outbox.schema import check_table, migrate
    from outbox.table import Table

    table = Table.parse("outbox")
    recorder = _Recorder()
    with psycopg.connect(empty_dsn, autocommit=True) as pconn:
        migrate(pconn, table, "aggregate", layout=Layout(100, 8))
        seed(pconn, 660, aggregates=660)
        pconn.execute("UPDATE outbox SET aggregate_id = 'A' WHERE id IN (50, 640, 650)")
        pconn.execute("UPDATE outbox SET status = 'done', done_at = now() WHERE id < 640")
        pconn.execute("UPDATE outbox SET status = 'done', done_at = now() WHERE id > 650")
        async with await psycopg.AsyncConnection.connect(empty_dsn, autocommit=True) as aconn:
            layout = await check_table(aconn, table)
            [held] = await lease.claim(
                aconn, table, owner="elsewhere", batch=1, lease=timedelta(minutes=5),
                max_attempts=5, ordered=True, window=ClaimWindow(layout),
            )  # fmt: skip
            assert held.id == 640
            s = settings(empty_dsn, ordering="aggregate", batch=10)
            async with dispatching(s, recorder) as replica:
                window = replica.window

                def floor() -> int | None:
                    return None if window.stale() else window.bounds().unfinished_low

                await wait_until(lambda: floor() == 600, what="the replica's floor at 600")
                now = datetime.now(UTC)
                f = ReplayFilter(now - timedelta(hours=1), now + timedelta(hours=1),
                                 aggregate_id="A")  # fmt: skip
                progress = perform(pconn, start(table, perform(pconn, preview(table, f))))
                perform(pconn, send_batch(table, progress))
                assert progress.sent == 1  # id 50: 640 is in flight, 650 pending
                # Told by the NOTIFY, not by its next floor reading (FLOOR_TTL, 30 s, later).
                await wait_until(lambda: floor() == 0, timeout=10, what="the window read again")
                await lease.finalize(aconn, table, [Outcome.done(held)], layout=layout)
                await wait_until(lambda: len(recorder.sent) == 11, what="50 and 641-650 sent")
    sent = [(m.id, m.replay) for m in recorder.sent if m.aggregate_id == "A"]
    assert sent == [(50, 1), (650, None)]
