"""The send rate per destination, kept by every replica together.

Tokens come from the destination's bucket in the shared table (outbox.destinations), a few
at a time, so that all replicas together keep to `--rate-limit`.
"""

from __future__ import annotations

import asyncio
import logging
import math
import random
from collections.abc import Callable
from typing import Any

from outbox import destinations as dest
from outbox.runner import fetch_async
from outbox.worker.retry import DatabaseErrors
from outbox.worker.settings import WorkerSettings

log = logging.getLogger("outbox.worker")

# Tokens taken from the shared bucket at once: a twentieth of a second's worth, so tokens a
# replica holds unused add little to what a window sees.
TOKEN_CHUNK_SECONDS = 0.05


class RateLimiter:
    """Send tokens per destination, taken from the shared bucket a few at a time."""

    def __init__(self, settings: WorkerSettings, connection: Callable[[], Any]) -> None:
        assert settings.rate_limit is not None
        self.rate = settings.rate_limit
        self.table = settings.table
        self.connection = connection
        self.chunk = max(1, math.ceil(self.rate * TOKEN_CHUNK_SECONDS))
        self.tokens: dict[str, int] = {}
        self._lock = asyncio.Lock()

    async def acquire(self, destination: str, want: int = 1) -> int:
        """Between 1 and `want` tokens, waiting for them as long as it takes."""
        while True:
            have = self.tokens.get(destination, 0)
            if have:
                taken = min(have, want)
                self.tokens[destination] = have - taken
                return taken
            async with self._lock:
                if self.tokens.get(destination, 0):
                    continue  # another task refilled while this one waited for the lock
                try:
                    async with self.connection() as conn:
                        granted = await fetch_async(
                            conn,
                            dest.take_tokens(
                                self.table, destination, rate=self.rate,
                                want=max(self.chunk, want),
                            ),
                        )  # fmt: skip
                except DatabaseErrors as exc:
                    log.debug("could not take send tokens: %s", exc)
                    granted = 0
                if granted:
                    self.tokens[destination] = granted
                    continue
                # Empty: wait about as long as a chunk takes to refill, spread so that
                # replicas do not ask together.
                await asyncio.sleep(self.chunk / self.rate * random.uniform(0.5, 1.0))
