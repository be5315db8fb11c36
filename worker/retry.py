"""One way for a worker service to run a database operation until it works.

Every service meets the same database: when it is away (a restart, a failover, a network
cut) the claimer, the finalizer, the lease keeper and the listener all wait for it in the
same way, each with its own streak of failures. The errors are classified by
`outbox.plumbing.dberrors` (the one classification every component uses): one that may pass by
itself is retried with a growing back-off, one that will not (a statement that cannot work until
a person changes something) with the longest.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import TypeVar

import psycopg

from outbox.plumbing import dberrors
from outbox.plumbing.dsn import with_pg_environment
from outbox.plumbing.redact import describe_dsn
from outbox.plumbing.waiting import first_of
from outbox.worker.metrics import Metrics

log = logging.getLogger("outbox.worker")

T = TypeVar("T")

# Back-off between tries: doubling from the first, up to the cap.
RETRY_START, RETRY_CAP = 0.1, 5.0

DatabaseErrors = (psycopg.Error, OSError)


class Stopped(Exception):
    """The worker stopped while an operation was waiting to be tried again."""


def _never(exc: BaseException) -> bool:
    return False


class DatabaseRetry:
    def __init__(
        self, metrics: Metrics, dsn: str, on_failure: Callable[[], None] = lambda: None
    ) -> None:
        self.metrics = metrics
        self.dsn = dsn
        # Called on every failure that makes the worker unready (the pool checks its idle
        # connections: one broken connection usually means all are).
        self.on_failure = on_failure

    async def until_done(
        self,
        operation: str,
        call: Callable[[], Awaitable[T]],
        *,
        stop: asyncio.Event | None = None,
        give_up: Callable[[BaseException], bool] = _never,
        retry_in: float | None = None,
        readiness: bool = True,
    ) -> T:
        """Await `call()` again after each database error until it returns.

        `give_up(exc)` re-raises an error at once (the caller has a better answer than
        waiting); `stop` ends the wait between tries with `Stopped`; `retry_in` waits that
        long between tries instead of the back-off; `readiness` False keeps a failure from
        making the worker unready (the listener: polling covers for it).
        """
        failures = 0
        while True:
            try:
                result = await call()
            except DatabaseErrors as exc:
                if give_up(exc):
                    raise
                failures += 1
                delay = self.failed(operation, exc, failures, retry_in, readiness=readiness)
                if stop is None:
                    await asyncio.sleep(delay)
                elif await _stopped_within(stop, delay):
                    raise Stopped from None
                continue
            if failures:
                log.info("%s works again after %d failed tries", operation, failures)
            return result

    def failed(
        self,
        operation: str,
        exc: BaseException,
        failures: int,
        retry_in: float | None = None,
        *,
        readiness: bool = True,
    ) -> float:
        """Count and report a failed operation; how long to wait before trying again."""
        self.metrics.db_errors.labels(operation).inc()
        if readiness:
            self.metrics.ready = False
            self.on_failure()
        transient = dberrors.is_transient(exc)
        delay = retry_in if retry_in is not None else backoff(failures)
        if not transient and retry_in is None:
            delay = max(delay, RETRY_CAP)
        # One line per streak start, then every 10th, so an outage does not flood the log.
        if failures == 1 or failures % 10 == 0:
            where = describe_dsn(with_pg_environment(self.dsn))  # PGHOST=db: db, not a socket
            log.log(
                logging.WARNING if transient else logging.ERROR,
                "%s failed (%s, attempt %d) on %s: %s; %sretrying in %.1fs",
                operation, type(exc).__name__, failures, where,
                dberrors.describe(exc), "" if transient else "not transient, ", delay,
            )  # fmt: skip
        return delay


def backoff(failures: int) -> float:
    return float(min(RETRY_CAP, RETRY_START * 2 ** min(failures - 1, 10)))


async def _stopped_within(stop: asyncio.Event, seconds: float) -> bool:
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(seconds):
            await stop.wait()
    return stop.is_set()


async def unless_stopped(stop: asyncio.Event, call: Awaitable[T]) -> T:
    """Await `call`, but end it at once if `stop` is set first (Stopped): a server that never
    answers would otherwise hold a stop for a whole connect timeout."""
    attempt, _ = await first_of(call, stop.wait())
    if attempt.cancelled():
        raise Stopped
    result: T = attempt.result()
    return result
