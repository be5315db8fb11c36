"""One table, one resource: which table each served resource dispatches (`Tables`).

Workers of two resources on one table would finalize each other's rows, and each would size
for the other's backlog. The registry is in memory and filled as the resources' passes read
their tables, so on its own it would be first-come: after an operator start or a leader
failover, the newer resource's pass may read first and find itself alone. Hence the rule
that no resource runs workers on a reading until every resource this replica serves at
start (listed once, `start`) has been read once, its table known or its reading failed
(`settled`); and, as a server restart changes its tables' identities, a resource whose
table's identity changed waits until the resources that shared the old one have been read
again.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field

from outbox.operator_reads import TableIdentity

log = logging.getLogger("outbox.controller")

Key = tuple[str, str]  # (namespace, name)
# How long a pass waits for the others before it lists the resources again (one deleted
# since the first listing is never read; one still there is waited for).
RELIST_SECONDS = 30.0


@dataclass
class Tables:
    """Which table each served resource dispatches, by the server's identity of it: one
    table, one resource. The first (the older resource; by namespace and name on a tie)
    keeps it; any other gets `TableConflict` and runs no workers. A resource keeps its
    entry while its reading fails (its table is still its own), until it is deleted."""

    served: dict[Key, tuple[str, str]] = field(default_factory=dict)
    # (namespace, name) -> (identity key, creationTimestamp)
    _unread: set[Key] | None = None  # listed at start and not read yet; None: not listed
    _read: set[Key] = field(default_factory=set)  # read at least once
    _again: dict[Key, set[Key]] = field(default_factory=dict)  # to be read again, by whom
    _changed: asyncio.Event = field(default_factory=asyncio.Event)
    _listing: asyncio.Lock = field(default_factory=asyncio.Lock)

    def first(
        self, namespace: str, name: str, created: str, identity: TableIdentity
    ) -> tuple[str, str] | None:
        """Record what this resource serves; the resource that had the table first, if
        not this one."""
        me = (namespace, name)
        before = self.served.get(me)
        if before is not None and before[0] != identity.key:
            # Its table's identity changed (a server restart does it to every table of the
            # server): whoever shared the old one still holds it until read again.
            shared = {key for key, (other, _) in self.served.items() if other == before[0]}
            if shared - {me}:
                self._again[me] = shared - {me}
        self.served[me] = (identity.key, created)
        rivals = [key for key, (other, _) in self.served.items() if other == identity.key]
        first = min(rivals, key=lambda key: (self.served[key][1], key))
        return None if first == me else first

    def read(self, namespace: str, name: str) -> None:
        """This resource's pass read its table, or failed to."""
        me = (namespace, name)
        self._read.add(me)
        if self._unread is not None:
            self._unread.discard(me)
        for waiting in self._again.values():
            waiting.discard(me)
        self._notify()

    def forget(self, namespace: str, name: str) -> None:
        me = (namespace, name)
        self.served.pop(me, None)
        self._again.pop(me, None)
        self.read(namespace, name)  # nobody waits for a deleted resource
        self._read.discard(me)

    async def start(self, listing: Callable[[], Awaitable[Iterable[Key]]]) -> None:
        """Once: the resources served at start, each to be read before anyone runs workers."""
        async with self._listing:
            if self._unread is None:
                self._unread = set(await listing()) - self._read

    def pending(self, namespace: str, name: str) -> set[Key]:
        """The resources to be read before this one may run workers."""
        return (self._unread or set()) | self._again.get((namespace, name), set())

    async def settled(
        self, namespace: str, name: str, listing: Callable[[], Awaitable[Iterable[Key]]]
    ) -> None:
        """Return once `pending` is empty. Every RELIST_SECONDS the resources are listed
        again: one deleted meanwhile is not waited for."""
        if waiting := self.pending(namespace, name):
            log.info(
                "%s/%s: runs no workers until these are read: %s", namespace, name,
                ", ".join(f"{ns}/{n}" for ns, n in sorted(waiting)),
            )  # fmt: skip
        while waiting := self.pending(namespace, name):
            changed = self._changed
            try:  # not asyncio.wait_for, which drops a cancellation that comes with the change
                async with asyncio.timeout(RELIST_SECONDS):
                    await changed.wait()
            except TimeoutError:
                listed = set(await listing())
                for key in waiting - listed:
                    self.forget(*key)

    def _notify(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()
