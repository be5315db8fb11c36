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

Payloads are bounded: one whose JSON text is longer than the limit is refused with
`PayloadTooLarge` before anything is written (the whole call: `enqueue_many` writes all its
events or none). The limit is 1 MiB (`outbox.limits.MAX_PAYLOAD_BYTES`); a call may give its
own with `max_payload_bytes=`, and `set_max_payload_bytes` changes it for the process. The
text measured is the one sent to PostgreSQL, made by the connection's JSON dumps function
(psycopg's `set_json_dumps`, if the application set one), and is made once.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Any, overload

import psycopg
from psycopg import sql
from psycopg.adapt import PyFormat
from psycopg.types.json import Jsonb

from outbox.limits import MAX_PAYLOAD_BYTES, MAX_PAYLOAD_RANGE, format_bytes
from outbox.models import Event
from outbox.runner import Query, Row, run
from outbox.table import DEFAULT_TABLE_NAME, Table, text_constant


class PayloadTooLarge(ValueError):
    """An event's payload, as JSON text, is longer than the limit; nothing was written.

    The message names the event by its place in the call and its types, never by any of its
    content."""

    def __init__(self, index: int, event: Event, size: int, limit: int) -> None:
        super().__init__(
            f"event {index} ({event.aggregate_type} {event.event_type}): payload of {size} "
            f"bytes of JSON exceeds max_payload_bytes {limit} ({format_bytes(limit)}); "
            "store large data elsewhere and send a reference to it"
        )
        self.index, self.size, self.limit = index, size, limit


_max_payload_bytes = MAX_PAYLOAD_BYTES


def set_max_payload_bytes(limit: int) -> int:
    """Set the process's payload limit, for calls that do not give one; returns the old one.

    Workers send a longer payload than their `--max-payload-bytes` to dead: raise both."""
    global _max_payload_bytes
    low, high = MAX_PAYLOAD_RANGE
    if not low <= limit <= high:
        raise ValueError(f"max_payload_bytes {limit} is out of range ({low} to {high})")
    old, _max_payload_bytes = _max_payload_bytes, limit
    return old


def get_max_payload_bytes() -> int:
    """The process's payload limit (see set_max_payload_bytes)."""
    return _max_payload_bytes


def _payloads(
    conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any],
    events: Sequence[Event],
    limit: int | None,
) -> list[Jsonb]:
    """Each payload as the JSON text the connection would send, measured against the limit;
    wrapped so that psycopg sends that text rather than making it again."""
    limit = _max_payload_bytes if limit is None else limit
    dumper = conn.adapters.get_dumper(Jsonb, PyFormat.TEXT)(Jsonb, conn)
    payloads = []
    for index, event in enumerate(events):
        text = bytes(dumper.dump(Jsonb(event.payload)) or b"")
        if len(text) > limit:
            raise PayloadTooLarge(index, event, len(text), limit)
        payloads.append(Jsonb(event.payload, dumps=_sending(text)))
    return payloads


def _sending(text: bytes) -> Callable[[object], bytes]:
    """A dumps function that returns the text already made."""

    def dumps(_: object) -> bytes:
        return text

    return dumps


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


def _insert(
    table: str | Table, events: Sequence[Event], payloads: list[Jsonb], lock_aggregate: bool
) -> Query[list[int]]:
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
        "payloads": payloads,
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
    max_payload_bytes: int | None = ...,
) -> list[int]: ...
@overload
def enqueue_many(
    conn: psycopg.AsyncConnection[Any],
    events: Iterable[Event],
    *,
    table: str | Table = ...,
    lock_aggregate: bool = ...,
    max_payload_bytes: int | None = ...,
) -> Awaitable[list[int]]: ...
def enqueue_many(
    conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any],
    events: Iterable[Event],
    *,
    table: str | Table = DEFAULT_TABLE_NAME,
    lock_aggregate: bool = False,
    max_payload_bytes: int | None = None,
) -> list[int] | Awaitable[list[int]]:
    """Insert many events in one statement; returns their ids in input order.

    Raises PayloadTooLarge, writing nothing, when any payload's JSON text is longer than
    `max_payload_bytes` (default: the process's limit, 1 MiB unless set)."""
    batch = list(events)
    payloads = _payloads(conn, batch, max_payload_bytes)
    return run(conn, _insert(table, batch, payloads, lock_aggregate and bool(batch)))


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
    max_payload_bytes: int | None = ...,
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
    max_payload_bytes: int | None = ...,
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
    max_payload_bytes: int | None = None,
) -> int | Awaitable[int]:
    """Insert one event in the caller's transaction; returns its id.

    Raises PayloadTooLarge, writing nothing, when the payload's JSON text is longer than
    `max_payload_bytes` (default: the process's limit, 1 MiB unless set)."""
    event = Event(aggregate_type, aggregate_id, event_type, payload)
    payloads = _payloads(conn, [event], max_payload_bytes)
    insert = _insert(table, [event], payloads, lock_aggregate)
    return run(conn, Query(insert.statement, insert.params, lambda rows: _ids(rows)[0]))
