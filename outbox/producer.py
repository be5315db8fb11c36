"""The producer API: write events in the application's own transaction.

    with conn.transaction():
        conn.execute("UPDATE orders SET state = 'paid' WHERE id = %s", (order_id,))
        enqueue(conn, aggregate_type="order", aggregate_id=str(order_id),
                event_type="OrderPaid", payload={"order_id": order_id})

Nothing here commits: the event becomes visible to workers exactly when the business change
does. Both functions accept a sync or an async psycopg connection; with an async one they
return an awaitable.

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
from outbox.table import DEFAULT_TABLE_NAME, Table

_LOCK_AGGREGATES = sql.SQL(
    "SELECT pg_advisory_xact_lock(k) FROM (SELECT DISTINCT hashtextextended({ns} || a, 0) AS k "
    "FROM unnest(%(aggregates)s::text[]) AS a ORDER BY k) AS keys"  # sorted: no deadlocks
)


def _statements(
    table: str | Table, events: Sequence[Event], lock_aggregate: bool
) -> list[tuple[sql.Composed, dict[str, Any]]]:
    t = table if isinstance(table, Table) else Table.parse(table)
    statements: list[tuple[sql.Composed, dict[str, Any]]] = []
    if lock_aggregate:
        lock = _LOCK_AGGREGATES.format(ns=sql.Literal(f"outbox:{t}:"))
        statements.append((lock, {"aggregates": [e.aggregate_id for e in events]}))
    insert = sql.SQL(
        "INSERT INTO {t} (aggregate_type, aggregate_id, event_type, payload) "
        "SELECT u.aggregate_type, u.aggregate_id, u.event_type, u.payload "
        "FROM unnest(%(types)s::text[], %(aggregates)s::text[], %(events)s::text[], "
        "%(payloads)s::jsonb[]) WITH ORDINALITY AS u(aggregate_type, aggregate_id, event_type, "
        "payload, n) ORDER BY u.n RETURNING id"
    ).format(t=t.ident)
    params = {
        "types": [e.aggregate_type for e in events],
        "aggregates": [e.aggregate_id for e in events],
        "events": [e.event_type for e in events],
        "payloads": [Jsonb(e.payload) for e in events],
    }
    statements.append((insert, params))
    return statements


def _ids(rows: list[tuple[Any, ...]]) -> list[int]:
    # Identity values are assigned in insertion order, which follows the input order.
    return sorted(int(row[0]) for row in rows)


def _run_sync(
    conn: psycopg.Connection[Any], statements: list[tuple[sql.Composed, dict[str, Any]]]
) -> list[int]:
    rows: list[tuple[Any, ...]] = []
    with conn.cursor() as cur:
        for statement, params in statements:
            cur.execute(statement, params)
        rows = cur.fetchall()
    return _ids(rows)


async def _run_async(
    conn: psycopg.AsyncConnection[Any], statements: list[tuple[sql.Composed, dict[str, Any]]]
) -> list[int]:
    async with conn.cursor() as cur:
        for statement, params in statements:
            await cur.execute(statement, params)
        rows = await cur.fetchall()
    return _ids(rows)


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
    statements = _statements(table, batch, lock_aggregate and bool(batch))
    if isinstance(conn, psycopg.AsyncConnection):
        return _run_async(conn, statements)
    return _run_sync(conn, statements)


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
    statements = _statements(table, [event], lock_aggregate)
    if isinstance(conn, psycopg.AsyncConnection):
        return _first(_run_async(conn, statements))
    return _run_sync(conn, statements)[0]


async def _first(ids: Awaitable[list[int]]) -> int:
    return (await ids)[0]
