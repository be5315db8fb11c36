"""outbox-tui driven with App.run_test() and Pilot against real PostgreSQL: what it shows
matches the database, actions change exactly the confirmed rows, read-only refuses, the
pollers never overlap, and the app reconnects by itself."""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
from collections.abc import Callable
from typing import Any

import psycopg
import pytest
from helpers import row, seed, serve_ordering, statuses
from psycopg import sql
from textual.pilot import Pilot
from textual.worker import WorkerCancelled
from tui_fakes import FakeSource

from outbox.operations import repair
from outbox.runner import fetch
from outbox.stats import queue_stats
from outbox.table import Table
from outbox.tui.app import OutboxApp
from outbox.tui.config import Config, parse_args
from outbox.tui.poller import Poller
from outbox.tui.screens.confirm import ConfirmScreen
from outbox.tui.screens.dead import DeadScreen
from outbox.tui.screens.detail import DetailScreen
from outbox.tui.screens.help import HelpScreen

SIZE = (120, 40)


def screen_text(app: OutboxApp) -> str:
    """What the terminal shows on the top screen, as plain text."""
    return "\n".join(strip.text for strip in app.screen._compositor.render_strips())


async def settle(pilot: Pilot[Any]) -> None:
    """Every poll in flight has finished and the screen is repainted."""
    await pilot.pause()
    for worker in [w for w in pilot.app.workers if w.group == "poll"]:
        with contextlib.suppress(WorkerCancelled):
            await worker.wait()
    await pilot.pause()


async def until(
    pilot: Pilot[Any], predicate: Callable[[], Any], what: str, timeout: float = 15
) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}:\n{screen_text(pilot.app)}")
        await pilot.pause(0.05)


async def refresh(pilot: Pilot[Any]) -> None:
    await settle(pilot)
    pilot.app.action_refresh_now()
    await settle(pilot)


def _shape(conn) -> list[int]:
    """12 rows: 3 ready, 1 backing off, 2 leased by w1 (one expired), 3 dead, 3 done."""
    ids = seed(conn, 12, aggregates=4)
    conn.execute("UPDATE outbox SET available_at = now() + interval '1 hour', attempts = 2 "
                 "WHERE id = %s", (ids[3],))  # fmt: skip
    conn.execute("UPDATE outbox SET status = 'processing', attempts = 1, lease_owner = 'w1', "
                 "lease_until = now() + interval '1 minute' WHERE id = %s", (ids[4],))  # fmt: skip
    conn.execute("UPDATE outbox SET status = 'processing', attempts = 1, lease_owner = 'w1', "
                 "lease_until = now() - interval '1 minute' WHERE id = %s", (ids[5],))  # fmt: skip
    conn.execute("UPDATE outbox SET status = 'dead', attempts = 12, last_error = 'HTTP 503' "
                 "WHERE id = ANY(%s)", (ids[6:9],))  # fmt: skip
    conn.execute("UPDATE outbox SET status = 'done', done_at = now() WHERE id = ANY(%s)",
                 (ids[9:],))  # fmt: skip
    return ids


def _app(dsn: str, **config: Any) -> OutboxApp:
    config.setdefault("interval", 0.2)
    return OutboxApp(Config(dsn=dsn, **config))


# -- what it shows ---------------------------------------------------------------------------


async def test_dashboard_counts_match_the_database_and_follow_it_live(conn, dsn):
    serve_ordering(conn)
    _shape(conn)
    app = _app(dsn, ordered=True)
    async with app.run_test(size=SIZE) as pilot:
        # The poll draws the counts; the status line follows from its message.
        await until(
            pilot,
            lambda: "pending" in screen_text(app) and "● connected" in screen_text(app),
            "the first poll",
        )
        text = screen_text(app)
        assert re.search(r"pending\s+4\s+3 ready", text), text
        assert re.search(r"processing\s+2\s+1 lease expired", text), text
        assert re.search(r"dead\s+3\b", text), text
        assert re.search(r"expired leases\s+1\b", text), text
        assert re.search(r"w1\s+2\s+1\b", text), text  # lease holder: held, expired
        assert re.search(r"blocked aggregates\s+\d", text), text
        # Ordered: what the workers may claim now, as the stats (and the operator) read it.
        heads = queue_stats(conn, Table.default(), ordered=True).claimable_heads
        assert re.search(rf"oldest claimable\s+\S+\s+{heads} heads", text), text
        assert "● connected" in text
        # Attempts of waiting rows: 0 -> 3, 1 -> 2, 2 -> 1.
        assert re.search(r"0 █+\s+3\b", text) and re.search(r"2 █+\s+1\b", text), text

        # Live: new arrivals and a new dead row show up without a key press, and the
        # arrivals sparkline (from max_id between snapshots) moves off zero.
        seed(conn, 20)
        conn.execute("UPDATE outbox SET status = 'dead' WHERE id = (SELECT max(id) FROM outbox)")
        await until(pilot, lambda: re.search(r"pending\s+23\b", screen_text(app)), "live refresh")
        assert re.search(r"dead\s+4\b", screen_text(app))
        await until(
            pilot,
            lambda: re.search(r"arrivals\s+[1-9][\d.]*/s", screen_text(app)),
            "arrivals rate",
        )


async def test_dead_letters_list_groups_filter_and_detail(conn, dsn):
    ids = seed(conn, 9)
    conn.execute("UPDATE outbox SET status = 'dead', attempts = 12, last_error = "
                 "'timeout after ' || id || '.5s' WHERE id = ANY(%s)", (ids[:5],))  # fmt: skip
    conn.execute("UPDATE outbox SET status = 'dead', attempts = 3, event_type = 'Refunded', "
                 "last_error = 'HTTP 422: {\"id\": ' || id || '}' WHERE id = ANY(%s)",
                 (ids[5:8],))  # fmt: skip
    app = _app(dsn)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        await pilot.press("d")
        await until(pilot, lambda: "dead letters 8" in screen_text(app), "the dead list")
        dead = app.screen
        assert isinstance(dead, DeadScreen)
        assert dead.page is not None
        assert [m.id for m in dead.page.messages] == sorted(ids[:8], reverse=True)

        await pilot.press("g")
        await until(pilot, lambda: "timeout after <n>s" in screen_text(app), "error groups")
        text = screen_text(app)
        assert re.search(r"5\s+timeout after <n>s", text), text
        assert re.search(r'3\s+HTTP 422: \{"id": <n>\}', text), text
        await pilot.press("enter")  # the biggest group, as a filter on the list
        await until(
            pilot,
            lambda: (
                "→ 5" in screen_text(app) and {m.id for m in dead.page.messages} == set(ids[:5])
            ),
            "the group filter",
        )
        assert dead.filter.error_group == "timeout after <n>s"

        # k9s-style filter line: `/`, type, enter.
        await pilot.press("slash", *"type:Refunded", "enter")
        await until(
            pilot,
            lambda: (
                "→ 3" in screen_text(app) and {m.id for m in dead.page.messages} == set(ids[5:8])
            ),
            "the typed filter",
        )
        await pilot.press("slash", *" colour:red", "enter")
        await until(pilot, lambda: "unknown filter colour:" in screen_text(app), "filter error")
        await pilot.press("escape")

        await pilot.press("enter")
        await until(pilot, lambda: isinstance(app.screen, DetailScreen), "the detail screen")
        await until(pilot, lambda: "payload" in screen_text(app), "the detail")
        text = screen_text(app)
        assert f"message {ids[7]}" in text
        assert f'HTTP 422: {{"id": {ids[7]}}}' in text  # the full last error
        assert '"text": "xxxxxxxxxxxxxxxxxxxx"' in text  # the payload, pretty-printed
        for column in ("aggregate_type", "lease_version", "available_at", "done_at"):
            assert column in text
        assert "no action recorded" in text


async def test_paging_keeps_up_with_many_dead_rows(conn, dsn):
    seed(conn, 130)
    conn.execute("UPDATE outbox SET status = 'dead'")
    app = _app(dsn, page_size=50, paused=True)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        await pilot.press("d")
        await settle(pilot)
        dead = app.screen
        assert isinstance(dead, DeadScreen) and dead.page is not None
        assert dead.page.messages[0].id == 130 and len(dead.page.messages) == 50
        for expected_first in (80, 30):
            await pilot.press("right_square_bracket")
            await settle(pilot)
            assert dead.page.messages[0].id == expected_first
        assert len(dead.page.messages) == 30 and not dead.page.has_older
        assert "page 3 (101-130)" in screen_text(app)
        await pilot.press("left_square_bracket")
        await settle(pilot)
        assert dead.page.messages[0].id == 80
        await pilot.press("t")
        await settle(pilot)
        assert dead.page.messages[0].id == 130 and dead.before is None


# -- actions ---------------------------------------------------------------------------------


async def test_requeue_by_filter_changes_exactly_the_confirmed_rows(conn, dsn, table):
    ids = seed(conn, 10)
    conn.execute("UPDATE outbox SET status = 'dead', attempts = 12, last_error = 'HTTP 503' "
                 "WHERE id = ANY(%s)", (ids[:5],))  # fmt: skip
    conn.execute("UPDATE outbox SET status = 'dead', attempts = 12, last_error = 'HTTP 422' "
                 "WHERE id = ANY(%s)", (ids[5:8],))  # fmt: skip
    app = _app(dsn)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        await pilot.press("d", "slash", *"503", "enter")
        await until(pilot, lambda: "→ 5" in screen_text(app), "the filter")
        await pilot.press("R")
        # The dialog is pushed after a count query and drawn after that: wait for its text.
        await until(pilot, lambda: "Requeue 5 dead messages?" in screen_text(app), "the dialog")
        assert isinstance(app.screen, ConfirmScreen)
        assert "matching error:503" in screen_text(app)

        # While the dialog is open: one of the five is requeued, re-claimed and dies again
        # (its lease_version moves), and a new matching dead row appears.
        conn.execute("UPDATE outbox SET lease_version = lease_version + 1 WHERE id = %s",
                     (ids[0],))  # fmt: skip
        conn.execute("UPDATE outbox SET status = 'dead', last_error = 'HTTP 503' WHERE id = %s",
                     (ids[9],))  # fmt: skip
        assert statuses(conn)["dead"] == 9

        await pilot.press("y")
        await until(pilot, lambda: "requeued 4 of 5" in screen_text(app), "the result")
        assert "1 changed since shown, left alone" in screen_text(app)
    assert [row(conn, i)["status"] for i in ids[1:5]] == ["pending"] * 4
    assert [row(conn, i)["attempts"] for i in ids[1:5]] == [0] * 4
    assert row(conn, ids[0])["status"] == "dead"  # changed meanwhile: untouched
    assert row(conn, ids[9])["status"] == "dead"  # not in what was confirmed: untouched
    assert [row(conn, i)["status"] for i in ids[5:8]] == ["dead"] * 3
    [record] = fetch(conn, repair.recent_actions(table))
    assert (record.action, record.requested, record.count) == ("requeue", 5, 4)
    assert record.message_ids == sorted(ids[1:5])
    assert record.filter is not None
    assert record.filter["query"] == "error:503" and record.filter["via"] == "outbox-tui"


async def test_requeue_marked_rows_cancel_and_skip_a_head(conn, dsn, table):
    serve_ordering(conn)
    ids = seed(conn, 6, aggregates=2)  # agg-0: ids 0, 2, 4; agg-1: 1, 3, 5
    conn.execute("UPDATE outbox SET status = 'dead', last_error = 'x' WHERE id = ANY(%s)",
                 (ids[:4],))  # fmt: skip
    app = _app(dsn, ordered=True)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        await pilot.press("d")
        await until(pilot, lambda: "dead letters 4" in screen_text(app), "the dead list")
        # Newest first: ids[3], ids[2], ids[1], ids[0]. Mark the first two.
        await pilot.press("space", "space")
        assert "2 marked" in screen_text(app)
        await pilot.press("r")
        await until(pilot, lambda: "Requeue 2 dead messages?" in screen_text(app), "the dialog")
        assert isinstance(app.screen, ConfirmScreen)
        await pilot.press("n")  # cancel: nothing changes
        await until(pilot, lambda: "cancelled" in screen_text(app), "cancel notice")
        assert statuses(conn)["dead"] == 4
        await pilot.press("r")
        await until(pilot, lambda: isinstance(app.screen, ConfirmScreen), "the dialog")
        await pilot.press("y")
        await until(pilot, lambda: "requeued 2 of 2" in screen_text(app), "the result")
        assert row(conn, ids[3])["status"] == row(conn, ids[2])["status"] == "pending"
        await until(pilot, lambda: "dead letters 2" in screen_text(app), "the refresh")

        # Skip ids[0], the dead head of agg-0, from its detail screen.
        dead = app.screen
        assert isinstance(dead, DeadScreen)
        await until(pilot, lambda: dead.highlighted() is not None, "a row")
        while (m := dead.highlighted()) is not None and m.id != ids[0]:
            await pilot.press("down")
        await pilot.press("enter")
        await until(pilot, lambda: "head of its aggregate" in screen_text(app), "detail")
        await pilot.press("s")
        await until(
            pilot, lambda: "It is the head of order/agg-0" in screen_text(app), "the skip dialog"
        )
        assert isinstance(app.screen, ConfirmScreen)
        await pilot.press("y")
        await until(pilot, lambda: "skipped 1 of 1" in screen_text(app), "the skip")
        assert row(conn, ids[0])["status"] == "done"
        # The detail shows the message's history from the audit log.
        await until(pilot, lambda: re.search(r"skip\s+by ", screen_text(app)), "history")
    assert [r.action for r in fetch(conn, repair.recent_actions(table))] == ["skip", "requeue"]


async def test_read_only_hides_and_refuses_every_action(conn, dsn, table):
    ids = seed(conn, 3)
    conn.execute("UPDATE outbox SET status = 'dead' WHERE id = ANY(%s)", (ids,))
    app = _app(dsn, read_only=True)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        await pilot.press("d")
        await until(pilot, lambda: "dead letters 3" in screen_text(app), "the dead list")
        text = screen_text(app)
        assert "READ-ONLY" in text
        footer = text.splitlines()[-1]
        assert "filter" in footer
        for hidden in ("requeue", "skip", "mark"):
            assert hidden not in footer, footer
        for key in ("space", "r", "R", "s"):
            await pilot.press(key)
            await pilot.pause()
            assert not isinstance(app.screen, ConfirmScreen)
        await until(pilot, lambda: "read-only" in screen_text(app), "the refusal")
        await pilot.press("enter")
        await until(pilot, lambda: "payload" in screen_text(app), "detail")
        await pilot.press("r", "s")
        await pilot.pause()
        assert isinstance(app.screen, DetailScreen)
        await pilot.press("question_mark")
        assert isinstance(app.screen, HelpScreen)
        assert "requeue" not in screen_text(app)
        # Even a request that got past the screens is refused, and so is the session.
        screen_seen = [repair.Seen(ids[0], "dead", 0)]
        with pytest.raises(Exception, match="read-only"):
            await app.source.apply("requeue", screen_seen, {})
    assert statuses(conn) == {"dead": 3}
    assert fetch(conn, repair.recent_actions(table)) == []


# -- refresh, errors, reconnects ---------------------------------------------------------------


async def test_pollers_never_overlap_and_obey_pause_and_interval():
    source = FakeSource(delay=0.15)
    app = OutboxApp(Config(interval=0.01), source=source)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause(0.3)
        for _ in range(10):  # "refresh now" hammered while polls are in flight
            app.action_refresh_now()
            await pilot.pause(0.01)
        await pilot.press("d")
        await pilot.pause(0.5)
        # One poll at a time per poller: dashboard and dead list each at most one call.
        assert source.max_in_flight <= 2
        assert all(isinstance(p, Poller) for p in app.pollers())

        await pilot.press("p")
        assert app.paused and "paused" in screen_text(app)
        await settle(pilot)
        calls = source.calls
        await pilot.pause(0.5)
        assert source.calls == calls  # nothing while paused
        await pilot.press("ctrl+r")
        await settle(pilot)
        assert source.calls > calls  # but refresh-now still works
        await pilot.press("p")
        assert not app.paused

        app.interval = 2.0
        await pilot.press("plus")
        assert app.interval == 1.0
        await pilot.press("minus", "minus")
        assert app.interval == 5.0
        assert "⟳ 5s" in screen_text(app)


async def test_database_errors_show_and_the_app_reconnects_by_itself(admin_dsn, template):
    name = "outbox_tui_late"
    late_dsn = re.sub(r"dbname=\S+", f"dbname={name}", _with_dbname(admin_dsn, name))
    with psycopg.connect(admin_dsn, autocommit=True) as a:
        a.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
    app = _app(late_dsn)
    try:
        async with app.run_test(size=SIZE) as pilot:
            await until(pilot, lambda: "✖" in screen_text(app), "the error in the status line")
            assert "does not exist" in screen_text(app)
            with psycopg.connect(admin_dsn, autocommit=True) as a:
                a.execute(sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(
                    sql.Identifier(name), sql.Identifier(template)))  # fmt: skip
            await until(
                pilot,
                lambda: (
                    "● connected" in screen_text(app)
                    and re.search(r"pending\s+0\b", screen_text(app))
                ),
                "the reconnect",
            )

            # Kill the TUI's sessions under it: the next polls report it and recover.
            with psycopg.connect(late_dsn, autocommit=True) as c:
                c.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                          "WHERE application_name = 'outbox-tui'")  # fmt: skip
                seed(c, 2)
            # The counts are drawn by the poll; the status line follows from its message.
            await until(
                pilot,
                lambda: (
                    re.search(r"pending\s+2\b", screen_text(app))
                    and "● connected" in screen_text(app)
                ),
                "recovery",
            )
    finally:
        with psycopg.connect(admin_dsn, autocommit=True) as a:
            a.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
                sql.Identifier(name)))  # fmt: skip


def _with_dbname(dsn: str, dbname: str) -> str:
    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    params = conninfo_to_dict(dsn)
    params["dbname"] = dbname
    return make_conninfo("", **params)


async def test_a_v1_table_is_reported_with_what_to_do(empty_dsn):
    from outbox.schema import MIGRATIONS, migration_statements

    table = Table.parse("outbox")
    with psycopg.connect(empty_dsn, autocommit=True) as c:
        for statement in migration_statements(table)[: len(MIGRATIONS[0](table)) + 1]:
            c.execute(statement)
    app = _app(empty_dsn)
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: "outbox migrate" in screen_text(app), "the schema warning")
        assert "schema v1" in screen_text(app)


async def test_ordered_mode_on_a_table_without_its_index_says_what_to_run(dsn, conn):
    dead, _ = seed(conn, 2)  # one aggregate: a dead head, one message behind it
    conn.execute("UPDATE outbox SET status = 'dead', last_error = 'x' WHERE id = %s", (dead,))
    app = _app(dsn, ordered=True)
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: "--ordering aggregate" in screen_text(app), "the warning")
        assert "no index outbox_aggregate" in screen_text(app)
        assert await app.source.check(ordered=False) is None  # unordered workers are served
        # Meanwhile nothing that needs the index is read: each would scan the table.
        overview = await app.source.overview(True)
        assert overview.blocked is None and overview.stats.claimable_heads is None
        assert await app.source.blocking_heads() is None
        detail = await app.source.message(dead)
        assert detail is not None and detail.is_head is None and detail.waiting_behind is None
        # Someone runs what it says: the warning goes, and the figures come, without a restart.
        serve_ordering(conn)
        await until(pilot, lambda: "outbox_aggregate" not in screen_text(app), "the fix seen")
        overview = await app.source.overview(True)
        assert overview.blocked is not None and overview.stats.claimable_heads is not None
        assert [h.id for h in await app.source.blocking_heads()] == [dead]
        detail = await app.source.message(dead)
        assert detail is not None and detail.is_head is True and detail.waiting_behind == 1


async def test_help_lists_every_binding_and_the_filter_syntax():
    app = OutboxApp(Config(paused=True), source=FakeSource())
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        await pilot.press("d")
        await settle(pilot)
        await pilot.press("question_mark")
        text = screen_text(app)
        for words in ("requeue all", "older page", "newer page", "unmark all", "groups",
                      "refresh faster", "pause", "quit", "Filter (/)", "$.amount"):  # fmt: skip
            assert words.lower() in text.lower(), (words, text)
        await pilot.press("escape")
        assert isinstance(app.screen, DeadScreen)


# -- the command line ------------------------------------------------------------------------


def test_flags_and_environment(monkeypatch):
    monkeypatch.delenv("OUTBOX_DSN", raising=False)
    config = parse_args(["--dsn", "host=x", "--table", "app.events", "--refresh", "500ms",
                         "--slo", "5m", "--ordering", "aggregate", "--read-only"])  # fmt: skip
    assert config.dsn == "host=x" and str(config.table) == "app.events"
    assert (config.interval, config.slo, config.ordered, config.read_only) == (
        0.5, 300.0, True, True
    )  # fmt: skip
    monkeypatch.setenv("OUTBOX_READ_ONLY", "on")
    monkeypatch.setenv("OUTBOX_TABLE", "t2")
    assert parse_args([]).read_only and str(parse_args([]).table) == "t2"


@pytest.mark.parametrize(
    ("args", "named"),
    [(["--refresh", "soon"], "--refresh"), (["--ordering", "x"], "--ordering"),
     (["--bogus"], "--bogus"), (["--dsn", "host=x port"], "--dsn"),
     (["--refresh", "1ms"], "--refresh"),  # polled the database back to back
     (["--refresh", "2h"], "--refresh")],
)  # fmt: skip
def test_usage_errors_exit_2_with_one_line(args, named, capsys):
    with pytest.raises(SystemExit) as exit_info:
        parse_args(args)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and err.startswith("outbox-tui: error: ")
    assert named in err


async def test_a_slow_query_never_blocks_the_ui():
    """Keys are handled while a poll waits on the database."""
    # A poll that never finishes within the test: the key must be handled all the same.
    source = FakeSource(delay=60.0)
    app = OutboxApp(Config(), source=source)
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: source.in_flight == 1, "the poll waiting on the database")
        await pilot.press("question_mark")
        assert isinstance(app.screen, HelpScreen)
        assert source.in_flight == 1 and source.calls == 1
        await asyncio.sleep(0)
