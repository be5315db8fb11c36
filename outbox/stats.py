"""Queue state from index-backed queries, cheap on a table with millions of done rows.

A snapshot carries `max_id` (a monotonic arrival counter) and the database time it was
taken at, so that a poller derives arrival and completion rates from two snapshots without
scanning anything (see `rates`). Done rows are the one count that cannot be cheap: it is an
estimate from the planner's statistics unless `exact=True`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Any

import psycopg
from psycopg import sql

from outbox.table import Table


@dataclass(frozen=True)
class QueueStats:
    table: str
    sampled_at: datetime  # the database's now()
    pending: int
    ready: int  # pending with available_at <= now(): claimable right now
    processing: int
    dead: int
    done: int
    done_is_estimate: bool
    expired_leases: int  # processing rows past lease_until: crashed or stalled workers
    oldest_pending_age: float | None  # seconds since created_at of the oldest pending/processing
    oldest_ready_age: float | None  # seconds the longest-waiting ready message has been claimable
    max_id: int  # highest id so far: arrivals between two snapshots = difference
    attempts: dict[int, int]  # attempts -> messages, over pending and processing rows
    # Ordered tables only (None otherwise): what can be claimed at all, since only the head
    # of each aggregate is claimable.
    claimable_heads: int | None = None  # aggregates whose head is claimable now
    oldest_claimable_age: float | None = None  # seconds the oldest claimable head has waited
    blocked_by_dead: int | None = None  # messages waiting behind a dead head

    @property
    def backlog(self) -> int:
        """Messages not finished yet (pending + processing)."""
        return self.pending + self.processing

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["sampled_at"] = self.sampled_at.isoformat()
        data["attempts"] = {str(k): v for k, v in self.attempts.items()}
        data["backlog"] = self.backlog
        return data


@dataclass(frozen=True)
class Rates:
    arrivals_per_second: float
    completions_per_second: float  # messages leaving the backlog (done or dead)


def rates(before: QueueStats, after: QueueStats) -> Rates | None:
    """Arrival and completion rates between two snapshots; None if no time passed."""
    seconds = (after.sampled_at - before.sampled_at).total_seconds()
    if seconds <= 0:
        return None
    arrived = after.max_id - before.max_id
    completed = arrived - (after.backlog - before.backlog)
    return Rates(arrived / seconds, max(completed, 0) / seconds)


def _query(table: Table, exact: bool) -> sql.Composed:
    done = (
        sql.SQL("(SELECT count(*) FROM {t} WHERE status = 'done')")
        if exact
        else sql.SQL(
            "(SELECT greatest(reltuples, 0)::bigint FROM pg_class WHERE oid = {rc}::regclass)"
        )
    )
    return sql.SQL(
        """SELECT now(),
       (SELECT count(*) FROM {t} WHERE status = 'pending'),
       (SELECT count(*) FROM {t} WHERE status = 'pending' AND available_at <= now()),
       (SELECT count(*) FROM {t} WHERE status = 'processing'),
       (SELECT count(*) FROM {t} WHERE status = 'dead'),
       {done},
       (SELECT count(*) FROM {t} WHERE status = 'processing' AND lease_until < now()),
       (SELECT extract(epoch FROM now() - created_at)::float8 FROM {t}
         WHERE status IN ('pending', 'processing') ORDER BY id LIMIT 1),
       (SELECT extract(epoch FROM now() - min(available_at))::float8 FROM {t}
         WHERE status = 'pending' AND available_at <= now()),
       coalesce((SELECT max(id) FROM {t}), 0),
       (SELECT coalesce(jsonb_object_agg(attempts, n), '{{}}') FROM
          (SELECT attempts, count(*) AS n FROM {t}
            WHERE status IN ('pending', 'processing') GROUP BY attempts) AS a)"""
    ).format(
        t=table.ident,
        rc=table.regclass_literal,
        done=done.format(t=table.ident, rc=table.regclass_literal),
    )


def _build(table: Table, row: tuple[Any, ...], exact: bool) -> QueueStats:
    (now, pending, ready, processing, dead, done, expired, oldest, oldest_ready, max_id, dist) = row
    if not exact:
        # reltuples counts every row: what is not waiting or dead is (roughly) done.
        done = max(int(done) - pending - processing - dead, 0)
    return QueueStats(
        table=str(table),
        sampled_at=now,
        pending=pending,
        ready=ready,
        processing=processing,
        dead=dead,
        done=int(done),
        done_is_estimate=not exact,
        expired_leases=expired,
        oldest_pending_age=oldest,
        oldest_ready_age=oldest_ready,
        max_id=int(max_id),
        attempts={int(k): int(v) for k, v in sorted(dist.items(), key=lambda kv: int(kv[0]))},
    )


def queue_stats(conn: psycopg.Connection[Any], table: Table, *, exact: bool = False) -> QueueStats:
    row = conn.execute(_query(table, exact)).fetchone()
    assert row is not None
    return _build(table, row, exact)


async def queue_stats_async(
    conn: psycopg.AsyncConnection[Any], table: Table, *, exact: bool = False
) -> QueueStats:
    cur = await conn.execute(_query(table, exact))
    row = await cur.fetchone()
    assert row is not None
    return _build(table, row, exact)
