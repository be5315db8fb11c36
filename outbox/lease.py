"""The lease protocol as typed async functions: claim, finalize, extend, release.

Each call is one statement in its own short transaction (autocommit connections), so no
lock or transaction is held while a message is published. Each runs as a `Query`
(outbox.runner) of a statement from `outbox.queries`.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta

import psycopg

from outbox.limits import CLAIM_BYTES, WORKER_MAX_PAYLOAD_BYTES
from outbox.models import Message, Outcome, OutcomeKind
from outbox.queries import queries
from outbox.runner import Query, Row, fetch_async
from outbox.table import Table
from outbox.text import storable

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
    by_aggregate: bool = False,
    prepare: bool | None = None,
    max_payload_bytes: int = WORKER_MAX_PAYLOAD_BYTES,
    claim_bytes: int = CLAIM_BYTES,
) -> list[Message]:
    """Lease up to `batch` messages, oldest first; reaps expired last attempts to dead.

    `ordered` claims only the head of each aggregate; `by_aggregate` finds the heads by
    visiting aggregates rather than waiting rows (see OrderedClaims for when that is better).
    `prepare` is psycopg's: True sends the claim as a prepared statement (its plan is as good
    generic as custom, and planning it is most of an idle claim's time), None leaves it to
    the connection's `prepare_threshold`.

    Rows are bounded (outbox.limits): a row whose payload, as text, is longer than
    `max_payload_bytes` goes dead with the reason instead of being taken, and the messages
    taken hold at most `claim_bytes` of payload between them, or one message when the first
    alone is more; the rest stay ready for the next claim.
    """
    q = queries(table)
    statement = (q.claim_heads if by_aggregate else q.claim_ordered) if ordered else q.claim
    params = {
        "batch": batch,
        "owner": owner,
        "lease": lease,
        "max_attempts": max_attempts,
        "max_payload_bytes": max_payload_bytes,
        "claim_bytes": claim_bytes,
    }
    return await fetch_async(conn, Query(statement, params, _messages, prepare, binary=True))


def _messages(rows: list[Row]) -> list[Message]:
    messages = [Message._make(row) for row in rows]
    messages.sort(key=lambda m: m.id)  # RETURNING order is unspecified
    return messages


class OrderedClaims:
    """Chooses, claim by claim, how ordered mode finds the heads of aggregates.

    Walking ready rows in order stops once a batch of heads is found: cheap while heads are
    plentiful, but when a few aggregates hold a deep backlog (and their heads are in flight)
    it walks the whole backlog to find little. Visiting aggregates costs one index probe per
    aggregate with work, whatever the backlog. So: walk rows while that fills batches; after a
    short batch, visit aggregates; when visiting fills a batch (many aggregates), walk again.
    """

    def __init__(self) -> None:
        self.by_aggregate = False

    def observe(self, claimed: int, batch: int) -> None:
        # A short batch from either plan means few claimable heads: visit aggregates next.
        self.by_aggregate = claimed < batch


Applied = dict[tuple[int, int], str]  # (id, lease_version) -> the status the row ended in


async def finalize_applied(
    conn: AsyncConn,
    table: Table,
    outcomes: Sequence[Outcome],
    *,
    max_defer_age: timedelta = timedelta(days=1),
) -> Applied:
    """Apply outcomes, each fenced on its own lease_version.

    Returns the (id, lease_version) of every outcome applied, with the status its row ended
    in. One missing lost its lease: another claim took the row (or reaped it) meanwhile.
    """
    if not outcomes:
        return {}
    q = queries(table)
    ids = _bigint_array([o.message_id for o in outcomes])
    versions = _bigint_array([o.lease_version for o in outcomes])
    if all(o.kind is OutcomeKind.DONE for o in outcomes):
        params: dict[str, object] = {"ids": ids, "versions": versions, "n": len(outcomes)}

        def done(rows: list[Row]) -> Applied:
            count, applied_ids, applied_versions = rows[0]
            if count == len(outcomes):  # every row applied: the common case sends no ids back
                return {(o.message_id, o.lease_version): "done" for o in outcomes}
            pairs = zip(applied_ids or (), applied_versions or (), strict=True)
            return {(int(i), int(v)): "done" for i, v in pairs}

        return await fetch_async(conn, Query(q.finalize_done, params, done))
    params = {
        "ids": ids,
        "versions": versions,
        "statuses": [o.status.value for o in outcomes],
        "delays": [o.delay for o in outcomes],
        "errors": [_storable(o.error) for o in outcomes],
        "refunds": [o.refund_attempt for o in outcomes],
        "deferreds": [o.deferred for o in outcomes],
        "max_defer_age": max_defer_age,
    }
    return await fetch_async(conn, Query(q.finalize, params, _applied))


def _applied(rows: list[Row]) -> Applied:
    return {(int(i), int(v)): str(status) for i, v, status in rows}


async def finalize(
    conn: AsyncConn,
    table: Table,
    outcomes: Sequence[Outcome],
    *,
    max_defer_age: timedelta = timedelta(days=1),
) -> set[int]:
    """`finalize_applied`, answering only which ids were applied."""
    applied = await finalize_applied(conn, table, outcomes, max_defer_age=max_defer_age)
    return {message_id for message_id, _ in applied}


def _storable(error: str | None) -> str | None:
    return None if error is None else storable(error, MAX_ERROR_LENGTH)


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
    return await fetch_async(conn, Query(queries(table).extend, params, _renewed))


def _renewed(rows: list[Row]) -> set[int]:
    return {int(row[0]) for row in rows}


async def release(conn: AsyncConn, table: Table, messages: Sequence[Message]) -> set[int]:
    """Give messages back (shutdown): pending, available now, the attempt refunded."""
    return await finalize(conn, table, [Outcome.release(m) for m in messages])
