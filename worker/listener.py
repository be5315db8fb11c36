"""The listener: wakes the claimer on NOTIFY, on a connection of its own.

It reconnects by itself; while it is away the claimer polls, so nothing is missed, only
noticed later.
"""

from __future__ import annotations

import asyncio

import psycopg

from outbox.dsn import connect_options
from outbox.queries import queries
from outbox.worker.retry import DatabaseErrors, DatabaseRetry
from outbox.worker.settings import WorkerSettings


class Listener:
    def __init__(
        self, settings: WorkerSettings, retry: DatabaseRetry, wakeup: asyncio.Event
    ) -> None:
        self.settings = settings
        self.retry = retry
        self.wakeup = wakeup
        self.listening = False  # a LISTEN connection is up

    async def run(self) -> None:
        """Listen until cancelled."""
        while True:
            await self.retry.until_done("listen", self._listen, readiness=False)

    async def _listen(self) -> None:
        s = self.settings
        try:
            async with await psycopg.AsyncConnection.connect(
                s.dsn,
                autocommit=True,
                application_name=f"{s.owner} listener",
                **connect_options(s.dsn),
            ) as conn:
                await conn.execute(queries(s.table).listen)
                self.listening = True
                self.wakeup.set()  # anything may have arrived while we were not listening
                try:
                    async for _ in conn.notifies():
                        self.wakeup.set()
                except DatabaseErrors as exc:
                    # The connection was up: this failure starts a new streak.
                    self.listening = False
                    await asyncio.sleep(self.retry.failed("listen", exc, 1, readiness=False))
        finally:
            self.listening = False
