"""What an on-call operator can see beyond counts: which heads block which aggregates, which
workers are connected and what they hold, what requeueing everything covers (the count is
typed), and the action log with where each action came from and who ran it."""

from __future__ import annotations

import re

import psycopg
from helpers import row, seed, serve_ordering, statuses
from test_tui import SIZE, _app, screen_text, settle, until
from textual.widgets import Input
from tui_fakes import GROUP_KEYS, FakeSource, clock

from outbox.operations.repair import repair, select_targets
from outbox.queries import queries
from outbox.runner import fetch
from outbox.tui.app import OutboxApp
from outbox.tui.config import Config
from outbox.tui.screens.blocked import BlockedScreen
from outbox.tui.screens.confirm import ConfirmScreen
from outbox.tui.screens.dead import DeadScreen
from outbox.tui.screens.detail import DetailScreen
from outbox.tui.screens.history import ActionScreen, HistoryScreen
from outbox.tui.screens.workers import WorkersScreen


async def test_blocked_aggregates_list_their_dead_heads_and_skip_one_from_there(conn, dsn):
    serve_ordering(conn)
    ids = seed(conn, 9, aggregates=3)  # agg-0: 0, 3, 6; agg-1: 1, 4, 7; agg-2: 2, 5, 8
    conn.execute("UPDATE outbox SET status = 'dead', last_error = 'HTTP 503' WHERE id = ANY(%s)",
                 ([ids[0], ids[5]],))  # fmt: skip
    conn.execute("UPDATE outbox SET status = 'done' WHERE id = %s", (ids[2],))
    app = _app(dsn, ordered=True)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        await pilot.press("b")
        await until(pilot, lambda: "blocked aggregates 2" in screen_text(app), "the heads")
        assert isinstance(app.screen, BlockedScreen)
        text = screen_text(app)
        assert "3 messages wait behind their dead heads" in text, text
        # Most waiting first: agg-0's head (2 behind), then agg-2's (1 behind).
        assert re.search(rf"{ids[0]}\s+order/agg-0\s+Tested\s+2\b", text), text
        assert re.search(rf"{ids[5]}\s+order/agg-2\s+Tested\s+1\b", text), text
        await pilot.press("s")
        await until(pilot, lambda: "It is the head of order/agg-0" in screen_text(app), "dialog")
        assert isinstance(app.screen, ConfirmScreen)
        await pilot.press("y")
        await until(pilot, lambda: "blocked aggregates 1" in screen_text(app), "the refresh")
        assert row(conn, ids[0])["status"] == "done"
        await pilot.press("enter")
        await until(pilot, lambda: isinstance(app.screen, DetailScreen), "the head's detail")
        assert app.screen.message_id == ids[5]


async def test_workers_show_sessions_by_name_what_they_hold_and_gone_ones(conn, dsn, table):
    ids = seed(conn, 4)
    with psycopg.connect(dsn, autocommit=True, application_name="worker-x") as worker:
        params = {
            "owner": "worker-x",
            "lease": "5m",
            "batch": 2,
            "max_attempts": 5,
            "max_payload_bytes": 1 << 20,
            "claim_bytes": 1 << 24,
        }
        assert len(worker.execute(queries(table).claim, params).fetchall()) == 2
        conn.execute(
            "UPDATE outbox SET status = 'processing', lease_owner = 'worker-gone', "
            "lease_until = now() - interval '1 minute' WHERE id = %s",
            (ids[3],),
        )
        app = _app(dsn)
        async with app.run_test(size=SIZE) as pilot:
            await settle(pilot)
            await pilot.press("w")
            await until(pilot, lambda: "worker-x" in screen_text(app), "the sessions")
            assert isinstance(app.screen, WorkersScreen)
            await until(pilot, lambda: "outbox-tui" in screen_text(app), "the TUI's own")
            text = screen_text(app)
            assert re.search(r"worker-x\s+1\s+idle 1\s+2\s+0\s+\d+s ago", text), text
            assert re.search(r"worker-gone\s+gone\s+1\s+1\b", text), text
            assert "1 gone with leases held" in text


async def test_requeue_everything_shows_the_groups_and_wants_the_count_typed():
    source = FakeSource()
    app = OutboxApp(Config(paused=True), source=source, clock=clock)
    async with app.run_test(size=(100, 40)) as pilot:
        await settle(pilot)
        await pilot.press("d")
        await settle(pilot)
        assert isinstance(app.screen, DeadScreen)
        await pilot.press("R")
        await until(pilot, lambda: "By error group" in screen_text(app), "the breakdown")
        dialog = app.screen
        assert isinstance(dialog, ConfirmScreen)
        text = screen_text(app)
        assert "Requeue 60 dead messages?" in text
        for key in GROUP_KEYS[:2]:
            assert re.search(rf"15\s+{re.escape(key)}", text), text
        await pilot.press("y", "enter")  # a y is not the count
        await pilot.pause()
        assert app.screen is dialog and not source.applied
        assert "type exactly 60" in screen_text(app)
        dialog.query_one("#typed-count", Input).value = "6"
        await pilot.press("enter")
        await pilot.pause()
        assert app.screen is dialog and not source.applied
        dialog.query_one("#typed-count", Input).value = "60"
        await pilot.press("enter")
        await until(pilot, lambda: source.applied, "the requeue")
        [(action, seen, recorded)] = source.applied
        assert action == "requeue" and len(seen) == 60 and recorded["query"] == ""


async def test_the_action_log_says_where_from_and_who_and_opens_each_entry(conn, dsn, table):
    ids = seed(conn, 3)
    conn.execute("UPDATE outbox SET status = 'dead' WHERE id = ANY(%s)", (ids[:2],))
    seen = fetch(conn, select_targets(table))
    via_cli = {"all_dead": True, "via": "outbox requeue"}
    fetch(conn, repair(table, "requeue", seen, actor="alice", filter=via_cli))
    app = _app(dsn)
    async with app.run_test(size=(140, 40)) as pilot:
        await settle(pilot)
        await pilot.press("h")
        await until(pilot, lambda: "outbox requeue" in screen_text(app), "the action log")
        assert isinstance(app.screen, HistoryScreen)
        text = screen_text(app)
        assert re.search(rf"requeue\s+2\s+2\s+outbox requeue\s+alice \({conn.info.user}\)", text)
        assert '{"all_dead": true}' in text
        await pilot.press("enter")
        await until(pilot, lambda: isinstance(app.screen, ActionScreen), "the entry")
        text = screen_text(app)
        for message_id in ids[:2]:
            assert str(message_id) in text
        assert "2 of 2 confirmed" in text
        await pilot.press("enter")
        await until(pilot, lambda: isinstance(app.screen, DetailScreen), "a message of it")
        await until(pilot, lambda: re.search(r"requeue\s+by alice", screen_text(app)), "detail")
    assert statuses(conn) == {"pending": 3}


async def test_the_detail_shows_every_failed_attempt_with_its_time(conn, dsn, aconn, table):
    from datetime import timedelta

    from outbox.lease import claim, finalize
    from outbox.models import Outcome

    [message_id] = seed(conn, 1)
    for error in ("HTTP 503: first", "HTTP 503: second"):
        [m] = await claim(aconn, table, owner="w", batch=1, lease=timedelta(minutes=1),
                          max_attempts=5)  # fmt: skip
        await finalize(aconn, table, [Outcome.retry(m, timedelta(0), error)])
    [m] = await claim(aconn, table, owner="w", batch=1, lease=timedelta(minutes=1), max_attempts=5)
    await finalize(aconn, table, [Outcome.dead(m, "HTTP 422: gave up")])
    app = _app(dsn)
    async with app.run_test(size=(140, 50)) as pilot:
        await settle(pilot)
        await pilot.press("d")
        await until(pilot, lambda: "dead letters 1" in screen_text(app), "the dead list")
        await pilot.press("enter")
        await until(pilot, lambda: "every failed attempt" in screen_text(app), "the detail")
        await until(pilot, lambda: "HTTP 503: first" in screen_text(app), "the history")
        text = screen_text(app)
        assert re.search(r"#1\s+HTTP 503: first", text), text
        assert re.search(r"#2\s+HTTP 503: second", text), text
        assert re.search(r"#3\s+HTTP 422: gave up", text), text
        assert re.search(r"went dead\s+\d{4}-\d\d-\d\d", text), text
    assert row(conn, message_id)["status"] == "dead"


async def test_the_dashboard_says_how_many_messages_die_per_minute():
    import dataclasses
    from datetime import timedelta

    from tui_fakes import NOW, stats

    def dying(step: int):  # two more dead messages every two seconds
        return dataclasses.replace(
            stats(0), sampled_at=NOW + timedelta(seconds=2 * step), dead=60 + 2 * step
        )

    app = OutboxApp(Config(paused=True), source=FakeSource(snapshots=dying), clock=clock)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        app.action_refresh_now()
        await settle(pilot)
        assert "dead 60.0/min" in screen_text(app), screen_text(app)
