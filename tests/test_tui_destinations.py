"""outbox-tui's destinations, driven with Pilot against real PostgreSQL: each destination's
state as the workers share it, pausing (the reason typed) and resuming (confirmed) recorded in
the destinations row and the audit log, refused in read-only mode; and the dashboard telling
an outage in backoff apart from a healthy queue."""

from __future__ import annotations

import getpass
import re
from datetime import timedelta

import psycopg
import pytest
from helpers import seed
from test_tui import SIZE, _app, screen_text, settle, until
from textual import events
from textual.widgets import Input

from outbox import destinations as dest
from outbox.operations import repair
from outbox.runner import fetch
from outbox.table import Table
from outbox.tui.screens.confirm import DestinationConfirmScreen
from outbox.tui.screens.destinations import DestinationsScreen
from outbox.tui.screens.history import ActionScreen, HistoryScreen

API = "https://api.test"


def _open(conn, table, destination: str = API) -> None:
    """The breaker opened by a 503 with a Retry-After of 5 minutes, as the worker that serves
    it reports it."""

    def fail(row: dest.Destination, now) -> dest.Destination:
        failure = dest.Failure(1, "HTTP 503 from https://bot:s3cret@api.test/",
                               retry_after=timedelta(minutes=5))  # fmt: skip
        return dest.failed(row, failure, owner="w1", now=now, policy=dest.Policy())

    fetch(conn, dest.served(table, [destination], owner="w1"))
    dest.change_sync(conn, table, destination, fail)


def _row(conn) -> tuple[str, str | None, str | None]:
    found = conn.execute(
        "SELECT state, reason, changed_by FROM outbox_destinations WHERE destination = %s", (API,)
    ).fetchone()
    assert found is not None
    return found


async def test_pause_and_resume_a_destination_confirmed_and_recorded(conn, dsn, table):
    _open(conn, table)
    app = _app(dsn)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        await pilot.press("e")
        await until(pilot, lambda: API in screen_text(app), "the destinations")
        assert isinstance(app.screen, DestinationsScreen)
        text = screen_text(app)
        assert re.search(rf"{API}\s+open\s+\d+s\s+1\s+in [45]m", text), text
        assert "Retry-After" in text and "s3cret" not in text  # the error is redacted

        # Cancelled: nothing changes.
        await pilot.press("P")
        await until(pilot, lambda: isinstance(app.screen, DestinationConfirmScreen), "dialog")
        await pilot.press("escape")
        await until(pilot, lambda: "pause cancelled" in screen_text(app), "the cancel")
        assert _row(conn)[0] == "open"

        # The reason is typed (y and n are letters of it, not answers), enter pauses.
        await pilot.press("P")
        await until(pilot, lambda: "Pause https://api.test?" in screen_text(app), "dialog")
        assert "Open for" in screen_text(app) and "after 1 failure (" in screen_text(app)
        await pilot.press("enter")  # a blank reason is refused
        await until(pilot, lambda: "a reason is required" in screen_text(app), "the refusal")
        assert isinstance(app.screen, DestinationConfirmScreen)
        # A pasted control character is refused as the CLI refuses it, named escaped.
        await pilot.press("x")
        app.screen.query_one("#reason", Input).post_message(events.Paste("\x1b[2J"))
        await pilot.press("enter")
        await until(pilot, lambda: "control character" in screen_text(app), "the refusal")
        assert isinstance(app.screen, DestinationConfirmScreen)
        app.screen.query_one("#reason", Input).value = ""
        await pilot.press(*"deploy, no retries yet")
        await pilot.press("enter")
        await until(pilot, lambda: f"paused {API} (it was open)" in screen_text(app), "result")
        assert _row(conn) == ("paused", "deploy, no retries yet", getpass.getuser())
        await until(pilot, lambda: re.search(rf"{API}\s+paused", screen_text(app)), "refresh")
        assert re.search(r"reason\s+deploy, no retries yet", screen_text(app))

        # Pausing it again is said, not asked.
        await pilot.press("P")
        await until(pilot, lambda: "is already paused" in screen_text(app), "the notice")
        assert not isinstance(app.screen, DestinationConfirmScreen)

        await pilot.press("U")
        await until(pilot, lambda: "Resume https://api.test?" in screen_text(app), "dialog")
        assert "Paused for" in screen_text(app) and "deploy, no retries yet" in screen_text(app)
        await pilot.press("y")
        await until(pilot, lambda: f"resumed {API} (it was paused)" in screen_text(app), "resume")
        assert _row(conn) == ("closed", None, getpass.getuser())

        # Both in the audit log, from the TUI, by the OS user; the log opens each.
        resume, pause = fetch(conn, repair.recent_actions(table))
        assert (pause.action, pause.actor, pause.via) == ("pause", getpass.getuser(), "outbox-tui")
        assert pause.filter == {"destination": API, "reason": "deploy, no retries yet",
                                "was": "open", "via": "outbox-tui"}  # fmt: skip
        assert (resume.action, resume.filter["was"]) == ("resume", "paused")
        await pilot.press("escape", "h")
        await until(pilot, lambda: isinstance(app.screen, HistoryScreen), "the action log")
        await until(pilot, lambda: "resume" in screen_text(app), "the entries")
        await pilot.press("enter")
        await until(pilot, lambda: isinstance(app.screen, ActionScreen), "the entry")
        assert "a resume of a destination changes no message" in screen_text(app)


async def test_an_open_breaker_is_closed_by_hand_and_one_no_worker_serves_is_idle(conn, dsn, table):
    """`U` on an open destination closes its breaker at once (confirmed, recorded): someone
    who knows the API is back need not wait for a probe. A destination whose workers are
    gone (its URL changed) shows idle, and the dashboard holds nothing for it."""
    old = "https://old.test"
    _open(conn, table, old)
    conn.execute(
        "UPDATE outbox_destinations SET served_at = now() - interval '10 minutes', "
        "served_by = 'demo-worker-1' WHERE destination = %s",
        (old,),
    )
    _open(conn, table)
    app = _app(dsn)
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: f"rates · ✖ {API} open" in screen_text(app), "the dashboard")
        assert old not in screen_text(app)  # held: only the served one
        await pilot.press("e")
        await until(pilot, lambda: old in screen_text(app), "the destinations")
        text = screen_text(app)
        assert re.search(rf"{old}\s+idle\s", text), text
        assert re.search(rf"{API}\s+open\s", text), text
        assert "1 open" in text and "1 idle" in text
        # The table is by name: the served one first, then the idle one.
        await until(pilot, lambda: re.search(r"served\s+\d+s ago by w1", screen_text(app)), "row")
        await pilot.press("down")
        await until(pilot, lambda: re.search(r"destination\s+https://old", screen_text(app)), "2")
        text = screen_text(app)
        assert re.search(r"served\s+idle: last by demo-worker-1 10m 0\ds ago", text), text
        assert re.search(r"next probe\s+-", text), text  # nobody will probe it

        await pilot.press("up")
        await pilot.press("U")
        await until(pilot, lambda: f"Resume {API}?" in screen_text(app), "dialog")
        assert "Open for" in screen_text(app) and "without waiting for a probe" in screen_text(app)
        await pilot.press("y")
        await until(pilot, lambda: f"resumed {API} (it was open)" in screen_text(app), "result")
        assert _row(conn) == ("closed", None, getpass.getuser())
        [record] = fetch(conn, repair.recent_actions(table))
        assert (record.action, record.actor) == ("resume", getpass.getuser())
        assert record.filter == {"destination": API, "was": "open", "via": "outbox-tui"}

        # Closed already: said, not asked.
        await until(pilot, lambda: re.search(rf"{API}\s+closed", screen_text(app)), "refresh")
        await pilot.press("U")
        await until(pilot, lambda: "is already closed" in screen_text(app), "the notice")
        assert not isinstance(app.screen, DestinationConfirmScreen)


async def test_read_only_shows_the_destinations_and_refuses_to_change_them(conn, dsn, table):
    _open(conn, table)
    app = _app(dsn, read_only=True)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        await pilot.press("e")
        await until(pilot, lambda: API in screen_text(app), "the destinations")
        footer = screen_text(app).splitlines()[-1]
        assert "pause" not in footer.replace("p pause", "") and "resume" not in footer, footer
        for key in ("P", "U"):
            await pilot.press(key)
            await pilot.pause()
            assert not isinstance(app.screen, DestinationConfirmScreen)
        await until(pilot, lambda: "read-only" in screen_text(app), "the refusal")
        with pytest.raises(Exception, match="read-only"):
            await app.source.change_destination("pause", API, "x")
    assert _row(conn)[0] == "open"
    assert fetch(conn, repair.recent_actions(table)) == []


async def test_the_dashboard_shows_an_outage_in_backoff_and_the_held_destination(conn, dsn, table):
    """Every message waiting out a backoff: nothing is ready, yet the dashboard says how old
    the oldest unfinished message is, how many retry, and which destination is held."""
    ids = seed(conn, 4)
    conn.execute(
        "UPDATE outbox SET created_at = now() - interval '10 minutes', attempts = 2, "
        "available_at = now() + interval '3 minutes' WHERE id = ANY(%s)",
        (ids,),
    )
    _open(conn, table)
    app = _app(dsn)
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: "retrying" in screen_text(app), "the first poll")
        text = screen_text(app)
        assert re.search(r"oldest unfinished\s+10m 0\ds\s+over SLO", text), text
        assert re.search(r"oldest ready\s+-", text), text
        assert re.search(r"retrying\s+4\b", text), text
        assert re.search(rf"rates · ✖ {API} open for \d+s · e", text), text


async def test_control_characters_in_rows_are_shown_escaped_never_sent_to_the_terminal(
    conn, dsn, table
):
    # Rows written by an older version or another tool: ESC would retitle or clear the
    # terminal, a line break would break the table.
    hostile = "https://api.test/\x1b]0;pwned\x07"

    def fail(row: dest.Destination, now) -> dest.Destination:
        failure = dest.Failure(1, "HTTP 500: \x1b[2J\x1b[31mEVIL\nline2")
        return dest.failed(row, failure, owner="w1", now=now, policy=dest.Policy(threshold=1))

    dest.change_sync(conn, table, hostile, fail)
    app = _app(dsn)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        await pilot.press("e")
        await until(pilot, lambda: "pwned" in screen_text(app), "the destinations")
        text = screen_text(app)
        assert "\x1b" not in text and "\x07" not in text
        assert r"api.test/\x1b]0;pwned\x07" in text
        assert r"\x1b[2J\x1b[31mEVIL" in text


async def test_a_v4_table_shows_its_figures_and_what_to_run(empty_dsn):
    """A table not migrated to v5 has a destinations table without the workers' stamps: the
    dashboard still shows what it can read, and says what to run."""
    from outbox.schema import MIGRATIONS, migration_statements

    table = Table.parse("outbox")
    with psycopg.connect(empty_dsn, autocommit=True) as c:
        v4 = sum(len(step(table)) + 1 for step in MIGRATIONS[:4])  # each with its comment
        for statement in migration_statements(table)[:v4]:
            c.execute(statement)
        seed(c, 3)
    app = _app(empty_dsn)
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: "outbox migrate" in screen_text(app), "the schema warning")
        assert "schema v4" in screen_text(app)
        await until(pilot, lambda: re.search(r"pending\s+3\b", screen_text(app)), "figures")
