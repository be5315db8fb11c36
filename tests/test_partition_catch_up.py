"""Ordered mode on a partitioned table: the head check's start caught up beside the claims
(`ClaimWindow.catching_up_aside`, as a worker's claimer does it), never before a claim."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from helpers import seed, wait_until
from test_worker import Scripted
from workers import dispatching, settings

from outbox import lease
from outbox.claim_window import Bounds, ClaimWindow
from outbox.models import Outcome
from outbox.partitions import Layout
from outbox.schema import migrate
from outbox.table import Table

TABLE = Table.parse("outbox")
SIZE = 100


@pytest.fixture
def pconn(empty_dsn: str) -> Any:
    """`outbox` partitioned in partitions of SIZE ids, migrated for ordered mode."""
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        migrate(conn, TABLE, "aggregate", layout=Layout(SIZE, 12))
        yield conn


def _claim(aconn: Any, window: ClaimWindow, batch: int) -> Any:
    return lease.claim(
        aconn, TABLE, owner="w", batch=batch, lease=timedelta(minutes=1), max_attempts=5,
        ordered=True, window=window,
    )  # fmt: skip


async def test_claims_leave_the_catch_up_aside_and_still_keep_an_aggregates_order(
    pconn: Any, empty_dsn: str
) -> None:
    """An aggregate's first message is in partition 0 and in flight; its next ones are in
    partition 1, where the window has moved. The claims there never catch the head check's
    start up themselves: they check from partition 0 and leave agg-0's messages waiting.
    A catch-up beside them, once id 1 is done, moves the start to partition 1."""
    seed(pconn, 99, aggregates=99)  # ids 1-99: one message each of agg-0 .. agg-98
    seed(pconn, 60, aggregates=1)  # ids 100-159: agg-0's next messages, in partition 1
    async with (
        await psycopg.AsyncConnection.connect(empty_dsn, autocommit=True) as aconn,
        await psycopg.AsyncConnection.connect(empty_dsn, autocommit=True) as aside,
    ):
        window = ClaimWindow(Layout(SIZE, 12))
        window.catching_up_aside = True
        first = await _claim(aconn, window, 99)
        assert [m.id for m in first] == list(range(1, 100))
        assert window.bounds() == Bounds(100, 200, 0) and window.unfinished_behind
        held = next(m for m in first if m.id == 1)
        others = [Outcome.done(m) for m in first if m.id != 1]
        await lease.finalize(aconn, TABLE, others, layout=window.layout)
        # The claim checks from partition 0, where id 1 is in flight: agg-0 waits.
        assert await _claim(aconn, window, 50) == []
        assert window.bounds().unfinished_low == 0
        await window.catch_up(aside, TABLE)
        assert window.bounds() == Bounds(100, 200, 0)  # id 1 is still unfinished
        await lease.finalize(aconn, TABLE, [Outcome.done(held)], layout=window.layout)
        for _ in range(2):  # a later look settles what the first found (see Settling)
            await window.catch_up(aside, TABLE)
        assert window.bounds() == Bounds(100, 200, 100)
        assert [m.id for m in await _claim(aconn, window, 50)] == [100]


async def test_a_catch_up_that_ends_after_the_window_moved_keeps_the_window_where_it_went(
    pconn: Any, empty_dsn: str
) -> None:
    """The catch-up looks while the claims go on: when it ends, the window has moved on
    meanwhile. It sets where the head check starts, and leaves the window where the claims
    took it (written back as it was when the look began, it sent the next claim back to a
    partition drained already)."""
    seed(pconn, 250, aggregates=250)  # ids 1-250: partitions 0, 1 and 2
    async with (
        await psycopg.AsyncConnection.connect(empty_dsn, autocommit=True) as aconn,
        await psycopg.AsyncConnection.connect(empty_dsn, autocommit=True) as aside,
    ):
        window = ClaimWindow(Layout(SIZE, 12))
        window.catching_up_aside = True
        first = await _claim(aconn, window, 99)  # partition 0, to its last id
        await lease.finalize(aconn, TABLE, [Outcome.done(m) for m in first], layout=window.layout)
        assert window.bounds() == Bounds(100, 200, 0) and window.unfinished_behind
        # The catch-up's look waits behind a lock on partition 0 while the window moves on.
        with pconn.transaction():
            pconn.execute("LOCK TABLE outbox_p0 IN ACCESS EXCLUSIVE MODE")
            catching_up = asyncio.create_task(window.catch_up(aside, TABLE))
            await wait_until(
                lambda: (
                    pconn.execute(
                        "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
                    ).fetchone()[0]
                    == 1
                ),
                what="the catch-up waiting for partition 0",
            )
            window.claimed(list(range(100, 200)), 100, ordered=True)  # partition 1, all of it
            assert window.bounds() == Bounds(200, 300, 0)
        await catching_up
        assert window.bounds().low == 200  # where the claims took it
        # A later look settles what that one found (partition 0 all done: see Settling).
        await window.catch_up(aside, TABLE)
        assert window.bounds() == Bounds(200, 300, 100)


async def test_an_ordered_worker_drains_partitions_in_each_aggregates_order(
    pconn: Any, empty_dsn: str
) -> None:
    """A worker (its claimer catching up aside) across ten partitions of a few aggregates:
    each aggregate's messages published in id order, each once; the head check's start
    caught up as the window went."""
    seed(pconn, 1000, aggregates=7)
    publisher = Scripted(lambda _: None)
    async with dispatching(settings(empty_dsn, ordering="aggregate", batch=40), publisher) as r:
        await wait_until(lambda: len(publisher.calls) >= 1000, what="all published")
        assert r.window.catching_up_aside
        await wait_until(
            lambda: r.window.bounds().unfinished_low >= 900, what="the check's start caught up"
        )
    published = publisher.calls
    assert sorted(m.id for m in published) == list(range(1, 1001))
    for aggregate in {m.aggregate_id for m in published}:
        ids = [m.id for m in published if m.aggregate_id == aggregate]
        assert ids == sorted(ids), aggregate
