"""Waiting for cancelled tasks to end (outbox.plumbing.waiting)."""

from __future__ import annotations

import asyncio
import gc
from typing import Any

from helpers import dropping_one_cancellation

from outbox.plumbing.waiting import cancel_and_wait, cancel_soon


async def test_a_task_that_drops_its_cancellation_is_cancelled_again_until_it_ends():
    ticks: list[int] = []
    service = asyncio.create_task(dropping_one_cancellation(ticks))
    await asyncio.sleep(0.05)
    # Cancelled once and awaited, it would run on for good.
    service.cancel()
    done, _ = await asyncio.wait({service}, timeout=0.3)
    assert not done and service.cancelling() == 1
    await cancel_and_wait([service])
    assert service.cancelled()


async def test_tasks_ended_already_are_left_as_they_are():
    finished = asyncio.create_task(asyncio.sleep(0))
    await finished
    running = asyncio.create_task(asyncio.sleep(60))
    await cancel_and_wait([finished, running])
    assert finished.done() and not finished.cancelled()
    assert running.cancelled()


async def test_cancel_soon_cancels_at_once_and_again_until_the_task_ends():
    ticks: list[int] = []
    service = asyncio.create_task(dropping_one_cancellation(ticks))
    await asyncio.sleep(0.05)
    cancelling = cancel_soon([service])  # from a caller that cannot wait
    assert service.cancelling() == 1
    async with asyncio.timeout(2):
        await cancelling
    assert service.cancelled()


async def test_an_exception_a_cancelled_task_ended_with_is_not_reported_as_never_retrieved():
    reported: list[dict[str, Any]] = []
    asyncio.get_running_loop().set_exception_handler(lambda _, context: reported.append(context))

    async def fails_when_cancelled() -> None:
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            raise RuntimeError("cleaning up failed") from None

    read, unread = (asyncio.create_task(fails_when_cancelled()) for _ in range(2))
    await asyncio.sleep(0)  # both wait in their sleep
    await cancel_and_wait([read, unread])
    assert isinstance(read.exception(), RuntimeError)  # the caller can still read it
    del unread
    gc.collect()
    assert not reported
