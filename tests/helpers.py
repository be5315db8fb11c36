"""Small helpers shared by the tests: seeding rows, reading them back, waiting on the database."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import psycopg

from outbox import Event, enqueue_many


def seed(
    conn: psycopg.Connection[Any], count: int, *, aggregates: int = 1, event_type: str = "Tested"
) -> list[int]:
    events = [
        Event("order", f"agg-{i % aggregates}", event_type, {"n": i, "text": "x" * 20})
        for i in range(count)
    ]
    with conn.transaction():
        return enqueue_many(conn, events)


def row(conn: psycopg.Connection[Any], message_id: int) -> dict[str, Any]:
    cur = conn.execute("SELECT * FROM outbox WHERE id = %s", (message_id,))
    names = [d.name for d in cur.description or ()]
    values = cur.fetchone()
    assert values is not None, f"no row {message_id}"
    return dict(zip(names, values, strict=True))


def statuses(conn: psycopg.Connection[Any]) -> dict[str, int]:
    return dict(conn.execute("SELECT status, count(*) FROM outbox GROUP BY status").fetchall())  # type: ignore[arg-type]


def wait_until_db(conn: psycopg.Connection[Any], condition_sql: str, timeout: float = 30.0) -> None:
    """Wait until a boolean SQL expression holds, e.g. a lease being past now()."""
    deadline = time.monotonic() + timeout
    while not conn.execute(f"SELECT {condition_sql}").fetchone()[0]:  # type: ignore[index]
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for: {condition_sql}")
        time.sleep(0.02)


async def wait_until(predicate: Callable[[], Any], timeout: float = 30.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not await _call(predicate):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what or predicate}")
        await asyncio.sleep(0.02)


async def _call(predicate: Callable[[], Any]) -> Any:
    result = predicate()
    if asyncio.iscoroutine(result):
        return await result
    return result
