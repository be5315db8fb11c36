"""`Query[T]` (one statement, its parameters and how to read its rows) and its runners.

This is the one way to run a statement that serves sync and async connections alike: the
same definition runs on a sync connection (`fetch`: the CLI, migrations, scripts) and on an
async one (`fetch_async`: the TUI, the operator, the worker's lease calls); `run` picks by
the connection it is given, for APIs that accept either (the producer's). A query is a
single statement: atomic on its own in autocommit mode, part of the caller's transaction
otherwise. The statements themselves are composed where they belong (the lease protocol's
in `outbox.queries`, the others beside the functions that use them).

An operation of several statements, where what comes next depends on what came back (lock a
row, decide, write), is written once too: as `Steps`, a generator that yields each `Query`
and is sent its result, and returns the operation's value. It does no I/O of its own, so
`perform` runs it on a sync connection and `perform_async` on an async one, optionally in
one transaction; operations compose with `yield from`.
"""

from __future__ import annotations

import re
import time
import weakref
from collections.abc import Awaitable, Callable, Generator, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, AbstractContextManager, closing, nullcontext
from dataclasses import dataclass
from typing import Any, Generic, TypeVar, cast, overload

import psycopg
from psycopg import sql
from psycopg.types.string import TextLoader

T = TypeVar("T")
Row = tuple[Any, ...]
AnyConnection = psycopg.Connection[Any] | psycopg.AsyncConnection[Any]


@dataclass(frozen=True)
class Query(Generic[T]):
    """A composed statement, its parameters and how to turn its rows into a value."""

    statement: sql.Composed
    # None: a statement without placeholders, sent as it is.
    params: Mapping[str, Any] | None
    parse: Callable[[list[Row]], T]
    # psycopg's: True sends it as a prepared statement, None leaves it to the connection's
    # `prepare_threshold`.
    prepare: bool | None = None
    # Rows in binary: integers and timestamps decode faster than from text.
    binary: bool = False
    # json and jsonb columns come as their text, not decoded: for values that are shown
    # (outbox.plumbing.jsontext lays them out), which may be nested deeper than Python decodes.
    json_as_text: bool = False


def first_row(parse: Callable[[Row | None], T]) -> Callable[[list[Row]], T]:
    """A `parse` for a statement that returns at most one row: `parse(row or None)`."""
    return lambda rows: parse(rows[0] if rows else None)


def no_rows(rows: list[Row]) -> None:
    """A `parse` for a statement whose rows, if any, are not read (an UPDATE's)."""


# Statements rendered per connection, kept for the next run of the same statement.
# psycopg renders a composed statement to its text at every execute, walking each part in
# Python (180 to 230 µs for the claim), then finds its placeholders in that text (it
# remembers them only for statements up to 4,096 bytes, which the claims are not: 110 to
# 140 µs more of CPU), every few messages on a busy worker. Kept per connection,
# since its encoding and adapters render identifiers and literals; the statements are the
# long-lived ones `outbox.queries` caches, at most RENDERED_KEPT a connection (a partitioned
# table's claims name the partitions of the moment, so new ones come as the ids move on).
RENDERED_KEPT = 64
# psycopg's placeholders: `%%` for a `%`, `%(name)s` for a value; any other (`%s`, `%(name)b`)
# leaves the statement to psycopg, which says what is wrong with it.
_PLACEHOLDER = re.compile(rb"%%|%\((\w+)\)s|%")


@dataclass(frozen=True)
class _Rendered:
    """A statement's text on one connection; with positional placeholders (`$1`, `$2`, ...)
    and the names of the values they stand for, when psycopg's named ones could be numbered.
    The statement is kept beside them, so its id is not another's while they are kept."""

    statement: sql.Composed
    encoding: str  # the connection's when rendered: a `SET client_encoding` renders anew
    text: bytes
    positional: bytes | None
    names: tuple[str, ...]


_rendered: weakref.WeakKeyDictionary[Any, dict[int, _Rendered]] = weakref.WeakKeyDictionary()


def rendered(conn: AnyConnection, statement: sql.Composed) -> _Rendered:
    """`statement` rendered on `conn` as psycopg would, once."""
    kept = _rendered.get(conn)
    if kept is None:
        kept = _rendered[conn] = {}
    # By identity: a composed statement is not hashable.
    found = kept.get(id(statement))
    encoding = conn.info.encoding
    if found is not None and found.statement is statement and found.encoding == encoding:
        return found
    if len(kept) >= RENDERED_KEPT:
        kept.clear()
    text = statement.as_bytes(conn)
    names: dict[str, int] = {}
    numbered = True

    def number(placeholder: re.Match[bytes]) -> bytes:
        nonlocal numbered
        if placeholder[0] == b"%%":
            return b"%"
        if placeholder[1] is None:
            numbered = False
            return placeholder[0]
        return b"$%d" % names.setdefault(placeholder[1].decode(), len(names) + 1)

    positional = _PLACEHOLDER.sub(number, text)
    found = _Rendered(statement, encoding, text, positional if numbered else None, tuple(names))
    kept[id(statement)] = found
    return found


def _cursor_and_values(
    conn: AnyConnection, query: Query[Any]
) -> tuple[Any, bytes, Sequence[Any] | Mapping[str, Any] | None]:
    """The cursor to run `query` on, its text and its values: a raw cursor (positional
    placeholders, nothing left for psycopg to find) whenever the statement has values."""
    text = rendered(conn, query.statement)
    params = query.params
    if params is None or text.positional is None:
        return conn.cursor(), text.text, params
    try:
        values = [params[name] for name in text.names]
    except KeyError as missing:
        raise psycopg.ProgrammingError(f"query parameter missing: {missing.args[0]}") from None
    if isinstance(conn, psycopg.AsyncConnection):
        return psycopg.AsyncRawCursor(conn), text.positional, values
    return psycopg.RawCursor(conn), text.positional, values


# Who is told, of each statement a connection runs here, its text and the seconds it took
# (`observe`): the benchmarks' breakdowns by statement. The statements run on cursors of the
# runner's own, which a connection's `execute` never sees.
Observer = Callable[[bytes, float], None]
_observers: weakref.WeakKeyDictionary[Any, Observer] = weakref.WeakKeyDictionary()


def observe(conn: AnyConnection, observer: Observer | None) -> None:
    """Tell `observer` of every statement `conn` runs here from now on (None: no more)."""
    if observer is None:
        _observers.pop(conn, None)
    else:
        _observers[conn] = observer


# A statement without a result (an UPDATE without RETURNING) is parsed as no rows: psycopg
# refuses to fetch from it.
def fetch(conn: psycopg.Connection[Any], query: Query[T]) -> T:
    cursor, statement, values = _cursor_and_values(conn, query)
    observer = _observers.get(conn)
    started = time.perf_counter()
    try:
        with cursor:
            if query.json_as_text:
                _json_as_text(cursor)
            cursor.execute(statement, values, prepare=query.prepare, binary=_binary(query))
            return query.parse(cursor.fetchall() if cursor.description else [])
    finally:
        if observer is not None:
            observer(statement, time.perf_counter() - started)


async def fetch_async(conn: psycopg.AsyncConnection[Any], query: Query[T]) -> T:
    cursor, statement, values = _cursor_and_values(conn, query)
    observer = _observers.get(conn)
    started = time.perf_counter()
    try:
        async with cursor:
            if query.json_as_text:
                _json_as_text(cursor)
            await cursor.execute(statement, values, prepare=query.prepare, binary=_binary(query))
            return query.parse(await cursor.fetchall() if cursor.description else [])
    finally:
        if observer is not None:
            observer(statement, time.perf_counter() - started)


def _binary(query: Query[Any]) -> bool:
    """Rows in binary, unless json is to come as text (its text loader reads text rows)."""
    return query.binary and not query.json_as_text


def _json_as_text(cursor: psycopg.Cursor[Any] | psycopg.AsyncCursor[Any]) -> None:
    """This cursor's json and jsonb columns load as text (rows in text format)."""
    for name in ("json", "jsonb"):
        cursor.adapters.register_loader(name, TextLoader)


@overload
def run(conn: psycopg.Connection[Any], query: Query[T]) -> T: ...
@overload
def run(conn: psycopg.AsyncConnection[Any], query: Query[T]) -> Awaitable[T]: ...
def run(
    conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any], query: Query[T]
) -> T | Awaitable[T]:
    """`fetch` on a sync connection; an awaitable `fetch_async` on an async one."""
    if isinstance(conn, psycopg.AsyncConnection):
        return fetch_async(conn, query)
    return fetch(conn, query)


# -- operations of several statements ------------------------------------------------------

# Yields the queries to run, is sent each one's result, returns the operation's value.
Steps = Generator[Query[Any], Any, T]


def step(query: Query[T]) -> Steps[T]:
    """One statement of an operation, typed: `value = yield from step(query)`."""
    return (yield query)  # type: ignore[no-any-return]  # what the driver sends: query's T


class Rollback(Exception):
    """Raised by an operation that found nothing to do: its transaction is rolled back (what
    it wrote so far undone) and `perform` returns `value`. Without a transaction of the
    operation's own, what it wrote stands."""

    def __init__(self, value: Any) -> None:
        super().__init__(value)
        self.value = value


def perform(conn: psycopg.Connection[Any], steps: Steps[T], *, transaction: bool = False) -> T:
    """Run `steps` on a sync connection, in one transaction if asked (a savepoint inside the
    caller's). A statement's error ends the operation: it propagates, nothing is sent in."""
    scope: AbstractContextManager[Any] = conn.transaction() if transaction else nullcontext()
    try:
        with scope, closing(steps):
            next_step = _advance(steps, None)
            while isinstance(next_step, Query):
                next_step = _advance(steps, fetch(conn, next_step))
            return next_step.value
    except Rollback as rolled_back:
        return cast(T, rolled_back.value)


async def perform_async(
    conn: psycopg.AsyncConnection[Any], steps: Steps[T], *, transaction: bool = False
) -> T:
    """`perform` on an async connection."""
    scope: AbstractAsyncContextManager[Any] = conn.transaction() if transaction else nullcontext()
    try:
        async with scope:
            with closing(steps):
                next_step = _advance(steps, None)
                while isinstance(next_step, Query):
                    next_step = _advance(steps, await fetch_async(conn, next_step))
                return next_step.value
    except Rollback as rolled_back:
        return cast(T, rolled_back.value)


@dataclass(frozen=True)
class _Returned(Generic[T]):
    value: T


def _advance(steps: Steps[T], sent: Any) -> Query[Any] | _Returned[T]:
    """The operation's next query, or what it returned. Only the generator's own
    StopIteration ends it: one raised while a statement runs or parses stays an error."""
    try:
        return steps.send(sent)
    except StopIteration as done:
        return _Returned(done.value)
