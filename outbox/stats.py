"""Queue state from index-backed queries whose cost stays flat at any backlog.

A snapshot carries `max_id` (a monotonic arrival counter) and the database time it was
taken at, so that a poller derives arrival and completion rates from two snapshots without
scanning anything (see `rates`).

What a snapshot costs does not grow with the backlog: every count stops at `count_limit`
(`COUNT_LIMIT` unless asked otherwise; `exact=True` lifts it), and a count that reached it
reads "at least" (`QueueStats.at_least`; for people `≥N`, and `unknown` where that bound is
0, `QueueStats.count_text`). Past that size exact counts change no decision: the
claimable backlog is then estimated from the id span between the head of the claim order
and `max_id` (`QueueStats.ready_estimate`), and completions from how far that head moved.
The attempts distribution covers the oldest `count_limit` waiting messages. Done rows are
the one count that cannot be cheap: an estimate from the planner's statistics unless
`exact=True`, as long as those statistics are to be trusted. A table never analyzed has
none (`reltuples` -1: a demo's thousands of delivered rows read `done ~0`), and one changed a
lot since its last analyze has stale ones (`n_mod_since_analyze` past `STALE_FRACTION` of the
rows it knew: twice what makes autovacuum analyze it again); then the done rows are counted
among the first `count_limit` rows of the table, an exact figure when the table holds fewer,
else a lower bound (`at_least("done")`), never a wrong estimate.

Two ages, because they answer different questions. The ready age (`oldest_ready_age`) is how
long the head of the claim order has been claimable: what more workers would shorten, the
operator's sizing signal. It leaves out messages waiting out a backoff, so failures that
send messages into backoff keep it near zero; an outage that opens a destination's breaker
holds its messages back unsent and claimable instead (a publisher of one destination), and
then it grows while `retrying` stays near zero. The oldest unfinished age
(`oldest_unfinished_age`, from `created_at` of the oldest pending or processing message)
grows through any stall, backoff included: the one to alert on. `retrying` counts the
messages waiting out a backoff (pending, available later, at least one attempt spent), among
the oldest `count_limit` messages that wait for a later time (`waiting`).

Each destination's state (`destinations`: closed, open or paused; outbox.destinations) is
read by a second, small statement on `<table>_destinations`, which holds one row per
destination that a worker serves or served, or that ever failed, was paused or rate limited:
its cost follows the number of destinations, never the backlog. A destination no running
worker serves (`DestinationState.idle`) is no outage, whatever its row says: `unreachable`
leaves it out.

Ordered tables (`ordered=True`) add what can be claimed at all, since only the head of each
aggregate is claimable: the heads are found by a skip scan of the `aggregate` index, one
probe per aggregate with unfinished messages (at most `count_limit` of them). A head's age
counts from when it became claimable: the later of its `available_at` and its
predecessor's `done_at`, looked for among the `count_limit` ids below the newest head.

A partitioned table (outbox.partitions) is looked at through a window: a statement over its
parent would plan and open every partition, hundreds of them finished or made ahead. The
unfinished rows are looked for from the first partition `outbox maintain` has not noted
finished to the end of the one holding the newest id (`unfinished_window`, read from the
catalog), the ids named as constants so that the planner prunes the rest, or that one
partition itself when it is the whole window; the done rows stay the statistics' estimate
over every partition.

One definition serves sync and async connections alike: `stats_query` builds the statement
as a `Query` and `snapshot` its statements as `Steps` (outbox.runner), which
`queue_stats` / `queue_stats_async` run.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from datetime import datetime
from typing import Any

import psycopg
from psycopg import sql

from outbox import destinations as dest
from outbox.partitions import (
    FINISHED_NOTE,
    FIRST_ID,
    PAST_ID,
    last_id_given,
    partition_named,
    unusable_bound,
    written_past,
)
from outbox.plumbing.redact import redact_text
from outbox.runner import Query, Row, Steps, perform, perform_async, step
from outbox.table import Table

# Counts stop here by default: a walk of at most this many index entries whatever the backlog
# (what a snapshot measured to: docs/autoscaling.md), and well past the point where an exact
# figure would change a scaling decision or what an operator does.
COUNT_LIMIT = 10_000

# `exact=True`: no bound in practice (PostgreSQL's LIMIT takes a bigint).
_UNBOUNDED = 2**62

# The planner's statistics are stale past this many changes (inserts, updates, deletes) since
# the last analyze, as a fraction of the rows it counted: autovacuum analyzes again at 10%
# (and 50 rows) by default, so twice that means it is behind or off for this table.
STALE_FRACTION = 0.2

_COUNTED = (
    "pending", "ready", "waiting", "retrying", "processing", "dead", "expired_leases",
    "blocked_by_dead",
)  # fmt: skip


def _iso(moment: datetime | None) -> str | None:
    return moment.isoformat() if moment is not None else None


def _seconds(later: datetime | None, earlier: datetime | None) -> float | None:
    if later is None or earlier is None:
        return None
    return (later - earlier).total_seconds()


@dataclass(frozen=True)
class DestinationState:
    """A destination as people and the operator see it: its row (outbox.destinations) with
    the error redacted and the times also as seconds from the database's now()."""

    destination: str
    state: str  # closed, open (the breaker) or paused (by a person)
    since: datetime | None  # when it entered that state
    for_seconds: float | None  # how long it has been in it
    failures: int  # in the window (closed), or since it opened
    last_error: str | None  # redacted (outbox.plumbing.redact)
    last_failure: datetime | None
    next_probe_at: datetime | None  # open only: when a replica may take the next probe
    next_probe_in: float | None  # seconds until then; 0 or less: due
    probing: str | None  # the replica holding the probe right now, if one does
    reason: str | None  # why it was paused (or "Retry-After" for an open one)
    changed_by: str | None  # who paused it, or resumed it last
    served_at: datetime | None = None  # a worker configured for it last said so (None: never)
    served_ago: float | None = None  # seconds since then
    served_by: str | None = None  # that worker
    # No worker has served it lately (outbox.destinations.IDLE_AFTER): its row is what the
    # last ones left, which nothing running will probe or change.
    idle: bool = False

    @classmethod
    def of(cls, row: dest.Destination, now: datetime) -> DestinationState:
        probing = (
            row.probe_owner
            if row.state == dest.OPEN and row.probe_until is not None and row.probe_until > now
            else None
        )
        next_probe = row.next_probe_at if row.state == dest.OPEN else None
        return cls(
            destination=row.destination,
            state=row.state,
            since=row.since,
            for_seconds=_seconds(now, row.since),
            failures=row.failures,
            last_error=redact_text(row.last_error) if row.last_error is not None else None,
            last_failure=row.last_failure,
            next_probe_at=next_probe,
            next_probe_in=_seconds(next_probe, now),
            probing=probing,
            reason=row.reason,
            changed_by=row.changed_by,
            served_at=row.served_at,
            served_ago=_seconds(now, row.served_at),
            served_by=row.served_by,
            idle=dest.is_idle(row, now),
        )

    @property
    def sending(self) -> bool:
        return self.state == dest.CLOSED

    @property
    def shown_state(self) -> str:
        """The state people and alerts see: the row's, or `idle` for one no worker serves."""
        return dest.IDLE if self.idle else self.state

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        for name in ("since", "last_failure", "next_probe_at", "served_at"):
            data[name] = _iso(data[name])
        return data


def destination_states(table: Table) -> Query[list[DestinationState]]:
    """Every destination with a row, as `DestinationState`s, by name."""
    listing = dest.listing(table)
    return Query(
        listing.statement,
        listing.params,
        lambda rows: [DestinationState.of(row, now) for row, now in listing.parse(rows)],
    )


@dataclass(frozen=True)
class QueueStats:
    table: str
    sampled_at: datetime  # the database's now()
    pending: int
    ready: int  # pending with available_at <= now(): claimable right now
    processing: int
    dead: int
    done: int
    done_is_estimate: bool  # the planner's statistics (see the module's docstring)
    expired_leases: int  # processing rows past lease_until: crashed or stalled workers
    # Seconds since created_at of the oldest unfinished message (pending or processing),
    # backoff included; also named `oldest_unfinished_age`.
    oldest_pending_age: float | None
    # Seconds the longest-waiting ready message has been claimable: messages waiting out a
    # backoff are not ready, so they do not show here (see the module's docstring).
    oldest_ready_age: float | None
    max_id: int  # highest id so far: arrivals between two snapshots = difference
    attempts: dict[int, int]  # attempts -> messages, over (the oldest) pending and processing rows
    # Counts that reached this are lower bounds (see `at_least`); None: every count is exact.
    count_limit: int | None = None
    oldest_ready_id: int | None = None  # id of the head of the claim order (oldest ready row)
    # Ordered tables only (None otherwise): what can be claimed at all, since only the head
    # of each aggregate is claimable.
    claimable_heads: int | None = None  # aggregates whose head is claimable now
    # Seconds the oldest claimable head has been claimable (since its predecessor finished).
    oldest_claimable_age: float | None = None
    blocked_by_dead: int | None = None  # messages waiting behind a dead head
    # Pending and available later: in backoff, deferred, or held back for a destination.
    waiting: int = 0
    # Of those, the ones with at least one attempt spent: waiting out a backoff. Counted
    # among the `waiting` rows walked, so a lower bound when `waiting` is.
    retrying: int = 0
    destinations: tuple[DestinationState, ...] = ()  # every destination with a row, by name
    # Done rows counted (statistics missing or stale) stopped at the count limit: a lower bound.
    done_at_least: bool = False

    @property
    def backlog(self) -> int:
        """Messages not finished yet (pending + processing); a lower bound if either is."""
        return self.pending + self.processing

    @property
    def oldest_unfinished_age(self) -> float | None:
        """Seconds since the oldest pending or processing message was created: it grows
        through any stall, backoff included, unlike the ready age."""
        return self.oldest_pending_age

    @property
    def unreachable(self) -> tuple[DestinationState, ...]:
        """The destinations nothing is sent to (open or paused) that a running worker
        serves: an idle one's state holds nothing back any more."""
        return tuple(d for d in self.destinations if not d.sending and not d.idle)

    def at_least(self, name: str) -> bool:
        """Whether the count `name` stopped at the count limit (the true figure may be more)."""
        if name == "retrying":  # counted among the waiting rows walked
            name = "waiting"
        if name == "done":  # counted (or estimated) its own way
            return self.done_at_least
        value = getattr(self, name)
        return self.count_limit is not None and value is not None and value >= self.count_limit

    @property
    def counts_exact(self) -> bool:
        return not any(self.at_least(name) for name in _COUNTED)

    @property
    def ready_estimate(self) -> int:
        """Claimable messages: the count, or past the limit the id span from the head of the
        claim order to the newest message (messages arrive in id order and are claimed
        oldest first, so nearly all of that span is waiting)."""
        if not self.at_least("ready") or self.oldest_ready_id is None:
            return self.ready
        return max(self.ready, self.max_id - self.oldest_ready_id + 1)

    def count_text(self, name: str) -> str:
        """A count for people: `≥10000` where it stopped at the limit. A lower bound of 0
        bounds nothing (the done rows not counted past a backlog at the limit, or none of
        the rows walked in backoff) and `≥0` read as none: it is `unknown`, the done rows'
        with what counts them."""
        value = getattr(self, name)
        if not self.at_least(name):
            return str(value)
        if value == 0:
            return "unknown (--exact counts them)" if name == "done" else "unknown"
        return f"≥{value}"

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["sampled_at"] = self.sampled_at.isoformat()
        data["attempts"] = {str(k): v for k, v in self.attempts.items()}
        data["oldest_unfinished_age"] = self.oldest_unfinished_age
        data["destinations"] = [d.to_dict() for d in self.destinations]
        data["backlog"] = self.backlog
        data["ready_estimate"] = self.ready_estimate
        data["at_least"] = [name for name in (*_COUNTED, "done") if self.at_least(name)]
        return data


@dataclass(frozen=True)
class Rates:
    arrivals_per_second: float
    completions_per_second: float  # messages leaving the backlog (done or dead)


def rates(before: QueueStats, after: QueueStats) -> Rates | None:
    """Arrival and completion rates between two snapshots; None if no time passed, or if
    max(id) went down (the newest rows were purged or the table emptied): no arrival count
    can be had from that pair.

    Completions are arrivals minus the backlog's growth while both backlogs are exact;
    past the count limit, how far the head of the claim order moved through the ids.
    """
    seconds = (after.sampled_at - before.sampled_at).total_seconds()
    if seconds <= 0 or after.max_id < before.max_id:
        return None
    arrived = after.max_id - before.max_id
    if before.at_least("pending") or after.at_least("pending"):
        head_before, head_after = before.oldest_ready_id, after.oldest_ready_id
        completed = (
            head_after - head_before
            if head_before is not None and head_after is not None
            else arrived - (after.ready_estimate - before.ready_estimate)
        )
    else:
        completed = arrived - (after.backlog - before.backlog)
    return Rates(arrived / seconds, max(completed, 0) / seconds)


def _bounded_count(t: sql.Composable, where: sql.Composable, order: sql.SQL) -> sql.Composed:
    # Ordered like the partial index that holds these rows, so the planner walks that index
    # and stops at the limit, instead of a sequential scan that "should" find them soon
    # (it would read every done row before the backlog at the table's end).
    return sql.SQL(
        "(SELECT count(*) FROM (SELECT 1 FROM {t} WHERE {w} ORDER BY {o} LIMIT %(limit)s) AS c)"
    ).format(t=t, w=where, o=order)


# The heads of the aggregates (ordered mode): a skip scan of the `aggregate` index, one probe
# per aggregate with unfinished messages, at most %(limit)s of them.
_HEADS = sql.SQL(
    """WITH RECURSIVE heads(aggregate_id, id, n) AS (
    (SELECT aggregate_id, id, 1 FROM {t} WHERE status <> 'done'{ids}
      ORDER BY aggregate_id, id LIMIT 1)
    UNION ALL
    SELECT nx.aggregate_id, nx.id, h.n + 1 FROM heads AS h CROSS JOIN LATERAL (
        SELECT aggregate_id, id FROM {t}
         WHERE status <> 'done' AND aggregate_id > h.aggregate_id{ids}
         ORDER BY aggregate_id, id LIMIT 1) AS nx
     WHERE h.n < %(limit)s
), head_rows AS (
    SELECT o.aggregate_id, o.id, o.status, o.available_at, o.lease_until
      FROM heads AS h JOIN {t} AS o ON o.id = h.id{o_ids}
), recent_done AS (
    SELECT p.aggregate_id, p.id, p.done_at FROM {t} AS p
     WHERE p.status = 'done' AND p.id < (SELECT max(id) FROM head_rows)
       AND p.id >= (SELECT max(id) FROM head_rows) - %(limit)s{p_ids}
), freed(aggregate_id, at) AS (
    SELECT DISTINCT ON (h.aggregate_id) h.aggregate_id, p.done_at
      FROM head_rows AS h JOIN recent_done AS p
        ON p.aggregate_id = h.aggregate_id AND p.id < h.id
     ORDER BY h.aggregate_id, p.id DESC
)
"""
)

# Ordered mode's claimable figures. A head became claimable when it became available or
# when its predecessor (the aggregate's previous row) finished, whichever came last: a head
# freed by its predecessor's completion has waited since then. Counted from `available_at`,
# a long chain on one aggregate reads as old as its rows (saturation) while every worker
# has room. No index holds done rows by aggregate, so the predecessors are looked for on the
# primary key, among the %(limit)s ids below the newest head (`recent_done`, one range
# walk): heads freed while the workers keep up have their predecessors there, however many
# aggregates the rows are spread over. A predecessor further back, or purged, leaves
# `available_at`: an age read long, as before, never short.
#
# The oldest claimable head is the one claimable longest among the heads of the skip scan;
# where that stopped at the limit, the first head of the claim order (what the ordered claim
# itself finds, among the oldest %(limit)s ready rows; its predecessor looked for among the
# %(limit)s ids below it) covers the aggregates it did not reach.
_ORDERED_COLUMNS = sql.SQL(
    """,
       (SELECT count(*) FROM head_rows AS h
         WHERE (h.status = 'pending' AND h.available_at <= now())
            OR (h.status = 'processing' AND h.lease_until < now())),
       extract(epoch FROM now() - least(
         (SELECT greatest(c.available_at,
                          (SELECT p.done_at FROM {t} AS p
                            WHERE p.id < c.id AND p.id >= c.id - %(limit)s
                              AND p.aggregate_id = c.aggregate_id{p_ids}
                            ORDER BY p.id DESC LIMIT 1))
            FROM (SELECT id, aggregate_id, available_at FROM {t}
                   WHERE status = 'pending' AND available_at <= now(){ids}
                   ORDER BY available_at, id LIMIT %(limit)s) AS c
           WHERE NOT EXISTS (SELECT 1 FROM {t} AS prev
                              WHERE prev.aggregate_id = c.aggregate_id AND prev.id < c.id
                                AND prev.status <> 'done'{prev_ids})
           ORDER BY c.available_at, c.id LIMIT 1),
         (SELECT min(greatest(h.available_at, f.at))
            FROM head_rows AS h LEFT JOIN freed AS f ON f.aggregate_id = h.aggregate_id
           WHERE h.status = 'pending' AND h.available_at <= now())))::float8,
       (SELECT count(*) FROM (
          SELECT 1 FROM head_rows AS h JOIN {t} AS b
              ON b.aggregate_id = h.aggregate_id AND b.id > h.id AND b.status <> 'done'{b_ids}
           WHERE h.status = 'dead' LIMIT %(limit)s) AS c)"""
)


# Done rows without `exact`: [how, figure]. How 0: the planner's estimate of every row
# (reltuples, summed over the partitions if any: the layout's are all leaves, read from
# pg_inherits, which takes no lock on them as pg_partition_tree does), trusted only while
# every part has been analyzed (or vacuumed) and changed little since (`STALE_FRACTION`),
# or was never analyzed and is empty: a partition made ahead is neither analyzed nor
# written to until its ids come, and it made a table of millions of analyzed done rows
# read `done ≥0`.
# Else the done rows among the first %(limit)s rows in id order (the primary key, oldest
# first; of a partitioned table's window, see `unfinished_window`): how 1 when that was the
# whole table (exact), 2 when it stopped at the limit or looked in a window only (a lower
# bound). The count is a subquery only the ELSE branch refers to: PostgreSQL runs it only
# when it is needed.
_DONE = sql.SQL(
    """(SELECT CASE
         WHEN bool_and(CASE WHEN c.reltuples >= 0
                            THEN coalesce(pg_stat_get_mod_since_analyze(c.oid), 0)
                                 <= c.reltuples * {stale}
                            ELSE pg_relation_size(c.oid) = 0 END)
         THEN ARRAY[0, sum(greatest(c.reltuples, 0))::bigint]
         ELSE (SELECT ARRAY[CASE WHEN count(*) < %(limit)s AND {whole} THEN 1 ELSE 2 END,
                            count(*) FILTER (WHERE r.status = 'done')]
                 FROM (SELECT status FROM {t} WHERE TRUE{ids} ORDER BY id LIMIT %(limit)s) AS r)
       END
  FROM pg_class AS c
 WHERE (c.oid = {rc}::regclass AND c.relkind <> 'p')
    OR c.oid IN (SELECT inhrelid FROM pg_inherits WHERE inhparent = {rc}::regclass))"""
)


def _ids(window: tuple[int, int] | None, alias: str | None = None) -> sql.Composable:
    """` AND id >= low AND id < high` (of `alias` if given) as constants, which PostgreSQL
    prunes a partitioned table's other partitions by while planning; nothing without one."""
    if window is None:
        return sql.SQL("")
    column = sql.Identifier(alias, "id") if alias else sql.Identifier("id")
    return sql.SQL(" AND {c} >= {low} AND {c} < {high}").format(
        c=column, low=sql.Literal(window[0]), high=sql.Literal(window[1])
    )


def _aliased(window: Window | None, leaf: bool, alias: str) -> sql.Composable:
    return _ids(None if leaf or window is None else (window.low, window.high), alias)


def _statement(
    table: Table, exact: bool, ordered: bool, window: Window | None = None
) -> sql.Composed:
    # A window that is one partition: that partition itself, as a plain table (its rows are
    # all within it); else the parent, every statement bounded to the window's ids.
    leaf = window is not None and window.leaf is not None
    t = (
        partition_named(table, window.leaf, window.schema).ident
        if window and window.leaf
        else table.ident
    )
    ids = _ids(None if leaf or window is None else (window.low, window.high))

    def count(where: str, order: str) -> sql.Composed:
        if exact:  # every row is read anyway: let the planner choose how
            return sql.SQL("(SELECT count(*) FROM {t} WHERE {w}{ids})").format(
                t=t, w=sql.SQL(where), ids=ids
            )
        return _bounded_count(t, sql.SQL(where) + ids, sql.SQL(order))

    # Pending rows available later, and those of them with an attempt spent (in backoff):
    # one walk of the ready index from now() on, at most %(limit)s rows.
    later = "status = 'pending' AND available_at > now()"
    waiting = (
        sql.SQL(
            "(SELECT ARRAY[count(*), count(*) FILTER (WHERE attempts > 0)] FROM {t} WHERE {w}{ids})"
        ).format(t=t, w=sql.SQL(later), ids=ids)
        if exact
        else sql.SQL(
            "(SELECT ARRAY[count(*), count(*) FILTER (WHERE w.attempts > 0)] FROM "
            "(SELECT attempts FROM {t} WHERE {w}{ids} ORDER BY available_at, id "
            "LIMIT %(limit)s) AS w)"
        ).format(t=t, w=sql.SQL(later), ids=ids)
    )
    done = (
        # Every partition: an exact count is asked for, whatever it costs.
        sql.SQL("(SELECT count(*) FROM {t} WHERE status = 'done')").format(t=table.ident)
        if exact
        else _DONE.format(
            t=t,
            rc=table.regclass_literal,
            stale=sql.Literal(STALE_FRACTION),
            ids=ids,
            whole=sql.Literal(window is None),
        )
    )
    body = sql.SQL(
        """SELECT now(),
       {pending},
       {ready},
       {processing},
       {dead},
       {done},
       {expired},
       (SELECT extract(epoch FROM now() - created_at)::float8 FROM {t}
         WHERE status IN ('pending', 'processing'){ids} ORDER BY id LIMIT 1),
       (SELECT extract(epoch FROM now() - available_at)::float8 FROM {t}
         WHERE status = 'pending' AND available_at <= now(){ids}
         ORDER BY available_at, id LIMIT 1),
       (SELECT id FROM {t}
         WHERE status = 'pending' AND available_at <= now(){ids}
         ORDER BY available_at, id LIMIT 1),
       coalesce((SELECT max(id) FROM {t} WHERE TRUE{ids}), 0),
       (SELECT coalesce(jsonb_object_agg(attempts, n), '{{}}') FROM
          (SELECT attempts, count(*) AS n FROM
             (SELECT attempts FROM {t} WHERE status IN ('pending', 'processing'){ids}
               ORDER BY id LIMIT %(limit)s) AS w
            GROUP BY attempts) AS a),
       {waiting}{ordered}"""
    ).format(
        t=t,
        waiting=waiting,
        pending=count("status = 'pending'", "available_at, id"),
        ready=count("status = 'pending' AND available_at <= now()", "available_at, id"),
        processing=count("status = 'processing'", "lease_until"),
        dead=count("status = 'dead'", "id"),
        expired=count("status = 'processing' AND lease_until < now()", "lease_until"),
        done=done,
        ids=ids,
        ordered=(
            _ORDERED_COLUMNS.format(
                t=t, ids=ids, p_ids=_aliased(window, leaf, "p"),
                prev_ids=_aliased(window, leaf, "prev"), b_ids=_aliased(window, leaf, "b"),
            )
            if ordered
            else sql.SQL("")
        ),
    )  # fmt: skip
    if not ordered:
        return body
    heads = _HEADS.format(
        t=t, ids=ids, o_ids=_aliased(window, leaf, "o"), p_ids=_aliased(window, leaf, "p")
    )
    return sql.Composed([heads, body])


def _build(table: Table, row: Row, exact: bool, limit: int | None) -> QueueStats:
    (now, pending, ready, processing, dead, done, expired, oldest, oldest_ready, ready_id) = row[
        :10
    ]
    max_id, dist, (waiting, retrying) = row[10:13]
    heads, head_age, blocked = row[13:16] if len(row) > 13 else (None, None, None)
    done_at_least = False
    if exact:
        estimate = False
    else:
        how, done = (int(v) for v in done)
        estimate, done_at_least = how == 0, how == 2
        if estimate and limit is not None and max(pending, processing, dead) >= limit:
            # A count that stopped at the limit is a lower bound: the estimate less it would
            # be too high (50,000 pending rows and none done showed `done ~40000`). All that
            # is known is a lower bound of nothing.
            estimate, done_at_least, done = False, True, 0
        elif estimate:
            # reltuples counts every row: what is not waiting or dead is (roughly) done.
            done = max(done - pending - processing - dead, 0)
    return QueueStats(
        table=str(table),
        sampled_at=now,
        pending=pending,
        ready=ready,
        processing=processing,
        dead=dead,
        done=int(done),
        done_is_estimate=estimate,
        done_at_least=done_at_least,
        expired_leases=expired,
        oldest_pending_age=oldest,
        oldest_ready_age=oldest_ready,
        max_id=int(max_id),
        attempts={int(k): int(v) for k, v in sorted(dist.items(), key=lambda kv: int(kv[0]))},
        count_limit=limit,
        oldest_ready_id=ready_id,
        claimable_heads=heads,
        oldest_claimable_age=head_age,
        blocked_by_dead=blocked,
        waiting=int(waiting),
        retrying=int(retrying),
    )


def stats_query(
    table: Table,
    *,
    exact: bool = False,
    ordered: bool = False,
    count_limit: int = COUNT_LIMIT,
    window: Window | None = None,
) -> Query[QueueStats]:
    """The snapshot statement: bounded counts (`count_limit`) unless `exact`; the claimable
    figures of an ordered table if `ordered`; every unfinished row looked for within the ids
    of `window` (a partitioned table's, `unfinished_window`)."""
    if count_limit < 1:
        raise ValueError("count_limit must be at least 1")
    limit = None if exact else count_limit

    def parse(rows: list[Row]) -> QueueStats:
        return _build(table, rows[0], exact, limit)

    statement = _statement(table, exact, ordered, window)
    return Query(statement, {"limit": limit or _UNBOUNDED}, parse)


def _query(table: Table, exact: bool, ordered: bool = False) -> sql.Composable:
    """The statement with the default count limit written in, for EXPLAIN in plan guards."""
    query = stats_query(table, exact=exact, ordered=ordered)
    assert query.params is not None
    text = query.statement.as_string(None).replace("%(limit)s", str(int(query.params["limit"])))
    return sql.SQL(text)  # composed from quoted parts above


# A partitioned table's partitions that `outbox maintain` has not noted finished (the notes by
# a join), each with its id range (deparsed without opening the partition: a bound holds no
# column), the newest id the sequence gave (-1 for a role that may not read the sequence:
# then every partition's file is looked at), and, for a partition wholly past it, whether its
# file holds anything: a row a producer wrote with an id of its own past the sequence (which
# `outbox maintain` sees through max(id); outbox.partitions.written_past, which the claims'
# window asks too). The others' sizes are not looked at. No row for a plain table.
_WINDOW = sql.SQL(
    """SELECT w.relname, w.low, w.high, w.last, {written}, w.bound, w.schema
  FROM (SELECT p.oid, p.relname::text AS relname, pg_get_expr(p.relpartbound, 0) AS bound,
               (SELECT nspname::text FROM pg_namespace WHERE oid = p.relnamespace) AS schema,
               substring(pg_get_expr(p.relpartbound, 0) FROM {low})::bigint AS low,
               substring(pg_get_expr(p.relpartbound, 0) FROM {high})::bigint AS high,
               (SELECT coalesce({last}, -1)) AS last
          FROM pg_inherits AS i
          JOIN pg_class AS p ON p.oid = i.inhrelid
          LEFT JOIN pg_description AS d
            ON d.objoid = p.oid AND d.classoid = 'pg_class'::regclass AND d.objsubid = 0
         WHERE i.inhparent = {rc}::regclass
           AND NOT coalesce(starts_with(d.description, {note}), false)) AS w"""
)


@dataclass(frozen=True)
class Window:
    """Where a partitioned table's unfinished rows can be (`unfinished_window`)."""

    low: int  # first id
    high: int  # past the last id
    # The partition that is the whole window, if one is: a snapshot then names it itself
    # and plans as on a plain table.
    leaf: str | None = None
    # The schema `leaf` is in, as the catalog holds it: named there, it is the partition
    # whatever the search_path reaches first (outbox.partitions.in_schema), where named as a
    # table named without its schema is, a table of its name in a schema before the table's
    # (the role's own) was counted in its stead.
    schema: str | None = field(default=None, compare=False)


def unfinished_window(table: Table) -> Query[Window | None]:
    """The ids a partitioned table's unfinished rows can be in, from its first partition that
    `outbox maintain` has not found finished (a partition it noted holds done rows only: a
    replay forgets the note of the partitions it sends again) to the end of the one holding
    the newest id (the sequence's, or one a producer wrote of its own past it); None for a
    plain table. A snapshot's statement names this range as
    constants, so it plans and opens those partitions only, not the hundreds of finished
    ones behind them or made ahead."""
    statement = _WINDOW.format(
        rc=table.regclass_literal,
        low=sql.Literal(FIRST_ID),
        high=sql.Literal(PAST_ID),
        note=sql.Literal(FINISHED_NOTE),
        # A role that may not read the sequence (-1): every partition's file is looked at.
        last=last_id_given(table),
        written=written_past(sql.SQL("w.oid"), sql.SQL("w.low"), sql.SQL("w.last")),
    )

    def parse(rows: list[Row]) -> Window | None:
        for name, low, high, *_, bound, _ in rows:
            if low is None or high is None:  # DEFAULT, MINVALUE or MAXVALUE: not a range
                raise unusable_bound(table, str(name), bound)
        found = [
            (str(name), int(low), int(high), str(schema)) for name, low, high, *_, schema in rows
        ]
        if not found:
            return None
        last = int(rows[0][3])
        written_past = {str(row[0]) for row in rows if row[4]}
        first = min(found, key=lambda p: p[1])
        # The partition holding the newest id (never noted: it may still take rows), or a
        # later one a row was written to with an id of its own.
        newest = max(
            (p for p in found if p[1] <= last or p[0] in written_past),
            key=lambda p: p[1],
            default=first,
        )
        if first != newest:
            return Window(first[1], newest[2])
        return Window(first[1], newest[2], newest[0], newest[3])

    return Query(statement, None, parse)


def snapshot(
    table: Table,
    *,
    exact: bool = False,
    ordered: bool = False,
    count_limit: int = COUNT_LIMIT,
    destinations: bool = True,
) -> Steps[QueueStats]:
    """The snapshot's statements: the queue's, then each destination's state unless
    `destinations` is False (`queue_stats` runs them)."""
    window = yield from step(unfinished_window(table))
    query = stats_query(table, exact=exact, ordered=ordered, count_limit=count_limit, window=window)
    stats = yield from step(query)
    if not destinations:
        return stats
    found = yield from step(destination_states(table))
    return replace(stats, destinations=tuple(found))


def queue_stats(
    conn: psycopg.Connection[Any],
    table: Table,
    *,
    exact: bool = False,
    ordered: bool = False,
    count_limit: int = COUNT_LIMIT,
    destinations: bool = True,
) -> QueueStats:
    """The snapshot, and each destination's state unless `destinations` is False."""
    steps = snapshot(
        table, exact=exact, ordered=ordered, count_limit=count_limit, destinations=destinations
    )
    return perform(conn, steps)


async def queue_stats_async(
    conn: psycopg.AsyncConnection[Any],
    table: Table,
    *,
    exact: bool = False,
    ordered: bool = False,
    count_limit: int = COUNT_LIMIT,
    destinations: bool = True,
) -> QueueStats:
    """`queue_stats` on an async connection."""
    steps = snapshot(
        table, exact=exact, ordered=ordered, count_limit=count_limit, destinations=destinations
    )
    return await perform_async(conn, steps)
