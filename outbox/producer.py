"""The producer API: write events in the application's own transaction.

    with conn.transaction():
        conn.execute("UPDATE orders SET state = 'paid' WHERE id = %s", (order_id,))
        enqueue(conn, aggregate_type="order", aggregate_id=str(order_id),
                event_type="OrderPaid", payload={"order_id": order_id})

Nothing here commits: the event becomes visible to workers exactly when the business change
does. Both functions accept a sync or an async psycopg connection (one `Query`, see
`outbox.runner`); with an async one they return an awaitable.

Ordered dispatch needs ids of one aggregate to be committed in id order. When several
transactions may write the same aggregate at once and the application does not already
lock the aggregate's row, pass `lock_aggregate=True`: a transaction-scoped advisory lock per
aggregate then serializes those writers until commit.
"""

from __future__ import annotations

from collections.abc import Awaitable, Iterable, Sequence
from typing import Any, overload

import psycopg
from psycopg import sql
from psycopg.types.json import Jsonb

from outbox.models import Event
from outbox.runner import Query, Row, run
from outbox.table import DEFAULT_TABLE_NAME, Table, text_constant

_INSERT = sql.SQL(
    """{locks}INSERT INTO {t} (aggregate_type, aggregate_id, event_type, payload)
SELECT u.aggregate_type, u.aggregate_id, u.event_type, u.payload
  FROM unnest(%(types)s::text[], %(aggregates)s::text[], %(events)s::text[], %(payloads)s::jsonb[])
       WITH ORDINALITY AS u(aggregate_type, aggregate_id, event_type, payload, n){after_locks}
 ORDER BY u.n
RETURNING id"""
)
# One advisory lock per aggregate, taken in key order (no deadlocks) before any row gets
# its id: the rows wait for the locks (a materialized CTE is read before the first row).
_LOCK_AGGREGATES = sql.SQL(
    """WITH locks AS MATERIALIZED (
    SELECT pg_advisory_xact_lock(k) FROM (
        SELECT DISTINCT hashtextextended({ns} || a, 0) AS k
          FROM unnest(%(aggregates)s::text[]) AS a ORDER BY k) AS keys
)
"""
)
_AFTER_LOCKS = sql.SQL("\n WHERE (SELECT count(*) FROM locks) >= 0")


def _insert(table: str | Table, events: Sequence[Event], lock_aggregate: bool) -> Query[list[int]]:
    t = table if isinstance(table, Table) else Table.parse(table)
    statement = _INSERT.format(
        t=t.ident,
        locks=_LOCK_AGGREGATES.format(ns=text_constant(f"outbox:{t}:"))
        if lock_aggregate
        else sql.SQL(""),
        after_locks=_AFTER_LOCKS if lock_aggregate else sql.SQL(""),
    )
    params = {
        "types": [e.aggregate_type for e in events],
        "aggregates": [e.aggregate_id for e in events],
        "events": [e.event_type for e in events],
        "payloads": [Jsonb(e.payload) for e in events],
    }
    return Query(statement, params, _ids)


def _ids(rows: list[Row]) -> list[int]:
    # Identity values are assigned in insertion order, which follows the input order.
    return sorted(int(row[0]) for row in rows)


@overload
def enqueue_many(
    conn: psycopg.Connection[Any],
    events: Iterable[Event],
    *,
    table: str | Table = ...,
    lock_aggregate: bool = ...,
) -> list[int]: ...
@overload
def enqueue_many(
    conn: psycopg.AsyncConnection[Any],
    events: Iterable[Event],
    *,
    table: str | Table = ...,
    lock_aggregate: bool = ...,
) -> Awaitable[list[int]]: ...
def enqueue_many(
    conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any],
    events: Iterable[Event],
    *,
    table: str | Table = DEFAULT_TABLE_NAME,
    lock_aggregate: bool = False,
) -> list[int] | Awaitable[list[int]]:
    """Insert many events in one statement; returns their ids in input order."""
    batch = list(events)
    return run(conn, _insert(table, batch, lock_aggregate and bool(batch)))


@overload
def enqueue(
    conn: psycopg.Connection[Any],
    *,
    aggregate_type: str,
    aggregate_id: str,
    event_type: str,
    payload: object,
    table: str | Table = ...,
    lock_aggregate: bool = ...,
) -> int: ...
@overload
def enqueue(
    conn: psycopg.AsyncConnection[Any],
    *,
    aggregate_type: str,
    aggregate_id: str,
    event_type: str,
    payload: object,
    table: str | Table = ...,
    lock_aggregate: bool = ...,
) -> Awaitable[int]: ...
def enqueue(
    conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any],
    *,
    aggregate_type: str,
    aggregate_id: str,
    event_type: str,
    payload: object,
    table: str | Table = DEFAULT_TABLE_NAME,
    lock_aggregate: bool = False,
) -> int | Awaitable[int]:
    """Insert one event in the caller's transaction; returns its id."""
    event = Event(aggregate_type, aggregate_id, event_type, payload)
    insert = _insert(table, [event], lock_aggregate)
    return run(conn, Query(insert.statement, insert.params, lambda rows: _ids(rows)[0]))
