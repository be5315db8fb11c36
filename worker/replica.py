"""One worker replica: the services that claim, publish, finalize and keep leases, assembled
around one ledger of held messages.

- the claimer (claimer.py) leases messages whenever the ledger has room, woken by NOTIFY
  (listener.py) or the poll timer;
- publishing (publishing.py) turns held messages into outcomes through the publisher;
- the finalizer (finalizer.py) writes the outcomes, each row fenced on its lease_version
  (in ordered mode it wakes the claimer too: a finalize makes the next heads);
- the lease keeper (lease_keeper.py) extends the leases of what is held.

The services share only the ledger (ledger.py) and wait for the database in one way
(retry.py). They run in one task group; the claimer runs until a stop, the others until the
replica has given back or finalized everything it holds. On stop, claiming ends, unstarted
messages are released at once (attempt refunded), in-flight publishes get the grace period,
and the finalizer drains before the pool closes.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Coroutine, Mapping
from typing import Any

import psycopg
from psycopg_pool import AsyncConnectionPool

from outbox.plumbing import dberrors
from outbox.plumbing.dsn import connect_options, connect_timeout, with_pg_environment
from outbox.plumbing.errors import SettingError
from outbox.plumbing.redact import describe_dsn, redact_dsn, redact_url
from outbox.plumbing.waiting import cancel_and_wait
from outbox.runner import perform_async
from outbox.schema import check_table
from outbox.session import home_first, utc_by_name
from outbox.table import shown
from outbox.worker import tracing
from outbox.worker.claimer import Claimer
from outbox.worker.destination_gate import DestinationGate
from outbox.worker.finalizer import Finalizer
from outbox.worker.lease_keeper import LeaseKeeper
from outbox.worker.ledger import Ledger
from outbox.worker.listener import Listener
from outbox.worker.metrics import Metrics
from outbox.worker.partition_keeper import PartitionKeeper
from outbox.worker.publishers.base import BatchPublisher, Publisher, PublisherBase, declared
from outbox.worker.publishers.registry import load_publisher, shown_values
from outbox.worker.publishing import Publishing
from outbox.worker.rate_limit import RateLimiter
from outbox.worker.retry import DatabaseRetry, Stopped, unless_stopped
from outbox.worker.service import Shared
from outbox.worker.settings import WorkerSettings

log = logging.getLogger("outbox.worker")

# psycopg prepares any statement run `prepare_threshold` times, and None turns off even the
# explicit `prepare=True`. Only the claims are prepared (their generic plans are guarded by
# tests); a threshold never reached keeps the batched unnest statements unprepared, since a
# generic plan of theirs may be many times slower.
EXPLICIT_PREPARE_ONLY = 2**31 - 1
# How long an operation waits for a pooled connection before it counts as a database error.
POOL_TIMEOUT = 10.0
# Pooled connections: the claimer's and the finalizer's, open from the start so that the
# first burst does not wait for a second connection to be made; up to two more for the
# lease keeper and for an operation that overlaps another. The listener has its own.
POOL_MIN, POOL_MAX = 2, 4
# Most seconds closing the pool waits for its background workers.
POOL_CLOSE_TIMEOUT = 0.5
# However short the lease, a stop waits at least this long for the last outcomes' write.
DRAIN_MIN_WAIT = 10.0

Pool = AsyncConnectionPool[psycopg.AsyncConnection[tuple[object, ...]]]


class Replica:
    def __init__(
        self,
        settings: WorkerSettings,
        publisher: PublisherBase | Publisher | BatchPublisher,
        metrics: Metrics | None = None,
    ) -> None:
        s = self.settings = settings
        self.publisher = declared(publisher)
        self.metrics = metrics or Metrics()
        self.ledger = Ledger(s.batch, s.concurrency, s.claim_bytes)
        self.pool: Pool = AsyncConnectionPool(
            s.dsn,
            min_size=POOL_MIN,
            max_size=POOL_MAX,
            open=False,
            name="outbox-worker",
            configure=self._configure,
            kwargs={
                "autocommit": True,
                "prepare_threshold": EXPLICIT_PREPARE_ONLY if s.prepared_statements else None,
                "application_name": s.owner,
                **connect_options(s.dsn),
            },
            # Long enough for one connection attempt of the DSN's own connect_timeout.
            timeout=max(POOL_TIMEOUT, float(connect_timeout(s.dsn))),
        )
        self._pool_check: asyncio.Task[None] | None = None
        retry = self.retry = DatabaseRetry(self.metrics, s.dsn, self._check_pool)
        wakeup = asyncio.Event()
        shared = Shared(s, self.ledger, self.pool.connection, retry, self.metrics)
        self.window = shared.window
        self.listener = Listener(s, retry, wakeup, self.window)
        self.gate = DestinationGate(shared, self.publisher)
        limiter = RateLimiter(s, self.pool.connection) if s.rate_limit is not None else None
        self.publishing = Publishing(shared, self.publisher, self.gate, limiter)
        self.partition_keeper = PartitionKeeper(shared)
        self.claimer = Claimer(
            shared, wakeup=wakeup, listening=lambda: self.listener.listening,
            on_claimed=self.publishing.start, gate=self.gate,
            on_refused=self.partition_keeper.tell_refused,
        )  # fmt: skip
        self.finalizer = Finalizer(shared, wakeup=wakeup)
        self.lease_keeper = LeaseKeeper(shared)

    @property
    def listening(self) -> bool:
        return self.listener.listening

    async def run(self, stop: asyncio.Event) -> None:
        """Dispatch until `stop` is set, then shut down cleanly."""
        await self.pool.open(wait=False)
        try:
            if not await self._check_table(stop):
                return
            await self.gate.refresh()
            self.metrics.ready = True
            self._log_start()
            async with asyncio.TaskGroup() as services:
                background = [
                    services.create_task(self._supervised(name, run, stop), name=name)
                    for name, run in (
                        ("finalizer", self.finalizer.run()),
                        ("lease keeper", self.lease_keeper.run()),
                        ("listener", self.listener.run()),
                        ("destination gate", self.gate.run()),
                        ("partition keeper", self.partition_keeper.run()),
                    )
                ]
                try:
                    await self.claimer.run(stop)
                finally:
                    await self._shutdown()  # even after a bug: give back what is held
                    await cancel_and_wait(background)
        finally:
            self.publishing.close()
            self.metrics.ready = False
            if self._pool_check is not None:
                self._pool_check.cancel()
                await asyncio.gather(self._pool_check, return_exceptions=True)
            # Its background workers may be stuck connecting to a server that never
            # answers: abandon them rather than make a stop wait for their connect timeout.
            await self.pool.close(timeout=POOL_CLOSE_TIMEOUT)

    async def _supervised(
        self, name: str, service: Coroutine[Any, Any, None], stop: asyncio.Event
    ) -> None:
        """The background services run until cancelled; ending otherwise is a bug. Stop the
        replica cleanly rather than go on without one (outcomes would pile up)."""
        try:
            await service
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("the %s ended unexpectedly; stopping the worker", name)
        else:
            log.error("the %s ended unexpectedly; stopping the worker", name)
        stop.set()

    async def _check_table(self, stop: asyncio.Event) -> bool:
        """Wait until the table can be checked (True), or a stop (False). A connection
        refused for good (no such role or database, authentication failed) raises
        SettingError: waiting would not fix it."""
        try:
            await self.retry.until_done(
                "check table",
                lambda: unless_stopped(stop, self._check_table_once()),
                stop=stop,
                give_up=dberrors.is_permanent_connection_failure,
            )
        except Stopped:
            return False
        except (psycopg.Error, OSError) as exc:
            where = describe_dsn(with_pg_environment(self.settings.dsn))
            raise SettingError(
                f"--dsn: cannot connect to {where}: {dberrors.describe(exc)}"
            ) from None
        return True

    async def _check_table_once(self) -> None:
        # A connection of its own, not the pool's: a failure then says why (role or database
        # missing, refused, ...), where the pool would only report a timeout.
        s = self.settings
        async with await psycopg.AsyncConnection.connect(
            s.dsn, autocommit=True, application_name=s.owner, **connect_options(s.dsn)
        ) as conn:
            await perform_async(conn, home_first(s.table))
            self.window.layout = await check_table(conn, s.table, ordered=s.ordered)

    async def _configure(self, conn: psycopg.AsyncConnection[tuple[object, ...]]) -> None:
        """Each new pooled connection: its time zone (`utc_by_name`), and what is named
        after the table in the table's schema (`home_first`)."""
        await utc_by_name(conn)
        await perform_async(conn, home_first(self.settings.table))

    def _log_start(self) -> None:
        s = self.settings
        log.info(
            "worker %s dispatching %s from %s (%s publisher%s, format %s%s, %s, ordering %s, "
            "%s event loop)",
            s.owner, shown(s.table), redact_dsn(s.dsn) or "PG* environment", self.publisher.name,
            self._publisher_options(), s.format, _signing(s.publisher_options),
            _traces(os.environ, s.otel_parent), s.ordering, _loop_name(),
        )  # fmt: skip

    def _publisher_options(self) -> str:
        """` http-url=...` for the start-up line: the options given, secrets masked."""
        try:
            factory = load_publisher(self.settings.publisher)
        except SettingError:  # a publisher made in code, not by name
            return ""
        shown = shown_values(factory.options, self.settings.publisher_options)
        return f" {shown}" if shown else ""

    async def _shutdown(self) -> None:
        s, ledger = self.settings, self.ledger
        released = ledger.release_waiting()
        log.info(
            "stopping: releasing %d unstarted messages, waiting up to %.1fs for %d in flight",
            released, s.shutdown_grace.total_seconds(), ledger.publishing,
        )  # fmt: skip
        await self.publishing.stop(s.shutdown_grace.total_seconds())
        # Outcomes are queued; the finalizer writes them all (it waits out database errors).
        try:
            async with asyncio.timeout(max(DRAIN_MIN_WAIT, s.lease.total_seconds())):
                await ledger.drained.wait()
        except TimeoutError:
            log.error(
                "stopping with %d messages unfinalized: their leases will expire and others "
                "will take them over", len(ledger.held),
            )  # fmt: skip

    def _check_pool(self) -> None:
        """One broken connection usually means all are (a restart, a failover, terminated
        backends): test the idle ones now, rather than meet them one by one, each failure
        doubling the back-off while leases run out."""
        if self._pool_check is not None and not self._pool_check.done():
            return
        self._pool_check = asyncio.get_running_loop().create_task(self.pool.check())
        # Its failure (the pool closing under it) is nobody's to report.
        self._pool_check.add_done_callback(lambda t: t.cancelled() or t.exception())


def _signing(options: Mapping[str, Any]) -> str:
    """`, signed with 2 secrets` when requests are signed (how many, never what they are)."""
    secrets = options.get("http_signing_secret") or ()
    if not secrets:
        return ""
    return f", signed with {len(secrets)} secret{'s' if len(secrets) > 1 else ''}"


def _traces(env: Mapping[str, str], parent: str) -> str:
    """Whether publish spans are made, where they go and what the stored context is to them:
    the exporter's endpoint with any credentials or query values masked."""
    if not tracing.wanted(env):
        return "no traces"
    exporters = env.get("OTEL_TRACES_EXPORTER", "").strip().lower() or "otlp"
    endpoint = (
        env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "").strip()
        or env.get("OTEL_EXPORTER_OTLP_ENDPOINT", "").strip()
    )
    where = f" to {redact_url(endpoint)}" if endpoint and "otlp" in exporters else ""
    return f"traces {exporters}{where} ({parent})"


def _loop_name() -> str:
    """`uvloop` or `asyncio`: which event loop runs the worker, for the start-up line."""
    return type(asyncio.get_running_loop()).__module__.split(".")[0]
