"""The lease loop: claim a batch, publish outside any transaction, finalize fenced.

Three tasks share the work, each on its own pooled connection, so that database round trips
overlap with publishing:

- the claimer leases up to `batch` messages whenever there is room, and wakes on NOTIFY or
  the poll timer. At most `2 * batch + concurrency` are held in all (the extra batch is
  outcomes being written), and at most `batch + concurrency` wait or publish. A publisher
  that outpaces the database gets one batch more: the next claim then goes out as soon as
  the last one is in, and its round trip overlaps the publishing of that batch and the
  finalizing of the one before. After a claim that took all there was, the claimer lets
  those messages start publishing before it claims again;
- up to `concurrency` publishing tasks take claimed messages in order, publish each under
  the publish timeout (one timer for all, see in_flight) and turn the result into an
  Outcome;
- the finalizer writes outcomes as they arrive, all that are waiting in one statement,
  each row fenced on its own lease_version; while publishes are still running it first
  lets them gather for FINALIZE_LINGER.

A heartbeat extends the leases of messages held for a third of the lease. On stop, claiming
ends, unstarted messages are released at once (attempt refunded), in-flight publishes get
the grace period, and the finalizer drains before the pool closes.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import TypeVar

import psycopg
from psycopg_pool import AsyncConnectionPool

from outbox import dberrors, lease
from outbox.models import Message, Outcome
from outbox.queries import queries
from outbox.schema import check_table
from outbox.settings import (
    SettingError,
    connect_options,
    connect_timeout,
    describe_dsn,
    redact_dsn,
    redact_urls,
)
from outbox.worker.backoff import retry_delay
from outbox.worker.in_flight import InFlight
from outbox.worker.metrics import Metrics
from outbox.worker.publishers.base import Defer, PermanentError, Publisher, RetryableError
from outbox.worker.publishers.registry import load_publisher, shown_values
from outbox.worker.settings import WorkerSettings

log = logging.getLogger("outbox.worker")

T = TypeVar("T")

# Most outcomes written by one finalize statement.
FINALIZE_CHUNK = 1000
# While publishes are still running, how long the finalizer lets outcomes gather before it
# writes them. Each statement costs a round trip on both sides whatever its size; with a
# publisher that waits, outcomes come one by one, and writing each few at once made the
# finalize most of the worker's and the database's cost per message. Delivery is not
# delayed: only the row's `done` is, and a crash meanwhile means a redelivery, as it does
# for a finalize in flight.
FINALIZE_LINGER = 0.01
# Idle back-off without LISTEN: the first empty claim waits this long, doubling up to the
# poll interval.
IDLE_WAIT_START = 0.05
# psycopg prepares any statement run `prepare_threshold` times, and None turns off even the
# explicit `prepare=True`. Only the claims are prepared (their generic plans are guarded by
# tests); a threshold never reached keeps the batched unnest statements unprepared, since a
# generic plan of theirs may be many times slower.
EXPLICIT_PREPARE_ONLY = 2**31 - 1
# How long an operation waits for a pooled connection before it counts as a database error.
POOL_TIMEOUT = 10.0
# Shortest wait between two heartbeat rounds.
HEARTBEAT_MIN_WAIT = 0.05
# Pooled connections: the claimer's and the finalizer's, open from the start so that the
# first burst does not wait for a second connection to be made; up to two more for the
# heartbeat and for an operation that overlaps another. The listener has its own.
POOL_MIN, POOL_MAX = 2, 4
# Most seconds closing the pool waits for its background workers.
POOL_CLOSE_TIMEOUT = 0.5
# Reconnect back-off after a database error.
DB_RETRY_START, DB_RETRY_CAP = 0.1, 5.0


class Dispatcher:
    def __init__(
        self,
        settings: WorkerSettings,
        publisher: Publisher,
        metrics: Metrics | None = None,
    ) -> None:
        self.settings = settings
        self.publisher = publisher
        self.metrics = metrics or Metrics()
        self._held: dict[int, Message] = {}  # claimed, not finalized yet
        self._renewed_at: dict[int, float] = {}  # monotonic time of claim or last extension
        self._waiting: collections.deque[Message] = collections.deque()  # not started yet
        self._in_flight = InFlight(settings.publish_timeout.total_seconds())
        self._publishers: set[asyncio.Task[None]] = set()
        self._pool_check: asyncio.Task[None] | None = None
        # Outcomes not written yet, and the event that wakes the finalizer for them (a deque
        # and an event cost less per message than an asyncio.Queue).
        self._outcomes: collections.deque[Outcome] = collections.deque()
        self._outcomes_waiting = asyncio.Event()
        self._room = asyncio.Event()  # set when publishing or finalizing frees room to claim
        self._wakeup = asyncio.Event()  # set by NOTIFY
        self._drained = asyncio.Event()  # set when nothing is held
        self._drained.set()
        self.listening = False  # a LISTEN connection is up
        self._ordered_claims = lease.OrderedClaims()
        # How long the last claim that found messages took; when the last batch came in, and
        # how long after that everything waiting had started publishing.
        self._claim_seconds = 0.0
        self._held_at = 0.0
        self._published_in = 0.0
        self._pool: AsyncConnectionPool[psycopg.AsyncConnection[tuple[object, ...]]] | None = None

    # -- life cycle ---------------------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        """Dispatch until `stop` is set, then shut down cleanly."""
        s = self.settings
        self._pool = AsyncConnectionPool(
            s.dsn,
            min_size=POOL_MIN,
            max_size=POOL_MAX,
            open=False,
            name="outbox-worker",
            kwargs={
                "autocommit": True,
                "prepare_threshold": EXPLICIT_PREPARE_ONLY if s.prepared_statements else None,
                "application_name": s.owner,
                **connect_options(s.dsn),
            },
            # Long enough for one connection attempt of the DSN's own connect_timeout.
            timeout=max(POOL_TIMEOUT, float(connect_timeout(s.dsn))),
        )
        await self._pool.open(wait=False)
        try:
            if not await self._until_stopped(self._check_table, stop, "check table"):
                return
            self.metrics.ready = True
            log.info(
                "worker %s dispatching %s from %s (%s publisher%s, ordering %s, %s event loop)",
                s.owner, s.table, redact_dsn(s.dsn) or "PG* environment", self.publisher.name,
                self._publisher_options(), s.ordering, _loop_name(),
            )  # fmt: skip
            helpers = [
                asyncio.create_task(self._finalizer(), name="finalizer"),
                asyncio.create_task(self._heartbeat(), name="heartbeat"),
                asyncio.create_task(self._listen(), name="listener"),
            ]
            for task in helpers:
                task.add_done_callback(lambda t: self._helper_ended(t, stop))
            try:
                try:
                    await self._claimer(stop)
                finally:
                    await self._shutdown()  # even after a bug: give back what is held
            finally:
                for task in helpers:
                    task.cancel()
                await asyncio.gather(*helpers, return_exceptions=True)
                self._in_flight.close()
        finally:
            self.metrics.ready = False
            if self._pool_check is not None:
                self._pool_check.cancel()
                await asyncio.gather(self._pool_check, return_exceptions=True)
            # Its background workers may be stuck connecting to a server that never answers:
            # abandon them rather than make a stop wait for their connect timeout.
            await self._pool.close(timeout=POOL_CLOSE_TIMEOUT)

    def _publisher_options(self) -> str:
        """` http-url=...` for the start-up line: the options given, secrets masked."""
        try:
            factory = load_publisher(self.settings.publisher)
        except SettingError:  # a publisher made in code, not by name
            return ""
        shown = shown_values(factory.options, self.settings.publisher_options)
        return f" {shown}" if shown else ""

    def _helper_ended(self, task: asyncio.Task[None], stop: asyncio.Event) -> None:
        """The finalizer, heartbeat and listener run until cancelled; ending otherwise is a
        bug. Stop the worker rather than go on without them (outcomes would pile up)."""
        if task.cancelled():
            return
        log.error(
            "the %s task ended unexpectedly; stopping the worker", task.get_name(),
            exc_info=task.exception(),
        )  # fmt: skip
        stop.set()

    async def _check_table(self) -> None:
        # A connection of its own, not the pool's: a failure then says why (role or database
        # missing, refused, ...), where the pool would only report a timeout.
        s = self.settings
        async with await psycopg.AsyncConnection.connect(
            s.dsn, autocommit=True, application_name=s.owner, **connect_options(s.dsn)
        ) as conn:
            await check_table(conn, s.table, ordered=s.ordered)

    async def _shutdown(self) -> None:
        s = self.settings
        unstarted = list(self._waiting)
        self._waiting.clear()
        log.info(
            "stopping: releasing %d unstarted messages, waiting up to %.1fs for %d in flight",
            len(unstarted), s.shutdown_grace.total_seconds(), len(self._in_flight),
        )  # fmt: skip
        for message in unstarted:
            self._put_outcome(Outcome.release(message))
        if self._publishers:
            _, late = await asyncio.wait(
                list(self._publishers), timeout=s.shutdown_grace.total_seconds()
            )
            for task in late:
                task.cancel()  # abandoned publishes are released too; the id dedups downstream
            await asyncio.gather(*late, return_exceptions=True)
        # Outcomes are queued; let the finalizer write them all (it retries database errors).
        try:
            await asyncio.wait_for(self._drained.wait(), timeout=max(10.0, s.lease.total_seconds()))
        except TimeoutError:
            log.error(
                "stopping with %d messages unfinalized: their leases will expire and others "
                "will take them over", len(self._held),
            )  # fmt: skip

    # -- claiming -----------------------------------------------------------------------------

    async def _claimer(self, stop: asyncio.Event) -> None:
        # A stop wakes the idle wait as a NOTIFY does: that wait is then one event and a
        # timer, where waiting on three things took three tasks per wake-up (0.2 ms of the
        # 0.3 ms from NOTIFY to claim at light load).
        stopping = asyncio.ensure_future(stop.wait())
        stopping.add_done_callback(lambda _: self._wakeup.set())
        try:
            await self._claim_until(stop)
        finally:
            stopping.cancel()

    async def _claim_until(self, stop: asyncio.Event) -> None:
        s = self.settings
        empty_claims = 0
        db_failures = 0
        while not stop.is_set():
            room = self._room_to_claim()
            if room < min(s.batch, max(1, s.batch // 2)) and self._held:
                # Not enough room for a worthwhile claim: wait until publishing or finalizing
                # frees some.
                self._room.clear()
                await _first_of(stop.wait(), self._room.wait())
                continue
            want = min(s.batch, room)
            self._wakeup.clear()  # a NOTIFY during the claim must still wake the next wait
            started = time.monotonic()
            try:
                messages = await self._claim(want)
            except (psycopg.Error, OSError) as exc:
                db_failures += 1
                delay = self._database_error("claim", exc, db_failures)
                await _first_of(stop.wait(), asyncio.sleep(delay))
                continue
            if db_failures:
                log.info("database reachable again")
                db_failures = 0
            self.metrics.ready = True  # whichever operation failed before, claiming works
            if messages:
                self._claim_seconds = time.monotonic() - started
                self._hold(messages)
                empty_claims = 0
                if len(messages) < want:
                    # All there was: the next claim is not urgent, these messages are. Let
                    # their publishing start before the claim is sent (half a millisecond
                    # sooner at light load).
                    await asyncio.sleep(0)
                # Claim again without waiting: after a full batch, more is probably there;
                # after a short one, a NOTIFY during the claim may have announced more.
                continue
            empty_claims += 1
            # Listening, new rows announce themselves: poll only for retries coming due and
            # expired leases. Not listening, back off from a short wait up to the interval.
            idle = s.poll_interval.total_seconds()
            if not self.listening:
                idle = min(idle, IDLE_WAIT_START * 2 ** (empty_claims - 1))
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(idle):
                    await self._wakeup.wait()
            if self._wakeup.is_set():
                empty_claims = 0

    def _room_to_claim(self) -> int:
        """How many messages the next claim may ask for.

        At most `2 * batch + concurrency` may be held: one batch's outcomes being written
        while the next is published. Of those, at most `batch + concurrency` may be waiting
        or publishing; a publisher faster than the database (the last batch was published
        in less time than a claim takes) gets one batch more. The next claim then goes out
        as soon as the last one is in, so its round trip overlaps publishing instead of
        following it. A slower publisher is not claimed ahead of: its messages would wait,
        leased, while other workers could publish them.
        """
        s = self.settings
        unpublished = len(self._waiting) + len(self._in_flight)
        limit = s.batch + s.concurrency
        if self._publishing_outpaces_claims():
            limit += s.batch
        held_limit = 2 * s.batch + s.concurrency
        return min(limit - unpublished, held_limit - len(self._held))

    async def _claim(self, want: int) -> list[Message]:
        s = self.settings
        assert self._pool is not None
        async with self._pool.connection() as conn:
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
            )
        self._ordered_claims.observe(len(messages), want)
        self.metrics.claim_batch.observe(len(messages))
        if messages and log.isEnabledFor(logging.DEBUG):  # the history a chaos test checks
            log.debug(
                "claimed %d messages", len(messages),
                extra={"event": "claimed", "owner": s.owner, "ids": [m.id for m in messages],
                       "versions": [m.lease_version for m in messages]},
            )  # fmt: skip
        return messages

    def _publishing_outpaces_claims(self) -> bool:
        """The last batch in had all started publishing sooner than a claim takes, and no
        message waiting now has waited that long."""
        waited = self._published_in
        if self._waiting:
            oldest = self._waiting[0].id
            waited = max(waited, time.monotonic() - self._renewed_at.get(oldest, self._held_at))
        return waited < self._claim_seconds

    def _hold(self, messages: list[Message]) -> None:
        now = self._held_at = time.monotonic()
        for message in messages:
            self._held[message.id] = message
            self._renewed_at[message.id] = now
        self._waiting.extend(messages)
        self._drained.clear()
        self.metrics.in_flight.set(len(self._held))
        # A few long-lived publishing tasks instead of one task per message: creating tasks
        # was a tenth of the worker's CPU time with a fast publisher.
        # A finished task may still be in the set until its done-callback runs: count live ones.
        alive = sum(1 for task in self._publishers if not task.done())
        wanted = min(self.settings.concurrency, len(self._waiting)) - alive
        for _ in range(wanted):
            task = asyncio.create_task(self._publish_waiting())
            self._publishers.add(task)
            task.add_done_callback(self._publishers.discard)

    # -- publishing ---------------------------------------------------------------------------

    async def _publish_waiting(self) -> None:
        """Publish claimed messages one after the other until none is waiting."""
        task = asyncio.current_task()
        assert task is not None
        half_a_batch = self.settings.batch // 2
        while self._waiting:
            message = self._waiting.popleft()
            if len(self._waiting) == half_a_batch:
                # Room for a worthwhile claim now, whatever the finalizer does: wake the
                # claimer, so the next batch comes in before publishing runs dry.
                self._room.set()
            started = time.perf_counter()
            outcome: Outcome | None
            try:
                outcome = await self._publish(message, task)
            except asyncio.CancelledError:
                # Shutdown, after the grace period: abandon it and give it back.
                self._put_outcome(Outcome.release(message))
                raise
            except Exception:
                # Fits no failure class: a bug. Leave the row to its lease; the attempt
                # limit stops it if it keeps happening.
                log.exception(
                    "unclassified error publishing message %s (lease_version %s); leaving "
                    "it to its lease", message.id, message.lease_version,
                    extra={"outbox_id": message.id, "lease_version": message.lease_version},
                )  # fmt: skip
                self.metrics.messages.labels("error").inc()
                self._forget(message.id, message.lease_version)
                outcome = None
            finally:
                self.metrics.publish_seconds.observe(time.perf_counter() - started)
            if outcome is not None:
                self._put_outcome(outcome)
        # Every claimed message has started: room for the next claim, if the finalizer
        # leaves some.
        self._published_in = time.monotonic() - self._held_at
        self._room.set()

    async def _publish(self, message: Message, task: asyncio.Task[None]) -> Outcome:
        s = self.settings
        try:
            key = (message.id, message.lease_version)
            await self._in_flight.publish(key, task, self.publisher.publish(message))
        except TimeoutError:
            return self._retry_or_dead(
                message,
                f"retryable: publish timed out after {s.publish_timeout.total_seconds():g}s",
            )
        except Defer as defer:
            return Outcome.defer(message, defer.delay, _reason(defer))
        except PermanentError as exc:
            return Outcome.dead(message, f"permanent: {_reason(exc)}")
        except RetryableError as exc:
            return self._retry_or_dead(
                message, f"retryable: {_reason(exc)}", retry_after=exc.retry_after
            )
        return Outcome.done(message)

    def _retry_or_dead(
        self, message: Message, error: str, *, retry_after: timedelta | None = None
    ) -> Outcome:
        s = self.settings
        if message.attempts >= s.max_attempts:
            return Outcome.dead(message, f"retries exhausted ({message.attempts}); last {error}")
        delay = retry_delay(
            message.attempts, retry_after=retry_after, base=s.backoff_base, cap=s.backoff_cap
        )
        return Outcome.retry(message, delay, error)

    # -- finalizing ---------------------------------------------------------------------------

    async def _finalizer(self) -> None:
        while True:
            if not self._outcomes:
                self._outcomes_waiting.clear()
                await self._outcomes_waiting.wait()
                continue
            if len(self._outcomes) < FINALIZE_CHUNK and (self._in_flight or self._waiting):
                await asyncio.sleep(FINALIZE_LINGER)  # more are on their way
            waiting = self._outcomes
            outcomes = [waiting.popleft() for _ in range(min(len(waiting), FINALIZE_CHUNK))]
            try:
                applied = await self._with_retries("finalize", self._finalize, outcomes)
            except psycopg.Error:
                # Not the database being away (that is retried): a batch it will never take.
                # Leave these rows to their leases, as for a publisher bug; the attempt limit
                # ends any that keeps failing.
                log.exception(
                    "could not write %d outcomes; their rows are left to their leases",
                    len(outcomes),
                )
                self.metrics.db_errors.labels("finalize").inc()
                self.metrics.messages.labels("error").inc(len(outcomes))
                for outcome in outcomes:
                    self._forget(outcome.message_id, outcome.lease_version)
                continue
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
            for outcome in outcomes:
                ended = applied.get((outcome.message_id, outcome.lease_version))
                if ended is None:
                    self._lost_lease(outcome)
                else:  # a defer past the maximum defer age ended dead: count what happened
                    counts["dead" if ended == "dead" else outcome.kind] += 1
                self._drop(outcome.message_id, outcome.lease_version)
            self._freed()
            for label, count in counts.items():
                self.metrics.messages.labels(label).inc(count)
            self.metrics.in_flight.set(len(self._held))

    def _put_outcome(self, outcome: Outcome) -> None:
        self._outcomes.append(outcome)
        self._outcomes_waiting.set()

    async def _finalize(self, outcomes: list[Outcome]) -> lease.Applied:
        assert self._pool is not None
        async with self._pool.connection() as conn:
            return await lease.finalize_applied(
                conn, self.settings.table, outcomes, max_defer_age=self.settings.max_defer_age
            )

    def _lost_lease(self, outcome: Outcome) -> None:
        self.metrics.lost_leases.inc()
        log.warning(
            "lost lease: message %s lease_version %s was taken over or reaped before its "
            "outcome (%s) was written; the message may be delivered again",
            outcome.message_id, outcome.lease_version, outcome.kind,
            extra={"outbox_id": outcome.message_id, "lease_version": outcome.lease_version},
        )  # fmt: skip

    def _forget(self, message_id: int, lease_version: int) -> None:
        self._drop(message_id, lease_version)
        self._freed()

    def _drop(self, message_id: int, lease_version: int) -> None:
        held = self._held.get(message_id)
        if held is not None and held.lease_version == lease_version:  # not a newer claim
            del self._held[message_id]
            self._renewed_at.pop(message_id, None)

    def _freed(self) -> None:
        """After dropping held messages (once per batch, not per message): wake the claimer,
        and the shutdown once nothing is held."""
        self._room.set()
        if not self._held:
            self._drained.set()

    # -- heartbeat and notifications ----------------------------------------------------------

    async def _heartbeat(self) -> None:
        s = self.settings
        # Renew a lease once a third of it has passed, checking twice as often, so a renewal
        # that fails (database away) has another chance well before the lease runs out.
        third = s.lease.total_seconds() / 3
        failures = 0
        while True:
            # The settings refuse leases under a second; a dispatcher built in code with a
            # smaller one still must not spin.
            await asyncio.sleep(max(third / 2, HEARTBEAT_MIN_WAIT))
            now = time.monotonic()
            due = [m for i, m in self._held.items() if now - self._renewed_at.get(i, now) >= third]
            if not due:
                continue
            try:
                renewed = await self._extend(due)
            except (psycopg.Error, OSError) as exc:
                failures += 1
                self._database_error("extend leases", exc, failures, retry_in=third / 2)
                continue  # the next round tries again, well before the leases run out
            failures = 0
            for message_id in renewed:
                if message_id in self._renewed_at:
                    self._renewed_at[message_id] = now
            log.debug("extended %d of %d leases", len(renewed), len(due))

    async def _extend(self, messages: list[Message]) -> set[int]:
        assert self._pool is not None
        async with self._pool.connection() as conn:
            return await lease.extend(
                conn, self.settings.table, messages, lease=self.settings.lease
            )

    async def _listen(self) -> None:
        """Wake the claimer on NOTIFY; reconnects by itself. Polling covers any gap."""
        s = self.settings
        failures = 0
        while True:
            try:
                async with await psycopg.AsyncConnection.connect(
                    s.dsn,
                    autocommit=True,
                    application_name=f"{s.owner} listener",
                    **connect_options(s.dsn),
                ) as conn:
                    await conn.execute(queries(s.table).listen)
                    failures = 0
                    self.listening = True
                    self._wakeup.set()  # anything may have arrived while we were not listening
                    async for _ in conn.notifies():
                        self._wakeup.set()
            except (psycopg.Error, OSError) as exc:
                self.listening = False
                failures += 1
                await asyncio.sleep(self._database_error("listen", exc, failures))

    # -- helpers ------------------------------------------------------------------------------

    async def _with_retries(
        self, operation: str, call: Callable[[list[Outcome]], Awaitable[T]], arg: list[Outcome]
    ) -> T:
        failures = 0
        while True:
            try:
                return await call(arg)
            except (psycopg.Error, OSError) as exc:
                if not dberrors.is_transient(exc):
                    raise  # the same batch would fail the same way: the caller gives it up
                # The database is away or the connection broke: the same batch will do later.
                failures += 1
                await asyncio.sleep(self._database_error(operation, exc, failures))

    async def _until_stopped(
        self, call: Callable[[], Awaitable[None]], stop: asyncio.Event, operation: str
    ) -> bool:
        """Retry `call` on database errors until it succeeds (True) or stop is set (False).

        A stop ends an attempt in progress at once (a server that never answers would hold
        it for the whole connect timeout). A connection refused for good (no such role or
        database, authentication failed) raises SettingError: waiting would not fix it.
        """
        failures = 0
        while not stop.is_set():
            attempt = asyncio.ensure_future(call())
            if not await _first_of(stop.wait(), asyncio.shield(attempt), first=attempt.done):
                attempt.cancel()
                await asyncio.gather(attempt, return_exceptions=True)
                return False
            try:
                attempt.result()
                return True
            except (psycopg.Error, OSError) as exc:
                if dberrors.is_permanent_connection_failure(exc):
                    raise SettingError(
                        f"--dsn: cannot connect to {describe_dsn(self.settings.dsn)}: "
                        f"{dberrors.describe(exc)}"
                    ) from None
                failures += 1
                delay = self._database_error(operation, exc, failures)
                await _first_of(stop.wait(), asyncio.sleep(delay))
        return False

    def _database_error(
        self, operation: str, exc: BaseException, failures: int, retry_in: float | None = None
    ) -> float:
        """Count and report a failed database operation; returns how long to wait before
        trying again: a growing back-off when the error may pass by itself, the longest
        one when it will not (the statement cannot work until a person changes something)."""
        self.metrics.db_errors.labels(operation).inc()
        if operation != "listen":
            self.metrics.ready = False
            self._check_pool()
        transient = dberrors.is_transient(exc)
        delay = retry_in if retry_in is not None else _db_backoff(failures)
        if not transient and retry_in is None:
            delay = max(delay, DB_RETRY_CAP)
        # One line per streak start, then every 10th, so an outage does not flood the log.
        if failures == 1 or failures % 10 == 0:
            log.log(
                logging.WARNING if transient else logging.ERROR,
                "%s failed (%s, attempt %d) on %s: %s; %sretrying in %.1fs",
                operation, type(exc).__name__, failures, describe_dsn(self.settings.dsn),
                dberrors.describe(exc), "" if transient else "not transient, ", delay,
            )  # fmt: skip
        return delay

    def _check_pool(self) -> None:
        """One broken connection usually means all are (a restart, a failover, terminated
        backends): test the idle ones now, rather than meet them one by one, each failure
        doubling the back-off while leases run out."""
        if self._pool is None or (self._pool_check is not None and not self._pool_check.done()):
            return
        self._pool_check = asyncio.get_running_loop().create_task(self._pool.check())
        # Its failure (the pool closing under it) is nobody's to report.
        self._pool_check.add_done_callback(lambda t: t.cancelled() or t.exception())


def _reason(exc: Exception) -> str:
    """A publisher's reason as stored in last_error (readable by anyone who may SELECT the
    table, and shown by the TUI): URL credentials and query values redacted, whichever
    publisher wrote it."""
    return redact_urls(str(exc))


def _db_backoff(failures: int) -> float:
    return float(min(DB_RETRY_CAP, DB_RETRY_START * 2 ** min(failures - 1, 10)))


async def _first_of(*waits: Awaitable[object], first: Callable[[], bool] | None = None) -> bool:
    """Wait until any awaitable finishes, cancel the others; returns first() if given."""
    tasks = [asyncio.ensure_future(w) for w in waits]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.gather(*tasks, return_exceptions=True)
    return first() if first is not None else True


def _loop_name() -> str:
    """`uvloop` or `asyncio`: which event loop runs the worker, for the start-up line."""
    return type(asyncio.get_running_loop()).__module__.split(".")[0]
