"""A worker's statements on the rows it holds lock them in one order (by id), so that two of
them on the same rows never deadlock: the lease keeper's extend and a finalize of the same
batch run at once on two connections, each given its ids in its own order.

Each case interleaves them for real: `first` runs on ids in ascending order and waits on a
row locked elsewhere (having locked the rows before it), `second` starts on some of the same
ids in descending order and waits on `first`; then the lock elsewhere is given up. Locking in
the order given, `second` held the last row `first` goes on to, and PostgreSQL found a
deadlock and failed one of them (`DeadlockDetected`). Each must also apply to every row it
still holds: a lock that waited re-checks the row, and must not drop it."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from helpers import seed, wait_until

from outbox.lease import claim, extend, finalize, release
from outbox.models import Message, Outcome
from outbox.partitions import Layout, check
from outbox.schema import migrate
from outbox.table import Table

TABLE = Table.parse("outbox")
LEASE = timedelta(minutes=5)

Conn = psycopg.AsyncConnection[Any]
Run = Callable[[Conn, Sequence[Message], Layout | None], Awaitable[set[int]]]


async def _extend(conn: Any, held: Sequence[Message], layout: Layout | None) -> set[int]:
    return await extend(conn, TABLE, held, lease=LEASE, layout=layout)


async def _done(conn: Any, held: Sequence[Message], layout: Layout | None) -> set[int]:
    return await finalize(conn, TABLE, [Outcome.done(m) for m in held], layout=layout)


async def _mixed(conn: Any, held: Sequence[Message], layout: Layout | None) -> set[int]:
    outcomes = [Outcome.retry(held[0], timedelta(0), "HTTP 503"), Outcome.dead(held[-1], "422")]
    return await finalize(conn, TABLE, outcomes, layout=layout)


async def _release(conn: Any, held: Sequence[Message], layout: Layout | None) -> set[int]:
    return await release(conn, TABLE, held, layout=layout)


async def _held(conn: Any, aconn: Any, ids: Sequence[int]) -> list[Message]:
    """Rows `ids` among a thousand leased (ids 1100 to 2100; those below done), as a few
    busy workers hold them: each statement then probes the primary key once per id, in the
    order its ids come (with a handful of rows in flight, it walks them all in an index's
    order, by id, whatever the order given)."""
    seed(conn, 2100)
    conn.execute("UPDATE outbox SET status = 'done' WHERE id < 1100")
    leased = await claim(aconn, TABLE, owner="W", batch=1001, lease=LEASE, max_attempts=5)
    assert len(leased) == 1001
    conn.execute("VACUUM ANALYZE outbox")
    return [m for m in leased if m.id in ids]


def _blocked_by(conn: Any, waiting: int, holder: int) -> bool:
    row = conn.execute("SELECT %s = ANY(pg_blocking_pids(%s))", (holder, waiting)).fetchone()
    return bool(row[0])


async def _interleaved(
    conn: Any, dsn: str, held: list[Message], first: Run, second: Run, layout: Layout | None
) -> list[Any]:
    """`first` on `held` (three rows, ascending) waiting on the middle row, locked by `conn`;
    `second` on the outer two, descending, waiting on `first`; then `conn` lets go. What
    each returned, or raised."""
    low, middle, high = held
    async with (
        await psycopg.AsyncConnection.connect(dsn, autocommit=True) as a,
        await psycopg.AsyncConnection.connect(dsn, autocommit=True) as b,
    ):
        holder = conn.info.backend_pid
        with conn.transaction():
            conn.execute("SELECT FROM outbox WHERE id = %s FOR UPDATE", (middle.id,))
            first_run = asyncio.create_task(first(a, held, layout))
            await wait_until(
                lambda: _blocked_by(conn, a.info.backend_pid, holder), what="first to wait"
            )
            second_run = asyncio.create_task(second(b, [high, low], layout))
            await wait_until(
                lambda: _blocked_by(conn, b.info.backend_pid, a.info.backend_pid),
                what="second to wait on first",
            )
        return await asyncio.gather(first_run, second_run, return_exceptions=True)


CASES = [
    pytest.param(_extend, _done, id="extend-then-finalize_done"),
    pytest.param(_extend, _mixed, id="extend-then-finalize"),
    pytest.param(_done, _extend, id="finalize_done-then-extend"),
    pytest.param(_release, _extend, id="release-then-extend"),
]


def _expected(first: Run, held: list[Message]) -> list[set[int]]:
    ids = {m.id for m in held}
    if first is _extend:  # the finalize then applies to the outer two, leases still held
        return [ids, ids - {held[1].id}]
    return [ids, set()]  # the extend then finds none of them held any more


@pytest.mark.parametrize(("first", "second"), CASES)
async def test_extend_and_finalize_of_the_same_rows_in_opposite_orders_both_apply(
    conn, aconn, dsn, first, second
):
    held = await _held(conn, aconn, (1500, 1501, 1502))
    results = await _interleaved(conn, dsn, held, first, second, None)
    assert results == _expected(first, held)


@pytest.mark.parametrize(
    "ids", [(1500, 1501, 1502), (1999, 2000, 2001)], ids=["one-partition", "two-partitions"]
)
async def test_a_partitioned_tables_extend_and_finalize_lock_in_one_order(empty_dsn, ids):
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        migrate(conn, TABLE, layout=Layout(1000, 3))
        async with await psycopg.AsyncConnection.connect(empty_dsn, autocommit=True) as aconn:
            layout = await check(aconn, TABLE)
            held = await _held(conn, aconn, ids)
        results = await _interleaved(conn, empty_dsn, held, _extend, _done, layout)
        assert results == _expected(_extend, held)
