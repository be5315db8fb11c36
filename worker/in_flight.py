"""The publishes in flight, and one timer for all their deadlines.

Every publish gets the same timeout, so deadlines come due in the order publishes started.
An insertion-ordered map from publish to (deadline, task) and a single timer set for the
oldest deadline are then enough. An `asyncio.timeout` per publish built a Timeout object
and pushed a timer onto the loop's heap only to cancel it, about 8 µs each time. Here
starting and finishing a publish are two O(1) map operations, and the timer fires about
once per timeout period.

A publish past its deadline gets its task cancelled, as `asyncio.timeout` would, and the
cancellation is taken back (`Task.uncancel`) and raised as TimeoutError.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Awaitable

Key = tuple[int, int]  # (id, lease_version): after a takeover two generations may publish


class InFlight:
    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        self._running: collections.OrderedDict[Key, tuple[float, asyncio.Task[None]]] = (
            collections.OrderedDict()
        )
        self._timer: asyncio.TimerHandle | None = None

    def __len__(self) -> int:
        return len(self._running)

    async def publish(self, key: Key, task: asyncio.Task[None], publish: Awaitable[None]) -> None:
        """Await `publish`, which `task` runs, under the deadline: TimeoutError past it.

        `task` is the caller's own (passed in: looking it up costs a call per message).
        """
        loop = task.get_loop()
        deadline = loop.time() + self.timeout
        self._running[key] = (deadline, task)
        if self._timer is None:
            self._timer = loop.call_at(deadline, self._expire)
        try:
            await publish
        except BaseException as exc:
            if self._running.pop(key, None) is not None:  # ended in time: not the deadline's
                raise
            # The deadline cancelled it: take that cancel back. Still cancelled: a stop's
            # cancel came too, and the stop wins. Not a CancelledError: the publisher turned
            # the cancel into an error of its own, and its word is kept.
            if task.uncancel() > 0 or not isinstance(exc, asyncio.CancelledError):
                raise
            raise TimeoutError from None
        if self._running.pop(key, None) is None:
            # Past the deadline, but the publish returned anyway (it caught the cancel):
            # delivered; the cancel is taken back.
            task.uncancel()

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _expire(self) -> None:
        """Cancel every publish past its deadline, oldest first; then wait for the next."""
        self._timer = None
        running = self._running
        while running:
            key, (deadline, task) = next(iter(running.items()))
            loop = task.get_loop()
            if deadline > loop.time():
                self._timer = loop.call_at(deadline, self._expire)
                return
            del running[key]
            task.cancel()
