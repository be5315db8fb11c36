"""The claimer: leases messages into the ledger whenever there is room.

It claims up to a batch at a time (as much as the ledger has room for), claims again at
once after a full claim, and otherwise waits for a NOTIFY (the listener sets `wakeup`; in
ordered mode the finalizer too, when a finalize may have made new heads), for the poll
timer (retries coming due, expired leases), or for room. Each NOTIFY wakes one claim at
most: a claim after a short one, with no NOTIFY since, would find nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any

import psycopg

from outbox import lease
from outbox.models import Message
from outbox.plumbing.waiting import first_of
from outbox.table import shown
from outbox.worker.destination_gate import DestinationGate
from outbox.worker.retry import Stopped
from outbox.worker.service import Service, Shared

log = logging.getLogger("outbox.worker")

# Idle back-off without LISTEN: the first empty claim waits this long, doubling up to the
# poll interval.
IDLE_WAIT_START = 0.05


class Claimer(Service):
    def __init__(
        self,
        shared: Shared,
        *,
        wakeup: asyncio.Event,
        listening: Callable[[], bool],
        on_claimed: Callable[[], None],
        gate: DestinationGate,
        on_refused: Callable[[], Awaitable[None]],
    ) -> None:
        super().__init__(shared)
        self.wakeup = wakeup  # set by NOTIFY, and by a stop
        self.listening = listening
        self.on_claimed = on_claimed  # publishing starts on what came in
        self.gate = gate  # while the publisher's one destination is down, claims are gated
        self.on_refused = on_refused  # says which partition lacks which privilege, and the fix
        self._ordered_claims = lease.OrderedClaims()
        self._sent = 0.0  # monotonic time the last claim was sent

    async def run(self, stop: asyncio.Event) -> None:
        """Claim until `stop` is set."""
        # A stop wakes the idle wait as a NOTIFY does: that wait is then one event and a
        # timer, not three tasks per wake-up.
        stopping = asyncio.ensure_future(stop.wait())
        stopping.add_done_callback(lambda _: self.wakeup.set())
        try:
            await self._claim_until(stop)
        except Stopped:
            pass
        finally:
            stopping.cancel()

    async def _claim_until(self, stop: asyncio.Event) -> None:
        s, ledger = self.settings, self.ledger
        empty_claims = 0
        while not stop.is_set():
            room = ledger.room_to_claim(time.monotonic())
            if not ledger.worth_claiming(room):
                # Wait until publishing or finalizing frees some.
                ledger.room.clear()
                await first_of(stop.wait(), ledger.room.wait())
                continue
            want = ledger.rows_for(ledger.bytes_to_claim(), min(s.batch, room))
            limit = None if self.gate.all_clear else await self.gate.claim_limit()
            if limit == 0:
                # The destination is down: nothing to claim until a probe is due or the
                # breaker closes (another replica's probe).
                await self.gate.wait_to_claim(stop)
                continue
            if limit is not None:
                want = min(want, limit)
            self.wakeup.clear()  # a NOTIFY during the claim must still wake the next wait
            started = time.monotonic()
            messages, full = await self.retry.until_done(
                "claim", partial(self._claim_or_say_why_refused, want), stop=stop
            )
            self.metrics.ready = True  # whichever operation failed before, claiming works
            if limit == 1 and messages:
                self.gate.probe_claimed(messages[0])
            if messages:
                now = time.monotonic()
                ledger.hold(messages, now, claim_seconds=now - started, sent=self._sent)
                self.metrics.in_flight.set(len(ledger.held))
                self.on_claimed()
                empty_claims = 0
                if full:
                    continue  # more is probably there: claim again without waiting
                # All there was: the next claim is not urgent, these messages are. Let
                # their publishing start before another claim is sent.
                await asyncio.sleep(0)
                if not self.listening():
                    continue  # nothing would say that more came
                # Listening, whatever was committed since the claim's snapshot has a
                # NOTIFY coming (one heard during the claim has set `wakeup` already), and
                # in ordered mode the finalizer says when new heads may be ready: a claim
                # now would mostly find nothing.
            else:
                empty_claims += 1
            # Listening, new rows announce themselves: poll only for retries coming due and
            # expired leases. Not listening, back off from a short wait up to the interval.
            idle = s.poll_interval.total_seconds()
            if not self.listening():
                idle = min(idle, IDLE_WAIT_START * 2 ** (empty_claims - 1))
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(idle):
                    await self.wakeup.wait()
            if self.wakeup.is_set():
                empty_claims = 0

    async def _learn_layout(self, conn: Any) -> None:
        """A plain table may have been converted to the partitioned layout since the start
        (`outbox migrate --partition-size`): its claims then go on through the parent, and
        from here on address its partitions."""
        layout = await self.window.learn_layout(conn, self.settings.table)
        if layout is not None:
            log.info(
                "table %s is partitioned now (partitions of %d ids): claims address its "
                "partitions", shown(self.settings.table), layout.partition_size,
            )  # fmt: skip

    async def _claim_or_say_why_refused(self, want: int) -> tuple[list[Message], bool]:
        try:
            return await self._claim(want)
        except psycopg.errors.InsufficientPrivilege:
            await self.on_refused()  # the error names a partition, not what it lacks
            raise

    async def _claim(self, want: int) -> tuple[list[Message], bool]:
        """The messages claimed, and whether the claim was full: `want` of them, or cut
        short by the byte budget or by the end of its partition (plenty more may be
        ready)."""
        s = self.settings
        budget = self.ledger.bytes_to_claim()
        async with self.connection() as conn:
            if self.window.layout_due():
                await self._learn_layout(conn)
            # When the claim that succeeded was sent (not the first attempt's, should the
            # database have been away): the messages' ages at publish count from it.
            self._sent = time.monotonic()
            messages = await lease.claim(
                conn,
                s.table,
                owner=s.owner,
                batch=want,
                lease=s.lease,
                max_attempts=s.max_attempts,
                ordered=s.ordered,
                by_aggregate=self._ordered_claims.by_aggregate,
                prepare=s.prepared_statements or None,
                max_payload_bytes=s.max_payload_bytes,
                claim_bytes=budget,
                window=self.window,
            )
        # A partitioned table's claim that took its partition's last id came back short
        # only for that: the rest is in the next partition, claimed at once.
        full = len(messages) >= want or self.window.ran_out_of_ids
        if messages and not full:
            # Cut short by the byte budget: one more message of the average size would
            # not have fitted.
            taken = sum(len(m.payload_json) for m in messages)
            full = taken + taken / len(messages) > budget
        if s.ordered:
            self._ordered_claims.observe(want if full else len(messages), want)
        self.metrics.claim_batch.observe(len(messages))
        if messages and log.isEnabledFor(logging.DEBUG):  # the history a chaos test checks
            log.debug(
                "claimed %d messages", len(messages),
                extra={"event": "claimed", "owner": s.owner, "ids": [m.id for m in messages],
                       "versions": [m.lease_version for m in messages]},
            )  # fmt: skip
        return messages, full
