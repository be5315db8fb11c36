"""The dispatch loop against real PostgreSQL and a real HTTP server, in this process."""

from __future__ import annotations

import asyncio
import gc
import logging
import time
import weakref
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from helpers import RUNNING, row, seed, serve_ordering, statuses, wait_until
from workers import dispatching, settings

from outbox import enqueue
from outbox.demo.sink import Reply, Sink
from outbox.lease import Applied, claim
from outbox.models import Message, Outcome
from outbox.worker.cli import GC_YOUNG_THRESHOLD, calm_collector
from outbox.worker.finalizer import FINALIZE_LINGER, Finalizer
from outbox.worker.ledger import Ledger
from outbox.worker.metrics import Metrics
from outbox.worker.publishers.base import Defer, PermanentError, RetryableError
from outbox.worker.publishers.http import HttpPublisher
from outbox.worker.publishers.null import NullPublisher
from outbox.worker.replica import Replica
from outbox.worker.service import Shared

# A retried message must stay pending while the test looks at it: the test settings' 50 ms
# backoff cap would bring it back at once. (Full jitter may still pick a tiny delay: one in
# several thousand with a two-hour ceiling.)
NO_QUICK_RETRY: dict[str, Any] = {
    "backoff_base": timedelta(hours=1),
    "backoff_cap": timedelta(days=1),
}


def _http(sink: Sink) -> HttpPublisher:
    return HttpPublisher(sink.url, owner="test-worker")


def _count(conn, where: str) -> int:
    return conn.execute(f"SELECT count(*) FROM outbox WHERE {where}").fetchone()[0]


@pytest.mark.parametrize("prepared", [True, False], ids=["prepared-claim", "unprepared"])
async def test_delivers_everything_over_http_with_the_id_as_idempotency_key(
    conn, dsn, sink, prepared
):
    ids = seed(conn, 300, aggregates=17)
    async with dispatching(settings(dsn, prepared_statements=prepared), _http(sink)) as d:
        await wait_until(lambda: _count(conn, "status = 'done'") == 300, what="all done")
    assert sorted(sink.delivered_ids()) == ids
    for request in sink.delivered():
        assert request.key == str(request.body["id"])
        assert request.headers["Content-Type"] == "application/json"
        assert set(request.body) >= {
            "id",
            "aggregate_type",
            "aggregate_id",
            "event_type",
            "payload",
        }
    first = next(r for r in sink.delivered() if r.body["id"] == ids[0])
    assert first.body["payload"] == {"n": 0, "text": "x" * 20}
    assert d.metrics.messages.labels("done")._value.get() == 300
    assert _count(conn, "lease_owner IS NOT NULL") == 0


async def test_http_classification_end_to_end(conn, dsn):
    ids = seed(conn, 3)
    replies = {ids[0]: Reply(200), ids[1]: Reply(422), ids[2]: Reply(503)}
    with Sink(lambda body, nth: replies[body["id"]]) as sink:
        async with dispatching(
            settings(dsn, backoff_base=timedelta(seconds=300), backoff_cap=timedelta(hours=1)),
            _http(sink),
        ):
            await wait_until(
                lambda: (
                    # One statement: read apart, "none processing" could be seen before the
                    # claim and "all attempted" right after it.
                    _count(conn, "status <> 'processing' AND attempts > 0") == 3
                )
            )
    assert row(conn, ids[0])["status"] == "done"
    dead = row(conn, ids[1])
    assert dead["status"] == "dead" and dead["last_error"].startswith("permanent: HTTP 422")
    failed = row(conn, ids[2])
    assert failed["status"] == "pending" and failed["attempts"] == 1
    assert "HTTP 503" in failed["last_error"]
    # One message failing is the message's trouble, not the destination's.
    assert conn.execute("SELECT state FROM outbox_destinations").fetchall() == [("closed",)]


async def test_a_retry_after_pauses_the_whole_destination_and_refunds_the_attempt(conn, dsn):
    [limited] = seed(conn, 1)
    with Sink(lambda body, nth: Reply(429, {"Retry-After": "120"})) as sink:
        async with dispatching(settings(dsn), _http(sink)):
            await wait_until(
                lambda: (
                    conn.execute(
                        "SELECT count(*) FROM outbox_destinations WHERE state = 'open'"
                    ).fetchone()[0]
                    == 1
                )
            )
            await wait_until(lambda: _count(conn, "status = 'pending'") == 1)
            later = seed(conn, 5)
            # Claimed by nobody while the destination waits out its Retry-After.
            await asyncio.sleep(0.5)  # a window in which a wrong worker would send them
            assert _count(conn, f"id IN ({', '.join(map(str, later))}) AND attempts > 0") == 0
        assert len(sink.requests) == 1
    message = row(conn, limited)
    assert message["status"] == "pending" and message["attempts"] == 0  # refunded
    wait, reason, url = conn.execute(
        "SELECT extract(epoch FROM next_probe_at - since), reason, destination "
        "FROM outbox_destinations"
    ).fetchone()
    assert (
        119 <= wait <= 121 and reason == "Retry-After" and url == sink.url.removesuffix("/events")
    )


async def test_unreachable_endpoint_is_retried_not_dead(conn, dsn):
    [message_id] = seed(conn, 1)
    with Sink() as gone:
        url = gone.url
    async with dispatching(settings(dsn, **NO_QUICK_RETRY), HttpPublisher(url, owner="t")):
        await wait_until(
            lambda: (
                row(conn, message_id)["attempts"] == 1
                and row(conn, message_id)["status"] == "pending"
            )
        )
    assert "ClientConnectorError" in row(conn, message_id)["last_error"]


class Scripted:
    """A publisher whose behaviour per message is decided by the test."""

    name = "scripted"

    def __init__(self, behave) -> None:
        self.behave = behave
        self.calls: list[Message] = []

    async def start(self) -> None: ...

    async def close(self) -> None: ...

    async def publish(self, message: Message) -> None:
        self.calls.append(message)
        result = self.behave(message)
        if asyncio.iscoroutine(result):
            await result


async def test_retries_exhausted_goes_dead(conn, dsn):
    [message_id] = seed(conn, 1)

    def fail(m: Message) -> None:
        raise RetryableError("downstream flaky")

    publisher = Scripted(fail)
    async with dispatching(settings(dsn, max_attempts=3), publisher):
        await wait_until(lambda: row(conn, message_id)["status"] == "dead")
    r = row(conn, message_id)
    assert r["attempts"] == 3 and len(publisher.calls) == 3
    assert (
        r["last_error"].startswith("retries exhausted (3)")
        and "downstream flaky" in r["last_error"]
    )


async def test_business_defer_and_permanent_error(conn, dsn):
    deferred, broken = seed(conn, 2)

    def behave(m: Message) -> None:
        if m.id == deferred:
            raise Defer(timedelta(minutes=10), "customer not created yet")
        raise PermanentError("schema mismatch")

    async with dispatching(settings(dsn), Scripted(behave)):
        await wait_until(
            lambda: (
                _count(conn, "status = 'processing'") == 0
                and _count(conn, "status = 'dead'") == 1
                and _count(conn, "last_error LIKE 'deferred%'") == 1
            )
        )
    d = row(conn, deferred)
    assert (d["status"], d["attempts"]) == ("pending", 0)
    assert row(conn, broken)["last_error"] == "permanent: schema mismatch"


async def test_unclassified_exception_leaves_the_row_to_its_lease_and_the_loop_goes_on(
    conn, dsn, caplog
):
    ids = seed(conn, 5)

    def behave(m: Message) -> None:
        if m.id == ids[2]:
            raise ZeroDivisionError("bug in the publisher")

    with caplog.at_level(logging.ERROR, logger="outbox.worker"):
        async with dispatching(settings(dsn), Scripted(behave)) as d:
            await wait_until(lambda: _count(conn, "status = 'done'") == 4)
            assert d.metrics.messages.labels("error")._value.get() == 1
    untouched = row(conn, ids[2])
    assert untouched["status"] == "processing" and untouched["lease_version"] == 1
    assert any(
        "ZeroDivisionError" in (r.exc_text or "") and str(ids[2]) in r.getMessage()
        for r in caplog.records
    )


async def test_lost_lease_is_logged_and_counted_and_never_overwrites(conn, dsn, caplog):
    [message_id] = seed(conn, 1)
    release = asyncio.Event()

    async def behave(m: Message) -> None:
        await release.wait()

    with caplog.at_level(logging.WARNING, logger="outbox.worker"):
        async with dispatching(settings(dsn), Scripted(behave)) as d:
            await wait_until(lambda: row(conn, message_id)["status"] == "processing")
            # Another worker took the message over (its lease had expired).
            conn.execute(
                "UPDATE outbox SET lease_version = lease_version + 1, lease_owner = 'other' "
                "WHERE id = %s",
                (message_id,),
            )
            release.set()
            await wait_until(lambda: d.metrics.lost_leases._value.get() == 1)
    r = row(conn, message_id)
    assert (r["status"], r["lease_owner"], r["lease_version"]) == ("processing", "other", 2)
    [line] = [rec.getMessage() for rec in caplog.records if "lost lease" in rec.getMessage()]
    assert f"message {message_id} lease_version 1" in line


async def test_the_lease_keeper_keeps_a_slow_publish_from_losing_its_lease(conn, dsn, table):
    [message_id] = seed(conn, 1)
    release = asyncio.Event()

    async def behave(m: Message) -> None:
        await release.wait()

    # Short, to see renewals soon; not so short that a stalled loop on a loaded machine
    # misses one (this test's own sync queries run on the dispatcher's loop).
    lease = timedelta(seconds=3)
    async with dispatching(
        settings(dsn, lease=lease, publish_timeout=timedelta(seconds=30)), Scripted(behave)
    ):
        await wait_until(lambda: row(conn, message_id)["status"] == "processing")
        first_expiry = row(conn, message_id)["lease_until"]
        await wait_until(
            lambda: row(conn, message_id)["lease_until"] > first_expiry + lease, what="an extension"
        )
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as other:
            for _ in range(3):  # well past the original lease, nobody can take it
                assert (
                    await claim(other, table, owner="B", batch=5, lease=lease, max_attempts=5) == []
                )
                await asyncio.sleep(lease.total_seconds() / 2)
        release.set()
        await wait_until(lambda: row(conn, message_id)["status"] == "done")
    assert row(conn, message_id)["lease_version"] == 1


async def test_notify_wakes_an_idle_worker_without_waiting_for_the_poll(conn, dsn, sink):
    async with dispatching(settings(dsn, poll_interval=timedelta(minutes=5)), _http(sink)) as d:
        # Idle and listening: the next poll is minutes away.
        await wait_until(
            lambda: d.listening and d.metrics.claim_batch._sum.get() == 0 and _claims(d) >= 2
        )
        claims_before = _claims(d)
        loop = asyncio.get_running_loop()
        started = loop.time()
        message_id = enqueue(conn, aggregate_type="a", aggregate_id="1", event_type="E", payload={})
        assert await asyncio.to_thread(sink.wait_for, lambda s: message_id in s.delivered_ids(), 60)
        assert loop.time() - started < 60  # far sooner than the 5-minute poll
        assert _claims(d) > claims_before


def test_ordered_finalizes_linger_behind_a_backlog_only_not_for_publishes_in_flight():
    """In ordered mode the finalize makes the next heads: lingering for outcomes still being
    published would hold those back. Behind a backlog (messages waiting to be published) a
    linger costs nothing they would not wait anyway; unordered, both are worth it."""

    def finalizer(ordering: str, publishing: int, waiting: int) -> Finalizer:
        s = settings("", ordering=ordering)
        ledger = Ledger(s.batch, s.concurrency)
        ledger.publishing = publishing
        ledger.waiting.extend([None] * waiting)  # type: ignore[list-item]
        shared = Shared(s, ledger, connection=None, retry=None, metrics=Metrics())  # type: ignore[arg-type]
        return Finalizer(shared, wakeup=asyncio.Event())

    assert not finalizer("aggregate", publishing=3, waiting=0)._more_coming()
    assert finalizer("aggregate", publishing=3, waiting=5)._more_coming()
    assert finalizer("none", publishing=3, waiting=0)._more_coming()
    assert not finalizer("none", publishing=0, waiting=0)._more_coming()


class _Deaf:
    """A listener that says it listens and never hears a NOTIFY: the claimer then waits the
    whole poll interval between idle claims."""

    listening = True

    async def run(self) -> None:
        await asyncio.Event().wait()


async def test_ordered_the_next_head_is_claimed_without_a_notify_or_the_poll(conn, dsn):
    """A finalize makes an aggregate's next message its head, and no NOTIFY says so: the
    finalizer wakes the claimer. With no NOTIFY heard and the poll an hour away, an
    aggregate's three messages are still delivered, one after the other."""
    serve_ordering(conn)
    ids = seed(conn, 3, aggregates=1)
    delivered: list[int] = []
    publisher = Scripted(lambda m: delivered.append(m.id))
    d = Replica(settings(dsn, ordering="aggregate", poll_interval=timedelta(hours=1)), publisher)
    d.listener = _Deaf()  # type: ignore[assignment]
    stop = asyncio.Event()
    task = asyncio.create_task(d.run(stop), name="ordered replica")
    RUNNING.add(task)
    try:
        await wait_until(lambda: _count(conn, "status = 'done'") == 3, what="all three done")
    finally:
        RUNNING.discard(task)
        stop.set()
        await asyncio.wait_for(task, timeout=60)
    assert delivered == ids


async def test_each_notify_wakes_one_claim_and_no_empty_claim_follows_a_short_one(conn, dsn):
    """Messages committed one at a time: each NOTIFY wakes one claim, which takes the message.
    A claim right after a short claim (no NOTIFY since) would find nothing: none is sent."""
    d = Replica(settings(dsn, poll_interval=timedelta(hours=1)), NullPublisher())
    claim, sent = d.claimer._claim, 0

    async def counted(want: int) -> tuple[list[Message], bool]:
        nonlocal sent
        sent += 1
        return await claim(want)

    d.claimer._claim = counted  # type: ignore[method-assign]
    stop = asyncio.Event()
    task = asyncio.create_task(d.run(stop), name="replica")
    RUNNING.add(task)
    try:
        # Idle: listening, the listener's first wake-up claimed, no claim in flight.
        await wait_until(
            lambda: d.listening and not d.claimer.wakeup.is_set() and sent == _claims(d) > 0,
            what="an idle listening worker",
        )
        claims, empty = sent, _empty_claims(d)
        for n in range(10):
            enqueue(conn, aggregate_type="a", aggregate_id=str(n), event_type="E", payload={})
            await wait_until(lambda: _count(conn, "status = 'done'") == n + 1)  # noqa: B023
        assert sent - claims == 10
        assert _empty_claims(d) - empty == 0
    finally:
        RUNNING.discard(task)
        stop.set()
        await asyncio.wait_for(task, timeout=60)


async def test_an_idle_worker_has_its_claim_and_finalize_connections_open_before_work(conn, dsn):
    """The first burst does not wait for a connection to be made: the claimer's and the
    finalizer's are both open (beside the listener's) before anything arrives. At least
    those: the pool grows by one should two of the start's statements overlap."""
    owner = "connections-worker"
    query = "SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE %s"
    async with dispatching(settings(dsn, owner=owner), NullPublisher()) as d:
        # Idle: it has claimed, and found nothing. Waited for with the rest: the listener's
        # connection may be up before the first claim's answer has reached the claimer.
        await wait_until(
            lambda: (
                d.listening
                and _claims(d) >= 1
                and conn.execute(query, (owner + "%",)).fetchone()[0] >= 3
            ),
            timeout=30,
            what="a claim, two pooled connections and the listener's",
        )


async def test_a_stop_ends_an_idle_wait_at_once(dsn):
    """Idle, listening, with the next poll an hour away: a stop must not wait for it."""
    d = Replica(settings(dsn, poll_interval=timedelta(hours=1)), NullPublisher())
    stop = asyncio.Event()
    task = asyncio.create_task(d.run(stop))
    try:
        await wait_until(lambda: d.listening and _claims(d) >= 2, what="an idle wait")
        stop.set()
        # Were the stop not to wake the wait, this would run into the hour-long poll.
        await asyncio.wait_for(task, timeout=30)
    finally:
        stop.set()
        if not task.done():
            task.cancel()
    assert task.exception() is None


def _empty_claims(d) -> int:
    [family] = d.metrics.claim_batch.collect()
    return int(
        next(
            s.value
            for s in family.samples
            if s.name.endswith("_bucket") and float(s.labels["le"]) == 0
        )
    )


def _claims(d) -> int:
    return int(
        sum(
            s.value for s in d.metrics.claim_batch.collect()[0].samples if s.name.endswith("_count")
        )
    )


async def test_clean_stop_leaves_nothing_processing(conn, dsn):
    seed(conn, 40)
    release = asyncio.Event()
    started = asyncio.Event()

    async def behave(m: Message) -> None:
        started.set()
        await release.wait()

    s = settings(dsn, batch=20, concurrency=2, shutdown_grace=timedelta(seconds=30))
    publisher = Scripted(behave)
    async with dispatching(s, publisher) as d:
        await started.wait()
        await wait_until(lambda: _count(conn, "status = 'processing'") >= 20)
        asyncio.get_running_loop().call_later(
            0.3, release.set
        )  # in-flight ones finish within grace
    assert statuses(conn).get("processing", 0) == 0
    assert _count(conn, "status = 'done'") >= 2
    released = _count(conn, "status = 'pending' AND attempts = 0 AND lease_version > 0")
    assert released >= 18  # claimed but never started: given back with the attempt refunded
    assert d.metrics.messages.labels("released")._value.get() == released


class FuturePublisher:
    """A publisher whose publish returns a plain awaitable (a Future), not a coroutine."""

    name = "future"

    def __init__(self, resolve: bool) -> None:
        self.resolve = resolve

    async def start(self) -> None: ...

    async def close(self) -> None: ...

    def publish(self, message: Message) -> asyncio.Future[None]:
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if self.resolve:
            future.set_result(None)
        return future  # never resolved otherwise: only the publish timeout ends it


async def test_publishers_returning_plain_awaitables_are_awaited_under_the_timeout(conn, dsn):
    [done] = seed(conn, 1)
    s = settings(dsn, publish_timeout=timedelta(milliseconds=200), **NO_QUICK_RETRY)
    async with dispatching(s, FuturePublisher(resolve=True)):
        await wait_until(lambda: row(conn, done)["status"] == "done")
    [stuck] = seed(conn, 1)
    async with dispatching(s, FuturePublisher(resolve=False)):
        await wait_until(
            lambda: row(conn, stuck)["attempts"] == 1 and row(conn, stuck)["status"] == "pending"
        )
    assert "publish timed out after 0.2s" in row(conn, stuck)["last_error"]


async def test_a_publish_that_waits_then_overruns_is_timed_out_and_retried(conn, dsn):
    [message_id] = seed(conn, 1)

    async def behave(m: Message) -> None:
        await asyncio.sleep(0)  # waits once, then keeps waiting far past the timeout
        await asyncio.sleep(60)

    s = settings(dsn, publish_timeout=timedelta(milliseconds=200), **NO_QUICK_RETRY)
    async with dispatching(s, Scripted(behave)):
        # One read of the row: two could see `pending` before the claim and `attempts = 1`
        # of the claim itself, and then the shutdown gives the row back unfinished.
        await wait_until(
            lambda: (r := row(conn, message_id))["status"] == "pending" and r["attempts"] == 1
        )
    assert "publish timed out" in row(conn, message_id)["last_error"]


async def test_an_error_text_postgres_would_refuse_is_stored_escaped_and_the_loop_goes_on(
    conn, dsn
):
    bad, good = seed(conn, 2)

    def behave(m: Message) -> None:
        if m.id == bad:  # a downstream's binary body quoted in the error: NUL, a lone surrogate
            raise RetryableError("HTTP 503: \x00\x01 \udc80 body")

    s = settings(dsn, **NO_QUICK_RETRY)
    async with dispatching(s, Scripted(behave)):
        await wait_until(
            lambda: row(conn, bad)["status"] == "pending" and row(conn, good)["status"] == "done"
        )
    assert row(conn, bad)["last_error"] == "retryable: HTTP 503: \\x00\\x01 \\udc80 body"


async def test_a_defer_past_the_maximum_age_is_counted_as_dead(conn, dsn):
    [message_id] = seed(conn, 1)
    conn.execute("UPDATE outbox SET created_at = now() - interval '2 days'")

    def behave(m: Message) -> None:
        raise Defer(timedelta(seconds=5), "still waiting")

    async with dispatching(settings(dsn), Scripted(behave)) as d:
        await wait_until(lambda: row(conn, message_id)["status"] == "dead")
        await wait_until(lambda: d.metrics.messages.labels("dead")._value.get() == 1)
    assert d.metrics.messages.labels("deferred")._value.get() == 0


async def test_reclaiming_its_own_expired_message_keeps_both_generations_apart(conn, dsn, caplog):
    [message_id] = seed(conn, 1)
    first_started, release_first = asyncio.Event(), asyncio.Event()

    async def behave(m: Message) -> None:
        if m.lease_version == 1:
            first_started.set()
            await release_first.wait()  # v1 is stuck in its publish while its lease runs out

    with caplog.at_level(logging.WARNING, logger="outbox.worker"):
        async with dispatching(settings(dsn), Scripted(behave)) as d:
            await first_started.wait()
            conn.execute("UPDATE outbox SET lease_until = now() - interval '1 second'")
            # This same worker takes the message over as v2 and finishes it.
            await wait_until(lambda: row(conn, message_id)["status"] == "done")
            release_first.set()
            await wait_until(lambda: d.metrics.lost_leases._value.get() == 1)
            assert d.metrics.messages.labels("done")._value.get() == 1
    r = row(conn, message_id)
    assert (r["status"], r["lease_version"]) == ("done", 2)
    assert any(
        f"message {message_id} lease_version 1" in rec.getMessage() for rec in caplog.records
    )


async def test_a_claim_that_took_all_there_was_starts_publishing_before_claiming_again(conn, dsn):
    """Light load: the messages in hand go first; the claim after them would find nothing."""
    events: list[str] = []

    def behave(m: Message) -> None:
        events.append(f"publish {m.id}")

    publisher = Scripted(behave)
    async with dispatching(settings(dsn, batch=10, concurrency=4), publisher) as d:
        claim = d.claimer._claim

        async def recorded(want: int) -> tuple[list[Message], bool]:
            events.append("claim sent")
            messages, full = await claim(want)
            events.append(f"claimed {len(messages)}")
            return messages, full

        d.claimer._claim = recorded  # type: ignore[method-assign]
        await wait_until(lambda: "claimed 0" in events, what="an idle claim")
        [message_id] = seed(conn, 1)
        await wait_until(lambda: _count(conn, "status = 'done'") == 1)
        # The next claim: a NOTIFY heard during the claim, or the poll.
        await wait_until(lambda: "claim sent" in events[events.index("claimed 1") :])
    found = events.index("claimed 1")
    # Its publish comes before the next claim is sent, not after.
    assert events[found : found + 3] == ["claimed 1", f"publish {message_id}", "claim sent"]


async def test_the_next_claim_runs_while_the_last_batch_is_being_finalized(conn, dsn):
    """A publisher that never waits leaves the finalize as the slow step: the claimer must
    not wait for it, but claim once more, and no further (one batch being finalized)."""
    seed(conn, 50)
    batch = 10
    blocker = psycopg.connect(dsn)  # holds the first batch's rows, so its finalize waits
    locked: list[int] = []

    def behave(m: Message) -> None:
        if not locked:
            rows = blocker.execute(
                "SELECT id FROM outbox WHERE status = 'processing' FOR UPDATE"
            ).fetchall()
            locked.extend(r[0] for r in rows)

    try:
        async with dispatching(settings(dsn, batch=batch, concurrency=1), Scripted(behave)) as d:
            # Held by the worker, not only committed: the second claim's rows are in the
            # table a moment before its result reaches the worker.
            await wait_until(
                lambda: len(d.ledger.held) == 2 * batch,
                what="a second claim while the first batch's finalize waits",
            )
            # The first publish locked the first batch's rows, and the second's too if that
            # claim (sent as soon as the first was in) had already committed.
            assert len(locked) in (batch, 2 * batch) and _count(conn, "status = 'done'") == 0
            # Both batches published, the first one's outcomes still unwritten: no room
            # for a third claim (held at most 2 x batch + concurrency).
            await wait_until(lambda: not d.ledger.waiting and not d.ledger.publishing)
            assert len(d.ledger.held) == 2 * batch
            assert _count(conn, "status = 'processing'") == 2 * batch
            blocker.rollback()
            await wait_until(lambda: _count(conn, "status = 'done'") == 50)
    finally:
        blocker.close()
    assert _count(conn, "lease_version <> 1") == 0  # each claimed once: nothing lost a lease


async def _waiting_at_each_claim(conn, dsn: str, batches: int, batch: int, behave) -> list[int]:
    """Drain `batches` full batches with concurrency 1: how many messages waited unpublished
    as each claim went out."""
    seed(conn, batches * batch)
    dispatcher = Replica(settings(dsn, batch=batch, concurrency=1), Scripted(behave))
    waiting: list[int] = []
    claim = dispatcher.claimer._claim

    async def watched(want: int) -> tuple[list[Message], bool]:
        waiting.append(len(dispatcher.ledger.waiting))
        return await claim(want)

    dispatcher.claimer._claim = watched  # type: ignore[method-assign]
    stop = asyncio.Event()
    running = asyncio.create_task(dispatcher.run(stop))
    try:
        await wait_until(lambda: _count(conn, "status = 'done'") == batches * batch)
    finally:
        stop.set()
        await running
    assert _count(conn, "lease_version <> 1") == 0  # each claimed once: nothing lost a lease
    return waiting


async def test_a_publisher_faster_than_claims_gets_the_next_claim_at_once(conn, dsn):
    """A publisher that never waits publishes a batch sooner than a claim returns: the next
    claim goes out as soon as a batch is in, with all of it still to publish, rather than
    after it (the claim's round trip then overlaps publishing)."""
    waiting = await _waiting_at_each_claim(conn, dsn, 6, 100, lambda m: None)
    # The first claim found nothing held; the second went out at once after it came in.
    assert waiting[:2] == [0, 100]


async def test_a_publisher_slower_than_claims_is_not_claimed_ahead_of(conn, dsn):
    """Publishing a batch takes longer than claiming one: once that is seen, claims wait
    until at most half a batch is left to publish, as they would without claiming ahead
    (messages waiting leased are messages other workers cannot publish)."""

    async def slow(m: Message) -> None:
        # 0.4 s a batch: slower than a claim even when a loaded machine stalls one.
        await asyncio.sleep(0.02)

    waiting = await _waiting_at_each_claim(conn, dsn, 4, 20, slow)
    assert waiting[:2] == [0, 20]  # nothing known yet at the start
    assert max(waiting[2:]) <= 10, waiting


async def test_outcomes_of_a_waiting_publisher_gather_into_few_finalize_statements(conn, dsn):
    """Outcomes arrive one by one while publishes are still running: the finalizer lets them
    gather for FINALIZE_LINGER instead of writing every few at once, so the statements are
    at most about one per linger (each costs a round trip whatever its size). The last ones,
    with nothing left publishing, are written at once."""
    seed(conn, 400)

    async def waits(m: Message) -> None:
        await asyncio.sleep(0.002)

    dispatcher = Replica(settings(dsn, batch=100, concurrency=20), Scripted(waits))
    sizes: list[int] = []
    times: list[float] = []
    finalize = dispatcher.finalizer._finalize

    async def counted(outcomes: list[Outcome]) -> Applied:
        sizes.append(len(outcomes))
        times.append(time.monotonic())
        return await finalize(outcomes)

    dispatcher.finalizer._finalize = counted  # type: ignore[method-assign]
    stop = asyncio.Event()
    running = asyncio.create_task(dispatcher.run(stop))
    try:
        await wait_until(lambda: _count(conn, "status = 'done'") == 400)
    finally:
        stop.set()
        await running
    assert sum(sizes) == 400
    # Writing as outcomes came (the old way) sent a statement per round trip, a few
    # outcomes each; here at most one per linger, plus the last and any written at once
    # when nothing was publishing between two claims.
    assert len(sizes) <= (times[-1] - times[0]) / FINALIZE_LINGER + 4, (sizes, times)
    assert max(sizes) > 20, sizes


@pytest.mark.parametrize("path", ["one-by-one", "batches"])
async def test_the_age_at_publish_counts_from_created_at_on_the_databases_clock(conn, dsn, path):
    """A message committed 5 s ago by the database's clock (its created_at moved back) is
    published about 5 s old; the others a moment after their commit."""
    ids = seed(conn, 3)
    conn.execute("UPDATE outbox SET created_at = now() - interval '5 s' WHERE id = %s", (ids[0],))
    publisher: Any = NullPublisher() if path == "one-by-one" else Batched()
    async with dispatching(settings(dsn), publisher) as d:
        await wait_until(lambda: _count(conn, "status = 'done'") == 3)
        [family] = d.metrics.age_at_publish.collect()
    buckets = {float(s.labels["le"]): s.value for s in family.samples if s.name.endswith("_bucket")}
    assert buckets[5.0] == 2  # the two fresh ones: well under 5 s
    assert buckets[10.0] == 3  # the old one: 5 s and a moment, not its worker-side age
    [total] = [s.value for s in family.samples if s.name.endswith("_sum")]
    assert 5.0 < total < 10.0


async def test_a_plain_tables_claims_read_no_claim_window(conn, dsn):
    """On a plain table the claim window costs nothing: the worker drains it with the
    plain statements and never reads partitions for a window."""
    seed(conn, 5)
    async with dispatching(settings(dsn), NullPublisher()) as d:
        await wait_until(lambda: _count(conn, "status = 'done'") == 5)
        assert d.window.layout is None
        assert d.window.stale()  # never read since it was made


class Batched:
    """A batch publisher that delivers every message."""

    name = "batched"

    async def start(self) -> None: ...

    async def close(self) -> None: ...

    async def publish_batch(self, messages: Any) -> list[None]:
        return [None] * len(messages)


def test_the_publish_histogram_exposes_what_a_prometheus_histogram_would():
    from prometheus_client import CollectorRegistry, Histogram, generate_latest

    from outbox.worker.metrics import Metrics

    observed = (0.0, 0.0000004, 0.001, 0.0011, 0.3, 30, 31)
    metrics = Metrics()
    reference_registry = CollectorRegistry()
    reference = Histogram(
        "outbox_publish_duration_seconds",
        "Time spent in one publish, whatever its outcome",
        buckets=metrics.publish_seconds._bounds[:-1],
        registry=reference_registry,
    )
    for seconds in observed:
        metrics.publish_seconds.observe(seconds)
        reference.observe(seconds)

    def lines(registry: CollectorRegistry) -> list[str]:
        text = generate_latest(registry).decode()
        return [
            line for line in text.splitlines()
            if line.startswith("outbox_publish_duration_seconds") and "_created" not in line
        ]  # fmt: skip

    assert lines(metrics.registry) == lines(reference_registry)
    assert 'outbox_publish_duration_seconds_bucket{le="0.001"} 3.0' in lines(metrics.registry)


def test_ages_observed_at_once_count_as_observed_one_by_one():
    """observe_all (a batch's ages, sorted and bisected) puts each amount in the bucket
    observe puts it in, amounts on a bound and beyond the last one included."""
    from outbox.worker.metrics import AGE_BUCKETS, Metrics

    ages = [0.0, 0.001, 0.0011, 0.0024, 0.5, 1.0, 59.9, 60.0, 61.0, 3600.0, 0.001]
    one_by_one, at_once = Metrics(), Metrics()
    for age in ages:
        one_by_one.age_at_publish.observe(age)
    at_once.age_at_publish.observe_all(ages[:4])
    at_once.age_at_publish.observe_all([])
    at_once.age_at_publish.observe_all(ages[4:])
    [expected] = one_by_one.age_at_publish.collect()
    [got] = at_once.age_at_publish.collect()
    counted = [(s.name, s.labels, s.value) for s in got.samples if not s.name.endswith("_sum")]
    assert counted == [
        (s.name, s.labels, s.value) for s in expected.samples if not s.name.endswith("_sum")
    ]
    [got_sum, expected_sum] = (
        next(s.value for s in family.samples if s.name.endswith("_sum"))
        for family in (got, expected)
    )
    assert got_sum == pytest.approx(expected_sum)  # summed in another order
    buckets = {s.labels["le"]: s.value for s in got.samples if s.name.endswith("_bucket")}
    assert buckets["0.001"] == 3 and buckets["60.0"] == 9 and buckets["+Inf"] == len(ages)
    assert len(buckets) == len(AGE_BUCKETS) + 1


def test_the_worker_runs_the_cyclic_collector_less_often_and_still_collects_cycles() -> None:
    before = gc.get_threshold()
    try:
        calm_collector()
        assert gc.get_threshold() == (GC_YOUNG_THRESHOLD, *before[1:])
        assert gc.get_freeze_count() > 0  # start-up's objects are out of the collector's walks

        class Node:
            peer: Any = None

        node = Node()
        node.peer = node  # a cycle: reference counting alone never frees it
        gone = weakref.ref(node)
        del node
        gc.collect()
        assert gone() is None
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)
