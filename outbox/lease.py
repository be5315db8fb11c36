"""The lease protocol as typed async functions: claim, finalize, extend, release.

Each call is one statement in its own short transaction (autocommit connections), so no
lock or transaction is held while a message is published.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta

import psycopg

from outbox.models import Message, Outcome, Status
from outbox.queries import queries
from outbox.table import Table

MAX_ERROR_LENGTH = 2000

AsyncConn = psycopg.AsyncConnection[tuple[object, ...]]


async def claim(
    conn: AsyncConn,
    table: Table,
    *,
    owner: str,
    batch: int,
    lease: timedelta,
    max_attempts: int,
    ordered: bool = False,
) -> list[Message]:
    """Lease up to `batch` messages, oldest first; reaps expired last attempts to dead."""
    q = queries(table)
    params = {"batch": batch, "owner": owner, "lease": lease, "max_attempts": max_attempts}
    # Binary results: integers and timestamps decode faster than from text.
    async with conn.cursor(binary=True) as cur:
        await cur.execute(q.claim_ordered if ordered else q.claim, params)
        rows = await cur.fetchall()
    messages = [Message._make(row) for row in rows]
    messages.sort(key=lambda m: m.id)  # RETURNING order is unspecified
    return messages


async def finalize(
    conn: AsyncConn,
    table: Table,
    outcomes: Sequence[Outcome],
    *,
    max_defer_age: timedelta = timedelta(days=1),
) -> set[int]:
    """Apply outcomes, each fenced on its own lease_version; returns the ids that were applied.

    An id missing from the result lost its lease: another claim took the row (or reaped it).
    """
    if not outcomes:
        return set()
    q = queries(table)
    ids = _bigint_array([o.message_id for o in outcomes])
    versions = _bigint_array([o.lease_version for o in outcomes])
    params: dict[str, object]
    if all(o.status is Status.DONE for o in outcomes):
        statement, params = q.finalize_done, {"ids": ids, "versions": versions}
    else:
        statement = q.finalize
        params = {
            "ids": ids,
            "versions": versions,
            "statuses": [o.status.value for o in outcomes],
            "delays": [o.delay for o in outcomes],
            "errors": [o.error[:MAX_ERROR_LENGTH] if o.error else None for o in outcomes],
            "refunds": [o.refund_attempt for o in outcomes],
            "deferreds": [o.deferred for o in outcomes],
            "max_defer_age": max_defer_age,
        }
    params["n"] = len(outcomes)
    async with conn.cursor() as cur:
        await cur.execute(statement, params)
        row = await cur.fetchone()
    assert row is not None
    count, applied = row
    if count == len(outcomes):  # every row applied: the common case sends no ids back
        return {o.message_id for o in outcomes}
    return {int(i) for i in applied or ()}  # type: ignore[attr-defined]


def _bigint_array(values: list[int]) -> str:
    """An array literal for `::bigint[]`: much cheaper than adapting a list element by element."""
    return "{" + ",".join(map(str, values)) + "}"


async def extend(
    conn: AsyncConn, table: Table, messages: Sequence[Message], *, lease: timedelta
) -> set[int]:
    """Heartbeat: renew the leases still held; returns the ids whose lease was renewed."""
    if not messages:
        return set()
    params = {
        "ids": [m.id for m in messages],
        "versions": [m.lease_version for m in messages],
        "lease": lease,
    }
    async with conn.cursor() as cur:
        await cur.execute(queries(table).extend, params)
        return {int(row[0]) for row in await cur.fetchall()}  # type: ignore[call-overload]


async def release(conn: AsyncConn, table: Table, messages: Sequence[Message]) -> set[int]:
    """Give messages back (shutdown): pending, available now, the attempt refunded."""
    return await finalize(conn, table, [Outcome.release(m) for m in messages])
