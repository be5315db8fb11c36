"""Publishing over the ledger, without a database: results become outcomes, per message and
in batches, and a stop gives back what it abandons."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence
from datetime import timedelta

import psycopg
from test_ledger import _messages
from workers import settings

from outbox.models import Message, OutcomeKind
from outbox.worker.destination_gate import DestinationGate
from outbox.worker.ledger import Ledger
from outbox.worker.metrics import Metrics
from outbox.worker.publishers.base import Defer, PermanentError, RetryableError, declared
from outbox.worker.publishing import Publishing
from outbox.worker.rate_limit import RateLimiter
from outbox.worker.service import Shared

FAILURES: dict[int, Exception] = {
    2: RetryableError("HTTP 503"),
    3: PermanentError("HTTP 422"),
    4: Defer(timedelta(seconds=30), "not yet"),
}


class Batches:
    name = "batches"

    def __init__(self, hang: bool = False) -> None:
        self.calls: list[list[int]] = []
        self.hang = hang
        self.called = asyncio.Event()

    async def publish_batch(self, messages: Sequence[Message]) -> list[Exception | None]:
        self.calls.append([m.id for m in messages])
        self.called.set()
        if self.hang:
            await asyncio.Event().wait()
        return [FAILURES.get(m.id) for m in messages]


def _publishing(
    publisher: object, limiter: RateLimiter | None = None, **overrides: object
) -> tuple[Ledger, Publishing]:
    # The breaker off: failures here are the messages' own.
    s = settings("", **{"batch": 4, "concurrency": 2, "breaker_failures": 0, **overrides})
    ledger = Ledger(s.batch, s.concurrency)
    metrics = Metrics()
    # No database: the destination gate reads and writes it only when something fails.
    shared = Shared(s, ledger, connection=None, retry=None, metrics=metrics)  # type: ignore[arg-type]
    publisher = declared(publisher)  # type: ignore[arg-type]
    gate = DestinationGate(shared, publisher)
    return ledger, Publishing(shared, publisher, gate, limiter)


async def _outcomes(ledger: Ledger, count: int) -> dict[int, OutcomeKind]:
    while len(ledger.outcomes) < count:
        ledger.outcomes_waiting.clear()
        await ledger.outcomes_waiting.wait()
    return {o.message_id: o.kind for o in ledger.take_outcomes(count)}


async def test_a_batch_publisher_gets_batches_and_each_result_becomes_its_outcome():
    publisher = Batches()
    ledger, publishing = _publishing(publisher)
    ledger.hold(_messages(1, 6), now=0.0, claim_seconds=0.0)
    publishing.start()
    assert await _outcomes(ledger, 6) == {
        1: OutcomeKind.DONE, 2: OutcomeKind.RETRIED, 3: OutcomeKind.DEAD,
        4: OutcomeKind.DEFERRED, 5: OutcomeKind.DONE, 6: OutcomeKind.DONE,
    }  # fmt: skip
    assert sorted(len(c) for c in publisher.calls) == [2, 4]  # at most a batch per call
    assert ledger.publishing == 0


async def test_a_batch_past_the_publish_timeout_is_retried_whole():
    ledger, publishing = _publishing(Batches(hang=True), publish_timeout=timedelta(seconds=0.05))
    ledger.hold(_messages(1, 3), now=0.0, claim_seconds=0.0)
    publishing.start()
    outcomes = await _outcomes(ledger, 3)
    assert set(outcomes.values()) == {OutcomeKind.RETRIED}, outcomes


async def test_a_stop_gives_back_a_batch_still_publishing():
    publisher = Batches(hang=True)
    ledger, publishing = _publishing(publisher)
    ledger.hold(_messages(1, 3), now=0.0, claim_seconds=0.0)
    publishing.start()
    await publisher.called.wait()
    assert ledger.publishing == 3
    await publishing.stop(grace=0.01)
    assert await _outcomes(ledger, 3) == dict.fromkeys([1, 2, 3], OutcomeKind.RELEASED)
    assert ledger.publishing == 0


class PoolThatDropsOneCancellation:
    """A connection pool whose database is unreachable, and whose wait for a connection drops
    the first cancellation, as psycopg_pool's does on Python 3.11 when the cancellation comes
    together with its answer (asyncio.wait_for, gh-86296)."""

    def __init__(self) -> None:
        self.asked = asyncio.Event()
        self.dropped = False

    @contextlib.asynccontextmanager
    async def connection(self) -> AsyncIterator[None]:
        if not self.dropped:
            self.asked.set()
            try:
                await asyncio.Event().wait()  # for a connection that does not come
            except asyncio.CancelledError:
                self.dropped = True
        raise psycopg.OperationalError("connection refused")
        yield


async def test_a_stop_ends_a_publish_waiting_for_send_tokens_that_dropped_its_cancellation():
    """Cancelled once, a task whose wait for a connection dropped the cancellation would wait
    for send tokens from a database that no longer answers as long as it takes: the stop
    would never end."""
    pool = PoolThatDropsOneCancellation()
    s = settings("", rate_limit=100.0)
    ledger, publishing = _publishing(Batches(), RateLimiter(s, pool.connection))
    ledger.hold(_messages(1, 1), now=0.0, claim_seconds=0.0)
    publishing.start()
    await pool.asked.wait()
    ledger.release_waiting()  # as a stop does first
    async with asyncio.timeout(5):
        await publishing.stop(grace=0.01)
    assert pool.dropped and not publishing.tasks
    outcomes = await _outcomes(ledger, 1)
    assert outcomes == {1: OutcomeKind.RELEASED}
    assert ledger.publishing == 0


class PoolThatNeverAnswers:
    """A connection pool whose database never answers."""

    def __init__(self) -> None:
        self.asked = asyncio.Event()

    @contextlib.asynccontextmanager
    async def connection(self) -> AsyncIterator[None]:
        self.asked.set()
        await asyncio.Event().wait()
        yield


async def test_a_stop_gives_back_a_message_whose_send_waited_for_a_token():
    class Delivers:
        name = "delivers"

        async def publish(self, message: Message) -> None:
            return None

    pool = PoolThatNeverAnswers()
    limiter = RateLimiter(settings("", rate_limit=100.0), pool.connection)
    ledger, publishing = _publishing(Delivers(), limiter)
    ledger.hold(_messages(1, 1), now=0.0, claim_seconds=0.0)
    publishing.start()
    await pool.asked.wait()  # taken, waiting for a token
    await publishing.stop(grace=0.01)
    # Given back at once: not held until the stop gives up waiting for it (the lease).
    assert ledger.publishing == 0
    assert await _outcomes(ledger, 1) == {1: OutcomeKind.RELEASED}


async def test_a_batch_publisher_returning_the_wrong_count_leaves_the_rows_to_their_leases():
    class Short(Batches):
        async def publish_batch(self, messages: Sequence[Message]) -> list[Exception | None]:
            return [None]

    ledger, publishing = _publishing(Short())
    ledger.hold(_messages(1, 2), now=0.0, claim_seconds=0.0)
    publishing.start()
    await ledger.drained.wait()  # forgotten: nothing held, nothing written
    assert not ledger.outcomes
    assert publishing.metrics.messages.labels("error")._value.get() == 2


async def test_a_per_message_publisher_runs_up_to_concurrency_at_once():
    running, most = 0, 0
    release, two_running = asyncio.Event(), asyncio.Event()

    class Slow:
        name = "slow"

        async def publish(self, message: Message) -> None:
            nonlocal running, most
            running += 1
            most = max(most, running)
            if running == 2:
                two_running.set()
            await release.wait()
            running -= 1
            if message.id in FAILURES:
                raise FAILURES[message.id]

    ledger, publishing = _publishing(Slow())
    ledger.hold(_messages(1, 5), now=0.0, claim_seconds=0.0)
    publishing.start()
    await two_running.wait()
    release.set()
    outcomes = await _outcomes(ledger, 5)
    assert most == 2
    assert outcomes[3] is OutcomeKind.DEAD and outcomes[5] is OutcomeKind.DONE


async def test_publishes_in_flight_are_no_free_hands_for_messages_claimed_after_them():
    """Two publishes hang, two more messages come in: with room for four at once, the two new
    ones start beside the hanging ones instead of waiting for them to end."""
    running: set[int] = set()
    two_running, four_running, release = asyncio.Event(), asyncio.Event(), asyncio.Event()

    class Hanging:
        name = "hanging"

        async def publish(self, message: Message) -> None:
            running.add(message.id)
            if len(running) == 2:
                two_running.set()
            if len(running) == 4:
                four_running.set()
            await release.wait()

    ledger, publishing = _publishing(Hanging(), concurrency=4)
    ledger.hold(_messages(1, 2), now=0.0, claim_seconds=0.0)
    publishing.start()
    await two_running.wait()
    ledger.hold(_messages(3, 2), now=0.0, claim_seconds=0.0)
    publishing.start()
    for _ in range(100):  # the new tasks' first steps, however many the loop needs
        if four_running.is_set():
            break
        await asyncio.sleep(0)
    assert running == {1, 2, 3, 4}
    assert len(publishing.tasks) == 4
    release.set()
    outcomes = await _outcomes(ledger, 4)
    assert set(outcomes.values()) == {OutcomeKind.DONE}


class Hostile:
    """Errors as a broker or a plugin may word them: a downstream's text, line breaks and
    terminal escapes included."""

    name = "hostile"

    async def publish_batch(self, messages: Sequence[Message]) -> list[Exception | None]:
        errors = {
            1: RetryableError("stream gone\n2026-01-01 INFO forged\x1b[2J"),
            2: PermanentError("refused: \x9b31m\ttabbed"),
        }
        return [errors[m.id] for m in messages]


async def test_every_publishers_reason_is_stored_with_its_control_characters_escaped():
    # last_error is printed by the TUI and the CLI and read by people with psql: one line.
    ledger, publishing = _publishing(Hostile())
    ledger.hold(_messages(1, 2), now=0.0, claim_seconds=0.0)
    publishing.start()
    while len(ledger.outcomes) < 2:
        ledger.outcomes_waiting.clear()
        await ledger.outcomes_waiting.wait()
    errors = sorted(str(o.error) for o in ledger.take_outcomes(2))
    assert errors == [
        "permanent: refused: \\x9b31m\\ttabbed",
        "retryable: stream gone\\n2026-01-01 INFO forged\\x1b[2J",
    ]
