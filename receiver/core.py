"""Apply one delivery once: the inbox record and the handler's effect in one transaction.

Every helper of this package (HTTP, NATS, Kafka) comes down to `apply_async` or `apply`:

1. open a transaction on the receiver's own database;
2. `outbox.inbox.record(consumer, message id)` (`INSERT … ON CONFLICT DO NOTHING`);
3. only if that delivery is the first, run the handler in the same transaction;
4. commit: the effect and the record become durable together, or neither does.

The caller acknowledges to the sender only after step 4 returned. A crash anywhere before
the commit leaves neither the effect nor the record, and the sender's redelivery applies the
message; a crash after it leaves both, and the redelivery is dropped at step 2.

A serialization failure or a deadlock (the receiver's own transaction may run at REPEATABLE
READ or SERIALIZABLE, or its effect may lock rows) rolls the whole attempt back and runs it
again, a few times: the rerun sees what the other transaction committed.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import psycopg

from outbox import inbox
from outbox.table import Table

T = TypeVar("T")
log = logging.getLogger("outbox.receiver")

AsyncConnection = psycopg.AsyncConnection[Any]
# Where a helper takes a connection for each delivery: a pool's `connection` method
# (psycopg_pool.AsyncConnectionPool(...).connection) or any function giving an async context
# manager of a connection.
AsyncConnect = Callable[[], AbstractAsyncContextManager[AsyncConnection]]

# Rolled back and run again: another transaction's commit decides the rerun.
RETRYABLE = (psycopg.errors.SerializationFailure, psycopg.errors.DeadlockDetected)
DEFAULT_TRIES = 5


@dataclass(frozen=True)
class Applied(Generic[T]):
    """What became of one delivery."""

    first: bool
    """The delivery recorded its id: the handler ran (its effect is committed if `committed`)."""
    committed: bool
    """The transaction committed: False when the handler asked for a rollback (`keep`)."""
    value: T | None = None
    """What the handler returned (None for a duplicate)."""

    @property
    def duplicate(self) -> bool:
        return not self.first


class _Discard(Exception):
    """Raised inside the transaction to roll it back when `keep` refuses the handler's value."""


def _pause(attempt: int) -> float:
    """A short random wait before a rerun, so two reruns do not collide again."""
    return random.uniform(0, 0.01 * 2**attempt)


async def apply_async(
    connect: AsyncConnect,
    handler: Callable[[AsyncConnection], Awaitable[T]],
    *,
    consumer: str,
    message_id: str,
    table: str | Table = inbox.DEFAULT_INBOX_TABLE,
    keep: Callable[[T], bool] | None = None,
    tries: int = DEFAULT_TRIES,
    replay: int | None = None,
) -> Applied[T]:
    """Run `handler(conn)` in one transaction with the inbox record, unless the id was
    recorded before. `keep(value)` False rolls the transaction back (record and effect),
    e.g. for a handler that answers an HTTP error: the sender will try again, and must find
    no record. Exceptions from the handler roll back and propagate. `replay` (a replay's
    number, read where the signature covers it) applies that replay once more
    (outbox.inbox.record)."""
    for attempt in range(tries):
        try:
            async with connect() as conn:
                return await _apply_once_async(
                    conn,
                    handler,
                    consumer=consumer,
                    message_id=message_id,
                    table=table,
                    keep=keep,
                    replay=replay,
                )
        except RETRYABLE as exc:
            if attempt + 1 == tries:
                raise
            log.info("delivery %s rolled back (%s), running it again", message_id, exc.sqlstate)
            await asyncio.sleep(_pause(attempt))
    raise AssertionError("unreachable")


async def _apply_once_async(
    conn: AsyncConnection,
    handler: Callable[[AsyncConnection], Awaitable[T]],
    *,
    consumer: str,
    message_id: str,
    table: str | Table,
    keep: Callable[[T], bool] | None,
    replay: int | None,
) -> Applied[T]:
    value: T | None = None
    try:
        async with conn.transaction():
            first = await inbox.record(
                conn, consumer=consumer, message_id=message_id, table=table, replay=replay
            )
            if not first:
                return Applied(first=False, committed=True)
            value = await handler(conn)
            if keep is not None and not keep(value):
                raise _Discard
    except _Discard:
        return Applied(first=True, committed=False, value=value)
    return Applied(first=True, committed=True, value=value)


def apply(
    conn: psycopg.Connection[Any],
    handler: Callable[[psycopg.Connection[Any]], T],
    *,
    consumer: str,
    message_id: str,
    table: str | Table = inbox.DEFAULT_INBOX_TABLE,
    tries: int = DEFAULT_TRIES,
    replay: int | None = None,
) -> Applied[T]:
    """`apply_async` for a sync connection (a Kafka consumer's loop)."""
    for attempt in range(tries):
        try:
            with conn.transaction():
                first = inbox.record(
                    conn, consumer=consumer, message_id=message_id, table=table, replay=replay
                )
                if not first:
                    return Applied(first=False, committed=True)
                value = handler(conn)
            return Applied(first=True, committed=True, value=value)
        except RETRYABLE as exc:
            if attempt + 1 == tries:
                raise
            log.info("delivery %s rolled back (%s), running it again", message_id, exc.sqlstate)
            time.sleep(_pause(attempt))
    raise AssertionError("unreachable")


__all__ = ["RETRYABLE", "Applied", "AsyncConnect", "AsyncConnection", "apply", "apply_async"]
