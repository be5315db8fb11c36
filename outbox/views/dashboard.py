"""What the dashboard reads beside `outbox.stats`: who holds leases, which sessions are
connected (workers by their owner name), and (ordered mode) which aggregates a dead head
stops."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from psycopg import sql

from outbox.operations.repair import Seen
from outbox.queries import CLAIM_MARKER
from outbox.runner import Query
from outbox.stats import Window
from outbox.table import Table
from outbox.views.window import within


@dataclass(frozen=True)
class LeaseHolder:
    owner: str  # lease_owner; "" when a row is processing without one
    held: int
    expired: int
    earliest_expiry: datetime  # the lease that runs out first (or ran out longest ago)


def lease_holders(
    table: Table, *, limit: int = 100, window: Window | None = None
) -> Query[list[LeaseHolder]]:
    """Processing rows per lease_owner (over the `outbox_leased` index), within a
    partitioned table's `window` if given (outbox.views.window)."""
    statement = sql.SQL(
        """SELECT coalesce(lease_owner, ''), count(*),
       count(*) FILTER (WHERE lease_until < now()), min(lease_until)
  FROM {t} WHERE status = 'processing'{ids}
 GROUP BY 1 ORDER BY 2 DESC, 1
 LIMIT %(limit)s::int"""
    ).format(t=table.ident, ids=within(window))
    return Query(
        statement,
        {"limit": limit},
        lambda rows: [LeaseHolder(str(r[0]), int(r[1]), int(r[2]), r[3]) for r in rows],
    )


@dataclass(frozen=True)
class Blocked:
    aggregates: int  # aggregates whose head (first unfinished message) is dead
    waiting: int  # pending or processing messages queued behind those heads


def blocked_aggregates(table: Table, *, window: Window | None = None) -> Query[Blocked]:
    """Ordered mode: aggregates stopped by a dead head. Dead rows come from `outbox_dead`,
    each aggregate is probed on `outbox_aggregate`; within a partitioned table's `window` if
    given (outbox.views.window): every unfinished row is in it."""
    statement = sql.SQL(
        """SELECT count(*), coalesce(sum(
         (SELECT count(*) FROM {t} AS w
           WHERE w.aggregate_id = h.aggregate_id AND w.id > h.head
             AND w.status IN ('pending', 'processing'){w_ids})), 0)
  FROM (SELECT aggregate_id, min(id) AS head FROM {t}
         WHERE status = 'dead'{ids} GROUP BY aggregate_id) AS h
 WHERE NOT EXISTS (SELECT 1 FROM {t} AS p
                    WHERE p.aggregate_id = h.aggregate_id AND p.id < h.head
                      AND p.status <> 'done'{p_ids})"""
    ).format(
        t=table.ident, ids=within(window), w_ids=within(window, "w"), p_ids=within(window, "p")
    )
    return Query(statement, {}, lambda rows: Blocked(int(rows[0][0]), int(rows[0][1])))


@dataclass(frozen=True)
class BlockingHead:
    """A dead message that stops its aggregate in ordered mode: the first unfinished one."""

    id: int
    aggregate_type: str
    aggregate_id: str
    event_type: str
    last_error: str | None
    lease_version: int
    created_at: datetime
    waiting: int  # pending or processing messages of its aggregate behind it

    @property
    def seen(self) -> Seen:
        return Seen(self.id, "dead", self.lease_version)


def blocking_heads(
    table: Table, *, limit: int = 200, window: Window | None = None
) -> Query[list[BlockingHead]]:
    """The dead heads behind `blocked_aggregates`, most messages waiting first (within
    `window` as there)."""
    statement = sql.SQL(
        """SELECT o.id, o.aggregate_type, o.aggregate_id, o.event_type, o.last_error,
       o.lease_version, o.created_at,
       (SELECT count(*) FROM {t} AS w WHERE w.aggregate_id = o.aggregate_id AND w.id > o.id
           AND w.status IN ('pending', 'processing'){w_ids}) AS waiting
  FROM (SELECT aggregate_id, min(id) AS head FROM {t}
         WHERE status = 'dead'{ids} GROUP BY aggregate_id) AS h
  JOIN {t} AS o ON o.id = h.head{o_ids}
 WHERE NOT EXISTS (SELECT 1 FROM {t} AS p
                    WHERE p.aggregate_id = h.aggregate_id AND p.id < h.head
                      AND p.status <> 'done'{p_ids})
 ORDER BY waiting DESC, o.id
 LIMIT %(limit)s::int"""
    ).format(
        t=table.ident,
        ids=within(window),
        w_ids=within(window, "w"),
        o_ids=within(window, "o"),
        p_ids=within(window, "p"),
    )
    return Query(
        statement,
        {"limit": limit},
        lambda rows: [
            BlockingHead(int(r[0]), r[1], r[2], r[3], r[4], int(r[5]), r[6], int(r[7]))
            for r in rows
        ],
    )


@dataclass(frozen=True)
class Session:
    """The database sessions of one application_name (a worker's is its owner name), with
    the leases that name holds; a name that holds leases without a session is a worker gone."""

    name: str
    connections: int  # 0: no session, only leases left behind
    connected_since: datetime | None
    last_claim: datetime | None  # when one of its sessions last started a claim
    states: str  # e.g. "idle 3, active 1"
    held: int
    expired: int


def sessions(
    table: Table, *, limit: int = 100, window: Window | None = None
) -> Query[list[Session]]:
    """Client sessions of this database by application_name, and every lease owner.

    A claim is recognised by the comment its statement starts with (pg_stat_activity shows
    a session's last statement); other roles' statements need pg_read_all_stats to be seen.
    Leases are looked for within a partitioned table's `window` if given."""
    statement = sql.SQL(
        """WITH s AS (
    SELECT application_name AS name, count(*) AS connections,
           min(backend_start) AS since,
           max(query_start) FILTER (WHERE query LIKE %(claim)s) AS last_claim,
           string_agg(DISTINCT state || ' ' || n, ', ') AS states
      FROM (SELECT application_name, backend_start, query_start, query,
                   coalesce(state, '?') AS state,
                   count(*) OVER (PARTITION BY application_name, state) AS n
              FROM pg_stat_activity
             WHERE datname = current_database() AND backend_type = 'client backend'
               AND pid <> pg_backend_pid()) AS a
     GROUP BY application_name
), l AS (
    SELECT lease_owner AS name, count(*) AS held,
           count(*) FILTER (WHERE lease_until < now()) AS expired
      FROM {t} WHERE status = 'processing' AND lease_owner IS NOT NULL{ids} GROUP BY 1
)
SELECT coalesce(s.name, l.name), coalesce(s.connections, 0), s.since, s.last_claim,
       coalesce(s.states, ''), coalesce(l.held, 0), coalesce(l.expired, 0)
  FROM s FULL JOIN l ON l.name = s.name
 ORDER BY s.last_claim DESC NULLS LAST, 6 DESC, 1
 LIMIT %(limit)s::int"""
    ).format(t=table.ident, ids=within(window))
    return Query(
        statement,
        {"claim": f"{CLAIM_MARKER}%", "limit": limit},
        lambda rows: [
            Session(str(r[0]), int(r[1]), r[2], r[3], str(r[4]), int(r[5]), int(r[6])) for r in rows
        ],
    )
