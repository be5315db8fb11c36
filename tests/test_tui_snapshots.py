"""SVG snapshots of the main screens (pytest-textual-snapshot), at 80x24 and 200x60.

Deterministic by construction: a `Source` of fixed data (tests/tui_fakes.py), a frozen
clock for every age and time shown, and refresh paused so nothing moves while the picture
is taken (the dashboard's sparklines get their history from explicit refreshes first).
Update after an intended change with `pytest tests/test_tui_snapshots.py --snapshot-update`
and review the SVGs (`snapshot_report.html` shows the differences).
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

import pytest
from textual.pilot import Pilot
from textual.widgets import Input
from textual.worker import WorkerCancelled
from tui_fakes import FakeSource, clock

from outbox.tui.app import OutboxApp
from outbox.tui.config import Config
from outbox.tui.screens.dead import DeadScreen

SMALL = (80, 24)
LARGE = (200, 60)


def make_app(**config: Any) -> OutboxApp:
    return OutboxApp(Config(paused=True, **config), source=FakeSource(), clock=clock)


async def idle(pilot: Pilot[Any]) -> None:
    """Until every poll has finished and the screen has caught up (an action's worker may
    be waiting on its dialog: that one is left alone)."""
    await pilot.pause()
    for worker in [w for w in pilot.app.workers if w.group == "poll"]:
        with contextlib.suppress(WorkerCancelled):
            await worker.wait()
    # The footer recomposes after a poll changes which actions apply: let it finish.
    for _ in range(3):
        await pilot.pause()
    await pilot.wait_for_scheduled_animations()


async def warm(pilot: Pilot[Any]) -> None:
    """Refresh the dashboard enough times for full sparklines."""
    app = pilot.app
    assert isinstance(app, OutboxApp)
    await idle(pilot)
    for _ in range(30):
        app.action_refresh_now()
        await idle(pilot)


def steps(*keys: str) -> Callable[[Pilot[Any]], Awaitable[None]]:
    """Warm up, then press keys one at a time, letting each refresh settle."""

    async def run(pilot: Pilot[Any]) -> None:
        await warm(pilot)
        for key in _keys(keys):
            await pilot.press(key)
            await idle(pilot)

    return run


def _keys(keys: Iterable[str]) -> list[str]:
    out: list[str] = []
    for key in keys:
        out.extend(list(key[5:]) if key.startswith("text:") else [key])
    return out


@pytest.mark.parametrize("size", [SMALL, LARGE], ids=["80x24", "200x60"])
def test_dashboard(snap_compare, size):
    assert snap_compare(make_app(ordered=True), terminal_size=size, run_before=steps())


@pytest.mark.parametrize("size", [SMALL, LARGE], ids=["80x24", "200x60"])
def test_dead_letters_with_a_mark(snap_compare, size):
    run = steps("d", "down", "space")
    assert snap_compare(make_app(), terminal_size=size, run_before=run)


def test_error_groups(snap_compare):
    assert snap_compare(make_app(), terminal_size=SMALL, run_before=steps("d", "g"))


@pytest.mark.parametrize("size", [SMALL, LARGE], ids=["80x24", "200x60"])
def test_message_detail(snap_compare, size):
    run = steps("d", "down", "enter")
    assert snap_compare(make_app(), terminal_size=size, run_before=run)


def test_filter_then_requeue_all_confirmation(snap_compare):
    run = steps("d", "slash", "text:type:OrderPaid", "enter", "R")
    assert snap_compare(make_app(), terminal_size=SMALL, run_before=run)


def test_filter_line_while_typing(snap_compare):
    async def run(pilot: Pilot[Any]) -> None:
        await steps("d", "slash")(pilot)
        # The cursor blinks on a timer: hold it visible so the picture does not depend on
        # how long the typing took.
        pilot.app.screen.query_one(Input).cursor_blink = False
        for key in _keys(["text:error:HTTP"]):
            await pilot.press(key)
            await idle(pilot)

    assert snap_compare(make_app(), terminal_size=SMALL, run_before=run)


def test_help_on_the_dead_letters_screen(snap_compare):
    assert snap_compare(make_app(), terminal_size=SMALL, run_before=steps("d", "question_mark"))


def test_read_only_dead_letters(snap_compare):
    assert snap_compare(make_app(read_only=True), terminal_size=SMALL, run_before=steps("d"))


def test_snapshot_app_is_paused_and_frozen():
    """The premise of the snapshots: no live refresh and a frozen clock."""
    app = make_app()
    assert app.poll_interval() is None
    assert app.clock() == clock()
    assert DeadScreen.SHOWS_FILTER_HELP


@pytest.mark.parametrize("size", [SMALL, LARGE], ids=["80x24", "200x60"])
def test_destinations(snap_compare, size):
    assert snap_compare(make_app(), terminal_size=size, run_before=steps("e"))


def test_pause_a_destination_with_its_reason_typed(snap_compare):
    async def run(pilot: Pilot[Any]) -> None:
        await steps("e", "P")(pilot)
        pilot.app.screen.query_one(Input).cursor_blink = False  # see test_filter_line_while_typing
        for key in _keys(["text:partner asked us to hold"]):
            await pilot.press(key)
            await idle(pilot)

    assert snap_compare(make_app(), terminal_size=SMALL, run_before=run)
