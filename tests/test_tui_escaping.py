"""Every string outbox-tui reads from the database reaches the terminal as text: control
characters escaped (ESC would write the clipboard, retitle or clear the terminal; a line
break would forge a row), brackets shown as brackets (never read as markup), on every
screen and in every notice, `--read-only` or not. A producer or another tool can write any
of these columns."""

from __future__ import annotations

import json
import re
from typing import Any

import psycopg
import pytest
from helpers import seed, serve_ordering
from test_tui import _app, screen_text, settle, until
from textual.pilot import Pilot
from textual.widgets import Input, Static

from outbox import destinations as dest
from outbox.tui.app import OutboxApp
from outbox.tui.screens.blocked import BlockedScreen
from outbox.tui.screens.dead import DeadScreen
from outbox.tui.screens.destinations import DestinationsScreen
from outbox.tui.screens.detail import DetailScreen
from outbox.tui.screens.history import ActionScreen, HistoryScreen
from outbox.tui.screens.workers import WorkersScreen

# OSC 52 (writes the clipboard), OSC 0 (sets the title), CSI 2J (clears the screen), and a
# C1 CSI (the same in one byte, for terminals that read 8-bit controls).
SEQUENCES = "\x1b]52;c;cHduZWQ=\x07\x1b]0;pwned\x07\x1b[2J\x9b31m"
SHOWN = r"\x1b]52;c;cHduZWQ=\x07\x1b]0;pwned\x07\x1b[2J\x9b31m"
CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")

OWNER = f"w1{SEQUENCES}"
EVENT = f"Paid[b]{SEQUENCES}"  # `[b]` would be bold markup
AGGREGATE = f"o-1\n[red]{SEQUENCES}"
ERROR = f"HTTP 500: [i]{SEQUENCES}\nforged line"
DESTINATION = f"https://api.test/{SEQUENCES}"
_SHOWN_NAME = f"https://api.test/{SHOWN}"


def _hostile_rows(conn: psycopg.Connection[Any], table) -> list[int]:
    serve_ordering(conn)
    ids = seed(conn, 6, aggregates=2)
    conn.execute(
        "UPDATE outbox SET status = 'processing', attempts = 1, lease_owner = %s, "
        "lease_until = now() + interval '5 minutes' WHERE id = %s",
        (OWNER, ids[1]),
    )
    history = [{"at": "2025-03-14T12:00:00+00:00", "attempt": 1, "error": ERROR}]
    conn.execute(
        "UPDATE outbox SET status = 'dead', attempts = 3, aggregate_id = %s, event_type = %s, "
        "last_error = %s, errors = %s::jsonb, headers = %s::jsonb, "
        "payload = %s::jsonb WHERE id = ANY(%s)",
        (
            AGGREGATE,
            EVENT,
            ERROR,
            json.dumps(history),
            json.dumps({"x-tenant": SEQUENCES}),
            # jsonb's text keeps DEL and C1 as they are (it escapes C0 only).
            json.dumps({"note": SEQUENCES}, ensure_ascii=False),
            [ids[0], ids[2]],
        ),
    )
    conn.execute(
        "INSERT INTO outbox_actions (actor, action, message_ids, filter, requested, count) "
        "VALUES (%s, 'requeue', %s, %s::jsonb, 1, 1)",
        (
            f"ann{SEQUENCES}",
            [ids[0], ids[2]],
            json.dumps({"via": f"tool{SEQUENCES}", "x": SEQUENCES}),
        ),
    )

    def pause(row: dest.Destination, now) -> dest.Destination:
        return dest.paused(row, by=f"bob{SEQUENCES}", reason=f"why [b]{SEQUENCES}", now=now)

    dest.change_sync(conn, table, DESTINATION, pause)
    return ids


def _assert_escaped(app: OutboxApp, *shown: str) -> None:
    text = screen_text(app)
    found = CONTROL.search(text.replace("\n", ""))  # the lines are joined by "\n"
    assert found is None, f"{found[0]!r} reached the terminal:\n{text}"
    svg = app.export_screenshot()
    assert "\x1b" not in svg and "\x9b" not in svg
    for part in shown:
        assert part in text, f"{part!r} not shown:\n{text}"


async def _visit(pilot: Pilot[Any], key: str, screen: type, *shown: str) -> None:
    app = pilot.app
    await pilot.press(key)
    await until(pilot, lambda: isinstance(app.screen, screen), f"{screen.__name__}")
    await settle(pilot)
    await until(pilot, lambda: all(s in screen_text(app) for s in shown), f"{shown} shown")
    _assert_escaped(app, *shown)


@pytest.mark.parametrize("read_only", [False, True])
async def test_every_database_string_reaches_the_terminal_escaped(conn, dsn, table, read_only):
    ids = _hostile_rows(conn, table)
    app = _app(dsn, ordered=True, read_only=read_only)
    async with app.run_test(size=(160, 50)) as pilot:
        await until(pilot, lambda: "w1\\x1b" in screen_text(app), "the lease holders")
        await settle(pilot)
        _assert_escaped(app, r"w1\x1b]52;c;cHduZWQ=\x07\x1b]0;pwned\x07\x1b[2J\x9b31m")

        # A gone worker (its name only in lease_owner).
        await _visit(pilot, "w", WorkersScreen, r"w1\x1b]52;c;cHduZWQ=\x07")
        await pilot.press("escape")

        await _visit(pilot, "d", DeadScreen, r"Paid[b]\x1b]", r"HTTP 500: [i]\x1b]52")
        await _visit(pilot, "g", DeadScreen, r"HTTP 500: [i]\x1b]<n>;c;cHduZWQ=\x07")
        await pilot.press("enter")  # the group: the list filtered to it, the rows still found
        await until(
            pilot, lambda: "→ 2" in screen_text(app), "the list filtered to the hostile group"
        )
        _assert_escaped(app, r"HTTP 500: [i]\x1b]52")
        await _visit(pilot, "enter", DetailScreen, r"o-1\n[red]\x1b]52", r"x-tenant")
        _assert_escaped(app, '"note": "\\u001b]52;c;', r"\x9b31m", "forged line", r"ann\x1b]52")
        await pilot.press("escape", "escape", "escape")
        await until(pilot, lambda: len(app.screen_stack) == 2, "the dashboard")

        await _visit(pilot, "h", HistoryScreen, r"ann\x1b]52", r"tool\x1b]52")
        await _visit(pilot, "enter", ActionScreen, r"ann\x1b]52", r"tool\x1b]52")
        await pilot.press("escape", "escape")

        await _visit(pilot, "e", DestinationsScreen, r"https://api.test/\x1b]52", r"why [b]\x1b")
        await pilot.press("P")  # already paused: the notice names it, escaped too
        await pilot.pause()
        notice = "read-only" if read_only else rf"{_SHOWN_NAME} is already paused"
        await until(pilot, lambda: notice in screen_text(app), "the notice")
        _assert_escaped(app, notice)
        await pilot.press("escape")

        await _visit(pilot, "b", BlockedScreen, r"order/o-1\n[red]\x1b]52", r"Paid[b]\x1b")
    assert ids


async def test_database_errors_in_notices_and_the_filter_line_are_shown_escaped(conn, dsn):
    """A database error quotes what it was given: a trigger's message, a path's text."""
    ids = seed(conn, 2)
    conn.execute("UPDATE outbox SET status = 'dead', last_error = 'HTTP 503' WHERE id = ANY(%s)",
                 (ids,))  # fmt: skip
    # Another tool's trigger refuses the change with a message of its own.
    conn.execute(
        "CREATE FUNCTION refuse() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
        "RAISE EXCEPTION 'frozen by %', E'ops\\x1b]0;pwned\\x07\\x1b[2J'; END $$"
    )
    conn.execute(
        "CREATE TRIGGER refuse BEFORE UPDATE ON outbox FOR EACH ROW EXECUTE FUNCTION refuse()"
    )
    app = _app(dsn)
    async with app.run_test(size=(200, 30)) as pilot:
        await settle(pilot)
        await _visit(pilot, "d", DeadScreen, "HTTP 503")
        await pilot.press("r")
        await until(pilot, lambda: "Requeue 1 dead message?" in screen_text(app), "the dialog")
        await pilot.press("y")
        await until(pilot, lambda: "requeue failed" in screen_text(app), "the failure")
        _assert_escaped(app, r"frozen by ops\x1b]0;pwned\x07\x1b[2J")

        # The filter line says why a filter cannot be read, quoting it: escaped too.
        await pilot.press("slash")
        app.screen.query_one("#filter", Input).value = 'type:"a\x1b]0;pwned\x07'
        await pilot.press("enter")
        await until(pilot, lambda: "filter: " in screen_text(app), "the refusal")
        problem = str(app.screen.query_one("#filter-error", Static).render())
        assert r"\x1b]0;pwned" in problem and not CONTROL.search(problem), repr(problem)


async def test_keys_shown_escaped_still_name_their_rows(conn, dsn, table):
    """A destination's name and an error group are shown escaped, and what the operator
    does to them reaches the row they were escaped from."""
    ids = _hostile_rows(conn, table)
    app = _app(dsn)
    async with app.run_test(size=(160, 50)) as pilot:
        await settle(pilot)
        await _visit(pilot, "e", DestinationsScreen, _SHOWN_NAME)
        await pilot.press("U")
        await until(pilot, lambda: f"{_SHOWN_NAME}?" in screen_text(app), "the dialog")
        await pilot.press("y")
        await until(pilot, lambda: f"resumed {_SHOWN_NAME}" in screen_text(app), "the resume")
        state = conn.execute(
            "SELECT state FROM outbox_destinations WHERE destination = %s", (DESTINATION,)
        ).fetchone()
        assert state == ("closed",)
        assert conn.execute("SELECT count(*) FROM outbox_destinations").fetchone() == (1,)
        await pilot.press("escape")

        # The whole hostile error group, requeued from the group view.
        await _visit(pilot, "d", DeadScreen, r"HTTP 500: [i]\x1b]52")
        await _visit(pilot, "g", DeadScreen, r"HTTP 500: [i]\x1b]<n>;c;cHduZWQ=\x07")
        await pilot.press("R")
        await until(pilot, lambda: "Requeue 2 dead messages?" in screen_text(app), "the dialog")
        await pilot.press("y")
        await until(pilot, lambda: "requeued 2 of 2" in screen_text(app), "the requeue")
    assert conn.execute(
        "SELECT count(*) FROM outbox WHERE id = ANY(%s) AND status = 'pending'", ([ids[0], ids[2]],)
    ).fetchone() == (2,)
    # The audit log records the group as the rows hold it, not as it was shown.
    recorded = conn.execute(
        "SELECT filter -> 'filter' ->> 'error_group' FROM outbox_actions ORDER BY id DESC LIMIT 1"
    ).fetchone()
    assert recorded is not None and "\x1b]<n>;pwned" in recorded[0], recorded
