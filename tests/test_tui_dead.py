"""The dead letters screen's parts: marks are values that follow the version shown, a page
knows its neighbours, a page whose rows all went away falls back to the newest, and a
filter applied again starts over. Rows come from real PostgreSQL, driven through Pilot."""

from __future__ import annotations

from typing import Any

from helpers import row, seed
from test_tui import SIZE, _app, refresh, screen_text, settle, until
from textual.pilot import Pilot
from textual.widgets import Input
from tui_fakes import dead_messages

from outbox.operations.repair import Seen
from outbox.tui.screens.confirm import ConfirmScreen
from outbox.tui.screens.dead import DeadScreen
from outbox.tui.screens.dead.listing import Listing, Page
from outbox.tui.screens.dead.marks import Marks
from outbox.views.dead_letters import DeadPage
from outbox.views.filters import DeadFilter


def test_marks_are_values_that_take_the_version_shown():
    a, b = Seen(1, "dead", 3), Seen(2, "dead", 5)
    empty = Marks()
    one = empty.toggled(a)
    assert dict(empty) == {} and dict(one) == {1: a}  # a change is a new value
    two = one.toggled(b)
    assert dict(one) == {1: a} and dict(two) == {1: a, 2: b}
    assert two.toggled(a) == Marks([b]) and two.without([2, 9]) == Marks([a])
    [message] = dead_messages(1)
    shown = Marks([Seen(message.id, "dead", message.lease_version - 1), b])
    again = shown.as_shown([message, *dead_messages(3)[1:]])
    # The marked row on the page takes the version shown; the others stay as they were,
    # and a row shown but not marked is not marked by it.
    assert dict(again) == {message.id: message.seen, 2: b}


def test_a_listing_knows_its_neighbours_and_its_place():
    newest_first = sorted(dead_messages(5), key=lambda m: -m.id)
    middle = Listing(DeadFilter(), DeadPage(newest_first, True, True), 900_000, 3, 5)
    assert middle.span == (11, 15)
    assert middle.older() == Page(newest_first[-1].id, None, 4)
    assert middle.newer() == Page(None, newest_first[0].id, 2)
    assert middle.again() == Page(900_000, None, 3)
    only = Listing(DeadFilter(), DeadPage(newest_first[:2], False, False), None, 1, 5)
    assert only.span == (1, 2) and only.older() is None and only.newer() is None


async def _dead_screen(pilot: Pilot[Any]) -> DeadScreen:
    await settle(pilot)
    await pilot.press("d")
    await settle(pilot)
    screen = pilot.app.screen
    assert isinstance(screen, DeadScreen)
    return screen


async def _press(pilot: Pilot[Any], *keys: str) -> None:
    for key in keys:
        await pilot.press(key)
        await settle(pilot)


async def test_a_page_whose_rows_all_went_away_falls_back_to_the_newest(conn, dsn):
    ids = seed(conn, 130)
    conn.execute("UPDATE outbox SET status = 'dead'")
    newest_first = sorted(ids, reverse=True)
    app = _app(dsn, page_size=50, paused=True)
    async with app.run_test(size=SIZE) as pilot:
        dead = await _dead_screen(pilot)
        await _press(pilot, "right_square_bracket", "right_square_bracket")
        assert "page 3 (101-130)" in screen_text(app)
        assert dead.page is not None
        last_page = [m.id for m in dead.page.messages]
        assert last_page == newest_first[100:]
        # Someone else requeues every row of the page on screen.
        conn.execute("UPDATE outbox SET status = 'pending' WHERE id = ANY(%s)", (last_page,))
        await refresh(pilot)
        assert [m.id for m in dead.page.messages] == newest_first[:50]
        assert dead.before is None
        text = screen_text(app)
        assert "dead letters 100" in text and "page 1 (1-50) live" in text, text


async def test_a_filter_applied_again_or_cleared_starts_over_at_the_newest_page(conn, dsn):
    ids = seed(conn, 30, event_type="OrderPaid")
    conn.execute("UPDATE outbox SET status = 'dead'")
    newest = max(ids)
    app = _app(dsn, page_size=10, paused=True)
    async with app.run_test(size=SIZE) as pilot:
        dead = await _dead_screen(pilot)
        await _press(pilot, "slash", *"type:OrderPaid", "enter")
        assert "→ 30" in screen_text(app) and "page 1 (1-10) live" in screen_text(app)
        await _press(pilot, "right_square_bracket")
        assert "page 2 (11-20)" in screen_text(app)

        # The line starts from the filter in force; esc leaves it and the keys page again.
        await _press(pilot, "slash")
        assert dead.query_one("#filter", Input).value == "type:OrderPaid"
        await _press(pilot, "escape", "right_square_bracket")
        assert "page 3 (21-30)" in screen_text(app), screen_text(app)

        await _press(pilot, "slash", "enter")  # the same filter again
        assert dead.page is not None and dead.page.messages[0].id == newest
        assert "page 1 (1-10) live" in screen_text(app), screen_text(app)

        await _press(pilot, "x", "right_square_bracket")
        assert dead.filter.is_empty() and "page 2 (11-20)" in screen_text(app)
        await _press(pilot, "x")  # no filter to clear: still back to the newest page
        assert dead.page.messages[0].id == newest and dead.before is None


async def test_marks_are_fenced_on_the_version_last_shown(conn, dsn):
    ids = seed(conn, 3)
    conn.execute("UPDATE outbox SET status = 'dead' WHERE id = ANY(%s)", (ids,))
    app = _app(dsn, paused=True)
    async with app.run_test(size=SIZE) as pilot:
        dead = await _dead_screen(pilot)
        await pilot.press("space", "space")  # newest first: ids[2], ids[1]
        assert set(dead.marks) == {ids[2], ids[1]} and "2 marked" in screen_text(app)
        bump = "UPDATE outbox SET lease_version = lease_version + 1 WHERE id = %s"
        conn.execute(bump, (ids[2],))
        await refresh(pilot)  # shown again: the mark takes the new version
        assert dead.marks[ids[2]].lease_version == row(conn, ids[2])["lease_version"]
        conn.execute(bump, (ids[1],))  # changed since it was last shown
        await pilot.press("r")
        await until(pilot, lambda: "Requeue 2 dead messages?" in screen_text(app), "the dialog")
        assert isinstance(app.screen, ConfirmScreen)
        await pilot.press("y")
        await until(pilot, lambda: "1 changed since shown" in screen_text(app), "the result")
        assert "requeued 1 of 2" in screen_text(app)
        await until(pilot, lambda: app.screen is dead and not dead.marks, "the marks cleared")
    assert row(conn, ids[2])["status"] == "pending"
    assert row(conn, ids[1])["status"] == "dead"
