"""Waiting for the first of several things, and for cancelled tasks to end: one helper for
every component."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Iterable
from typing import Any


async def first_of(*waits: Awaitable[Any]) -> list[asyncio.Future[Any]]:
    """Wait until any of `waits` finishes, then cancel the others and wait for them to end
    (none is left running behind the caller). Returns them as futures, in the order given:
    the caller reads which finished, and how, from them."""
    futures: list[asyncio.Future[Any]] = [asyncio.ensure_future(wait) for wait in waits]
    try:
        await asyncio.wait(futures, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for future in futures:
            future.cancel()
        await asyncio.gather(*futures, return_exceptions=True)
    return futures


# How long a cancelled task may run on before it is cancelled again: its own cleanup may
# await (psycopg, cancelled mid-statement, asks the server to cancel it and waits for the
# answer), and a second cancellation would cut that short, leaving the statement running.
CANCEL_AGAIN_AFTER = 1.0


async def cancel_and_wait(tasks: Iterable[asyncio.Task[Any]]) -> None:
    """Cancel `tasks` and wait until each has ended, cancelling again any that runs on.

    A task can drop its cancellation: on Python 3.11, `asyncio.wait_for` returns a result
    that arrived together with the cancellation and drops it (gh-86296; psycopg_pool waits
    for a connection that way), and a service loop then simply goes on. Cancelled once and
    awaited, such a task held a worker's stop until it was killed.

    It stands for `cancel()` then `gather(..., return_exceptions=True)`: an exception a task
    ended with is the caller's to read from it, not reported as never retrieved."""
    tasks = list(tasks)
    pending = {task for task in tasks if not task.done()}
    while pending:
        for task in pending:
            task.cancel()
        _, pending = await asyncio.wait(pending, timeout=CANCEL_AGAIN_AFTER)
    for task in tasks:
        if not task.cancelled():
            task.exception()  # marks it retrieved, as gather does


# The cancelling tasks `cancel_soon` started: the loop keeps only weak references to tasks.
_cancelling: set[asyncio.Task[None]] = set()


def cancel_soon(tasks: Iterable[asyncio.Task[Any]]) -> asyncio.Task[None]:
    """`cancel_and_wait` for a caller that cannot wait (a callback, an event handler): `tasks`
    are cancelled now, and again by a task of their own until each has ended. That task is
    returned: await it to know they have."""
    tasks = list(tasks)
    for task in tasks:
        task.cancel()
    cancelling = asyncio.get_running_loop().create_task(cancel_and_wait(tasks))
    _cancelling.add(cancelling)
    cancelling.add_done_callback(_cancelling.discard)
    return cancelling
