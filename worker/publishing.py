"""Publishing: claimed messages out of the ledger, through the publisher, back as outcomes.

Two paths, by what the publisher offers:

- a **batch publisher** (`publish_batch`) is handed up to a batch of waiting messages at a
  time, a few calls in flight, and reports a result per message: clients that batch
  natively (Kafka's producer, JetStream's asynchronous publishes) send the batch and
  gather the acknowledgements at once;
- a **per-message publisher** (`publish`, the plugin API's simple form) is run by up to
  `concurrency` long-lived tasks that each take the next waiting message, publish it under
  the publish timeout (one timer for all, see in_flight) and turn the result into an
  outcome.

Either way the result is classified once, here: success, a retryable failure (retried with
full-jitter back-off until the attempts run out), a permanent one (dead) or a defer.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from datetime import timedelta

from outbox.models import Message, Outcome
from outbox.plumbing.waiting import cancel_and_wait
from outbox.worker import tracing
from outbox.worker.backoff import retry_delay
from outbox.worker.destination_gate import DestinationGate
from outbox.worker.in_flight import InFlight
from outbox.worker.publishers.base import (
    Defer,
    PermanentError,
    PublisherBase,
    RetryableError,
    reason,
)
from outbox.worker.rate_limit import RateLimiter
from outbox.worker.service import Service, Shared
from outbox.worker.settings import WorkerSettings

log = logging.getLogger("outbox.worker")

# Calls of a batch publisher in flight at once: one batch being acknowledged while the next
# is sent.
BATCHES_IN_FLIGHT = 2
# Ages at publish (and publish durations) a one-by-one publishing task keeps before observing
# them at once: a task that never runs dry (a slow publisher, a steady backlog) still shows
# them within this many.
AGES_HELD = 64


class Classifier:
    """A publish's result as the outcome the finalizer writes."""

    def __init__(self, settings: WorkerSettings) -> None:
        self.settings = settings
        self.timed_out = (
            f"retryable: publish timed out after {settings.publish_timeout.total_seconds():g}s"
        )

    def outcome(self, message: Message, error: BaseException | None) -> Outcome:
        if error is None:
            return Outcome.done(message)
        if isinstance(error, TimeoutError):
            return self.retry_or_dead(message, self.timed_out)
        if isinstance(error, Defer):
            return Outcome.defer(message, error.delay, reason(error))
        if isinstance(error, PermanentError):
            return Outcome.dead(message, f"permanent: {reason(error)}")
        if isinstance(error, RetryableError):
            return self.retry_or_dead(
                message, f"retryable: {reason(error)}", retry_after=error.retry_after
            )
        raise error  # fits no failure class: the caller treats it as a bug

    def retry_or_dead(
        self, message: Message, error: str, *, retry_after: timedelta | None = None
    ) -> Outcome:
        s = self.settings
        if message.attempts >= s.max_attempts:
            return Outcome.dead(message, f"retries exhausted ({message.attempts}); last {error}")
        delay = retry_delay(
            message.attempts, retry_after=retry_after, base=s.backoff_base, cap=s.backoff_cap
        )
        return Outcome.retry(message, delay, error)


class Publishing(Service):
    """Runs the publisher over what the ledger holds; `start()` after each claim. The
    destination gate says before each send whether it may go, and hears each result; the
    rate limiter, when there is one, gives a token per send."""

    def __init__(
        self,
        shared: Shared,
        publisher: PublisherBase,
        gate: DestinationGate,
        limiter: RateLimiter | None = None,
    ) -> None:
        super().__init__(shared)
        settings = self.settings
        self.publisher = publisher
        self.gate = gate
        self.limiter = limiter
        self.classifier = Classifier(settings)
        self.in_flight = InFlight(settings.publish_timeout.total_seconds())
        self.tasks: set[asyncio.Task[None]] = set()
        # The publisher's own calls, or the same making publish spans (worker/tracing.py).
        self._publish, batch = tracing.publish_calls(publisher, settings.otel_parent)
        self._publish_batch = batch
        if batch is not None:
            self._run, self._most = self._publish_batches, BATCHES_IN_FLIGHT
        else:
            self._run, self._most = self._publish_one_by_one, settings.concurrency

    def start(self) -> None:
        """Enough tasks for what is waiting beside what is publishing. A few long-lived
        tasks rather than one per message: creating tasks was a tenth of the worker's CPU
        with a fast publisher."""
        ledger = self.ledger
        # A task busy with a publish is no free hand for what is waiting: count both.
        wanted = min(self._most, ledger.publishing + len(ledger.waiting))
        # A finished task may still be in the set until its done-callback runs.
        alive = sum(1 for task in self.tasks if not task.done())
        for _ in range(wanted - alive):
            task = asyncio.create_task(self._run())
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)

    async def stop(self, grace: float) -> None:
        """Let publishes in flight finish within `grace`; abandon the rest (given back: the
        id de-duplicates downstream). A task that drops its cancellation is cancelled again:
        one waiting for send tokens would otherwise wait for them as long as it takes."""
        if not self.tasks:
            return
        _, late = await asyncio.wait(list(self.tasks), timeout=grace)
        await cancel_and_wait(late)

    def close(self) -> None:
        self.in_flight.close()

    # -- one by one -------------------------------------------------------------------------

    async def _publish_one_by_one(self) -> None:
        """Publish waiting messages one after the other until none is waiting."""
        task = asyncio.current_task()
        assert task is not None
        ledger, gate = self.ledger, self.gate
        put_outcome, done, delivered = ledger.put_outcome, Outcome.done, gate.delivered
        limiter, destination_of = self.limiter, self.publisher.destination_of
        publish, in_flight = self._publish, self.in_flight
        assert publish is not None
        clock, monotonic = time.perf_counter, time.monotonic
        # Each message's age as its publish starts and its publish's duration, kept here
        # and observed AGES_HELD at a time and as the loop ends: an observation per message
        # in Python cost as much as the rest of the loop's own steps. ledger.ages inlined
        # for the same reason.
        ages: list[float] = []
        durations: list[float] = []
        age, took, created_at = ages.append, durations.append, ledger.created_at
        try:
            while (message := ledger.take_one(now := monotonic())) is not None:
                try:
                    if not gate.all_clear and (hold := await gate.before(message)) is not None:
                        ledger.published()
                        ledger.put_outcome(Outcome.release(message, hold))  # unsent, refunded
                        continue
                    if limiter is not None:
                        await limiter.acquire(destination_of(message))
                        now = monotonic()  # the token may have been waited for
                except asyncio.CancelledError:
                    # A stop, after the grace period, before the send (waiting for a token):
                    # given back, not left held until the stop gives up waiting for it.
                    ledger.published()
                    ledger.put_outcome(Outcome.release(message))
                    raise
                # The take's clock reading, not one more: a clock read costs as much as the
                # rest of the observation on some virtual machines.
                age(now - created_at[message.id])
                if len(ages) >= AGES_HELD:
                    self._observe(ages, durations)
                started = clock()
                error: BaseException | None = None
                try:
                    await in_flight.publish(
                        (message.id, message.lease_version), task, publish(message)
                    )
                except asyncio.CancelledError:
                    # A stop, after the grace period: abandon it and give it back.
                    ledger.published()
                    ledger.put_outcome(Outcome.release(message))
                    raise
                except Exception as exc:
                    error = exc
                finally:
                    took(clock() - started)
                ledger.published()
                if error is None and delivered(message):
                    put_outcome(done(message))
                else:
                    await self._settle(message, error)
        finally:
            self._observe(ages, durations)
        ledger.ran_dry(time.monotonic())  # publishing freed room for the next claim

    def _observe(self, ages: list[float], durations: list[float]) -> None:
        """The ages at publish and publish durations a one-by-one task kept, observed at
        once (and forgotten)."""
        self.metrics.age_at_publish.observe_all(ages)
        self.metrics.publish_seconds.observe_all(durations)
        ages.clear()
        durations.clear()

    async def _settle(self, message: Message, error: BaseException | None) -> None:
        """The outcome of a publish that failed, or of any publish while this replica
        probes a destination: the destination gate hears of it first."""
        failure, retry_after = None, None
        if isinstance(error, RetryableError):
            failure, retry_after = reason(error), error.retry_after
        elif isinstance(error, TimeoutError):
            failure = self.classifier.timed_out
        # None for a delivery or a refusal for the message's own reason: the destination
        # answered.
        try:
            hold = await self.gate.after(message, failure, retry_after)
        except asyncio.CancelledError:
            # A stop, after the grace period, while the gate reported the result (its write
            # may wait for the database). The publish happened: its outcome still goes, as
            # the message's own, rather than be lost to the lease (a delivery sent again, a
            # failure forgotten); only the gate's bookkeeping is skipped.
            self._settle_unreported(message, error)
            raise
        if hold is not None:  # the destination's failure, not the message's
            self.ledger.put_outcome(Outcome.release(message, hold))
            return
        self._settle_unreported(message, error)

    def _settle_unreported(self, message: Message, error: BaseException | None) -> None:
        """The outcome of a publish as the message's own, without the destination gate (as
        when the gate cannot reach the database): done, retried, deferred or dead."""
        try:
            outcome = self.classifier.outcome(message, error)
        except Exception:
            self._unclassified(message, error)
        else:
            self.ledger.put_outcome(outcome)

    def _unclassified(self, message: Message, error: BaseException | None) -> None:
        """Fits no failure class: a bug. Leave the row to its lease; the attempt limit
        stops it if it keeps happening."""
        log.error(
            "unclassified error publishing message %s (lease_version %s); leaving it to its "
            "lease", message.id, message.lease_version,
            exc_info=error, extra={"outbox_id": message.id, "lease_version": message.lease_version},
        )  # fmt: skip
        self.metrics.messages.labels("error").inc()
        self.ledger.forget(message.id, message.lease_version)

    # -- in batches -------------------------------------------------------------------------

    async def _publish_batches(self) -> None:
        """Hand the publisher batches of waiting messages until none is waiting. A batch
        publisher has one destination (its cluster), so a batch shares one fate."""
        ledger, s, gate, limiter = self.ledger, self.settings, self.gate, self.limiter
        publish_batch = self._publish_batch
        assert publish_batch is not None
        timeout = s.publish_timeout.total_seconds()
        destination = self.publisher.one_destination()
        while ledger.waiting:
            want = min(s.batch, len(ledger.waiting))
            if limiter is not None:
                want = await limiter.acquire(destination, want)
            messages = ledger.take(want, time.monotonic())
            if not gate.all_clear:
                allowed: list[Message] = []
                for index, message in enumerate(messages):
                    try:
                        hold = await gate.before(message)
                    except asyncio.CancelledError:  # a stop: what is not decided yet goes back
                        unsent = [*allowed, *messages[index:]]
                        ledger.published(len(unsent))
                        ledger.put_outcomes(Outcome.release(m) for m in unsent)
                        raise
                    if hold is None:
                        allowed.append(message)
                    else:
                        ledger.published()
                        ledger.put_outcome(Outcome.release(message, hold))
                messages = allowed
            if not messages:
                continue
            self.metrics.age_at_publish.observe_all(ledger.ages(messages, time.monotonic()))
            started = time.perf_counter()
            results: Sequence[BaseException | None]
            try:
                async with asyncio.timeout(timeout):
                    results = await publish_batch(messages)
                if len(results) != len(messages):
                    raise RuntimeError(
                        f"{self.publisher.name}.publish_batch returned {len(results)} results "
                        f"for {len(messages)} messages"
                    )
            except TimeoutError as exc:
                results = [exc] * len(messages)
            except asyncio.CancelledError:
                ledger.published(len(messages))
                ledger.put_outcomes(Outcome.release(m) for m in messages)
                raise
            except Exception as exc:
                results = [exc] * len(messages)
            elapsed = time.perf_counter() - started
            ledger.published(len(messages))
            if results.count(None) == len(messages) and gate.delivered(messages[-1]):
                # The common case: every message delivered. One outcome list and one
                # observation for the batch, no step per message in Python.
                ledger.put_outcomes(Outcome.all_done(messages))
                self.metrics.publish_seconds.observe_many(elapsed, len(messages))
                continue
            self.metrics.publish_seconds.observe_many(elapsed, len(messages))
            delivered = [m for m, error in zip(messages, results, strict=True) if error is None]
            # While this replica probes, every result goes to the gate (one may close the
            # breaker); decided once for the batch, so that no delivery goes unrecorded.
            settle_all = not delivered or not gate.delivered(delivered[-1])
            if not settle_all:
                ledger.put_outcomes(map(Outcome.done, delivered))
            settling = [
                (message, error)
                for message, error in zip(messages, results, strict=True)
                if error is not None or settle_all
            ]
            for index, (message, error) in enumerate(settling):
                try:
                    await self._settle(message, error)
                except asyncio.CancelledError:
                    # A stop while the gate heard one of them (`_settle` kept its outcome):
                    # the results not told yet are outcomes all the same.
                    for unreported, its_error in settling[index + 1 :]:
                        self._settle_unreported(unreported, its_error)
                    raise
        ledger.ran_dry(time.monotonic())
