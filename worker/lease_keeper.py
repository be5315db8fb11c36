"""The lease keeper: extends the leases of held messages before they run out.

A lease is renewed once a third of it has passed, checked twice as often, so a renewal that
fails (the database away) has another chance well before the lease ends.
"""

from __future__ import annotations

import asyncio
import logging
import time
from functools import partial

from outbox import lease
from outbox.models import Message
from outbox.worker.service import Service, Shared

log = logging.getLogger("outbox.worker")

# Shortest wait between two rounds: the settings refuse leases under a second, but a
# replica built in code with a smaller one still must not spin.
MIN_WAIT = 0.05


class LeaseKeeper(Service):
    def __init__(self, shared: Shared) -> None:
        super().__init__(shared)
        self.third = self.settings.lease.total_seconds() / 3

    async def run(self) -> None:
        """Renew leases until cancelled."""
        wait = max(self.third / 2, MIN_WAIT)
        while True:
            await asyncio.sleep(wait)
            now = time.monotonic()
            due = self.ledger.due_for_renewal(now, self.third)
            if not due:
                continue
            renewed = await self.retry.until_done(
                "extend leases", partial(self._extend, due), retry_in=wait
            )
            self.ledger.renewed(renewed, now)
            log.debug("extended %d of %d leases", len(renewed), len(due))

    async def _extend(self, messages: list[Message]) -> set[int]:
        async with self.connection() as conn:
            return await lease.extend(
                conn,
                self.settings.table,
                messages,
                lease=self.settings.lease,
                layout=self.window.layout,
            )
