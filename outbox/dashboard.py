"""What the dashboard reads beside `outbox.stats`: who holds leases, and (ordered mode)
which aggregates a dead head stops."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from psycopg import sql

from outbox.query import Query
from outbox.table import Table


@dataclass(frozen=True)
class LeaseHolder:
    owner: str  # lease_owner; "" when a row is processing without one
    held: int
    expired: int
    earliest_expiry: datetime  # the lease that runs out first (or ran out longest ago)


def lease_holders(table: Table, *, limit: int = 100) -> Query[list[LeaseHolder]]:
    """Processing rows per lease_owner (over the `outbox_leased` index)."""
    statement = sql.SQL(
        """SELECT coalesce(lease_owner, ''), count(*),
       count(*) FILTER (WHERE lease_until < now()), min(lease_until)
  FROM {t} WHERE status = 'processing'
 GROUP BY 1 ORDER BY 2 DESC, 1
 LIMIT %(limit)s::int"""
    ).format(t=table.ident)
    return Query(
        statement,
        {"limit": limit},
        lambda rows: [LeaseHolder(str(r[0]), int(r[1]), int(r[2]), r[3]) for r in rows],
    )


@dataclass(frozen=True)
class Blocked:
    aggregates: int  # aggregates whose head (first unfinished message) is dead
    waiting: int  # pending or processing messages queued behind those heads


def blocked_aggregates(table: Table) -> Query[Blocked]:
    """Ordered mode: aggregates stopped by a dead head. Dead rows come from `outbox_dead`,
    each aggregate is probed on `outbox_aggregate`."""
    statement = sql.SQL(
        """SELECT count(*), coalesce(sum(
         (SELECT count(*) FROM {t} AS w
           WHERE w.aggregate_id = h.aggregate_id AND w.id > h.head
             AND w.status IN ('pending', 'processing'))), 0)
  FROM (SELECT aggregate_id, min(id) AS head FROM {t}
         WHERE status = 'dead' GROUP BY aggregate_id) AS h
 WHERE NOT EXISTS (SELECT 1 FROM {t} AS p
                    WHERE p.aggregate_id = h.aggregate_id AND p.id < h.head
                      AND p.status <> 'done')"""
    ).format(t=table.ident)
    return Query(statement, {}, lambda rows: Blocked(int(rows[0][0]), int(rows[0][1])))
