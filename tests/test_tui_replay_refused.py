"""The TUI's replay (`R` on the done screen) refused after the preview: a partition an
interrupted `outbox maintain` left pending detach between the preview and the typed count.
The replay's line is shown on the screen, as the preview shows it, and the TUI goes on."""

from __future__ import annotations

import psycopg
from test_replay_preview_detaching import _delivered, _left_half_detached, done_screen
from test_tui import SIZE, _app, screen_text, until
from textual.widgets import Input, Static

from outbox.tui.screens.confirm import ConfirmScreen


async def test_a_replay_refused_after_its_preview_shows_the_line_and_the_tui_goes_on(
    empty_dsn: str,
):
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        _delivered(conn)
        app = _app(empty_dsn)
        async with app.run_test(size=SIZE) as pilot:
            await until(pilot, lambda: "dead" in screen_text(app), "the dashboard")
            screen = await done_screen(app, pilot)
            await until(pilot, lambda: "250 messages (ids" in screen_text(app), "the preview")
            await pilot.press("R")
            await until(pilot, lambda: isinstance(app.screen, ConfirmScreen), "the dialog")
            # The table changes between the preview and the confirmation.
            _left_half_detached(empty_dsn, conn, "outbox_p1")
            app.screen.query_one("#typed-count", Input).value = "250"
            await pilot.press("enter")
            summary = screen.query_one("#replay-summary", Static)
            await until(pilot, lambda: "half detached" in str(summary.render()), "the line")
            shown = str(summary.render())
            assert "partition outbox_p1 of table outbox is half detached" in shown, shown
            assert "outbox maintain --table outbox" in shown, shown
            assert app.screen is screen and app.is_running
            assert screen.preview is None
            # Still usable: R has nothing to replay, and the screen previews again.
            await pilot.press("R")
            await until(pilot, lambda: "nothing to replay" in screen_text(app), "no replay")
            screen.query_one("#since", Input).value = "30m"
            screen.load()
            await until(pilot, lambda: "51 messages (ids 200 to 250" in screen_text(app), "again")
        assert conn.execute("SELECT count(*) FROM outbox_actions").fetchone() == (0,)
        assert conn.execute("SELECT count(*) FROM outbox WHERE status <> 'done'").fetchone() == (0,)
