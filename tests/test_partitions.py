"""The partitioned layout: made by `outbox migrate --partition-size`, checked before use, and
claimed, finalized and extended partition by partition, in both orderings."""

from __future__ import annotations

import itertools
import json
import logging
import re
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import Any

import psycopg
import pytest
from helpers import explain_prepared, seed, statuses, wait_until, wait_until_db
from helpers import outbox_on as outbox
from psycopg import sql
from test_worker import Scripted
from workers import dispatching, settings, spawn_worker, stop_worker

from outbox import Event, OutOfPartitions, enqueue, enqueue_many, lease
from outbox.claim_window import (
    SIGHTINGS_KEPT,
    Bounds,
    ClaimWindow,
    Settling,
    _oldest_unfinished,
    _window_reading,
)
from outbox.models import Outcome
from outbox.operations.replay import ReplayFilter, preview, send_batch, start
from outbox.operator_reads import read_table
from outbox.partitions import (
    Layout,
    Partition,
    check,
    keep_ahead,
    last_id_given,
    missing_ahead,
    partition_table,
    read_partitions,
)
from outbox.queries import queries
from outbox.runner import fetch, perform
from outbox.schema import _COLUMNS_AFTER_ID, SchemaError, check_table, migrate
from outbox.table import Table
from outbox.worker.publishers.base import RetryableError

TABLE = Table.parse("outbox")
SIZE = 100


@pytest.fixture
def pconn(empty_dsn: str) -> Any:
    """A fresh database holding `outbox` partitioned in partitions of SIZE ids, 3 ahead."""
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        migrate(conn, TABLE, layout=Layout(SIZE, 3))
        yield conn


def _leaves(conn: Any) -> list[tuple[int, int]]:
    return [(p.low, p.high) for p in fetch(conn, read_partitions(TABLE)) or []]


def test_migrate_makes_a_range_partitioned_table_with_partitions_ahead(pconn):
    assert _leaves(pconn) == [(0, 100), (100, 200), (200, 300), (300, 400)]
    strategy, default = pconn.execute(
        "SELECT partstrat, partdefid FROM pg_partitioned_table WHERE partrelid = 'outbox'::regclass"
    ).fetchone()
    assert (strategy, default) == ("r", 0)  # by range, and no DEFAULT partition
    assert pconn.execute("SELECT * FROM outbox_layout").fetchone() == (True, SIZE, 3)
    # Rows fill the partitions; migrating again keeps 3 whole partitions past the highest id.
    seed(pconn, 250)
    migrate(pconn, TABLE, layout=Layout(SIZE, 3))
    assert _leaves(pconn)[-1] == (500, 600)
    assert migrate(pconn, TABLE, layout=Layout(SIZE, 3)) == (7, 7)  # idempotent
    assert len(_leaves(pconn)) == 6


def test_migrate_refuses_another_partition_size_and_a_plain_table(pconn, dsn):
    with pytest.raises(SchemaError, match="partitions of 100 ids"):
        migrate(pconn, TABLE, layout=Layout(200, 3))
    with (
        psycopg.connect(dsn, autocommit=True) as plain,
        pytest.raises(SchemaError, match="not partitioned"),
    ):
        migrate(plain, TABLE, layout=Layout(SIZE, 3))


def test_cli_migrate_with_partitions_and_its_usage_errors(empty_dsn):
    def outbox(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "outbox", "migrate", "--dsn", empty_dsn, *args],
            capture_output=True,
            text=True,
            timeout=60,
        )

    alone = outbox("--partitions-ahead", "5")
    assert alone.returncode == 2 and "--partitions-ahead: needs --partition-size" in alone.stderr
    small = outbox("--partition-size", "5")
    assert small.returncode == 2 and "--partition-size" in small.stderr
    made = outbox("--partition-size", "1000", "--partitions-ahead", "200")
    assert made.returncode == 0, made.stderr
    with psycopg.connect(empty_dsn) as conn:
        assert len(_leaves(conn)) == 201


@pytest.mark.parametrize(
    "damage, reason",
    [
        ("CREATE TABLE outbox_rest PARTITION OF outbox DEFAULT", "DEFAULT partition"),
        ("DELETE FROM outbox_layout", "partition size is not recorded"),
        (
            "CREATE TABLE outbox_bare (LIKE outbox INCLUDING DEFAULTS INCLUDING CONSTRAINTS);"
            "DROP INDEX outbox_dead;"
            "ALTER TABLE outbox ATTACH PARTITION outbox_bare FOR VALUES FROM (400) TO (500);"
            "CREATE INDEX outbox_dead ON ONLY outbox (id) WHERE status = 'dead'",
            "index outbox_dead is missing",
        ),
    ],
    ids=["default", "unrecorded", "index"],
)
async def test_the_check_refuses_a_partitioned_table_it_cannot_serve(
    pconn, empty_dsn, damage, reason
):
    async with await psycopg.AsyncConnection.connect(empty_dsn, autocommit=True) as aconn:
        assert await check_table(aconn, TABLE) == Layout(SIZE, 3)
        for statement in damage.split(";"):
            pconn.execute(statement)
        with pytest.raises(SchemaError, match=reason):
            await check_table(aconn, TABLE)


async def test_the_check_refuses_a_table_partitioned_by_something_else(empty_dsn):
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        conn.execute("CREATE SEQUENCE outbox_id_seq")
        columns = _COLUMNS_AFTER_ID.as_string(conn)
        conn.execute(
            "CREATE TABLE outbox (id bigint NOT NULL DEFAULT nextval('outbox_id_seq'), "
            + columns
            + ") PARTITION BY HASH (aggregate_id)"
        )
        migrate(conn, TABLE)  # adopted: its columns are right
    async with await psycopg.AsyncConnection.connect(empty_dsn, autocommit=True) as aconn:
        with pytest.raises(SchemaError, match="partitioned by hash of aggregate_id"):
            await check_table(aconn, TABLE)


def _claim_args() -> dict[str, str]:
    return {
        "max_attempts": "12",
        "batch": "50",
        "owner": "w",
        "lease": "60 seconds",
        "max_payload_bytes": "2097152",
        "claim_bytes": "16777216",
    }


@pytest.mark.parametrize("generic", [False, True], ids=["custom", "generic"])
@pytest.mark.parametrize("statement", ["claim", "claim_ordered", "finalize", "extend"])
def test_statements_touch_only_the_partitions_of_their_window(pconn, statement, generic):
    """The hot statements name their id range as constants: their plans hold the window's
    partitions only, custom or generic, however many partitions are made ahead."""
    migrate(pconn, TABLE, "aggregate", layout=Layout(SIZE, 40))
    seed(pconn, 450, aggregates=20)
    pconn.execute("ANALYZE outbox")
    q = queries(TABLE, (200, 400), 100)
    args = {
        **_claim_args(),
        "ids": "{201,202}",
        "versions": "{1,1}",
        "statuses": "{done,dead}",
        "delays": "{0,0}",
        "errors": "{NULL,x}",
        "refunds": "{f,f}",
        "deferreds": "{f,f}",
        "max_defer_age": "1 day",
        "n": "2",
    }
    plan = explain_prepared(pconn, getattr(q, statement), args, generic=generic)
    touched = {int(n) for n in re.findall(r"outbox_p(\d+)", plan)}
    # The window is partitions 2 and 3; ordered mode's head check also looks in partition 1.
    allowed = {1, 2, 3} if statement == "claim_ordered" else {2, 3}
    assert touched and touched <= allowed, plan
    assert "outbox_p40" not in plan and "outbox_p0 " not in plan, plan


@pytest.mark.parametrize("generic", [False, True], ids=["custom", "generic"])
def test_an_ordered_claim_takes_rows_from_its_partition_and_checks_the_partitions_named(
    pconn, generic
):
    """A window of one partition with unfinished rows below it: the ordered claim locks,
    measures and leases rows of partition 2 itself, and its checks for an aggregate's other
    messages name partitions 1 and 2 themselves: the statement never opens the parent."""
    migrate(pconn, TABLE, "aggregate", layout=Layout(SIZE, 40))
    seed(pconn, 450, aggregates=20)
    pconn.execute("ANALYZE outbox")
    layout = Layout(SIZE, 40, named_leaves=True)
    q = lease._queries_within(TABLE, layout, (200, 300), 100)
    leaves = (partition_table(TABLE, 1), partition_table(TABLE, 2))
    assert q is queries(partition_table(TABLE, 2), checked=(TABLE, (100, 300), leaves))
    text = q.claim_ordered.as_string(pconn)
    assert '"outbox" AS' not in text and '"outbox_p1" AS prev' in text, text
    # A replayed row's later messages are looked for in its own partition only: no later
    # message can be in a partition below it.
    assert '"outbox_p2" AS later' in text and '"outbox_p1" AS later' not in text, text
    plan = explain_prepared(pconn, q.claim_ordered, _claim_args(), generic=generic)
    assert {int(n) for n in re.findall(r"outbox_p(\d+)", plan)} == {1, 2}, plan
    updated = set(re.findall(r"Update on (\w+)", plan))
    assert updated == {"outbox_p2"}, plan  # the leases are taken on the partition itself
    # Visiting aggregates walks every unfinished row from partition 1: through the parent.
    heads = explain_prepared(pconn, q.claim_heads, _claim_args(), generic=generic)
    assert {int(n) for n in re.findall(r"outbox_p(\d+)", heads)} == {1, 2}, heads


def test_an_ordered_claim_checks_through_the_parent_from_an_old_unfinished_partition(pconn):
    """Unfinished rows far below the window (a dead row pins its partition): the checks go
    through the parent, pruned to the partitions from there, rather than naming each one."""
    migrate(pconn, TABLE, "aggregate", layout=Layout(SIZE, 40))
    seed(pconn, 950, aggregates=20)
    pconn.execute("ANALYZE outbox")
    layout = Layout(SIZE, 40, named_leaves=True)
    low = 900 - (lease.CHECKED_PARTITIONS + 1) * SIZE
    q = lease._queries_within(TABLE, layout, (800, 900), low)
    assert q is queries(partition_table(TABLE, 8), checked=(TABLE, (low, 900), ()))
    assert '"outbox" AS prev' in q.claim_ordered.as_string(pconn)
    plan = explain_prepared(pconn, q.claim_ordered, _claim_args(), generic=False)
    touched = {int(n) for n in re.findall(r"outbox_p(\d+)", plan)}
    assert touched == set(range(low // SIZE, 9)), plan


def test_a_window_reading_names_the_partitions_themselves(pconn):
    """A reading of four partitions names each one (a statement through the parent planned
    several times as long), and finds what the same reading through the parent finds."""
    migrate(pconn, TABLE, "aggregate", layout=Layout(SIZE, 40))
    seed(pconn, 450, aggregates=20)
    pconn.execute("UPDATE outbox SET status = 'done', done_at = now() WHERE id < 230")
    pconn.execute("UPDATE outbox SET status = 'dead' WHERE id = 250")
    pconn.execute("UPDATE outbox SET available_at = now() + interval '1 hour' WHERE id < 260")
    layout = Layout(SIZE, 40, named_leaves=True)
    leaves = layout.leaves(TABLE, (0, 400))
    assert leaves == tuple(partition_table(TABLE, k) for k in range(4))
    reading = _window_reading(TABLE, (0, 400), leaves)
    assert "outbox_p" in reading.statement.as_string(pconn)
    through_parent = fetch(pconn, _window_reading(TABLE, (0, 400)))
    assert fetch(pconn, reading)[:2] == through_parent[:2] == (260, 230)
    # A partition named otherwise (or a converted table below the first): the parent.
    assert Layout(SIZE, 40).leaves(TABLE, (0, 400)) is None


@pytest.mark.parametrize("reading", ["window", "oldest unfinished"])
def test_a_reading_looks_in_no_partition_past_the_first_holding_what_it_looks_for(pconn, reading):
    """A partition the drain has just finished is costly to look in (an index entry for
    each row version no vacuum has removed yet, each visited in the heap), so a reading
    stops at the first partition holding what it looks for: the later ones' probes never
    run. Here partitions 0 and 1 are finished, 2 holds unfinished and ready rows."""
    migrate(pconn, TABLE, "aggregate", layout=Layout(SIZE, 40))
    seed(pconn, 450, aggregates=20)
    pconn.execute("UPDATE outbox SET status = 'done', done_at = now() WHERE id < 230")
    leaves = Layout(SIZE, 40, named_leaves=True).leaves(TABLE, (0, 400))
    read = _window_reading if reading == "window" else _oldest_unfinished
    query = read(TABLE, (0, 400), leaves)
    plan = [
        row[0]
        for row in pconn.execute(
            "EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF, SUMMARY OFF) "
            + query.statement.as_string(pconn)
        )
    ]
    probes = [re.search(r" on outbox_p(\d+)", line) for line in plan]
    ran = {
        int(p[1])
        for p, line in zip(probes, plan, strict=True)
        if p and "never executed" not in line
    }
    skipped = {
        int(p[1]) for p, line in zip(probes, plan, strict=True) if p and "never executed" in line
    }
    assert ran == {0, 1, 2} and skipped == {3}, "\n".join(plan)
    assert fetch(pconn, query)[0] == 230


async def _drain(
    aconn: Any, *, ordered: bool, batch: int, window: ClaimWindow | None = None
) -> list[list[int]]:
    """Claim and finalize until nothing is left; the ids of each claim."""
    window = window or ClaimWindow(Layout(SIZE, 3))
    claims = []
    while True:
        got = await lease.claim(
            aconn,
            TABLE,
            owner="w",
            batch=batch,
            lease=timedelta(minutes=1),
            max_attempts=5,
            ordered=ordered,
            window=window,
        )
        if not got:
            return claims
        claims.append([m.id for m in got])
        assert window.layout is not None
        done = await lease.finalize(
            aconn, TABLE, [Outcome.done(m) for m in got], layout=window.layout
        )
        assert done == {m.id for m in got}


@pytest.mark.parametrize("ordered", [False, True], ids=["unordered", "ordered"])
async def test_claims_drain_every_partition_and_move_their_window_on(pconn, empty_dsn, ordered):
    if ordered:
        migrate(pconn, TABLE, "aggregate")
    seed(pconn, 350, aggregates=7)
    async with await psycopg.AsyncConnection.connect(empty_dsn, autocommit=True) as aconn:
        claims = await _drain(aconn, ordered=ordered, batch=40)
    taken = [i for claim in claims for i in claim]
    assert sorted(taken) == list(range(1, 351))  # every row, once
    assert statuses(pconn) == {"done": 350}


@pytest.mark.parametrize("ordered", [False, True], ids=["unordered", "ordered"])
async def test_a_claim_that_takes_its_partitions_last_id_ends_there(pconn, empty_dsn, ordered):
    """Ids start at 1: the second claim of partition 0 comes back a row short, at the
    partition's end, and says so (the caller claims again at once) rather than taking that
    row from the next partition with a statement of its own; every claim after it starts at
    a partition's first id, so each claim of the drain is on one partition, each finalize
    too, and none comes back empty on the way."""
    if ordered:
        migrate(pconn, TABLE, "aggregate")
    seed(pconn, 350, aggregates=350)  # one message an aggregate: every row a head
    async with await psycopg.AsyncConnection.connect(empty_dsn, autocommit=True) as aconn:
        claims = await _drain(aconn, ordered=ordered, batch=50)
    assert [(c[0], c[-1]) for c in claims] == [
        (1, 50), (51, 99), (100, 149), (150, 199), (200, 249), (250, 299), (300, 349), (350, 350)
    ]  # fmt: skip
    assert statuses(pconn) == {"done": 350}


@pytest.mark.parametrize("ordered", [False, True], ids=["unordered", "ordered"])
async def test_ids_given_past_every_partition_leave_the_claims_in_the_partitions_made(
    empty_dsn, ordered
):
    """Inserts no partition took spend their ids all the same: the sequence is past every
    partition made (here 350, partitions up to 199, none made since: a worker's role may
    not create tables). The claims look only in the partitions made, where the window
    named the ones the ids reach and every claim failed on a missing partition, the rows
    below left undelivered until someone made partitions."""
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        migrate(conn, TABLE, "aggregate" if ordered else None, layout=Layout(SIZE, 1))
        seed(conn, 150, aggregates=7)
        conn.execute("SELECT setval('outbox_id_seq', 350)")
        async with await psycopg.AsyncConnection.connect(empty_dsn, autocommit=True) as aconn:
            window = ClaimWindow(await check(aconn, TABLE))  # as a worker learns it
            claims = await _drain(aconn, ordered=ordered, batch=40, window=window)
        assert sorted(i for claim in claims for i in claim) == list(range(1, 151))
        assert statuses(conn) == {"done": 150}


async def test_a_look_after_the_first_that_fails_returns_what_the_first_leased(pconn, empty_dsn):
    """A claim's first look leases rows of partition 0 and comes back short (id 99 is done,
    its last id untaken), so it looks again in partition 1, which its role may no longer
    update: the rows leased are returned, where the failure dropped them, left in
    `processing` until their lease ran out; the next claim meets the refusal itself."""
    seed(pconn, 150)
    pconn.execute("UPDATE outbox SET status = 'done', done_at = now() WHERE id = 99")
    pconn.execute("CREATE ROLE look_again LOGIN PASSWORD 'look'")
    pconn.execute(
        "GRANT SELECT, UPDATE ON outbox, outbox_p0, outbox_p1, outbox_p2, outbox_p3 TO look_again"
    )
    pconn.execute("GRANT SELECT ON SEQUENCE outbox_id_seq TO look_again")
    pconn.execute("GRANT SELECT ON outbox_layout TO look_again")
    worker = psycopg.conninfo.make_conninfo(empty_dsn, user="look_again", password="look")
    async with await psycopg.AsyncConnection.connect(worker, autocommit=True) as aconn:
        window = ClaimWindow(await check(aconn, TABLE))

        async def claim(batch: int) -> list[int]:
            got = await lease.claim(
                aconn, TABLE, owner="w", batch=batch, lease=timedelta(minutes=1),
                max_attempts=5, window=window,
            )  # fmt: skip
            return [m.id for m in got]

        assert await claim(10) == list(range(1, 11))  # the window read, on partition 0
        pconn.execute("REVOKE UPDATE ON outbox_p1 FROM look_again")
        assert await claim(120) == list(range(11, 99))
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            await claim(120)
    assert statuses(pconn) == {"processing": 98, "done": 1, "pending": 51}


async def _ordered_claim(aconn: Any, window: ClaimWindow, batch: int) -> list[Any]:
    """An ordered claim of up to `batch` through `window`."""
    return await lease.claim(
        aconn, TABLE, owner="w", batch=batch, lease=timedelta(minutes=1),
        max_attempts=5, ordered=True, window=window,
    )  # fmt: skip


async def test_ordered_mode_keeps_an_aggregates_order_across_a_partition_boundary(pconn, empty_dsn):
    """An aggregate's first message is in partition 0 and still in flight; its next ones sit
    in partition 1, which the window has moved to: they wait for it."""
    migrate(pconn, TABLE, "aggregate")
    seed(pconn, 99, aggregates=99)  # ids 1-99: one message each of agg-0 .. agg-98
    seed(pconn, 60, aggregates=1)  # ids 100-159: agg-0's next messages, in partition 1
    async with await psycopg.AsyncConnection.connect(empty_dsn, autocommit=True) as aconn:
        window = ClaimWindow(Layout(SIZE, 3))
        claim = partial(_ordered_claim, aconn, window)

        first = await claim(99)  # every head: agg-0's id 1 among them, held
        assert [m.id for m in first] == list(range(1, 100))
        # It took partition 0's last id: the window has moved on to partition 1, its head
        # check still looking from partition 0, where id 1 is in flight.
        assert window.bounds() == Bounds(100, 200, 0)
        held_head = next(m for m in first if m.id == 1)
        others = [Outcome.done(m) for m in first if m.id != 1]
        await lease.finalize(aconn, TABLE, others, layout=window.layout)
        # Partition 0 is all done but id 1; partition 1 holds only agg-0's later messages.
        assert await claim(50) == []
        await lease.finalize(aconn, TABLE, [Outcome.done(held_head)], layout=window.layout)
        after = await claim(50)
        assert [m.id for m in after] == [100]  # the next head, in the next partition


async def test_an_ordered_catch_up_looks_only_below_the_partition_its_claim_took_rows_in(
    pconn, empty_dsn, monkeypatch
):
    """A claim that took its partition's last id moved the window on, and the next claim's
    catch-up looked up to the window: into the partition just left, whose rows that claim
    holds, walking the entries of the rows done before them to find one of those. It looks
    below it only: with partition 0 in flight, not at all; then partition 0 alone."""
    from outbox import claim_window

    looked: list[tuple[int, int]] = []
    oldest_unfinished = claim_window._oldest_unfinished

    def spied(table: Table, behind: tuple[int, int], leaves: Any) -> Any:
        looked.append(behind)
        return oldest_unfinished(table, behind, leaves)

    monkeypatch.setattr(claim_window, "_oldest_unfinished", spied)
    migrate(pconn, TABLE, "aggregate")
    seed(pconn, 299, aggregates=299)  # ids 1-299, an aggregate each: every row a head
    async with await psycopg.AsyncConnection.connect(empty_dsn, autocommit=True) as aconn:
        window = ClaimWindow(Layout(SIZE, 3))
        claim = partial(_ordered_claim, aconn, window)

        first = await claim(99)
        assert [m.id for m in first] == list(range(1, 100))
        assert window.bounds() == Bounds(100, 200, 0)
        second = await claim(100)  # partition 0 in flight: no look behind
        assert [m.id for m in second] == list(range(100, 200))
        assert looked == []
        await lease.finalize(aconn, TABLE, [Outcome.done(m) for m in first], layout=window.layout)
        third = await claim(100)  # partition 0 done: looked into, below partition 1 only
        assert [m.id for m in third] == list(range(200, 300))
        assert looked == [(0, 100)]


@pytest.mark.parametrize("ordered", [False, True], ids=["unordered", "ordered"])
async def test_a_row_committed_after_the_rows_behind_it_were_delivered_is_claimed_first(
    pconn, empty_dsn, ordered
):
    """A producer's transaction takes id 1 and stays open while 250 later rows are committed
    and delivered, then commits, and its aggregate's next message follows. The window has
    moved to the top meanwhile; its floor did not, since a transaction open during its
    readings could still commit a row below: the next claim takes id 1 (the floor stood at
    the last rows' partition before, and id 1 waited for the reading from the lowest
    partition, 30s), and in ordered mode the aggregate's next message waits for it (it went
    first before)."""
    if ordered:
        migrate(pconn, TABLE, "aggregate")
    late = {"aggregate_type": "order", "aggregate_id": "late", "event_type": "Tested"}
    window = ClaimWindow(Layout(SIZE, 3))
    window.announcing = True  # as the worker's listener sets it
    with psycopg.connect(empty_dsn) as producer:
        assert enqueue(producer, **late, payload=0, lock_aggregate=True) == 1  # uncommitted
        seed(pconn, 250, aggregates=250)  # ids 2-251, committed
        async with await psycopg.AsyncConnection.connect(empty_dsn, autocommit=True) as aconn:
            drained = await _drain(aconn, ordered=ordered, batch=50, window=window)
            assert sorted(i for c in drained for i in c) == list(range(2, 252))
            await window.read(aconn, TABLE, 50)  # as the one every WINDOW_TTL does
            assert window.bounds().low == 200  # the window is at the top
            producer.commit()
            # The aggregate's next message: its producer waited for the first one's lock.
            assert enqueue(pconn, **late, payload=1, lock_aggregate=True) == 252
            window.announced()  # the listener heard both
            claims = await _drain(aconn, ordered=ordered, batch=50, window=window)
            assert claims[0][0] == 1
            if ordered:
                assert claims == [[1], [252]]

            # With no transaction open since, readings move the floor up to the top again.
            async def settled() -> bool:
                await window.read(aconn, TABLE, 50)
                return window.bounds().unfinished_low == 200

            await wait_until(settled, what="the floor to move up")
    assert statuses(pconn) == {"done": 252}


LATE = {"aggregate_type": "order", "aggregate_id": "late", "event_type": "Tested"}
OTHER = {"aggregate_type": "order", "aggregate_id": "other", "event_type": "Tested"}


def _writing(conn: Any) -> int:
    """Begin writing in this transaction (as business rows before the event would): its id."""
    return int(conn.execute("SELECT pg_current_xact_id()::text::bigint").fetchone()[0])


@asynccontextmanager
async def _partition_0_drained(
    pconn: Any, empty_dsn: str, ordered: bool
) -> AsyncIterator[tuple[Any, ClaimWindow]]:
    """Ids 1-98 delivered by a window listening for new rows: a connection and the window."""
    if ordered:
        migrate(pconn, TABLE, "aggregate")
    window = ClaimWindow(Layout(SIZE, 3))
    window.announcing = True
    seed(pconn, 98, aggregates=10)
    async with await psycopg.AsyncConnection.connect(empty_dsn, autocommit=True) as aconn:
        await _drain(aconn, ordered=ordered, batch=50, window=window)
        yield aconn, window


async def _late_row_goes_first(pconn: Any, aconn: Any, window: ClaimWindow, ordered: bool) -> None:
    """Once the producer holding id 99 committed: its aggregate's next message (101) is
    enqueued, and the claims take 99 first (ordered: 101 only after 99 is done)."""
    assert enqueue(pconn, **LATE, payload=1, lock_aggregate=True) == 101
    window.announced()
    claims = await _drain(aconn, ordered=ordered, batch=50, window=window)
    assert claims[0][0] == 99, claims
    if ordered:
        assert claims == [[99], [101]], claims


@pytest.mark.parametrize("ordered", [False, True], ids=["unordered", "ordered"])
async def test_a_producer_holding_the_newest_transaction_id_keeps_the_floor(
    pconn, empty_dsn, ordered
):
    """The producer holding id 99 open began last, and no newer transaction had ended when
    the window was read: a snapshot's xmax is past the newest transaction ended, so the
    reading saw nothing open (xmin = xmax) and took partition 1 for the floor at once. The
    bound a reading keeps is past every transaction id handed out."""
    async with _partition_0_drained(pconn, empty_dsn, ordered) as (aconn, window):
        with psycopg.connect(empty_dsn) as other, psycopg.connect(empty_dsn) as producer:
            _writing(other)
            _writing(producer)  # the newest transaction id
            assert enqueue(producer, **LATE, payload=0, lock_aggregate=True) == 99
            assert enqueue(other, **OTHER, payload=0, lock_aggregate=True) == 100
            other.commit()
            window.announced()
            assert await _drain(aconn, ordered=ordered, batch=50, window=window) == [[100]]
            producer.commit()
        await _late_row_goes_first(pconn, aconn, window, ordered)


@pytest.mark.parametrize("ordered", [False, True], ids=["unordered", "ordered"])
async def test_a_sighting_settles_only_once_the_producer_holding_a_row_below_has_ended(
    pconn, empty_dsn, ordered
):
    """A transaction open during the reading makes its finding a sighting; that one ends,
    later claims commit newer transactions, and the next reading's xmin is the producer's
    own transaction id (still open): the sighting must not settle on it."""
    async with _partition_0_drained(pconn, empty_dsn, ordered) as (aconn, window):
        with (
            psycopg.connect(empty_dsn) as unrelated,
            psycopg.connect(empty_dsn) as other,
            psycopg.connect(empty_dsn) as producer,
        ):
            _writing(unrelated)
            _writing(other)
            _writing(producer)
            assert enqueue(producer, **LATE, payload=0, lock_aggregate=True) == 99
            assert enqueue(other, **OTHER, payload=0, lock_aggregate=True) == 100
            other.commit()
            window.announced()
            await window.read(aconn, TABLE, 50)
            assert window.bounds().unfinished_low == 0  # a sighting, no more
            unrelated.commit()
            assert await _drain(aconn, ordered=ordered, batch=50, window=window) == [[100]]
            await window.read(aconn, TABLE, 50)
            assert window.bounds().unfinished_low == 0
            producer.commit()
        await _late_row_goes_first(pconn, aconn, window, ordered)


@pytest.mark.parametrize("ordered", [False, True], ids=["unordered", "ordered"])
async def test_the_first_reading_of_a_window_settles_nothing_while_a_producer_is_open(
    pconn, empty_dsn, ordered
):
    """A fresh window (a worker's start, a forget on a replay or a reconnection) reads while
    the producer of id 99 is open: it starts at the lowest partition and its floor stays
    there (it took the window's low, where the ready rows were, for its start)."""
    if ordered:
        migrate(pconn, TABLE, "aggregate")
    seed(pconn, 98, aggregates=10)  # ids 1-98
    pconn.execute("UPDATE outbox SET status = 'done', done_at = now()")
    window = ClaimWindow(Layout(SIZE, 3))
    window.announcing = True
    async with await psycopg.AsyncConnection.connect(empty_dsn, autocommit=True) as aconn:
        with psycopg.connect(empty_dsn) as producer:
            assert enqueue(producer, **LATE, payload=0, lock_aggregate=True) == 99
            seed(pconn, 2, aggregates=2)  # ids 100-101, committed
            await window.read(aconn, TABLE, 50)
            assert window.bounds() == Bounds(100, 200, 0)
            assert await _drain(aconn, ordered=ordered, batch=50, window=window) == [[100, 101]]
            producer.commit()
        assert enqueue(pconn, **LATE, payload=1, lock_aggregate=True) == 102
        window.announced()
        claims = await _drain(aconn, ordered=ordered, batch=50, window=window)
        assert claims[0][0] == 99, claims
        if ordered:
            assert claims == [[99], [102]], claims


def test_sightings_past_the_cap_merge_and_the_floor_keeps_moving():
    """Readings every moment while transactions each last 20 of them: 20 sightings wait at
    any time. Past the cap the newest two merge (the lower floor, the later bound); dropping
    the oldest, the first to settle, left the floor at 0 for good. A merged sighting never
    settles before its later bound is passed."""
    settling = Settling()
    assert settling.settle(0, 0, xmin=0, bound=1) == 0
    floors = [
        settling.settle(100 * (k // 10), 0, xmin=max(0, k - 20), bound=k + 1)
        for k in range(1, 2000)
    ]
    assert floors[-1] >= 100 * (1979 // 10) - 100  # behind by about the transactions' life
    assert all(a <= b for a, b in itertools.pairwise(floors))
    assert len(settling._sightings) <= SIGHTINGS_KEPT
    # None of them settles before every transaction of its reading has ended.
    waiting = Settling()
    waiting.settle(0, 0, xmin=0, bound=1)
    for k in range(1, 40):
        assert waiting.settle(100 * k, 0, xmin=1, bound=k + 1) == 0


class _CountingWindow(ClaimWindow):
    """A claim window that counts its readings."""

    reads = 0

    async def read(self, conn: Any, table: Table, batch: int) -> None:
        self.reads += 1
        await super().read(conn, table, batch)


async def test_an_ordered_window_wide_to_the_top_stays_while_no_row_is_announced(pconn, empty_dsn):
    """A few busy aggregates: every ordered claim is short (a head each). Once the window
    reaches the top of the ids, a short claim keeps it while the listener announces no new
    row, where it read the window again after each claim (two statements more a claim: an
    ordered drain over 7 aggregates made half the claims of the plain table's). A row
    announced has the next claim read again, and it finds the rows past the old top."""
    migrate(pconn, TABLE, "aggregate")
    seed(pconn, 150, aggregates=3)  # ids 1-150: 3 aggregates, 50 messages each
    window = _CountingWindow(Layout(SIZE, 3))
    window.announcing = True  # as the worker's listener sets it
    async with await psycopg.AsyncConnection.connect(empty_dsn, autocommit=True) as aconn:

        async def drain() -> list[list[int]]:
            claims = []
            while got := await lease.claim(
                aconn, TABLE, owner="w", batch=50, lease=timedelta(minutes=1),
                max_attempts=5, ordered=True, window=window,
            ):  # fmt: skip
                claims.append([m.id for m in got])
                await lease.finalize(
                    aconn, TABLE, [Outcome.done(m) for m in got], layout=window.layout
                )
            return claims

        claims = await drain()
        assert len(claims) == 50 and all(len(c) == 3 for c in claims)  # a head each
        assert window.reads <= 3, window.reads  # the first, the widened one (and a spare)
        seed(pconn, 110, aggregates=3)  # ids 151-260: the last 60 past the old top, 200
        window.announced()
        reads = window.reads
        assert sum(map(len, await drain())) == 110
        assert window.reads - reads <= 3, window.reads - reads
    assert statuses(pconn) == {"done": 260}


async def test_an_unordered_window_at_the_top_stays_while_no_row_is_announced(
    pconn, empty_dsn, monkeypatch
):
    """The end of a drain: the last row alone in its partition, the claim of it short at the
    top of the ids. It kept its window, where it read the window again from the floor the
    first reading found, over every partition the drain went through (at 1,000-id
    partitions, 70 ms: a tenth of a 30,000-row drain). A retry come due below the window is
    found by the reading every WINDOW_TTL; rows announced, at once."""
    seed(pconn, 301)  # ids 1-301: 301 alone in its partition
    window = _CountingWindow(Layout(SIZE, 3))
    window.announcing = True  # as the worker's listener sets it
    async with await psycopg.AsyncConnection.connect(empty_dsn, autocommit=True) as aconn:

        async def claim() -> list[Any]:
            return await lease.claim(
                aconn, TABLE, owner="w", batch=50, lease=timedelta(minutes=1),
                max_attempts=5, window=window,
            )  # fmt: skip

        async def drain() -> list[int]:
            taken = []
            while got := await claim():
                taken += [m.id for m in got]
                outcomes = [
                    Outcome.retry(m, timedelta(hours=1), "503")
                    if m.id == 120 and m.attempts == 1
                    else Outcome.done(m)
                    for m in got
                ]
                await lease.finalize(aconn, TABLE, outcomes, layout=window.layout)
            return taken

        assert sorted(await drain()) == list(range(1, 302))
        assert window.reads == 1, window.reads  # the first: the claims moved it on
        assert statuses(pconn) == {"done": 300, "pending": 1}  # 120, to retry
        pconn.execute("UPDATE outbox SET available_at = now() WHERE id = 120")  # due, below
        assert await drain() == []  # the window stays
        monkeypatch.setattr("outbox.claim_window.WINDOW_TTL", 0.0)
        assert await drain() == [120]  # the next reading found it
        monkeypatch.undo()
        seed(pconn, 10)  # ids 302-311, past the top the window read
        window.announced()
        reads = window.reads
        assert sorted(await drain()) == list(range(302, 312))
        assert window.reads - reads == 1, window.reads - reads
    assert statuses(pconn) == {"done": 311}


async def test_a_worker_drains_a_partitioned_table_through_fencing_and_retries(pconn, empty_dsn):
    """A real replica: claims, retries with backoff, dead letters and extends on the
    partitioned table, every statement through its window."""
    migrate(pconn, TABLE, layout=Layout(SIZE, 5))
    seed(pconn, 420, aggregates=10)
    failed: set[int] = set()

    async def publish(message: Any) -> None:
        if message.id % 50 == 0 and message.id not in failed:
            failed.add(message.id)
            raise RetryableError("first attempt fails")  # retried later, in its partition

    s = settings(empty_dsn, batch=40, lease=timedelta(seconds=3))
    async with dispatching(s, Scripted(publish)) as replica:
        await wait_until(lambda: statuses(pconn) == {"done": 420}, what="all done")
        assert replica.window.layout == Layout(SIZE, 5)
    assert len(failed) == 8


async def test_enqueue_past_the_partitions_made_ahead_says_which_table_and_what_to_do(
    pconn, empty_dsn
):
    seed(pconn, 399)  # ids 1-399 fill every partition made (up to id 399)
    with pytest.raises(OutOfPartitions, match=r"table outbox has no partition for id 400") as e:
        enqueue(pconn, aggregate_type="a", aggregate_id="1", event_type="E", payload={})
    assert "outbox maintain --table outbox" in str(e.value)
    async with await psycopg.AsyncConnection.connect(empty_dsn, autocommit=True) as aconn:
        with pytest.raises(OutOfPartitions, match="--partitions-ahead"):
            await enqueue_many(aconn, [Event("a", "1", "E", {})])
    # Any other check violation stays PostgreSQL's own.
    with pytest.raises(psycopg.errors.CheckViolation) as other:
        pconn.execute("INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, "
                      "status) VALUES ('a', '1', 'E', '{}', 'lost')")  # fmt: skip
    assert not isinstance(other.value, OutOfPartitions)
    migrate(pconn, TABLE, layout=Layout(SIZE, 3))  # what `outbox maintain` does first
    assert enqueue(pconn, aggregate_type="a", aggregate_id="1", event_type="E", payload={}) > 399


async def test_workers_keep_partitions_ahead_and_report_the_ids_left(pconn, empty_dsn, caplog):
    seed(pconn, 250)  # partitions up to id 399: 149 ids left ahead, 3 partitions wanted
    s = settings(empty_dsn, batch=40)
    caplog.set_level(logging.INFO, logger="outbox.worker")
    async with dispatching(s, Scripted(lambda m: None)) as replica:
        await wait_until(lambda: _leaves(pconn)[-1] == (500, 600), what="partitions made")
        # A partition a pass (more than a quarter was left), said once for the top-up.

        def said() -> list[str]:
            return [r.getMessage() for r in caplog.records if "ahead of" in r.getMessage()]

        await wait_until(said, what="the top-up said")
        assert said() == ["made 2 partitions ahead of outbox"]
        # Made on their own and attached: each has the parent's indexes.
        indexes = pconn.execute(
            "SELECT count(*) FROM pg_indexes WHERE tablename = 'outbox_p5'"
        ).fetchone()
        assert indexes == (5,)  # primary key, ready, leased, waiting, dead
        ids_ahead = replica.metrics.partition_ids_ahead
        await wait_until(lambda: ids_ahead._value.get() == 599 - 250, what="the metric")
        assert replica.metrics.partition_ids_target._value.get() == 300


async def test_a_top_up_makes_a_partition_a_pass_until_a_quarter_is_left(empty_dsn):
    """Partitions made ahead while a worker drains slow the drain (each ATTACH makes every
    session reload the table's partitions): a top-up with more than a quarter of the target
    left makes one partition a pass (the keeper paces its passes); below a quarter, every
    partition missing at once, as producers are near the end of what is made."""
    layout = Layout(SIZE, 8)  # a target of 800 ids ahead, topped up below 600
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        migrate(conn, TABLE, layout=layout)  # p0..p8
        seed(conn, 400)  # 499 ids left ahead: top up, one at a time
        async with await psycopg.AsyncConnection.connect(empty_dsn, autocommit=True) as aconn:
            passes = [await keep_ahead(aconn, TABLE, layout)]
            while passes[-1].more:
                passes.append(await keep_ahead(aconn, TABLE, layout, topping_up=True))
            assert [(p.made, p.left) for p in passes] == [(1, 599), (1, 699), (1, 799), (1, 899)]
            assert _leaves(conn)[-1] == (1200, 1300)
            idle = await keep_ahead(aconn, TABLE, layout)
            assert (idle.made, idle.more) == (0, False)  # 899 left: nothing to do, no lock
            seed(conn, 850)  # up to id 1250: 49 left, under a quarter of the target
            urgent = await keep_ahead(aconn, TABLE, layout)
        assert (urgent.made, urgent.left, urgent.more) == (8, 849, False)
        assert _leaves(conn)[-1] == (2000, 2100)


async def test_a_worker_whose_role_may_not_create_tables_says_so_once(pconn, empty_dsn, caplog):
    pconn.execute("CREATE ROLE outbox_dml LOGIN PASSWORD 'dml'")
    pconn.execute(
        "GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO outbox_dml"
    )
    pconn.execute("GRANT USAGE ON ALL SEQUENCES IN SCHEMA public TO outbox_dml")
    pconn.execute("REVOKE CREATE ON SCHEMA public FROM PUBLIC")
    seed(pconn, 250)
    params = psycopg.conninfo.conninfo_to_dict(empty_dsn)
    dml = psycopg.conninfo.make_conninfo(**{**params, "user": "outbox_dml", "password": "dml"})
    s = settings(dml, batch=40)
    with caplog.at_level("WARNING", logger="outbox.worker"):
        async with dispatching(s, Scripted(lambda m: None)) as replica:
            ids_ahead = replica.metrics.partition_ids_ahead
            await wait_until(lambda: ids_ahead._value.get() == 399 - 250, what="the metric")
    told = [r.getMessage() for r in caplog.records if "may not make partitions" in r.getMessage()]
    assert len(told) == 1
    # PostgreSQL's reason, and what making one takes (CREATE on the schema is not enough).
    assert "permission denied for schema public" in told[0], told
    assert "the table's owner or a member of its role" in told[0], told
    assert _leaves(pconn)[-1] == (300, 400)  # left to `outbox maintain`


async def test_stats_requeue_and_the_operators_read_work_on_a_partitioned_table(pconn, empty_dsn):
    """What people and the operator use, unchanged on the partitioned table."""
    seed(pconn, 250, aggregates=5)
    pconn.execute("UPDATE outbox SET status = 'done', done_at = now() WHERE id < 200")
    pconn.execute("UPDATE outbox SET status = 'dead', last_error = 'x' WHERE id IN (120, 230)")

    def outbox(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "outbox", *args, "--dsn", empty_dsn],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip

    stats = outbox("stats", "--json")
    assert stats.returncode == 0, stats.stderr
    counts = json.loads(stats.stdout)
    assert (counts["pending"], counts["dead"]) == (50, 2), counts
    requeued = outbox("requeue", "--id", "120,230")
    assert requeued.returncode == 0, requeued.stderr
    assert statuses(pconn) == {"done": 198, "pending": 52}
    async with await psycopg.AsyncConnection.connect(empty_dsn, autocommit=True) as aconn:
        backlog, _ = await read_table(aconn, TABLE)
    assert backlog.pending == 52


@pytest.mark.parametrize("ordering", ["none", "aggregate"])
def test_two_worker_processes_one_killed_drain_a_partitioned_table(pconn, empty_dsn, ordering):
    """Real processes: one is SIGKILLed mid-drain; its leases expire and the other takes its
    rows over, each window and head check across partitions. Nothing is lost."""
    migrate(pconn, TABLE, ordering, layout=Layout(SIZE, 25))
    seed(pconn, 2000, aggregates=40)
    flags = ("--publisher", "null", "--batch", "50", "--lease", "2s", "--ordering", ordering)
    doomed = spawn_worker(empty_dsn, *flags, owner="doomed")
    survivor = spawn_worker(empty_dsn, *flags, owner="survivor")
    try:
        wait_until_db(pconn, "(SELECT count(*) >= 300 FROM outbox WHERE status = 'done')", 60)
        stop_worker(doomed, signal.SIGKILL)
        wait_until_db(pconn, "NOT EXISTS (SELECT FROM outbox WHERE status <> 'done')", 90)
    finally:
        stop_worker(doomed, signal.SIGKILL)
        assert stop_worker(survivor) == 0
    assert statuses(pconn) == {"done": 2000}


async def test_a_partition_attached_under_another_name_sends_claims_through_the_parent(
    pconn, empty_dsn
):
    seed(pconn, 120)
    async with await psycopg.AsyncConnection.connect(empty_dsn, autocommit=True) as aconn:
        layout = await check_table(aconn, TABLE)
        assert layout is not None and layout.named_leaves
        # By hand: partition 1's rows now live in a table of another name.
        pconn.execute("ALTER TABLE outbox DETACH PARTITION outbox_p1")
        pconn.execute("ALTER TABLE outbox_p1 RENAME TO outbox_old_1")
        pconn.execute(
            "ALTER TABLE outbox ATTACH PARTITION outbox_old_1 FOR VALUES FROM (100) TO (200)"
        )
        pconn.execute("UPDATE outbox SET status = 'done', done_at = now() WHERE id < 100")
        window = ClaimWindow(layout)

        async def claim() -> list[Any]:
            return await lease.claim(
                aconn, TABLE, owner="w", batch=50, lease=timedelta(minutes=1), max_attempts=5,
                window=window,
            )  # fmt: skip

        # The claim meets the missing name, checks the table again and claims through the
        # parent at once, from then on.
        assert [m.id for m in await claim()] == list(range(100, 121))
        assert window.layout is not None and not window.layout.named_leaves


async def _replay_aggregate(pconn: Any, aggregate_id: str) -> int:
    """`outbox replay --aggregate-id` of every done row of the aggregate; how many."""
    now = datetime.now(UTC)
    f = ReplayFilter(now - timedelta(hours=1), now + timedelta(hours=1), aggregate_id=aggregate_id)
    progress = perform(pconn, start(TABLE, perform(pconn, preview(TABLE, f))))
    while not progress.finished:
        perform(pconn, send_batch(TABLE, progress))
    return progress.sent


@pytest.mark.parametrize("by_aggregate", [False, True], ids=["rows", "heads"])
async def test_a_replayed_row_waits_for_a_later_message_in_flight_in_another_partition(
    pconn, empty_dsn, by_aggregate
):
    """Aggregate A's id 650 (partition 6) is in flight when its id 50 (partition 0) is
    replayed: a claim whose window is partition 0 alone (named as the leaf itself) must not
    take 50 until 650 is finalized."""
    migrate(pconn, TABLE, "aggregate", layout=Layout(SIZE, 8))
    seed(pconn, 660, aggregates=660)
    pconn.execute("UPDATE outbox SET aggregate_id = 'A' WHERE id IN (50, 650)")
    pconn.execute("UPDATE outbox SET status = 'done', done_at = now() WHERE id <> 650")
    async with await psycopg.AsyncConnection.connect(empty_dsn, autocommit=True) as aconn:
        layout = await check_table(aconn, TABLE)
        assert layout is not None and layout.named_leaves

        async def claim(window: ClaimWindow) -> list[Any]:
            return await lease.claim(
                aconn, TABLE, owner="w", batch=50, lease=timedelta(minutes=1), max_attempts=5,
                ordered=True, by_aggregate=by_aggregate, window=window,
            )  # fmt: skip

        [in_flight] = await claim(ClaimWindow(layout))
        assert in_flight.id == 650
        assert await _replay_aggregate(pconn, "A") == 1  # id 50, pending again
        window = ClaimWindow(layout)
        await window.read(aconn, TABLE, 50)
        assert window.bounds() == Bounds(0, SIZE, 0)  # partition 0 alone: the leaf is named
        assert await claim(window) == []
        await lease.finalize(aconn, TABLE, [Outcome.done(in_flight)], layout=layout)
        [again] = await claim(window)
        assert (again.id, again.replay) == (50, 1)


async def test_finalize_and_extend_of_rows_in_a_partition_attached_under_another_name(
    pconn, empty_dsn
):
    """Rows held in partition 1 when it is re-attached under another name: the lease's
    extension and the finalize (each naming partition 1 itself) go through the parent
    instead, and apply."""
    seed(pconn, 120)
    pconn.execute("UPDATE outbox SET status = 'done', done_at = now() WHERE id < 100")
    async with await psycopg.AsyncConnection.connect(empty_dsn, autocommit=True) as aconn:
        layout = await check_table(aconn, TABLE)
        assert layout is not None and layout.named_leaves
        held = await lease.claim(
            aconn, TABLE, owner="w", batch=50, lease=timedelta(minutes=1), max_attempts=5,
            window=ClaimWindow(layout),
        )  # fmt: skip
        assert [m.id for m in held] == list(range(100, 121))
        pconn.execute("ALTER TABLE outbox DETACH PARTITION outbox_p1")
        pconn.execute("ALTER TABLE outbox_p1 RENAME TO outbox_old_1")
        pconn.execute(
            "ALTER TABLE outbox ATTACH PARTITION outbox_old_1 FOR VALUES FROM (100) TO (200)"
        )
        renewed = await lease.extend(aconn, TABLE, held, lease=timedelta(minutes=2), layout=layout)
        assert renewed == {m.id for m in held}
        outcomes = [Outcome.done(m) for m in held[:-1]]
        outcomes.append(Outcome.dead(held[-1], "permanent"))
        applied = await lease.finalize(aconn, TABLE, outcomes, layout=layout)
        assert applied == {m.id for m in held}
    assert statuses(pconn) == {"done": 119, "dead": 1}


@pytest.mark.parametrize("name", ["outbox", "o" * 60], ids=["short", "cut-short"])
async def test_the_ids_left_ahead_read_from_the_names_are_the_bounds_own(pconn, empty_dsn, name):
    """The keeper's every pass reads the ids left ahead from the partitions' names (no bound
    deparsed); a table whose partitions' names may be cut short to fit PostgreSQL's limit
    reads the bounds. Either way the figure is the bounds' own, and a partition made ahead
    moves it."""
    from outbox.partitions import _top_by_name, check, ids_ahead, make_partition

    table = Table.parse(name)
    migrate(pconn, table, None, layout=Layout(SIZE, 3))
    pconn.execute(
        psycopg.sql.SQL(
            "INSERT INTO {t} (aggregate_type, aggregate_id, event_type, payload) "
            "SELECT 'order', '1', 'Tested', '{{}}' FROM generate_series(1, 250)"
        ).format(t=table.ident)
    )
    async with await psycopg.AsyncConnection.connect(empty_dsn, autocommit=True) as aconn:
        layout = await check(aconn, table)
        assert layout is not None and layout.named_leaves
        by_bounds = await ids_ahead(aconn, table)
        assert await ids_ahead(aconn, table, layout) == by_bounds
        by_name = await _top_by_name(aconn, table, layout)
        assert (by_name is None) == (name != "outbox")
        made = partition_table(table, 100)
        for statement in make_partition(table, 100, 100 * SIZE, 101 * SIZE):
            await aconn.execute(statement)
        assert made.name in {p.name for p in fetch(pconn, read_partitions(table)) or []}
        assert await ids_ahead(aconn, table, layout) == await ids_ahead(aconn, table)
        assert await ids_ahead(aconn, table) == 101 * SIZE - 1 - 250
        assert made.name == f"{name}_p100" or name != "outbox"


def test_partitions_far_behind_the_sequence_are_refused_not_made_one_by_one(pconn, empty_dsn):
    """The sequence moved far past the partitions made (a RESTART, or inserts no partition
    took spending their ids in a loop): every partition up to it was made, a statement after
    another (a million of them behind an id of a billion). A run makes at most
    MAKE_AT_ONCE_FACTOR times the target, refuses the rest in one line naming the fix, and
    retires what it may all the same; so does the worker's keeper, every pass, once said."""
    seed(pconn, 150)
    pconn.execute("UPDATE outbox SET status = 'done', done_at = now() WHERE id < 100")
    pconn.execute("SELECT setval('outbox_id_seq', 1000000000)")
    refused = outbox(empty_dsn, "maintain", "--retention", "0s")
    assert refused.returncode == 1, refused.stdout
    assert refused.stderr.strip().splitlines() == [
        "outbox: error: table outbox: the last id given, 1000000000, lies 9999997 partitions "
        "past those made (ids below 400); making them all is refused (at most 16 a run). No "
        "row can hold an id no partition took: if the sequence was not moved on purpose, "
        "`SELECT setval('\"outbox_id_seq\"', 399)` (its next id 400) and run again"
    ]
    # Retired all the same: p0 (done) and p2 (empty, below the sequence's last id); p3, the
    # highest made, counts as holding the newest ids and stays (retired, no partition would
    # be left once the rows of p1 are done).
    assert _leaves(pconn) == [(100, 200), (300, 400)]
    pconn.execute("""SELECT setval('"outbox_id_seq"', 399)""")
    again = outbox(empty_dsn, "maintain", "--retention", "0s")
    assert again.returncode == 0, again.stderr
    assert _leaves(pconn)[-1] == (600, 700)  # the last id given, 399, and 3 partitions past


def test_no_partition_is_made_past_the_bigint_range() -> None:
    layout = Layout(10**12, 3)
    top = 2**63 - 1
    made = [Partition("outbox_p9223369", 9_223_369 * 10**12, 9_223_370 * 10**12)]
    missing = missing_ahead(TABLE, made, top - 10**12, layout)
    assert missing  # up to the last whole partition below the top of the range, no further
    assert max(high for _, _, high in missing) <= top
    assert missing[-1][0] == top // 10**12 - 1


def test_a_restarted_sequence_is_read_as_where_its_next_id_will_be(pconn, empty_dsn):
    """After `ALTER SEQUENCE ... RESTART WITH n` (or setval(..., false)) PostgreSQL's
    pg_sequence_last_value answers NULL until the next nextval: read as 0, the partitions
    ahead and the ids left ahead were counted from 0 (none made, every partition `made
    ahead`) while the next insert took id n."""
    seed(pconn, 150)
    last_given = sql.SQL("SELECT {last}").format(last=last_id_given(TABLE))
    pconn.execute("ALTER SEQUENCE outbox_id_seq RESTART WITH 350")
    assert pconn.execute(last_given).fetchone() == (349,)
    made = outbox(empty_dsn, "maintain")
    assert made.returncode == 0, made.stderr
    assert "made 3 partitions ahead" in made.stdout
    assert _leaves(pconn)[-1] == (600, 700)  # the id before the next, 349, and 3 past its own
    listing = json.loads(outbox(empty_dsn, "partitions", "--json").stdout)["partitions"]
    why_not = {p["name"]: p["why_not"] for p in listing}
    assert (why_not["outbox_p3"], why_not["outbox_p4"]) == ("it holds the newest ids", "made ahead")
    assert enqueue(pconn, aggregate_type="a", aggregate_id="1", event_type="E", payload={}) == 350
    assert pconn.execute(last_given).fetchone() == (350,)
    # A plain RESTART goes back to the sequence's START (1): the id before it is 0.
    pconn.execute("ALTER SEQUENCE outbox_id_seq RESTART")
    assert pconn.execute(last_given).fetchone() == (0,)
