"""The finalizer: writes the outcomes the ledger collects, each row fenced on its lease.

All outcomes waiting go in one statement (up to a chunk); while publishes are still
running it first lets them gather for FINALIZE_LINGER. A database that is away is waited
for (the same outcomes do later); a statement the database refuses for good leaves its rows
to their leases, as a publisher bug does.

In ordered mode a finalize is what makes an aggregate's next message its head, and no
NOTIFY announces that: the finalizer wakes the claimer itself, and lingers only behind a
backlog (a linger for publishes in flight would hold back the next heads).
"""

from __future__ import annotations

import asyncio
import collections
import logging
from functools import partial

import psycopg

from outbox import lease
from outbox.models import Outcome, OutcomeKind
from outbox.plumbing import dberrors
from outbox.worker.service import Service, Shared

log = logging.getLogger("outbox.worker")

# Most outcomes written by one finalize statement.
FINALIZE_CHUNK = 1000
# While publishes are still running, how long outcomes gather before they are written: each
# statement costs a round trip on both sides whatever its size, and with a publisher that
# waits outcomes come one by one. Delivery is not delayed, only the row's `done`; a crash
# meanwhile means a redelivery, as it does for a finalize in flight.
FINALIZE_LINGER = 0.01


DONE = OutcomeKind.DONE


def _not_transient(exc: BaseException) -> bool:
    return not dberrors.is_transient(exc)


class Finalizer(Service):
    def __init__(self, shared: Shared, *, wakeup: asyncio.Event) -> None:
        super().__init__(shared)
        self.wakeup = wakeup  # the claimer's: set when a finalize may have made new heads

    async def run(self) -> None:
        """Write outcomes until cancelled."""
        ledger = self.ledger
        while True:
            if not ledger.outcomes:
                ledger.outcomes_waiting.clear()
                await ledger.outcomes_waiting.wait()
                continue
            if len(ledger.outcomes) < FINALIZE_CHUNK and self._more_coming():
                await asyncio.sleep(FINALIZE_LINGER)
            outcomes = ledger.take_outcomes(FINALIZE_CHUNK)
            try:
                applied = await self.retry.until_done(
                    "finalize", partial(self._finalize, outcomes), give_up=_not_transient
                )
            except psycopg.Error:
                self._refused(outcomes)
                continue
            self._applied(outcomes, applied)

    def _more_coming(self) -> bool:
        """Whether outcomes are on their way, worth lingering for. In ordered mode only a
        backlog held counts (its messages wait longer than the linger anyway): a publish in
        flight alone is no reason to hold back the heads the next finalize makes."""
        ledger = self.ledger
        if self.settings.ordered:
            return bool(ledger.waiting)
        return bool(ledger.publishing or ledger.waiting)

    async def _finalize(self, outcomes: list[Outcome]) -> lease.Applied:
        async with self.connection() as conn:
            return await lease.finalize_applied(
                conn,
                self.settings.table,
                outcomes,
                max_defer_age=self.settings.max_defer_age,
                layout=self.window.layout,
            )

    def _applied(self, outcomes: list[Outcome], applied: lease.Applied) -> None:
        ledger = self.ledger
        if log.isEnabledFor(logging.DEBUG):  # the history a chaos test checks
            log.debug(
                "finalized %d outcomes", len(outcomes),
                extra={"event": "finalized", "owner": self.settings.owner,
                       "ids": [o.message_id for o in outcomes],
                       "versions": [o.lease_version for o in outcomes],
                       "outcomes": [o.kind for o in outcomes],
                       "applied": [(o.message_id, o.lease_version) in applied
                                   for o in outcomes]},
            )  # fmt: skip
        counts: collections.Counter[str] = collections.Counter()
        if len(applied) == len(outcomes) and lease.all_done(outcomes):
            # The common case, once per message: every outcome a delivery, every one applied.
            counts[DONE] = len(outcomes)
            ledger.drop_all(outcomes)
        else:
            for outcome in outcomes:
                ended = applied.get((outcome.message_id, outcome.lease_version))
                if ended is None:
                    self._lost_lease(outcome)
                else:  # a defer past the maximum defer age ended dead: count what happened
                    counts["dead" if ended == "dead" else outcome.kind] += 1
                ledger.drop(outcome.message_id, outcome.lease_version)
        ledger.freed()
        if applied and self.settings.ordered:
            # The next message of each aggregate ended here may be its head now.
            self.wakeup.set()
        for label, count in counts.items():
            self.metrics.messages.labels(label).inc(count)
        self.metrics.in_flight.set(len(ledger.held))

    def _refused(self, outcomes: list[Outcome]) -> None:
        """Not the database being away (that is waited for): a batch it will never take.
        Leave these rows to their leases; the attempt limit ends any that keeps failing."""
        log.exception(
            "could not write %d outcomes; their rows are left to their leases", len(outcomes)
        )
        self.metrics.db_errors.labels("finalize").inc()
        self.metrics.messages.labels("error").inc(len(outcomes))
        for outcome in outcomes:
            self.ledger.drop(outcome.message_id, outcome.lease_version)
        self.ledger.freed()

    def _lost_lease(self, outcome: Outcome) -> None:
        self.metrics.lost_leases.inc()
        log.warning(
            "lost lease: message %s lease_version %s was taken over or reaped before its "
            "outcome (%s) was written; the message may be delivered again",
            outcome.message_id, outcome.lease_version, outcome.kind,
            extra={"outbox_id": outcome.message_id, "lease_version": outcome.lease_version},
        )  # fmt: skip
