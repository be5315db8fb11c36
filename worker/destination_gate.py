"""The destination gate: this replica's side of the shared destination breakers.

Publishing asks it before a send whether a message may go, or for how long to hold it back,
and tells it each send's result; the claimer asks it how much it may claim while its one
destination is down. Nothing else of it is anyone's: the view of the shared state, the probes
and the served stamps are its own. The send rate is kept beside it (rate_limit.py).

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
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import random
import time
from datetime import datetime, timedelta
from typing import Any

from outbox import destinations as dest
from outbox.models import Message
from outbox.plumbing.waiting import first_of
from outbox.runner import fetch_async
from outbox.worker.publishers.base import PublisherBase
from outbox.worker.retry import DatabaseErrors
from outbox.worker.service import Service, Shared

log = logging.getLogger("outbox.worker")

# How often the shared state is read: how soon a replica follows a breaker another replica
# opened or closed.
REFRESH_INTERVAL = 1.0
# A probe's lease on the destination: the publish timeout and this margin. A replica killed
# mid-probe holds the probe no longer than that.
PROBE_MARGIN = timedelta(seconds=5)


class DestinationGate(Service):
    """Before a send: go, or hold back for so long (`before`); after it: its result
    (`delivered`, `after`). For the claimer: how much it may claim (`claim_limit`,
    `wait_to_claim`, `probe_claimed`)."""

    def __init__(self, shared: Shared, publisher: PublisherBase) -> None:
        super().__init__(shared)
        settings = self.settings
        self._policy = dest.Policy(
            threshold=settings.breaker_failures,
            window=settings.breaker_window,
            probe_cap=settings.probe_delay_max,
        )
        self._enabled = settings.breaker_failures > 0
        self._probe_hold = settings.publish_timeout + PROBE_MARGIN
        # The publisher declares its messages' destinations: one for all, or one per message.
        self._fixed = publisher.one_destination()
        self._per_message = publisher.per_message_destinations
        self._publisher_destination_of = publisher.destination_of
        # What this replica stamps as served: one destination for all, or each one met.
        self._served: set[str] = set() if self._per_message else {self._fixed}
        self._stamp_at = -math.inf  # monotonic: when the next stamp is due
        # Destinations not closed, as last read, with the monotonic time of their next probe.
        self._blocked: dict[str, dest.Destination] = {}
        self._probe_at: dict[str, float] = {}
        self._probes: dict[str, int] = {}  # destination -> the message this replica probes with
        # When this replica last saw each destination succeed (monotonic).
        self._succeeded_at: dict[str, float] = {}
        self._changed = asyncio.Event()  # the view changed: a gated claimer looks again
        self._shown: set[tuple[str, str]] = set()

    # -- before a send ----------------------------------------------------------------------

    @property
    def all_clear(self) -> bool:
        """No destination is held back: every message may go without asking `before`."""
        return not self._blocked

    async def before(self, message: Message) -> float | None:
        """None when the message may go: its destination is not blocked, or the message is
        its probe (with per-message destinations, a message for an open destination whose
        probe is due becomes it). Else how many seconds to hold it back, unsent and its
        attempt refunded."""
        destination = self._destination_of(message)
        if await self._admit(destination, message):
            return None
        return self._hold_back(destination)

    async def _admit(self, destination: str, message: Message) -> bool:
        row = self._blocked.get(destination)
        if row is None or self._probes.get(destination) == message.id:
            return True
        if not self._per_message or row.state != dest.OPEN or destination in self._probes:
            return False
        if not await self._take_probe(destination):
            return False
        self._probes[destination] = message.id
        return True

    # -- after a send -----------------------------------------------------------------------

    def delivered(self, message: Message) -> bool:
        """A message delivered: failures before it no longer count towards opening the
        breaker. False, and nothing recorded, while this replica probes a destination: the
        success is then told to `after`, which may close the breaker."""
        if self._probes:
            return False
        self._succeeded_at[self._destination_of(message)] = time.monotonic()
        return True

    async def after(
        self, message: Message, failure: str | None = None, retry_after: timedelta | None = None
    ) -> float | None:
        """A send's result: `failure` the reason of a retryable failure (a timeout, a
        refused connection, a 5xx), or None when the destination answered (delivered, or
        refused the message for a reason of its own). Returns how many seconds to hold the
        message back, unsent and its attempt refunded, when the failure is the destination's
        (it is open, or this failure opened it); None when the result is the message's own."""
        if failure is None:
            await self._answered(message)
            return None
        return await self._failed(message, failure, retry_after)

    async def _failed(
        self, message: Message, error: str, retry_after: timedelta | None
    ) -> float | None:
        destination = self._destination_of(message)
        self.metrics.destination_failures.labels(destination).inc()
        if not self._enabled:
            return None
        probing = self._probes.get(destination) == message.id
        if destination in self._blocked and not probing:
            # Sent before this replica learned it is down: nothing new to tell the others.
            return self._hold_back(destination)
        succeeded = self._succeeded_at.get(destination)
        ago = None if succeeded is None else time.monotonic() - succeeded
        failure = dest.Failure(message.id, error, retry_after, succeeded_ago=ago)
        owner, policy = self.settings.owner, self._policy
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
            self._probes.pop(destination, None)
        after = change.after or change.before
        if after.state == dest.CLOSED:
            return None
        if change.before.state == dest.CLOSED:
            log.warning(
                "destination %s is down (%d messages failed; last: %s): holding its messages "
                "back until a probe succeeds", destination, len(after.failing_ids), error,
            )  # fmt: skip
        return self._hold_back(destination)

    async def _answered(self, message: Message) -> None:
        """If the answer was to this replica's probe, the breaker closes for all."""
        destination = self._destination_of(message)
        self._succeeded_at[destination] = time.monotonic()
        if self._probes.get(destination) != message.id:
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
            self._probes.pop(destination, None)
        log.info("destination %s is back: its probe succeeded", destination)

    def _hold_back(self, destination: str) -> float:
        """Seconds to hold a message for a blocked destination. With one destination for all
        messages, none: claimers claim nothing for it while it is blocked, and everything
        is ready the moment it closes. With one per message, until about the next probe."""
        self.metrics.held_back.labels(destination).inc()
        if not self._per_message:
            return 0.0
        until = self._probe_at.get(destination, time.monotonic()) - time.monotonic()
        spread = self.settings.probe_delay_max.total_seconds()
        return max(1.0, until) + random.uniform(0, spread / 2)

    # -- for the claimer --------------------------------------------------------------------

    async def claim_limit(self) -> int | None:
        """How many messages the claimer may claim: None, no limit; 1, a probe (give the
        message claimed to `probe_claimed`); 0, none for now (`wait_to_claim`). Only a
        publisher with one destination gates claims."""
        if self._per_message or not self._blocked:
            return None
        row = self._blocked.get(self._fixed)
        if row is None:
            return None
        if row.state != dest.OPEN or self._fixed in self._probes:
            return 0
        return 1 if await self._take_probe(self._fixed) else 0

    async def wait_to_claim(self, stop: asyncio.Event) -> None:
        """After a claim limit of 0: until the view changes (another replica's probe closed
        the breaker), a probe may be due, or a stop."""
        self._changed.clear()
        until = self._probe_at.get(self._fixed, math.inf) - time.monotonic()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(max(0.01, min(REFRESH_INTERVAL, until))):
                await first_of(stop.wait(), self._changed.wait())

    def probe_claimed(self, message: Message) -> None:
        """The message claimed under a claim limit of 1: this replica's probe."""
        self._probes[self._fixed] = message.id

    # -- probes -----------------------------------------------------------------------------

    def _destination_of(self, message: Message) -> str:
        """The message's destination; a per-message one not met before is stamped as served
        at the next refresh."""
        if not self._per_message:
            return self._fixed
        destination = self._publisher_destination_of(message)
        if destination not in self._served:
            self._served.add(destination)
            self._stamp_at = -math.inf
        return destination

    async def _take_probe(self, destination: str) -> bool:
        """Whether this replica now holds the destination's probe (due, and nobody's)."""
        if time.monotonic() < self._probe_at.get(destination, 0.0):
            return False
        owner, hold = self.settings.owner, self._probe_hold
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
                if self._served and time.monotonic() >= self._stamp_at:
                    await self._stamp(conn)
                rows = await fetch_async(conn, dest.listing(self.settings.table))
        except DatabaseErrors as exc:
            # The claimer and the finalizer report the database's absence; keep the view.
            log.debug("could not read the destinations' breakers: %s", exc)
        else:
            self._read(rows)

    async def _stamp(self, conn: Any) -> None:
        # Due again whether or not it was written: a failure is retried at the next one.
        self._stamp_at = time.monotonic() + dest.SERVED_INTERVAL.total_seconds()
        table, owner = self.settings.table, self.settings.owner
        await fetch_async(conn, dest.served(table, sorted(self._served), owner=owner))

    def _read(self, rows: list[tuple[dest.Destination, datetime]]) -> None:
        for row, now in rows:
            self._learn(row, now)
        for gone in set(self._blocked) - {row.destination for row, _ in rows}:
            self._unblock(gone)  # its row was deleted: closed
        for name in set(self._probes) - set(self._blocked):
            self._probes.pop(name)  # closed meanwhile (by another replica's probe)
        # Only the destinations this replica serves: another dispatcher's, or the one its
        # URL named before a change, is not this worker's to report.
        shown = {(row.destination, row.state) for row, _ in rows if row.destination in self._served}
        for destination, state in shown | self._shown:
            self.metrics.destination_state.labels(destination, state).set(
                1 if (destination, state) in shown else 0
            )
        self._shown = shown

    def _learn(self, row: dest.Destination, now: datetime) -> None:
        """Take in a row as read."""
        if row.state == dest.CLOSED:
            self._unblock(row.destination)
            return
        if row.destination not in self._blocked:
            self._changed.set()
        self._blocked[row.destination] = row
        self._probe_at[row.destination] = (
            time.monotonic() + (row.next_probe_at - now).total_seconds()
            if row.next_probe_at is not None
            else math.inf  # paused: no probe
        )

    def _unblock(self, destination: str) -> None:
        if self._blocked.pop(destination, None) is not None:
            self._changed.set()
        self._probe_at.pop(destination, None)

    async def _change(self, destination: str, rule: dest.Rule) -> dest.Change:
        async with self.connection() as conn:
            change = await dest.change(conn, self.settings.table, destination, rule)
        self._learn(change.after or change.before, change.now)
        return change
