"""A message whose columns hold megabytes (an error that kept a whole response body, an
aggregate id written by another tool): its detail shows their beginnings and how long they
are, instead of laying out every character on each refresh, which held the screen for
seconds."""

from __future__ import annotations

import json

from helpers import seed
from rich.console import Group
from rich.table import Table as RichTable
from rich.text import Text
from test_tui import SIZE, _app, screen_text, settle, until
from textual.widgets import Static

from outbox.tui.screens.detail import SHOWN_ERROR, SHOWN_TEXT, DetailScreen

ERROR = "E" * 2_000_000
ATTEMPT = "H" * 200_000
AGGREGATE = "A" * 100_000


def _plain(renderable: object) -> str:
    """Every character a Static's content holds, as text."""
    if isinstance(renderable, Text):
        return renderable.plain
    if isinstance(renderable, Group):
        return "\n".join(_plain(r) for r in renderable.renderables)
    if isinstance(renderable, RichTable):
        return "\n".join(_plain(cell) for column in renderable.columns for cell in column.cells)
    return str(renderable)


async def test_the_detail_of_megabytes_of_error_shows_their_beginning(conn, dsn):
    [message_id, *_] = seed(conn, 2)
    history = [
        {"at": "2025-03-14T12:00:00+00:00", "attempt": n, "error": ATTEMPT} for n in range(1, 11)
    ]
    conn.execute(
        "UPDATE outbox SET status = 'dead', last_error = %s, errors = %s::jsonb, "
        "aggregate_id = %s WHERE id = %s",
        (ERROR, json.dumps(history), AGGREGATE, message_id),
    )
    app = _app(dsn, paused=True)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        await pilot.press("d")
        await until(pilot, lambda: "dead letters 1" in screen_text(app), "the dead list")
        await pilot.press("enter")
        await until(pilot, lambda: isinstance(app.screen, DetailScreen), "the detail")
        detail = app.screen
        assert isinstance(detail, DetailScreen)
        await until(pilot, lambda: detail.detail is not None, "the message")
        await settle(pilot)
        error = _plain(detail.query_one("#error", Static).content)
        assert error.startswith("E" * SHOWN_ERROR + "… (2,000,000 characters)"), error[-200:]
        assert len(error) < SHOWN_ERROR + 1_000
        attempts = _plain(detail.query_one("#attempts", Static).content)
        assert attempts.count("(200,000 characters)") == 10
        assert len(attempts) < 10 * (SHOWN_TEXT + 100) + 1_000
        title = _plain(detail.query_one("#title", Static).content)
        assert "(100,0" in title and len(title) < SHOWN_TEXT + 200, title[-200:]
