"""One statement, its parameters and how to read its rows: `Query[T]`.

The same definition runs on a sync connection (`fetch`, the CLI and scripts) and on an
async one (`fetch_async`, the TUI); `run` picks by the connection it is given, for APIs
that accept either (the producer's). A query is a single statement: atomic on its own in
autocommit mode, part of the caller's transaction otherwise.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Generic, TypeVar, overload

import psycopg
from psycopg import sql

T = TypeVar("T")
Row = tuple[Any, ...]


@dataclass(frozen=True)
class Query(Generic[T]):
    """A composed statement, its parameters and how to turn its rows into a value."""

    statement: sql.Composed
    params: Mapping[str, Any]
    parse: Callable[[list[Row]], T]


def fetch(conn: psycopg.Connection[Any], query: Query[T]) -> T:
    return query.parse(conn.execute(query.statement, query.params).fetchall())


async def fetch_async(conn: psycopg.AsyncConnection[Any], query: Query[T]) -> T:
    cursor = await conn.execute(query.statement, query.params)
    return query.parse(await cursor.fetchall())


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
