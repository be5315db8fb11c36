"""The TUI's screen of done messages (`o`), against real PostgreSQL: a window and a filter
show what they match, `R` replays exactly that after the typed count, recorded in the audit
log as the TUI's; a wrong count or read-only changes nothing."""

from __future__ import annotations

from typing import Any

from helpers import seed
from test_tui import SIZE, _app, screen_text, until
from textual.widgets import Input

from outbox.tui.screens.confirm import ConfirmScreen
from outbox.tui.screens.replay import ReplayScreen


def _done(conn: Any) -> list[int]:
    a = seed(conn, 6, aggregates=2, event_type="OrderPaid")
    b = seed(conn, 4, aggregates=2, event_type="OrderShipped")
    conn.execute("UPDATE outbox SET status = 'done', done_at = now(), attempts = 1")
    # One of them from long ago: outside the screen's window (the last hour).
    conn.execute("UPDATE outbox SET created_at = now() - interval '3 hours' WHERE id = %s", (a[0],))
    return a + b


async def _open(pilot: Any, app: Any, text: str) -> ReplayScreen:
    await until(pilot, lambda: "dead" in screen_text(app), "the dashboard")
    await pilot.press("o")
    await until(pilot, lambda: isinstance(app.screen, ReplayScreen), "the done screen")
    screen = app.screen
    screen.query_one("#replay-filter", Input).value = text
    screen.load()
    return screen


async def test_a_window_and_a_type_are_replayed_after_the_typed_count(conn, dsn):
    ids = _done(conn)
    app = _app(dsn)
    async with app.run_test(size=SIZE) as pilot:
        screen = await _open(pilot, app, "type:OrderPaid")
        await until(pilot, lambda: "5 messages (ids" in screen_text(app), "the preview")
        assert screen.preview is not None and screen.preview.by_type == {"OrderPaid": 5}
        assert [r.id for r in screen.rows] == ids[1:6]

        await pilot.press("R")
        await until(pilot, lambda: isinstance(app.screen, ConfirmScreen), "the dialog")
        assert "Replay 5 messages?" in screen_text(app)
        app.screen.query_one("#typed-count", Input).value = "4"
        await pilot.press("enter")
        await until(pilot, lambda: "That is not 5" in screen_text(app), "the refusal")
        assert conn.execute("SELECT count(*) FROM outbox WHERE status <> 'done'").fetchone() == (0,)
        app.screen.query_one("#typed-count", Input).value = "5"
        await pilot.press("enter")
        await until(pilot, lambda: "replay 1: sent 5 messages again" in screen_text(app), "sent")
    replayed = conn.execute(
        "SELECT array_agg(id ORDER BY id) FROM outbox WHERE status = 'pending' AND replay = 1"
    ).fetchone()
    assert replayed == (ids[1:6],)
    [(via, count, message_ids)] = conn.execute(
        "SELECT filter->>'via', count, message_ids FROM outbox_actions WHERE action = 'replay'"
    ).fetchall()
    assert (via, count, message_ids) == ("outbox-tui", 5, ids[1:6])


async def test_read_only_and_a_bad_window_change_nothing(conn, dsn):
    _done(conn)
    app = _app(dsn, read_only=True)
    async with app.run_test(size=SIZE) as pilot:
        screen = await _open(pilot, app, "")
        await until(pilot, lambda: "9 messages (ids" in screen_text(app), "the preview")
        await pilot.press("R")
        refused = "read-only: requeue, skip, replay, pause and resume are disabled"
        await until(pilot, lambda: refused in screen_text(app), "the refusal")
        screen.query_one("#since", Input).value = "yesterday"
        screen.load()
        await until(pilot, lambda: "time: 'yesterday' is neither" in screen_text(app), "error")
        screen.query_one("#since", Input).value = "1h"
        screen.query_one("#replay-filter", Input).value = "error:boom"
        screen.load()
        await until(pilot, lambda: "by type:, aggtype: and agg: only" in screen_text(app), "error")
    assert conn.execute("SELECT count(*) FROM outbox WHERE status <> 'done'").fetchone() == (0,)


async def test_a_replay_that_sends_fewer_than_confirmed_says_how_many_and_why(conn, dsn):
    """Rows gone between the preview and the typed count (a purge; on a partitioned table a
    retention run, which the TUI's replay holds off only from its confirmation on): the
    closing line says how many of those confirmed were not sent, as `outbox replay` does."""
    ids = _done(conn)
    app = _app(dsn)
    async with app.run_test(size=SIZE) as pilot:
        await _open(pilot, app, "type:OrderPaid")
        await until(pilot, lambda: "5 messages (ids" in screen_text(app), "the preview")
        await pilot.press("R")
        await until(pilot, lambda: isinstance(app.screen, ConfirmScreen), "the dialog")
        conn.execute("DELETE FROM outbox WHERE id = ANY(%s)", (ids[1:3],))
        app.screen.query_one("#typed-count", Input).value = "5"
        await pilot.press("enter")
        await until(
            pilot, lambda: "replay 1: sent 3 messages again" in screen_text(app), "the line"
        )
        assert "2 of the 5 confirmed not sent" in screen_text(app)
