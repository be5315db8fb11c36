"""The done screen's line when its preview cannot be read: the error's first line, escaped
for the terminal as the TUI shows every other text from the database, and markup in it
shown as written. The raw error was printed: every line of it, and an ESC in it sent to the
terminal."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import psycopg
import pytest
from helpers import seed
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from test_tui import SIZE, _app, screen_text, settle, until
from textual.widgets import Static

from outbox.tui.screens.replay import ReplayScreen

# What a function of the database raises, in a row-level policy on the table.
RAISED = "E'no [bold]reading[/bold] \\x1b[2J here\\nsecond line of it'"


@pytest.fixture
def reader(dsn: str) -> Iterator[str]:
    """A role of its own (roles are the cluster's), dropped after the test."""
    name = f"tui_reader_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE ROLE {}").format(sql.Identifier(name)))
    yield name
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(name)))
        conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(name)))


async def test_a_preview_that_cannot_be_read_shows_one_escaped_line(dsn: str, reader: str):
    role = sql.Identifier(reader)
    with psycopg.connect(dsn, autocommit=True) as conn:
        seed(conn, 3)
        conn.execute("UPDATE outbox SET status = 'done', done_at = now()")
        conn.execute(sql.SQL("GRANT ALL ON ALL TABLES IN SCHEMA public TO {}").format(role))
        conn.execute(sql.SQL("GRANT ALL ON ALL SEQUENCES IN SCHEMA public TO {}").format(role))
        conn.execute(
            "CREATE FUNCTION refuse() RETURNS boolean LANGUAGE plpgsql AS "
            f"$$ BEGIN RAISE EXCEPTION {RAISED}; END $$"
        )
        conn.execute("ALTER TABLE outbox ENABLE ROW LEVEL SECURITY")
        conn.execute("CREATE POLICY done_refused ON outbox USING (status <> 'done' OR refuse())")
    params = conninfo_to_dict(dsn)
    params["options"] = f"-c role={reader}"
    app = _app(make_conninfo("", **params), paused=True)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        await pilot.press("o")
        await until(pilot, lambda: isinstance(app.screen, ReplayScreen), "the done screen")
        summary = app.screen.query_one("#replay-summary", Static)
        await until(pilot, lambda: "cannot read" in str(summary.render()), "the line")
        shown = str(summary.render())
        assert shown == "cannot read: no [bold]reading[/bold] \\x1b[2J here", repr(shown)
        # On the screen: that line, and nothing of the error's next lines below it.
        lines = screen_text(app).splitlines()
        at = next(i for i, line in enumerate(lines) if "cannot read:" in line)
        assert "cannot read: no [bold]reading[/bold] \\x1b[2J here" in lines[at], lines[at]
        assert "second line" not in lines[at] + lines[at + 1], lines[at : at + 2]
