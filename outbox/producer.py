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

Headers (`headers=` of `enqueue`, `Event.headers`) are metadata the publishers send beside the
payload: a mapping of string names to string values, at most 64 of them
(`outbox.limits.MAX_HEADER_COUNT`) and 16 KiB as JSON text (`outbox.limits.MAX_HEADERS_BYTES`,
measured as PostgreSQL renders the stored value, which is how a worker measures it); anything
else is refused with `InvalidHeaders` before anything is written. The project's own headers
(the message id) always win over them.

Names are bounded too: an `event_type`, `aggregate_type` or `aggregate_id` longer than 1 KiB
in UTF-8 (`outbox.limits.MAX_NAME_BYTES`) is refused with `NameTooLong`. These are the limits
a worker's claim applies (anything past them goes `dead` there without being loaded), so an
event the producer accepts is one a worker with the defaults takes.

Trace context: when the application uses OpenTelemetry and a span is active, each event's
headers get the W3C `traceparent` and `tracestate` (and `baggage` when set), written by the
global propagator (`opentelemetry.propagate.inject`), so the worker's publish span can link
to the span that made the event and the receiver can continue the trace. A header the caller
gave is kept over the propagator's; `trace_context=False` turns it off. OpenTelemetry is
imported only by a process that has imported it already: without it, nothing changes.

The trace context is a convenience, never a reason for a write to fail: on a table not yet at
schema v4 (no `headers` column) it is left out and the event is written as before, while
headers the caller gave still need the column (an error says so). Whether the table has the
column is read once from the catalog per connection and table (the first enqueue with a
span active), and read again a minute after it was found missing: a migration is seen within
a minute, with no per-call cost either way.
"""

from __future__ import annotations

import inspect
import json
import re
import sys
import time
import weakref
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import Any, TypeVar, overload

import psycopg
from psycopg import sql
from psycopg.adapt import PyFormat
from psycopg.types.json import Jsonb

from outbox.limits import (
    MAX_HEADER_COUNT,
    MAX_HEADERS_BYTES,
    MAX_NAME_BYTES,
    MAX_PAYLOAD_BYTES,
    MAX_PAYLOAD_RANGE,
    format_bytes,
)
from outbox.models import Event
from outbox.runner import Query, Row, fetch, fetch_async, first_row, run
from outbox.table import DEFAULT_TABLE_NAME, Table, shown, shown_argument

T = TypeVar("T")


class OutOfPartitions(psycopg.errors.CheckViolation):
    """A partitioned table (docs/partitioning.md) has no partition for the next id: the
    producers outran the partitions made ahead. Nothing was written (the transaction is
    aborted, as after any failed statement)."""


_NO_PARTITION = re.compile(r"^no partition of relation")
_FAILING_ID = re.compile(r"\(id\) = \((\d+)\)")


def _out_of_partitions(exc: psycopg.errors.CheckViolation, table: Table) -> Exception:
    """PostgreSQL's refusal of a row no partition takes, saying what to do; any other
    check violation as it is."""
    if not _NO_PARTITION.match(exc.diag.message_primary or ""):
        return exc
    found = _FAILING_ID.search(exc.diag.message_detail or "")
    at = f" for id {found.group(1)}" if found else ""
    return OutOfPartitions(
        f"table {shown(table)} has no partition{at}: the producers outran the partitions made "
        f"ahead; run `outbox maintain --table {shown_argument(table)}` now, and raise "
        "--partitions-ahead (`outbox migrate --partition-size N --partitions-ahead M`) or "
        "run maintenance more often (docs/partitioning.md)"
    )


def _guarded(write: Callable[[], T | Awaitable[T]], table: Table) -> T | Awaitable[T]:
    """`write()`, with a partitioned table's refusal of an id past its partitions made
    clear, on a sync connection or an async one."""
    try:
        result = write()
    except psycopg.errors.CheckViolation as exc:
        raise _out_of_partitions(exc, table) from exc
    if not inspect.isawaitable(result):
        return result
    pending = result

    async def awaited() -> T:
        try:
            return await pending
        except psycopg.errors.CheckViolation as exc:
            raise _out_of_partitions(exc, table) from exc

    return awaited()


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


class NameTooLong(ValueError):
    """An event's `event_type`, `aggregate_type` or `aggregate_id` is longer than
    MAX_NAME_BYTES in UTF-8; nothing was written. The message names the event by its place in
    the call and the field, never by its content."""

    def __init__(self, index: int, field: str, size: int, limit: int) -> None:
        super().__init__(
            f"event {index}: {field} of {size} bytes exceeds the limit of {limit} bytes "
            f"({format_bytes(limit)})"
        )
        self.index, self.field, self.size, self.limit = index, field, size, limit


_NAMES = ("event_type", "aggregate_type", "aggregate_id")


def _check_names(events: Sequence[Event]) -> None:
    """NameTooLong for the first name past MAX_NAME_BYTES (checked before anything else, so
    that no other refusal quotes a long name)."""
    for index, event in enumerate(events):
        for field in _NAMES:
            value = getattr(event, field)
            if not isinstance(value, str) or len(value) * 4 <= MAX_NAME_BYTES:
                continue  # not text: psycopg refuses it; at most 4 bytes a character: short
            size = len(value.encode("utf-8", "surrogatepass"))
            if size > MAX_NAME_BYTES:
                raise NameTooLong(index, field, size, MAX_NAME_BYTES)


class InvalidHeaders(ValueError):
    """An event's headers are not a mapping of string names to string values, or are too
    large; nothing was written. The message names the event by its place in the call and its
    types, and never holds a header's value."""

    def __init__(self, index: int, event: Event, problem: str) -> None:
        super().__init__(f"event {index} ({event.aggregate_type} {event.event_type}): {problem}")
        self.index = index


class HeadersTooLarge(InvalidHeaders):
    """An event's headers, as JSON text, are longer than MAX_HEADERS_BYTES (measured as
    PostgreSQL renders the stored value: `{"a": "b", "c": "d"}`, characters outside ASCII as
    they are)."""

    def __init__(self, index: int, event: Event, size: int, limit: int) -> None:
        super().__init__(
            index,
            event,
            f"headers of {size} bytes of JSON exceed the limit of {limit} bytes "
            f"({format_bytes(limit)}); send large data in the payload",
        )
        self.size, self.limit = size, limit


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


def _trace_context() -> dict[str, str]:
    """The active span's W3C trace context (and baggage), as the global propagator writes it.

    Only a process that has imported OpenTelemetry can have an active span: one that has not
    is not made to import it (an import on every producer's first enqueue, for nothing)."""
    if "opentelemetry.context" not in sys.modules:
        return {}
    try:
        from opentelemetry import propagate, trace
    except ImportError:  # a partial install: behave as without it
        return {}
    if not trace.get_current_span().get_span_context().is_valid:
        return {}
    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    return carrier


class _Headers(list[Jsonb | None]):
    """Each event's headers; `optional` when all they hold is the trace context, which is
    left out on a table without the `headers` column."""

    optional = False


def _headers(
    conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any],
    events: Sequence[Event],
    trace_context: bool,
) -> _Headers | None:
    """Each event's headers (its own over the trace context), checked and measured; None when
    no event has any, so that a table before schema v4 still takes the insert.

    Measured as the text PostgreSQL makes of the stored value (`headers::text`), which a
    worker's claim measures: json.dumps with its default separators and characters outside
    ASCII as they are writes the same text, byte for byte, for a mapping of strings (key
    order aside, which is not a length). That text is what is sent, whatever JSON dumps the
    connection has: the two mean the same object of strings."""
    context = _trace_context() if trace_context else {}
    if not context and all(event.headers is None for event in events):
        return None
    headers = _Headers()
    headers.optional = all(not event.headers for event in events)
    for index, event in enumerate(events):
        own = _checked(index, event)
        merged = {**context, **own} if context else own
        if not merged:
            headers.append(None)
            continue
        if len(merged) > MAX_HEADER_COUNT:
            raise InvalidHeaders(
                index, event, f"{len(merged)} headers, more than the limit of {MAX_HEADER_COUNT}"
            )
        text = json.dumps(merged, ensure_ascii=False).encode("utf-8", "surrogatepass")
        if len(text) > MAX_HEADERS_BYTES:
            raise HeadersTooLarge(index, event, len(text), MAX_HEADERS_BYTES)
        headers.append(Jsonb(merged, dumps=_sending(text)))
    return headers


def _checked(index: int, event: Event) -> dict[str, str]:
    """The event's headers as a dict, or InvalidHeaders naming what is wrong (never a value:
    a header may hold a token)."""
    given = event.headers
    if given is None:
        return {}
    if not isinstance(given, Mapping):
        raise InvalidHeaders(
            index, event, f"headers must be a mapping of str to str, not {type(given).__name__}"
        )
    for name, value in given.items():
        if not isinstance(name, str) or not name:
            raise InvalidHeaders(
                index, event, f"a header name must be a non-empty str, not {type(name).__name__}"
            )
        if not isinstance(value, str):
            raise InvalidHeaders(
                index,
                event,
                f"header {name[:64]!r}: value must be a str, not {type(value).__name__}",
            )
    return dict(given)


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
# With headers (schema v4): only when some event has any, so that producers that send none
# keep working on a table not yet migrated.
_INSERT_WITH_HEADERS = sql.SQL(
    """{locks}INSERT INTO {t} (aggregate_type, aggregate_id, event_type, payload, headers)
SELECT u.aggregate_type, u.aggregate_id, u.event_type, u.payload, u.headers
  FROM unnest(%(types)s::text[], %(aggregates)s::text[], %(events)s::text[], %(payloads)s::jsonb[],
              %(headers)s::jsonb[])
       WITH ORDINALITY AS u(aggregate_type, aggregate_id, event_type, payload, headers, n)
       {after_locks}
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
    table: str | Table,
    events: Sequence[Event],
    payloads: list[Jsonb],
    lock_aggregate: bool,
    headers: list[Jsonb | None] | None = None,
) -> Query[list[int]]:
    t = table if isinstance(table, Table) else Table.parse(table)
    insert = _INSERT if headers is None else _INSERT_WITH_HEADERS
    statement = insert.format(
        t=t.ident,
        # Keyed on the table as the catalog names it: producers given `outbox` and
        # `public.outbox` took two locks for one aggregate and wrote it out of order.
        locks=_LOCK_AGGREGATES.format(
            ns=sql.SQL("('outbox:' || {n} || ':')").format(n=t.catalog_name_sql)
        )
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
    if headers is not None:
        params["headers"] = headers
    return Query(statement, params, _ids)


# Whether a table has the `headers` column (schema v4), by connection and table: True for
# good (a migration never drops it), else the monotonic time it was found missing: looked at
# again RECHECK_SECONDS later (the table may be migrated meanwhile). By connection, not by
# database name: a database restored or recreated under the same name is looked at afresh by
# its new connections.
_has_headers: weakref.WeakKeyDictionary[object, dict[tuple[str | None, str], bool | float]] = (
    weakref.WeakKeyDictionary()
)
RECHECK_SECONDS = 60.0


def _known(conn: object, table: Table) -> bool | None:
    """What is known of the table's `headers` column: True, False, or None (look it up)."""
    known = _has_headers.get(conn, {}).get((table.schema, table.name))
    if known is True:
        return True
    if known is None or time.monotonic() - known >= RECHECK_SECONDS:
        return None
    return False


def _remember(conn: object, table: Table, has: bool) -> None:
    tables = _has_headers.setdefault(conn, {})
    tables[(table.schema, table.name)] = True if has else time.monotonic()


def _headers_column(table: Table) -> Query[bool]:
    """Whether the table has the `headers` column (false for a table that does not exist:
    the insert then says so)."""
    statement = sql.SQL(
        "SELECT EXISTS (SELECT FROM pg_attribute WHERE attrelid = to_regclass({t}) "
        "AND attname = 'headers' AND NOT attisdropped)"
    ).format(t=table.regclass_literal)
    return Query(statement, None, first_row(lambda row: bool(row and row[0])))


def _write(
    conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any],
    table: str | Table,
    events: Sequence[Event],
    payloads: list[Jsonb],
    lock_aggregate: bool,
    headers: _Headers | None,
    parse: Callable[[list[Row]], T],
) -> T | Awaitable[T]:
    """Insert the events, leaving optional headers (the trace context alone) out when the
    table has no `headers` column: one catalog lookup per connection and table, not per call."""
    t = table if isinstance(table, Table) else Table.parse(table)

    def insert(with_headers: bool) -> Query[T]:
        query = _insert(t, events, payloads, lock_aggregate, headers if with_headers else None)
        return Query(query.statement, query.params, parse)

    if headers is None or not headers.optional:
        return run(conn, insert(True))
    known = _known(conn, t)
    if known is not None:
        return run(conn, insert(known))
    lookup = _headers_column(t)
    if isinstance(conn, psycopg.AsyncConnection):
        aconn = conn

        async def looked_up() -> T:
            has = await fetch_async(aconn, lookup)
            _remember(aconn, t, has)
            return await fetch_async(aconn, insert(has))

        return looked_up()
    has = fetch(conn, lookup)
    _remember(conn, t, has)
    return fetch(conn, insert(has))


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
    trace_context: bool = ...,
) -> list[int]: ...
@overload
def enqueue_many(
    conn: psycopg.AsyncConnection[Any],
    events: Iterable[Event],
    *,
    table: str | Table = ...,
    lock_aggregate: bool = ...,
    max_payload_bytes: int | None = ...,
    trace_context: bool = ...,
) -> Awaitable[list[int]]: ...
def enqueue_many(
    conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any],
    events: Iterable[Event],
    *,
    table: str | Table = DEFAULT_TABLE_NAME,
    lock_aggregate: bool = False,
    max_payload_bytes: int | None = None,
    trace_context: bool = True,
) -> list[int] | Awaitable[list[int]]:
    """Insert many events in one statement; returns their ids in input order.

    Raises PayloadTooLarge, writing nothing, when any payload's JSON text is longer than
    `max_payload_bytes` (default: the process's limit, 1 MiB unless set), InvalidHeaders
    when any event's headers are not string names and values within MAX_HEADER_COUNT and
    MAX_HEADERS_BYTES, and NameTooLong when a name is past MAX_NAME_BYTES; OutOfPartitions
    when a partitioned table has no partition for the ids yet.
    `trace_context=False` keeps the active span's context out of the headers."""
    batch = list(events)
    _check_names(batch)
    payloads = _payloads(conn, batch, max_payload_bytes)
    headers = _headers(conn, batch, trace_context) if batch else None
    t = table if isinstance(table, Table) else Table.parse(table)
    lock = lock_aggregate and bool(batch)
    return _guarded(lambda: _write(conn, t, batch, payloads, lock, headers, _ids), t)


@overload
def enqueue(
    conn: psycopg.Connection[Any],
    *,
    aggregate_type: str,
    aggregate_id: str,
    event_type: str,
    payload: object,
    headers: Mapping[str, str] | None = ...,
    table: str | Table = ...,
    lock_aggregate: bool = ...,
    max_payload_bytes: int | None = ...,
    trace_context: bool = ...,
) -> int: ...
@overload
def enqueue(
    conn: psycopg.AsyncConnection[Any],
    *,
    aggregate_type: str,
    aggregate_id: str,
    event_type: str,
    payload: object,
    headers: Mapping[str, str] | None = ...,
    table: str | Table = ...,
    lock_aggregate: bool = ...,
    max_payload_bytes: int | None = ...,
    trace_context: bool = ...,
) -> Awaitable[int]: ...
def enqueue(
    conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any],
    *,
    aggregate_type: str,
    aggregate_id: str,
    event_type: str,
    payload: object,
    headers: Mapping[str, str] | None = None,
    table: str | Table = DEFAULT_TABLE_NAME,
    lock_aggregate: bool = False,
    max_payload_bytes: int | None = None,
    trace_context: bool = True,
) -> int | Awaitable[int]:
    """Insert one event in the caller's transaction; returns its id.

    `headers` are sent beside the payload (string names and values); with OpenTelemetry in
    use and a span active, the span's trace context joins them unless `trace_context=False`.
    Raises PayloadTooLarge, writing nothing, when the payload's JSON text is longer than
    `max_payload_bytes` (default: the process's limit, 1 MiB unless set), InvalidHeaders
    when the headers are not string names and values within MAX_HEADER_COUNT and
    MAX_HEADERS_BYTES, and NameTooLong when a name is past MAX_NAME_BYTES; OutOfPartitions
    when a partitioned table has no partition for the id yet."""
    event = Event(aggregate_type, aggregate_id, event_type, payload, headers)
    _check_names([event])
    payloads = _payloads(conn, [event], max_payload_bytes)
    written = _headers(conn, [event], trace_context)
    t = table if isinstance(table, Table) else Table.parse(table)
    return _guarded(
        lambda: _write(conn, t, [event], payloads, lock_aggregate, written, _first_id), t
    )


def _first_id(rows: list[Row]) -> int:
    return _ids(rows)[0]
