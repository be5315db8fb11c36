"""The lease protocol on a real PostgreSQL: the seed article's scenarios and more."""

from __future__ import annotations

import multiprocessing
from datetime import UTC, datetime, timedelta

import psycopg
import pytest
from helpers import row, seed, wait_until_db

from outbox import Outcome, Status
from outbox.lease import OrderedClaims, claim, extend, finalize, release
from outbox.models import Message, OutcomeKind
from outbox.queries import REAPED_ERROR
from outbox.table import Table
from outbox.worker.replica import EXPLICIT_PREPARE_ONLY

LONG = timedelta(seconds=30)
SHORT = timedelta(milliseconds=300)


async def _claim(aconn, table, owner="A", batch=10, lease=LONG, max_attempts=12, ordered=False):
    return await claim(
        aconn,
        table,
        owner=owner,
        batch=batch,
        lease=lease,
        max_attempts=max_attempts,
        ordered=ordered,
    )


def _claim_in_process(dsn: str, owner: str, queue, start) -> None:  # type: ignore[no-untyped-def]
    import asyncio

    async def run() -> list[int]:
        table = Table.parse("outbox")
        got: list[int] = []
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            start.wait()  # all four begin together
            while batch := await claim(
                conn, table, owner=owner, batch=7, lease=LONG, max_attempts=5
            ):
                got.extend(m.id for m in batch)
        return got

    queue.put(asyncio.run(run()))


def test_four_processes_claim_200_distinct_ids(conn, dsn):
    ids = seed(conn, 200)
    ctx = multiprocessing.get_context("spawn")
    queue, start = ctx.Queue(), ctx.Barrier(4)
    procs = [
        ctx.Process(target=_claim_in_process, args=(dsn, f"W{i}", queue, start)) for i in range(4)
    ]
    for p in procs:
        p.start()
    results = [queue.get(timeout=60) for _ in procs]
    for p in procs:
        p.join(timeout=30)
    claimed = [i for r in results for i in r]
    assert len(claimed) == 200
    assert sorted(claimed) == ids  # each id exactly once
    assert sum(1 for r in results if r) >= 2, "the claims should have been spread over workers"


async def test_claim_sets_the_lease_columns(conn, aconn, table):
    [message_id] = seed(conn, 1)
    [m] = await _claim(aconn, table, owner="worker-1")
    r = row(conn, message_id)
    assert (m.id, m.lease_version, m.attempts) == (message_id, 1, 1)
    assert r["status"] == "processing" and r["lease_owner"] == "worker-1"
    assert r["lease_until"] > r["created_at"]
    assert m.payload_json.startswith("{") and '"n": 0' in m.payload_json


async def test_a_claim_asked_to_be_prepared_is_prepared_once_and_reused(conn, dsn, table):
    seed(conn, 3)
    prepared_statements = "SELECT statement FROM pg_prepared_statements"
    async with (
        await psycopg.AsyncConnection.connect(dsn, autocommit=True, prepare_threshold=None) as a,
        await psycopg.AsyncConnection.connect(
            dsn, autocommit=True, prepare_threshold=EXPLICIT_PREPARE_ONLY
        ) as b,
    ):
        [m1] = await claim(a, table, owner="A", batch=1, lease=LONG, max_attempts=5)
        assert await (await a.execute(prepared_statements)).fetchall() == []
        [m2] = await claim(b, table, owner="B", batch=1, lease=LONG, max_attempts=5, prepare=True)
        [m3] = await claim(b, table, owner="B", batch=1, lease=LONG, max_attempts=5, prepare=True)
        [(statement,)] = await (await b.execute(prepared_statements)).fetchall()
    assert "SKIP LOCKED" in statement
    assert sorted([m1.id, m2.id, m3.id]) == sorted(
        r[0] for r in conn.execute("SELECT id FROM outbox")
    )


async def test_crashed_claim_is_reclaimed_only_after_its_lease_and_stale_finalize_is_fenced(
    conn, dsn, table
):
    seed(conn, 1)
    async with (
        await psycopg.AsyncConnection.connect(dsn, autocommit=True) as a,
        await psycopg.AsyncConnection.connect(dsn, autocommit=True) as b,
    ):
        # Long enough that a stalled machine cannot expire it between these two claims.
        [ma] = await _claim(a, table, owner="A", lease=timedelta(seconds=2))
        assert await _claim(b, table, owner="B") == []  # leased: nobody else takes it
        wait_until_db(conn, "(SELECT lease_until < now() FROM outbox)")
        [mb] = await _claim(b, table, owner="B")
        assert mb.id == ma.id
        assert mb.lease_version == ma.lease_version + 1
        assert mb.attempts == ma.attempts + 1
        assert await finalize(a, table, [Outcome.done(ma)]) == set()  # A is fenced off
        assert await finalize(b, table, [Outcome.done(mb)]) == {mb.id}
    r = row(conn, mb.id)
    assert r["status"] == "done" and r["lease_owner"] is None and r["done_at"] is not None


async def test_expired_but_not_taken_over_finalize_still_succeeds(conn, aconn, table):
    seed(conn, 1)
    [m] = await _claim(aconn, table, lease=SHORT)
    wait_until_db(conn, "(SELECT lease_until < now() FROM outbox)")
    # Nobody claimed it meanwhile: the generation did not change, so the work stands.
    assert await finalize(aconn, table, [Outcome.done(m)]) == {m.id}


async def test_poison_message_goes_dead_after_max_attempts_without_any_finalize(conn, aconn, table):
    [message_id] = seed(conn, 1)
    for attempt in (1, 2, 3):
        [m] = await _claim(aconn, table, lease=SHORT, max_attempts=3)
        assert m.attempts == attempt
        wait_until_db(conn, "(SELECT lease_until < now() FROM outbox)")  # the worker "crashed"
    assert await _claim(aconn, table, max_attempts=3) == []  # reaped, never taken again
    r = row(conn, message_id)
    assert (r["status"], r["attempts"], r["last_error"]) == ("dead", 3, REAPED_ERROR)
    assert await _claim(aconn, table, max_attempts=3) == []


async def test_last_attempt_lease_expiry_reaps_to_dead_and_the_late_finalize_is_fenced(
    conn, aconn, table
):
    [message_id] = seed(conn, 1)
    [m] = await _claim(aconn, table, lease=SHORT, max_attempts=1)
    wait_until_db(conn, "(SELECT lease_until < now() FROM outbox)")
    assert await _claim(aconn, table, owner="B", max_attempts=1) == []  # reaps
    assert row(conn, message_id)["status"] == "dead"
    assert await finalize(aconn, table, [Outcome.done(m)]) == set()  # lost lease
    assert row(conn, message_id)["status"] == "dead"


async def test_defer_refunds_the_attempt(conn, aconn, table):
    [message_id] = seed(conn, 1)
    [m] = await _claim(aconn, table)
    assert await finalize(
        aconn, table, [Outcome.defer(m, timedelta(seconds=60), "stock not there")]
    )
    r = row(conn, message_id)
    assert r["status"] == "pending" and r["attempts"] == 0
    assert r["last_error"] == "deferred: stock not there"
    assert r["available_at"] > r["created_at"] + timedelta(seconds=50)
    assert await _claim(aconn, table) == []  # not before its time


async def test_defer_past_the_maximum_defer_age_goes_dead(conn, aconn, table):
    [message_id] = seed(conn, 1)
    conn.execute("UPDATE outbox SET created_at = now() - interval '2 hours'")
    [m] = await _claim(aconn, table)
    outcome = Outcome.defer(m, timedelta(seconds=1), "still waiting")
    assert await finalize(aconn, table, [outcome], max_defer_age=timedelta(hours=1))
    r = row(conn, message_id)
    assert r["status"] == "dead"
    assert "maximum defer age" in r["last_error"] and "still waiting" in r["last_error"]


async def test_retry_reschedules_with_the_delay_and_keeps_the_attempt(conn, aconn, table):
    [message_id] = seed(conn, 1)
    [m] = await _claim(aconn, table)
    await finalize(aconn, table, [Outcome.retry(m, timedelta(seconds=30), "HTTP 503")])
    r = row(conn, message_id)
    assert (r["status"], r["attempts"], r["last_error"]) == ("pending", 1, "HTTP 503")
    assert r["available_at"] >= r["created_at"] + timedelta(seconds=29)


async def test_mixed_batch_finalizes_each_row_on_its_own_version(conn, aconn, table):
    ids = seed(conn, 4)
    msgs = await _claim(aconn, table)
    # Another claim took over the third message meanwhile.
    conn.execute("UPDATE outbox SET lease_version = lease_version + 1 WHERE id = %s", (ids[2],))
    outcomes = [
        Outcome.done(msgs[0]),
        Outcome.dead(msgs[1], "HTTP 422"),
        Outcome.done(msgs[2]),
        Outcome.retry(msgs[3], timedelta(0), "HTTP 500"),
    ]
    applied = await finalize(aconn, table, outcomes)
    assert applied == {ids[0], ids[1], ids[3]}
    assert [row(conn, i)["status"] for i in ids] == ["done", "dead", "processing", "pending"]


async def test_release_gives_messages_back_with_the_attempt_refunded(conn, aconn, table):
    ids = seed(conn, 3)
    msgs = await _claim(aconn, table)
    assert await release(aconn, table, msgs) == set(ids)
    assert {(row(conn, i)["status"], row(conn, i)["attempts"]) for i in ids} == {("pending", 0)}
    assert [m.id for m in await _claim(aconn, table)] == ids  # claimable at once


async def test_extend_renews_held_leases_only(conn, aconn, table):
    ids = seed(conn, 2)
    msgs = await _claim(aconn, table, lease=timedelta(seconds=5))
    before = {i: row(conn, i)["lease_until"] for i in ids}
    conn.execute("UPDATE outbox SET lease_version = lease_version + 1 WHERE id = %s", (ids[1],))
    renewed = await extend(aconn, table, msgs, lease=timedelta(minutes=10))
    assert renewed == {ids[0]}
    assert row(conn, ids[0])["lease_until"] > before[ids[0]] + timedelta(minutes=9)
    assert row(conn, ids[1])["lease_until"] == before[ids[1]]


async def test_claim_takes_ready_rows_oldest_first_and_respects_batch(conn, aconn, table):
    ids = seed(conn, 10)
    first = await _claim(aconn, table, batch=4)
    assert [m.id for m in first] == ids[:4]
    second = await _claim(aconn, table, batch=100)
    assert [m.id for m in second] == ids[4:]


# Ordered mode finds heads two ways (walking ready rows, or visiting aggregates): both must
# give the same answers.
ORDERED_PLANS = pytest.mark.parametrize("by_aggregate", [False, True], ids=["rows", "aggregates"])


@ORDERED_PLANS
async def test_ordered_claim_takes_only_the_head_of_each_aggregate(
    conn, aconn, table, by_aggregate
):
    ids = seed(conn, 6, aggregates=2)  # agg-0: ids 0,2,4; agg-1: ids 1,3,5

    async def heads():
        return await claim(aconn, table, owner="A", batch=10, lease=LONG, max_attempts=12,
                           ordered=True, by_aggregate=by_aggregate)  # fmt: skip

    first = await heads()
    assert [m.id for m in first] == [ids[0], ids[1]]
    assert await heads() == []  # heads in flight: nothing else
    await finalize(aconn, table, [Outcome.done(first[0])])
    assert [m.id for m in await heads()] == [ids[2]]


@ORDERED_PLANS
async def test_a_dead_head_blocks_its_aggregate_only(conn, aconn, table, by_aggregate):
    ids = seed(conn, 4, aggregates=2)

    async def heads():
        return await claim(aconn, table, owner="A", batch=10, lease=LONG, max_attempts=12,
                           ordered=True, by_aggregate=by_aggregate)  # fmt: skip

    first = await heads()
    await finalize(aconn, table, [Outcome.dead(first[0], "HTTP 422"), Outcome.done(first[1])])
    nxt = await heads()
    assert [m.id for m in nxt] == [ids[3]]  # agg-1 moves on; agg-0 waits for a person
    await finalize(aconn, table, [Outcome.done(nxt[0])])
    assert await heads() == []
    assert row(conn, ids[2])["status"] == "pending"
    # A person skips the dead head (marks it done on purpose): the aggregate flows again.
    conn.execute("UPDATE outbox SET status = 'done', done_at = now() WHERE id = %s", (ids[0],))
    assert [m.id for m in await heads()] == [ids[2]]


@ORDERED_PLANS
async def test_an_expired_head_is_reclaimed_and_its_successor_waits(
    conn, aconn, table, by_aggregate
):
    ids = seed(conn, 2, aggregates=1)
    kw = {
        "owner": "A",
        "batch": 10,
        "max_attempts": 12,
        "ordered": True,
        "by_aggregate": by_aggregate,
    }
    [head] = await claim(aconn, table, lease=SHORT, **kw)
    wait_until_db(conn, f"(SELECT lease_until < now() FROM outbox WHERE id = {ids[0]})")
    [again] = await claim(aconn, table, lease=LONG, **kw)
    assert (again.id, again.lease_version) == (ids[0], head.lease_version + 1)
    assert await claim(aconn, table, lease=LONG, **kw) == []


def test_ordered_claims_switch_plans_on_short_batches():
    plan = OrderedClaims()
    assert plan.by_aggregate is False
    plan.observe(3, 500)  # few heads: walking rows scanned a backlog for little
    assert plan.by_aggregate is True
    plan.observe(500, 500)  # many heads: walking rows is cheap again
    assert plan.by_aggregate is False


async def test_broken_skip_locked_then_commit_design_double_publishes(conn, dsn):
    """Why the lease exists: row locks vanish at COMMIT, so a second worker takes the same rows."""
    seed(conn, 3)
    pick = (
        "SELECT id FROM outbox WHERE status = 'pending' ORDER BY id LIMIT 10 FOR UPDATE SKIP LOCKED"
    )
    with psycopg.connect(dsn) as a, psycopg.connect(dsn) as b:
        with a.transaction():
            taken_by_a = [r[0] for r in a.execute(pick).fetchall()]
        # A now "publishes" outside the transaction; its locks are gone.
        with b.transaction():
            taken_by_b = [r[0] for r in b.execute(pick).fetchall()]
    assert taken_by_a and taken_by_a == taken_by_b  # every message would be published twice


async def test_the_lease_prevents_the_double_take(conn, dsn, table):
    seed(conn, 3)
    async with (
        await psycopg.AsyncConnection.connect(dsn, autocommit=True) as a,
        await psycopg.AsyncConnection.connect(dsn, autocommit=True) as b,
    ):
        taken_by_a = await _claim(a, table, owner="A")
        taken_by_b = await _claim(b, table, owner="B")
    assert len(taken_by_a) == 3 and taken_by_b == []


@pytest.mark.parametrize("name", ["app.events_outbox", 'Weird "Name"; DROP TABLE x; --'])
async def test_protocol_works_on_qualified_and_hostile_table_names(empty_dsn, name):
    from outbox import enqueue
    from outbox.schema import SchemaError, check_table, migrate, orderings

    quoted = name if "." in name else '"' + name.replace('"', '""') + '"'
    table = Table.parse(quoted)
    with psycopg.connect(empty_dsn, autocommit=True) as c:
        migrate(c, table)
        c.execute("CREATE TABLE x (id int)")
        message_id = enqueue(
            c, aggregate_type="a", aggregate_id="1", event_type="E", payload={}, table=table
        )
    async with await psycopg.AsyncConnection.connect(empty_dsn, autocommit=True) as ac:
        [m] = await _claim(ac, table)
        assert m.id == message_id
        assert await finalize(ac, table, [Outcome.done(m)]) == {message_id}
    # Ordered mode's index, built and dropped under the same name.
    with psycopg.connect(empty_dsn, autocommit=True) as c:
        migrate(c, table, "aggregate")
        assert orderings(c, table) == ("none", "aggregate")
        second = enqueue(
            c, aggregate_type="a", aggregate_id="1", event_type="E", payload={}, table=table
        )
    async with await psycopg.AsyncConnection.connect(empty_dsn, autocommit=True) as ac:
        await check_table(ac, table, ordered=True)
        [m] = await _claim(ac, table, ordered=True)
        assert m.id == second
    with psycopg.connect(empty_dsn, autocommit=True) as c:
        migrate(c, table, "none")
        assert orderings(c, table) == ("none",)
    async with await psycopg.AsyncConnection.connect(empty_dsn, autocommit=True) as ac:
        with pytest.raises(SchemaError, match="--ordering aggregate"):
            await check_table(ac, table, ordered=True)
    with psycopg.connect(empty_dsn) as c:
        assert c.execute("SELECT to_regclass('x') IS NOT NULL").fetchone() == (True,)
    assert Status.DONE.value == "done"


def test_a_done_outcome_is_the_one_its_fields_make():
    """Outcome.done builds its tuple directly (the hot path): it must equal the outcome the
    named constructor makes, defaults included."""
    message = Message(7, 3, 1, "order", "order-1", "OrderPlaced", "{}", datetime.now(UTC))
    done = Outcome.done(message)
    assert done == Outcome(7, 3, OutcomeKind.DONE) and type(done) is Outcome
    assert (done.status, done.refund_attempt, done.deferred) == (Status.DONE, False, False)
