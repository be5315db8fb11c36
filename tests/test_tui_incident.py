"""Defects an incident drill found in outbox-tui, each driven through Pilot: operator input
never ends the app, producer data is drawn as plain text, labels match what is shown, and
stale numbers say so."""

from __future__ import annotations

import dataclasses
import re
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from helpers import seed, serve_ordering
from test_tui import SIZE, _app, screen_text, settle, until
from textual.widgets import DataTable, Input
from tui_fakes import NOW, FakeSource, clock, dead_messages, stats

from outbox.runner import fetch
from outbox.tui.app import OutboxApp
from outbox.tui.config import Config
from outbox.tui.screens.confirm import ConfirmScreen
from outbox.tui.screens.dead import DeadScreen
from outbox.tui.screens.detail import DetailScreen
from outbox.tui.screens.help import HelpScreen
from outbox.views import dead_letters
from outbox.views.dashboard import LeaseHolder
from outbox.views.filters import FilterError, parse_filter


def _fake_app(source: FakeSource | None = None, **config: Any) -> OutboxApp:
    return OutboxApp(Config(paused=True, **config), source=source or FakeSource(), clock=clock)


async def _dead_screen(pilot: Any) -> DeadScreen:
    await settle(pilot)
    await pilot.press("d")
    await settle(pilot)
    screen = pilot.app.screen
    assert isinstance(screen, DeadScreen)
    return screen


async def _type_filter(pilot: Any, text: str) -> None:
    await pilot.press("slash")
    box = pilot.app.screen.query_one("#filter", Input)
    box.value = text
    await pilot.press("enter")
    await settle(pilot)


# -- 1: a filter the language cannot read is an inline error -----------------------------------


@pytest.mark.parametrize("text", ['"HTTP 503', 'error:"unterminated', '"C:\\path"', 'agg:"x\\'])
def test_unreadable_filters_are_filter_errors(text):
    with pytest.raises(FilterError):
        parse_filter(text)


async def test_an_unterminated_quote_is_an_inline_error_not_a_crash():
    app = _fake_app()
    async with app.run_test(size=SIZE) as pilot:
        dead = await _dead_screen(pilot)
        for text in ('"HTTP 503', 'error:"unterminated', '"C:\\path"'):
            await _type_filter(pilot, text)
            assert app.is_running and app.screen is dead
            assert dead.has_class("filter-error"), text
            assert "filter:" in screen_text(app)
            await pilot.press("escape")
        assert dead.filter.is_empty()


# -- 2: values from the database are plain text ------------------------------------------------

MARKUP = "[/]"


async def test_markup_in_producer_data_is_drawn_as_text():
    messages = [
        dataclasses.replace(m, event_type=f"Paid{MARKUP}", aggregate_id=f"[b]o-{i}[/b")
        for i, m in enumerate(dead_messages(3))
    ]
    holders = [LeaseHolder(f"worker{MARKUP}", 3, 1, NOW)]
    source = FakeSource(messages=messages, holders=holders, payload={"note": "[red]x[/]"})
    app = _fake_app(source)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        assert f"worker{MARKUP}" in screen_text(app)
        dead = await _dead_screen(pilot)
        assert f"Paid{MARKUP}" in screen_text(app)
        assert "[b]o-2[/b" in screen_text(app)
        await pilot.press("s")
        await until(pilot, lambda: isinstance(app.screen, ConfirmScreen), "the skip dialog")
        assert "[b]o-2[/b" in screen_text(app)
        await pilot.press("n")
        await until(pilot, lambda: app.screen is dead, "the list again")
        await pilot.press("enter")
        await until(pilot, lambda: "[red]x[/]" in screen_text(app), "the detail")
        assert isinstance(app.screen, DetailScreen)


# -- 3: the page label matches the rows shown --------------------------------------------------


async def test_paging_fast_keeps_the_label_on_the_rows_shown():
    source = FakeSource(delay=0.2, dead=200)
    app = _fake_app(source, page_size=50)
    async with app.run_test(size=SIZE) as pilot:
        dead = await _dead_screen(pilot)
        newest_first = sorted((m.id for m in source.dead), reverse=True)
        await pilot.press("right_square_bracket", "right_square_bracket", "right_square_bracket")
        await settle(pilot)
        await settle(pilot)
        match = re.search(r"page (\d+) \((\d+)-(\d+)\)", screen_text(app))
        assert match is not None, screen_text(app)
        first = int(match.group(2))
        assert dead.page is not None
        assert newest_first.index(dead.page.messages[0].id) == first - 1, screen_text(app)


# -- 4: a bad JSON path is a filter error, not a lost database ---------------------------------


async def test_a_bad_json_path_keeps_the_filter_and_says_why(conn, dsn):
    ids = seed(conn, 6)
    conn.execute("UPDATE outbox SET status = 'dead', last_error = 'x' WHERE id = ANY(%s)", (ids,))
    conn.execute("UPDATE outbox SET event_type = 'InvoiceIssued' WHERE id = ANY(%s)", (ids[:2],))
    app = _app(dsn)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        await pilot.press("d")
        await until(pilot, lambda: "dead letters 6" in screen_text(app), "the dead list")
        dead = app.screen
        assert isinstance(dead, DeadScreen)
        await _type_filter(pilot, "type:InvoiceIssued")
        await until(pilot, lambda: "→ 2" in screen_text(app), "the first filter")
        await _type_filter(pilot, "$.amount >")
        await until(pilot, lambda: dead.has_class("filter-error"), "the inline error")
        assert dead.filter.event_type == "InvoiceIssued"  # the filter in force is unchanged
        for _ in range(3):  # several polls: the status line never blames the connection
            app.action_refresh_now()
            await settle(pilot)
            assert "✖" not in screen_text(app) and "reconnecting" not in screen_text(app)
        assert "jsonpath" in screen_text(app).lower() or "syntax" in screen_text(app).lower()


# -- 5: one failure, one group -----------------------------------------------------------------


def test_a_hex_id_of_digits_only_stays_in_its_group(conn, table):
    ids = seed(conn, 3)
    for message_id, upstream in zip(
        ids, ["9f86d081884c7d65", "8618726318862231", "5e1b"], strict=True
    ):
        conn.execute(
            "UPDATE outbox SET status = 'dead', last_error = %s WHERE id = %s",
            (f"HTTP 503: upstream {upstream} unavailable", message_id),
        )
    groups = fetch(conn, dead_letters.error_groups(table))
    assert (groups[0].key, groups[0].count) == ("HTTP 503: upstream <hex> unavailable", 2)


# -- 6: rates after max(id) goes down, and with no throughput ----------------------------------


async def test_rates_after_a_purge_and_with_nothing_moving():
    def snapshots(step: int) -> Any:
        # Nothing delivered at any time; everything purged after the second poll, so that
        # max(id) falls to 0; then one new message arrives (with a much higher id).
        max_id = [500_000, 500_000, 0, 0, 500_001][min(step, 4)]
        return dataclasses.replace(
            stats(0),
            sampled_at=NOW + timedelta(seconds=2 * step),
            pending=[10, 10, 0, 0, 1][min(step, 4)],
            ready=0,
            processing=0,
            dead=0,
            done=0,
            max_id=max_id,
            attempts={},
        )

    app = _fake_app(FakeSource(snapshots=snapshots))
    async with app.run_test(size=SIZE) as pilot:
        for _ in range(4):
            await settle(pilot)
            app.action_refresh_now()
        await settle(pilot)
        lines = screen_text(app).splitlines()
        text = "\n".join(lines)
        assert "peak 0.0/s" in text, text  # nothing was delivered: no peak
        # One message in two seconds, not 250,000 per second.
        assert "new messages per second · peak 0.5/s" in text, text
        top = next(i for i, line in enumerate(lines) if "throughput" in line)
        bottom = next(i for i, line in enumerate(lines) if "arrivals" in line)
        done_spark = "".join(lines[top + 1 : bottom])
        assert not set("▂▃▄▅▆▇█") & set(done_spark), text  # empty, not solid blocks


# -- 7: the skip dialog says what skipping does ------------------------------------------------


async def test_the_skip_dialog_does_not_overstate(conn, dsn):
    serve_ordering(conn)
    ids = seed(conn, 6, aggregates=2)  # agg-0: ids 0, 2, 4; agg-1: 1, 3, 5
    # agg-0: the dead head is followed by another dead message; agg-1: 1 done, 3 dead (head).
    conn.execute("UPDATE outbox SET status = 'dead', last_error = 'x' WHERE id = ANY(%s)",
                 ([ids[0], ids[2], ids[3]],))  # fmt: skip
    conn.execute("UPDATE outbox SET status = 'pending' WHERE id = %s", (ids[1],))
    app = _app(dsn, ordered=True)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        await pilot.press("d")
        await until(pilot, lambda: "dead letters 3" in screen_text(app), "the dead list")
        dead = app.screen
        assert isinstance(dead, DeadScreen)

        async def skip_dialog(message_id: int) -> str:
            await until(pilot, lambda: dead.highlighted() is not None, "a row")
            table = dead.query_one("#dead-table", DataTable)
            table.move_cursor(row=0)
            while (m := dead.highlighted()) is not None and m.id != message_id:
                await pilot.press("down")
            await pilot.press("s")
            await until(pilot, lambda: isinstance(app.screen, ConfirmScreen), "the dialog")
            await until(pilot, lambda: "head" in screen_text(app), "the dialog's notes")
            text = screen_text(app)
            await pilot.press("n")
            await until(pilot, lambda: app.screen is dead, "the list")
            return text

        text = await skip_dialog(ids[0])  # head, next also dead
        assert "nblocks" not in text.replace("not unblock", ""), text
        assert "also dead" in text, text
        text = await skip_dialog(ids[3])  # not the head: ids[1] is still pending
        assert "nblocks" not in text.replace("not unblock", ""), text
        assert "not the head" in text, text


# -- 8: what an action covers is what the operator can see -------------------------------------


async def test_marks_do_not_outlive_the_filter_and_r_in_groups_is_not_a_group_requeue():
    source = FakeSource()
    app = _fake_app(source)
    async with app.run_test(size=SIZE) as pilot:
        dead = await _dead_screen(pilot)
        await pilot.press("space", "space")
        assert len(dead.marks) == 2
        marked = set(dead.marks)  # the two newest: InvoiceIssued and OrderCancelled
        await _type_filter(pilot, "type:OrderPaid")
        assert dead.page is not None
        shown = {m.id for m in dead.page.messages}
        assert not marked & shown  # the marked rows are not on screen any more
        await pilot.press("r")
        await until(pilot, lambda: isinstance(app.screen, ConfirmScreen), "the dialog")
        assert "Requeue 1 dead message?" in screen_text(app), screen_text(app)
        await pilot.press("n")
        await settle(pilot)

        await pilot.press("x", "g")
        await settle(pilot)
        await pilot.press("r")
        await settle(pilot)
        assert not isinstance(app.screen, ConfirmScreen)
        await pilot.press("R")
        await until(pilot, lambda: isinstance(app.screen, ConfirmScreen), "the group dialog")
        assert "group" in screen_text(app)


# -- 9: help lists what works -------------------------------------------------------------------


async def test_help_lists_only_keys_that_work_and_home_end_move_the_cursor():
    app = _fake_app()
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        await pilot.press("question_mark")
        text = screen_text(app)
        assert "⏎" not in text, text  # nothing opens on the dashboard
        for clutter in ("focus", "copy", "tab"):
            assert clutter not in text.lower(), (clutter, text)
        await pilot.press("escape")
        dead = await _dead_screen(pilot)
        table = dead.query_one("#dead-table", DataTable)
        await pilot.press("end")
        assert table.cursor_row == table.row_count - 1
        await pilot.press("home")
        assert table.cursor_row == 0
        await pilot.press("question_mark")
        assert isinstance(app.screen, HelpScreen)
        assert "home" in screen_text(app) and "⏎" in screen_text(app)


# -- 10: stale numbers say so -------------------------------------------------------------------


async def test_numbers_from_before_an_outage_are_marked_stale():
    source = FakeSource()
    app = _fake_app(source)
    async with app.run_test(size=SIZE) as pilot:
        dead = await _dead_screen(pilot)
        assert "live" in screen_text(app)
        source.failing = psycopg.OperationalError("server closed the connection unexpectedly")
        app.action_refresh_now()
        await settle(pilot)
        text = screen_text(app)
        assert "live" not in text.split("\n")[1], text
        assert "stale since 12:00:00" in text, text
        assert dead.has_class("stale")
        await pilot.press("escape")
        await settle(pilot)
        app.action_refresh_now()
        await settle(pilot)
        assert "stale since 12:00:00" in screen_text(app)
        source.failing = None
        app.action_refresh_now()
        await settle(pilot)
        assert "stale" not in screen_text(app)


# -- 12: small ones -------------------------------------------------------------------------------


async def test_the_empty_result_text_is_whole():
    app = _fake_app(FakeSource(dead=0))
    async with app.run_test(size=(80, 24)) as pilot:
        await _dead_screen(pilot)
        assert "no dead messages" in screen_text(app)
        await _type_filter(pilot, "type:Nothing")
        assert "no dead messages match the filter" in screen_text(app), screen_text(app)


async def test_a_long_payload_string_wraps():
    tail = "END-OF-THE-LONG-STRING"
    payload = {"note": "y" * 150 + tail}
    app = _fake_app(FakeSource(payload=payload))
    async with app.run_test(size=(100, 40)) as pilot:
        await _dead_screen(pilot)
        await pilot.press("enter")
        await until(pilot, lambda: "payload" in screen_text(app), "the detail")
        assert tail in screen_text(app).replace("\n", "").replace(" ", ""), screen_text(app)


async def test_the_done_count_is_exact_on_a_small_table(conn, dsn):
    ids = seed(conn, 12)
    conn.execute("UPDATE outbox SET status = 'done', done_at = now() WHERE id = ANY(%s)",
                 (ids[:7],))  # fmt: skip
    app = _app(dsn)
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: "● connected" in screen_text(app), "the first poll")
        await until(pilot, lambda: re.search(r"done\s+7\b", screen_text(app)), "the exact count")
        assert "estimate" not in screen_text(app)
