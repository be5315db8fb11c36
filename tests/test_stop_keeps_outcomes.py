"""A stop while a publish's result is being told to the destination gate: the publish
happened, so its outcome (done after a delivery, a retry after a failure) reaches the table
before the replica ends; only the gate's bookkeeping is cut short. The gate's report is held
up by a real lock on the destination's row (`outbox_destinations`), taken by the test, as a
slow or busy database would hold it; real PostgreSQL, real worker replicas."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from helpers import row, seed, wait_until
from workers import dispatching, listening, settings, spawn_worker, stop_worker

from outbox.demo.sink import Reply, Sink
from outbox.models import Message
from outbox.worker.publishers.base import RetryableError

pytestmark = pytest.mark.slow

# A lease longer than the test: a message whose outcome is lost stays 'processing' for all
# of it, and is not taken back by anyone meanwhile.
LEASE = timedelta(seconds=10)


@contextmanager
def destination_locked(dsn: str) -> Iterator[None]:
    """Every destination's row locked, as a transaction of someone else's would hold it:
    the gate's report of a result waits for it."""
    with psycopg.connect(dsn) as locker:
        locker.execute("SELECT FROM outbox_destinations FOR UPDATE")
        try:
            yield
        finally:
            locker.rollback()


def gate_waiting(conn: psycopg.Connection[Any], owner: str) -> bool:
    """Whether a connection of the worker `owner` waits for a lock on a destination's row."""
    return bool(
        conn.execute(
            "SELECT EXISTS (SELECT FROM pg_stat_activity WHERE application_name = %s"
            " AND wait_event_type = 'Lock' AND query LIKE %s)",
            (owner, "%outbox_destinations%FOR UPDATE%"),
        ).fetchone()[0]  # type: ignore[index]
    )


async def test_sigterm_keeps_the_retry_of_a_failure_whose_report_to_the_gate_waits(
    conn, dsn, tmp_path
):
    """A worker process stopped by SIGTERM while the gate's report of a 503 waits: the
    message is retried, not left 'processing' until its lease runs out."""
    with Sink(lambda body, nth: Reply(503)) as api:
        worker = spawn_worker(
            dsn, "--publisher", "http", "--http-url", api.url, "--lease", "10s",
            "--publish-timeout", "2s", "--shutdown-grace", "200ms", "--poll-interval", "200ms",
            owner="w", log_path=str(tmp_path / "w.log"),
        )  # fmt: skip
        try:
            # Listening: the destination's row is there (stamped before the first claim).
            await wait_until(lambda: listening(conn, ["w"]) == 1, what="the worker up")
            with destination_locked(dsn):
                [message_id] = seed(conn, 1)
                await wait_until(lambda: gate_waiting(conn, "w"), what="the failure's report")
                assert stop_worker(worker) == 0
        finally:
            if worker.poll() is None:
                stop_worker(worker)
    ended = row(conn, message_id)
    # Retried as the message's own failure (the gate never heard of it), its attempt counted.
    assert ended["status"] == "pending", ended
    assert ended["attempts"] == 1 and "503" in ended["last_error"], ended
    assert ended["lease_owner"] is None, ended


class ProbeAnswered:
    """Fails once with a Retry-After, which opens the breaker and makes the message its
    probe soon after; then delivers the probe once the test lets it."""

    name = "probed"

    def __init__(self) -> None:
        self.probing = asyncio.Event()
        self.answer = asyncio.Event()

    async def start(self) -> None: ...

    async def close(self) -> None: ...

    async def publish(self, message: Message) -> None:
        if not self.probing.is_set():
            self.probing.set()  # the next publish is the probe
            raise RetryableError("HTTP 503", retry_after=timedelta(milliseconds=100))
        await self.answer.wait()


async def test_a_stop_keeps_a_probe_delivered_whose_report_to_the_gate_waits(conn, dsn):
    """While this replica probes, a delivery goes to the gate first (it closes the breaker);
    cut short by the stop, the delivery is still done, not redelivered after its lease."""
    publisher = ProbeAnswered()
    s = settings(dsn, lease=LEASE, shutdown_grace=timedelta(milliseconds=200))
    with ExitStack() as held:  # the lock outlasts the replica: it stops while its report waits
        async with dispatching(s, publisher):
            [message_id] = seed(conn, 1)
            await wait_until(
                lambda: _probe_owner(conn) == s.owner, what="the breaker open, this replica probing"
            )
            held.enter_context(destination_locked(dsn))
            publisher.answer.set()
            await wait_until(lambda: gate_waiting(conn, s.owner), what="the delivery's report")
    ended = row(conn, message_id)
    assert ended["status"] == "done", ended
    # The gate's side was skipped: the probe's lease on the destination runs out, and
    # another probe closes the breaker.
    assert _probe_owner(conn) == s.owner


def _stamped(conn: psycopg.Connection[Any]) -> bool:
    return bool(conn.execute("SELECT count(*) FROM outbox_destinations").fetchone()[0])  # type: ignore[index]


def _probe_owner(conn: psycopg.Connection[Any]) -> str | None:
    found = conn.execute("SELECT probe_owner FROM outbox_destinations").fetchone()
    return None if found is None else found[0]


class Batch:
    """A batch publisher: the first message delivered, the others failing."""

    name = "batch"

    def __init__(self) -> None:
        self.sent: list[list[int]] = []

    async def start(self) -> None: ...

    async def close(self) -> None: ...

    async def publish_batch(self, messages: Sequence[Message]) -> list[Exception | None]:
        self.sent.append([m.id for m in messages])
        return [None, *(RetryableError("HTTP 503") for _ in messages[1:])]


async def test_a_stop_keeps_every_outcome_of_a_batch_whose_failures_wait_for_the_gate(conn, dsn):
    """The failures of a batch are told to the gate one by one: the stop cuts the first
    report short, and neither that message nor those after it lose their outcome."""
    publisher = Batch()
    s = settings(dsn, lease=LEASE, shutdown_grace=timedelta(milliseconds=200))
    with ExitStack() as held:  # the lock outlasts the replica: it stops while its report waits
        async with dispatching(s, publisher):
            # The destination's row is there (stamped before the first claim) to be locked.
            await wait_until(lambda: _stamped(conn), what="the destination stamped")
            held.enter_context(destination_locked(dsn))
            ids = seed(conn, 3)
            await wait_until(lambda: gate_waiting(conn, s.owner), what="the first failure's report")
    assert publisher.sent == [ids]
    ended = {i: row(conn, i) for i in ids}
    assert [ended[i]["status"] for i in ids] == ["done", "pending", "pending"], ended
    assert all(ended[i]["lease_owner"] is None for i in ids), ended
