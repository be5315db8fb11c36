"""This replica's side of destination health: the shared breakers, the probes, the send rate.

The state lives in the database (outbox.destinations), shared by every replica of the
table; this module keeps a view of it, read every REFRESH_INTERVAL, and reports to it:

- a retryable failure (timeout, refused or reset connection, 5xx, 429) is reported with
  whether this replica saw a success since its last report. When the destination is open
  (or the report opened it) the failure is the destination's: the message goes back to
  `pending` unsent, its attempt refunded, so no message's attempts grow during an outage;
- while a destination is open, nothing is sent to it but one probe at a time, taken by one
  replica under a lease on the destination's row. With a publisher whose messages all go to
  one destination (HTTP, NATS, Kafka) the claimer claims nothing while it is open except
  the probe's one message; with per-message destinations (plugins) the first message for an
  open destination taken once its probe is due becomes the probe, and the others are given
  back until about the next one;
- a probe that gets an answer (success, or a refusal that is the message's own) closes the
  breaker for every replica; the others see it at their next read;
- the destinations this replica serves are stamped (outbox.destinations.served) before its
  first claim and every SERVED_INTERVAL: its publisher's one destination, or with
  per-message destinations each one met in a claimed message, from then on while the
  replica runs. A destination nobody stamps any more is idle, and its row (open, perhaps,
  after its URL changed) no longer holds anything back: the operator scales as if it were
  not there. Sends could not tell this: an open destination gets none, and is served.

The rate limit takes tokens from the destination's bucket in the same table, a few at a
time, so that all replicas together keep to it.
"""

from __future__ import annotations

import asyncio
import logging
import math
import random
import time
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

from outbox import destinations as dest
from outbox.models import Message
from outbox.runner import fetch_async
from outbox.worker.retry import DatabaseErrors
from outbox.worker.service import Service, Shared
from outbox.worker.settings import WorkerSettings

log = logging.getLogger("outbox.worker")

# How often the shared state is read: how soon a replica follows a breaker another replica
# opened or closed.
REFRESH_INTERVAL = 1.0
# A probe's lease on the destination: the publish timeout and this margin. A replica killed
# mid-probe holds the probe no longer than that.
PROBE_MARGIN = timedelta(seconds=5)
# Tokens taken from the shared bucket at once: a twentieth of a second's worth, so tokens a
# replica holds unused add little to what a window sees.
TOKEN_CHUNK_SECONDS = 0.05


class Health(Service):
    def __init__(self, shared: Shared, publisher: object) -> None:
        super().__init__(shared)
        settings = self.settings
        self.policy = dest.Policy(
            threshold=settings.breaker_failures,
            window=settings.breaker_window,
            probe_cap=settings.probe_delay_max,
        )
        self.enabled = settings.breaker_failures > 0
        self.probe_hold = settings.publish_timeout + PROBE_MARGIN
        # Publishers name the destination of their messages: one for all (`destination`),
        # or one per message (`destination_of`); a plugin that names none is its own.
        name = str(getattr(publisher, "name", "publisher"))
        self.fixed: str = str(getattr(publisher, "destination", name))
        per_message = getattr(publisher, "destination_of", None)
        self._destination_of: Callable[[Message], str] | None = per_message
        self.per_message = per_message is not None
        # What this replica stamps as served: one destination for all, or each one met.
        self.served: set[str] = set() if self.per_message else {self.fixed}
        self._stamp_at = -math.inf  # monotonic: when the next stamp is due
        self.limiter = (
            RateLimiter(settings, self.connection) if settings.rate_limit is not None else None
        )
        # Destinations not closed, as last read, with the monotonic time of their next probe.
        self.blocked: dict[str, dest.Destination] = {}
        self._probe_at: dict[str, float] = {}
        self.probes: dict[str, int] = {}  # destination -> the message this replica probes with
        # When this replica last saw each destination succeed (monotonic).
        self._succeeded_at: dict[str, float] = {}
        self.changed = asyncio.Event()  # the view changed: a gated claimer looks again
        self._shown: set[tuple[str, str]] = set()

    # -- the hot path -----------------------------------------------------------------------

    def destination_of(self, message: Message) -> str:
        """The message's destination; a per-message one not met before is stamped as served
        at the next refresh."""
        if self._destination_of is None:
            return self.fixed
        destination = self._destination_of(message)
        if destination not in self.served:
            self.served.add(destination)
            self._stamp_at = -math.inf
        return destination

    def delivered(self, message: Message) -> None:
        """A success: failures before it no longer count towards opening the breaker."""
        self._succeeded_at[self.destination_of(message)] = time.monotonic()

    async def admit(self, message: Message) -> bool:
        """Whether a message may go out (asked only while some destination is blocked): its
        destination is not blocked, or the message is its probe. With per-message
        destinations, a message for an open destination whose probe is due becomes it."""
        destination = self.destination_of(message)
        row = self.blocked.get(destination)
        if row is None or self.probes.get(destination) == message.id:
            return True
        if not self.per_message or row.state != dest.OPEN or destination in self.probes:
            return False
        if not await self.take_probe(destination):
            return False
        self.probing(destination, message)
        return True

    # -- reports ----------------------------------------------------------------------------

    async def failed(
        self, message: Message, error: str, retry_after: timedelta | None
    ) -> float | None:
        """Report a retryable failure. Returns how long to hold the message back, unsent
        and its attempt refunded, when the failure is the destination's (it is open, or this
        failure opened it); None when it is the message's own (retried as usual)."""
        destination = self.destination_of(message)
        self.metrics.destination_failures.labels(destination).inc()
        if not self.enabled:
            return None
        probing = self.probes.get(destination) == message.id
        if destination in self.blocked and not probing:
            # Sent before this replica learned it is down: nothing new to tell the others.
            return self.hold_back(destination)
        succeeded = self._succeeded_at.get(destination)
        ago = None if succeeded is None else time.monotonic() - succeeded
        failure = dest.Failure(message.id, error, retry_after, succeeded_ago=ago)
        owner, policy = self.settings.owner, self.policy
        try:
            change = await self._change(
                destination,
                lambda row, now: dest.failed(row, failure, owner=owner, now=now, policy=policy),
            )
        except DatabaseErrors as exc:
            # The database is away as well: the message's own failure, retried as usual.
            log.warning("could not report a failure of %s: %s", destination, exc)
            return None
        if probing:
            self.probes.pop(destination, None)
        after = change.after or change.before
        if after.state == dest.CLOSED:
            return None
        if change.before.state == dest.CLOSED:
            log.warning(
                "destination %s is down (%d messages failed; last: %s): holding its messages "
                "back until a probe succeeds", destination, len(after.failing_ids), error,
            )  # fmt: skip
        return self.hold_back(destination)

    async def answered(self, message: Message) -> None:
        """The destination answered a message (delivered, or refused it for a reason of the
        message's own): if that was this replica's probe, the breaker closes for all."""
        destination = self.destination_of(message)
        self._succeeded_at[destination] = time.monotonic()
        if self.probes.get(destination) != message.id:
            return
        owner = self.settings.owner
        try:
            await self._change(
                destination, lambda row, now: dest.succeeded(row, owner=owner, now=now)
            )
        except DatabaseErrors as exc:
            log.warning("could not close the breaker of %s: %s", destination, exc)
            return  # the probe's lease runs out; another probe closes it
        finally:
            self.probes.pop(destination, None)
        log.info("destination %s is back: its probe succeeded", destination)

    def hold_back(self, destination: str) -> float:
        """Seconds to hold a message for a blocked destination. With one destination for all
        messages, none: claimers claim nothing for it while it is blocked, and everything
        is ready the moment it closes. With one per message, until about the next probe."""
        self.metrics.held_back.labels(destination).inc()
        if not self.per_message:
            return 0.0
        until = self._probe_at.get(destination, time.monotonic()) - time.monotonic()
        spread = self.settings.probe_delay_max.total_seconds()
        return max(1.0, until) + random.uniform(0, spread / 2)

    # -- probes -----------------------------------------------------------------------------

    async def claim_gate(self) -> int | None:
        """How many messages the claimer may claim: None, no limit; 1, a probe (the next
        message claimed is registered as it, see `probing`); 0, none for now (wait for
        `changed` or `gate_wait()`). Only a publisher with one destination gates claims."""
        row = self.blocked.get(self.fixed)
        if self.per_message or row is None:
            return None
        if row.state != dest.OPEN or self.fixed in self.probes:
            return 0
        return 1 if await self.take_probe(self.fixed) else 0

    def gate_wait(self) -> float:
        """How long a gated claimer waits before it asks again, at most."""
        until = self._probe_at.get(self.fixed, math.inf) - time.monotonic()
        return max(0.01, min(REFRESH_INTERVAL, until))

    def probing(self, destination: str, message: Message) -> None:
        self.probes[destination] = message.id

    async def take_probe(self, destination: str) -> bool:
        """Whether this replica now holds the destination's probe (due, and nobody's)."""
        if time.monotonic() < self._probe_at.get(destination, 0.0):
            return False
        owner, hold = self.settings.owner, self.probe_hold
        try:
            change = await self._change(
                destination, lambda row, now: dest.probe_taken(row, owner=owner, now=now, hold=hold)
            )
        except DatabaseErrors:
            return False
        if change.after is None:
            self._learn(change.before, change.now)
            return False
        log.info("probing destination %s", destination)
        return True

    # -- the shared view --------------------------------------------------------------------

    async def run(self) -> None:
        """Read the shared state until cancelled."""
        while True:
            await asyncio.sleep(REFRESH_INTERVAL)
            await self.refresh()

    async def refresh(self) -> None:
        """Stamp what this replica serves, when due, and read the shared state once (also
        before the first claim: a replica started while a destination is down respects it
        from the start, and the operator counts its destination as served)."""
        try:
            async with self.connection() as conn:
                if self.served and time.monotonic() >= self._stamp_at:
                    await self._stamp(conn)
                rows = await fetch_async(conn, dest.listing(self.settings.table))
        except DatabaseErrors as exc:
            # The claimer and the finalizer report the database's absence; keep the view.
            log.debug("could not read destination health: %s", exc)
        else:
            self._read(rows)

    async def _stamp(self, conn: Any) -> None:
        # Due again whether or not it was written: a failure is retried at the next one.
        self._stamp_at = time.monotonic() + dest.SERVED_INTERVAL.total_seconds()
        table, owner = self.settings.table, self.settings.owner
        await fetch_async(conn, dest.served(table, sorted(self.served), owner=owner))

    def _read(self, rows: list[tuple[dest.Destination, datetime]]) -> None:
        for row, now in rows:
            self._learn(row, now)
        for gone in set(self.blocked) - {row.destination for row, _ in rows}:
            self._unblock(gone)  # its row was deleted: closed
        for name in set(self.probes) - set(self.blocked):
            self.probes.pop(name)  # closed meanwhile (by another replica's probe)
        # Only the destinations this replica serves: another dispatcher's, or the one its
        # URL named before a change, is not this worker's to report.
        shown = {(row.destination, row.state) for row, _ in rows if row.destination in self.served}
        for destination, state in shown | self._shown:
            self.metrics.destination_state.labels(destination, state).set(
                1 if (destination, state) in shown else 0
            )
        self._shown = shown

    def _learn(self, row: dest.Destination, now: datetime) -> None:
        """Take in a row as read (the blocked map is changed in place: its users hold it)."""
        if row.state == dest.CLOSED:
            self._unblock(row.destination)
            return
        if row.destination not in self.blocked:
            self.changed.set()
        self.blocked[row.destination] = row
        self._probe_at[row.destination] = (
            time.monotonic() + (row.next_probe_at - now).total_seconds()
            if row.next_probe_at is not None
            else math.inf  # paused: no probe
        )

    def _unblock(self, destination: str) -> None:
        if self.blocked.pop(destination, None) is not None:
            self.changed.set()
        self._probe_at.pop(destination, None)

    async def _change(self, destination: str, rule: dest.Rule) -> dest.Change:
        async with self.connection() as conn:
            change = await dest.change(conn, self.settings.table, destination, rule)
        self._learn(change.after or change.before, change.now)
        return change


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
