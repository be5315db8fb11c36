"""The shared publish deadline timer, on a real event loop (no database)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable

import pytest

from outbox.worker.in_flight import InFlight


async def _publish(in_flight: InFlight, key: tuple[int, int], publish: Awaitable[None]) -> str:
    task = asyncio.current_task()
    assert task is not None
    try:
        await in_flight.publish(key, task, publish)
    except TimeoutError:
        return "timed out"
    return "done"


async def test_only_publishes_past_their_own_deadline_are_timed_out_oldest_first():
    loop = asyncio.get_running_loop()
    in_flight = InFlight(timeout=0.2)
    answered = loop.create_future()
    first = asyncio.create_task(_publish(in_flight, (1, 1), loop.create_future()))
    quick = asyncio.create_task(_publish(in_flight, (2, 1), answered))
    await asyncio.sleep(0)  # both started; one timer, for the first deadline
    answered.set_result(None)
    assert await quick == "done"
    await asyncio.sleep(0.1)
    # Started half a timeout later: its deadline is not the first one's.
    later = asyncio.create_task(_publish(in_flight, (3, 1), loop.create_future()))
    assert await first == "timed out"
    assert len(in_flight) == 1 and not later.done()
    assert await later == "timed out"  # the timer was set again, for its deadline
    assert len(in_flight) == 0
    # Nothing in flight, no timer left; a new publish sets one again.
    assert await _publish(in_flight, (4, 1), loop.create_future()) == "timed out"
    assert first.cancelling() == later.cancelling() == 0  # every deadline cancel taken back
    in_flight.close()


async def test_a_stop_during_a_timed_out_publish_still_stops_the_task():
    loop = asyncio.get_running_loop()
    in_flight = InFlight(timeout=0.05)
    deadline_passed = asyncio.Event()

    async def ignoring_its_first_cancel() -> None:
        try:
            await loop.create_future()
        except asyncio.CancelledError:
            deadline_passed.set()
            await loop.create_future()

    task = asyncio.create_task(_publish(in_flight, (1, 1), ignoring_its_first_cancel()))
    await deadline_passed.wait()
    task.cancel()  # and now a stop
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_a_publish_that_returns_despite_its_deadline_counts_as_delivered():
    loop = asyncio.get_running_loop()
    in_flight = InFlight(timeout=0.05)

    async def finishing_anyway() -> None:
        with contextlib.suppress(asyncio.CancelledError):
            await loop.create_future()

    task = asyncio.create_task(_publish(in_flight, (1, 1), finishing_anyway()))
    assert await task == "done"
    assert task.cancelling() == 0


async def test_a_publish_finished_in_time_is_not_cancelled_and_the_timer_stops():
    in_flight = InFlight(timeout=0.05)
    task = asyncio.create_task(_publish(in_flight, (1, 1), asyncio.sleep(0.01)))
    assert await task == "done"
    assert task.cancelling() == 0
    await asyncio.sleep(0.1)  # the timer fires with nothing in flight and sets no other
    assert in_flight._timer is None
