"""The listener: wakes the claimer on NOTIFY, on a connection of its own.

A replay's NOTIFY (outbox.partitions.REPLAY_NOTICE) first has the claim window forgotten:
replayed rows may lie below it, and the next claim must read from the lowest partition so
that its head check sees them. So does a plain table's conversion to the partitioned layout
(LAYOUT_NOTICE: the next claim learns the layout), and every (re)connection, for a replay
or a conversion committed while it was away. It reconnects by itself; while it is away the
claimer polls, so nothing is missed, only noticed later (a replay below the window at the
next floor reading, FLOOR_TTL; a conversion within LAYOUT_TTL).
"""

from __future__ import annotations

import asyncio

import psycopg

from outbox.claim_window import ClaimWindow
from outbox.partitions import LAYOUT_NOTICE, REPLAY_NOTICE
from outbox.plumbing.dsn import connect_options
from outbox.queries import listen
from outbox.worker.retry import DatabaseErrors, DatabaseRetry
from outbox.worker.settings import WorkerSettings


class Listener:
    def __init__(
        self,
        settings: WorkerSettings,
        retry: DatabaseRetry,
        wakeup: asyncio.Event,
        window: ClaimWindow,
    ) -> None:
        self.settings = settings
        self.retry = retry
        self.wakeup = wakeup
        self.window = window  # the claimer's, forgotten on a replay
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
                await conn.execute(await listen(conn, s.table))
                self.listening = self.window.announcing = True
                # Anything may have arrived while we were not listening, a replay too.
                self.window.forget()
                self.wakeup.set()
                try:
                    async for notice in conn.notifies():
                        if notice.payload in (REPLAY_NOTICE, LAYOUT_NOTICE):
                            self.window.forget()
                        else:
                            self.window.announced()
                        self.wakeup.set()
                except DatabaseErrors as exc:
                    # The connection was up: this failure starts a new streak.
                    self.listening = self.window.announcing = False
                    await asyncio.sleep(self.retry.failed("listen", exc, 1, readiness=False))
        finally:
            self.listening = self.window.announcing = False
