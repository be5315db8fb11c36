"""Send delivered (or dead) messages again: `outbox replay`, the TUI's done screen, and
`outbox reconcile --replay`.

A replay is kept in the database as the same row sent again (schema v6): its status goes
back to `pending` (available now, attempts reset, like a requeue) and its `replay` column
takes the replay's number, a counter per table (`<table>_replays`: 1, 2, ...). So the
message keeps its id wherever the id travels (the fence, the wire, the receiver's inbox key,
`outbox reconcile`), the worker sends it like any row (the destination's rate limit and
breaker apply), and its history stays: the errors it met, and the audit log's records, one per
batch, whose `message_ids` name the rows that batch sent again (docs/replay.md says why not a
new row).

The window is on `created_at`, which has no index. Ids and `created_at` rise together (an id
is drawn at insert, `created_at` is the producer's transaction start): `window` bounds the id
range by a binary search of primary-key probes, widened by `CREATED_AT_SLACK` for
transactions that stayed open between the two, and every statement then filters on
`created_at` exactly inside that range. No index is added that every insert would pay for.

A replay goes in batches of at most `MAX_BATCH` rows, each one statement: pick the next rows
of the window by id, send them back to pending, and record the batch in the audit log, with
the replay's number, its filter, its batch size and the last id it reached. Between batches
a replay holds one thing, on its own session, from before its preview to its end: the
table's replays lock, shared (`holding_off_retirement`), under which no run of `outbox
maintain` retires a partition, so that none of the window's rows goes between two batches.
Stopped anywhere (Ctrl-C, a lost connection, SIGKILL), the batches done are done and
recorded; `resume_point` reads the audit log and the replay goes on from the next id under
the same number, in batches of the same size (`outbox replay --resume N`).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
from psycopg import sql
from psycopg.types.json import Jsonb

from outbox.operations.partition_maintenance import forget_finished, replays_lock, run_lock
from outbox.partitions import FIRST_ID, PAST_ID, REPLAY_NOTICE
from outbox.plumbing.errors import SchemaError
from outbox.plumbing.text import printable
from outbox.runner import Query, Row, Steps, first_row, perform, perform_async, step
from outbox.table import Table, shown, shown_argument
from outbox.views.filters import by_type_and_aggregate

STATUSES = ("done", "dead")  # what a replay may send again
DEFAULT_BATCH = 1000  # rows per batch: one statement each, and one audit record
MAX_BATCH = 10_000
# How long a producer's transaction may have stayed open between its start (`created_at`)
# and its insert (the id): the id range searched is widened by this much on each side.
CREATED_AT_SLACK = timedelta(minutes=10)
ACTION = "replay"  # the audit log's action


@dataclass(frozen=True)
class ReplayFilter:
    """Which messages: created in [since, until), with `status`, and every set field."""

    since: datetime
    until: datetime
    event_types: tuple[str, ...] = ()
    aggregate_type: str | None = None
    aggregate_id: str | None = None
    status: str = "done"
    ids: tuple[tuple[int, int], ...] | None = None
    """Only ids within these inclusive ranges (`outbox reconcile --replay`: the missing ones)."""

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"status {self.status!r} is not one of {', '.join(STATUSES)}")
        if self.until <= self.since:
            raise ValueError("the window is empty: --until must be later than --since")

    def to_json(self) -> dict[str, Any]:
        """The filter as the audit log keeps it (and `--resume` reads it back)."""
        data: dict[str, Any] = {
            "since": self.since.isoformat(),
            "until": self.until.isoformat(),
            "status": self.status,
        }
        if self.event_types:
            data["event_types"] = list(self.event_types)
        if self.aggregate_type is not None:
            data["aggregate_type"] = self.aggregate_type
        if self.aggregate_id is not None:
            data["aggregate_id"] = self.aggregate_id
        if self.ids is not None:
            data["id_ranges"] = [list(r) for r in self.ids]
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ReplayFilter:
        return cls(
            since=datetime.fromisoformat(data["since"]),
            until=datetime.fromisoformat(data["until"]),
            event_types=tuple(data.get("event_types", ())),
            aggregate_type=data.get("aggregate_type"),
            aggregate_id=data.get("aggregate_id"),
            status=data.get("status", "done"),
            ids=tuple((int(a), int(b)) for a, b in data["id_ranges"])
            if "id_ranges" in data
            else None,
        )

    def describe(self) -> str:
        parts = [f"{self.status} created {self.since.isoformat()} to {self.until.isoformat()}"]
        if self.event_types:
            parts.append("type " + " or ".join(self.event_types))
        if self.aggregate_type is not None:
            parts.append(f"aggregate type {self.aggregate_type}")
        if self.aggregate_id is not None:
            parts.append(f"aggregate {self.aggregate_id}")
        if self.ids is not None:
            parts.append(f"{len(self.ids)} id ranges")
        return ", ".join(parts)


@dataclass(frozen=True)
class IdRange:
    """Ids [first, past) that can hold the window's rows; empty when first >= past."""

    first: int
    past: int

    @property
    def empty(self) -> bool:
        return self.first >= self.past


# -- finding the window ------------------------------------------------------------------


def _bounds(table: Table) -> Query[tuple[int, int] | None]:
    statement = sql.SQL("SELECT min(id), max(id) FROM {t}").format(t=table.ident)
    return Query(statement, None, first_row(_min_max))


def _min_max(row: Row | None) -> tuple[int, int] | None:
    return None if row is None or row[0] is None else (int(row[0]), int(row[1]))


def _probe(table: Table, at: int) -> Query[tuple[int, datetime] | None]:
    """The first row at or after id `at` (one primary-key probe)."""
    statement = sql.SQL(
        "SELECT id, created_at FROM {t} WHERE id >= %(at)s ORDER BY id LIMIT 1"
    ).format(t=table.ident)
    return Query(statement, {"at": at}, first_row(_id_and_time))


def _id_and_time(row: Row | None) -> tuple[int, datetime] | None:
    return None if row is None else (int(row[0]), row[1])


def _first_at(table: Table, lowest: int, highest: int, moment: datetime) -> Steps[int]:
    """The smallest id x in [lowest, highest + 1] whose first row at or after it was created
    at `moment` or later (highest + 1 when none): a binary search of probes, each skipping
    the ids that do not exist."""
    lo, hi = lowest, highest + 1
    while lo < hi:
        mid = (lo + hi) // 2
        found = yield from step(_probe(table, mid))
        if found is None or found[1] >= moment:  # None: purged meanwhile, nothing after
            hi = mid
        else:
            lo = found[0] + 1  # every id in [mid, found id] starts at the found row
    return lo


def window(table: Table, since: datetime, until: datetime) -> Steps[IdRange]:
    """The ids that can hold rows created in [since, until), found without reading the rows
    between (about 2 x log2(ids) probes)."""
    bounds = yield from step(_bounds(table))
    if bounds is None:
        return IdRange(0, 0)
    lowest, highest = bounds
    first = yield from _first_at(table, lowest, highest, _widened(since, -CREATED_AT_SLACK))
    past = yield from _first_at(table, first, highest, _widened(until, CREATED_AT_SLACK))
    return IdRange(first, past)


_EARLIEST = datetime.min.replace(tzinfo=UTC)
_LATEST = datetime.max.replace(tzinfo=UTC)


def _widened(moment: datetime, by: timedelta) -> datetime:
    """`moment` moved by the slack; a window's edge at the calendar's end (year 1 or 9999,
    where Python's datetime stops) stays there: it means the table's first or last row."""
    try:
        return moment + by
    except OverflowError:
        return _EARLIEST if by < timedelta(0) else _LATEST


# -- what a filter matches ---------------------------------------------------------------


def _where(f: ReplayFilter) -> tuple[sql.Composable, dict[str, Any]]:
    """The rows of the filter within ids [%(first)s, %(past)s)."""
    chosen, params = by_type_and_aggregate(f.event_types, f.aggregate_type, f.aggregate_id)
    clauses: list[sql.Composable] = [
        sql.SQL("id >= %(first)s AND id < %(past)s"),
        sql.SQL("created_at >= %(since)s AND created_at < %(until)s"),
        sql.SQL("status = %(status)s"),
        *chosen,
    ]
    params.update(since=f.since, until=f.until, status=f.status)
    if f.ids is not None:
        clauses.append(
            sql.SQL(
                "EXISTS (SELECT 1 FROM unnest(%(range_firsts)s::bigint[], "
                "%(range_lasts)s::bigint[]) AS r(a, b) WHERE id BETWEEN r.a AND r.b)"
            )
        )
        params["range_firsts"] = [a for a, _ in f.ids]
        params["range_lasts"] = [b for _, b in f.ids]
    return sql.SQL(" AND ").join(clauses), params


@dataclass(frozen=True)
class Preview:
    """What a replay would send: `--dry-run`'s answer, and what the confirmation shows."""

    filter: ReplayFilter
    ids: IdRange
    count: int
    by_type: dict[str, int] = field(default_factory=dict)
    first_id: int | None = None
    last_id: int | None = None
    # When nothing matches: when the oldest message the table still holds was created (None:
    # it holds none), if messages older than it are gone (see `_oldest_kept`): a window older
    # than that may have matched rows retention took.
    oldest_kept: datetime | None = None
    emptied: bool = False  # nothing matches and the table holds no message at all

    def lines(self) -> list[str]:
        if not self.count:
            return [f"no message matches ({printable(self.filter.describe())}){self._retired()}"]
        head = (
            f"{self.count} message{'' if self.count == 1 else 's'} "
            f"(ids {self.first_id} to {self.last_id}; {printable(self.filter.describe())})"
        )
        # Any producer may have written a type with control characters: escaped, it is
        # shown as itself, never as a terminal command.
        by_type = sorted((printable(name), n) for name, n in self.by_type.items())
        width = max(len(name) for name, _ in by_type)
        return [head] + [f"  {name:<{width}}  {n}" for name, n in by_type]

    def _retired(self) -> str:
        """Why a window may find nothing: retention took its rows (`outbox purge`, or
        `outbox maintain` dropping their partitions); they cannot be sent again."""
        gone = "purged, or their partitions dropped by `outbox maintain`"
        if self.emptied:
            return f"; the table holds no message: any it held are gone ({gone})"
        if self.oldest_kept is not None and self.filter.since < self.oldest_kept:
            return (
                f"; the oldest message left was created at {self.oldest_kept.isoformat()}: "
                f"older ones are gone ({gone}) and cannot be sent again"
            )
        return ""


def _oldest_kept(table: Table) -> Query[tuple[datetime, bool] | None]:
    """When the oldest message the table holds was created, and whether messages older than
    it are gone: its id is past the first one the table's sequence gives, so the rows of the
    ids below were deleted (`outbox purge`) or their partitions dropped (`outbox maintain`).
    (An insert rolled back before any other also leaves its id unused.) No row: None."""
    statement = sql.SQL(
        "SELECT o.created_at, o.id > coalesce((SELECT s.seqstart FROM pg_sequence AS s"
        " WHERE s.seqrelid = pg_get_serial_sequence({name}, 'id')::regclass), 1)"
        " FROM (SELECT id, created_at FROM {t} ORDER BY id LIMIT 1) AS o"
    ).format(t=table.ident, name=table.regclass_literal)
    return Query(statement, None, first_row(lambda row: (row[0], bool(row[1])) if row else None))


def _preview_query(table: Table, f: ReplayFilter, ids: IdRange, limit: int | None) -> Query[Row]:
    where, params = _where(f)
    statement = sql.SQL(
        "SELECT coalesce(jsonb_object_agg(event_type, n), '{{}}'), coalesce(sum(n), 0), "
        "min(first_id), max(last_id) FROM (SELECT event_type, count(*) AS n, min(id) AS first_id, "
        "max(id) AS last_id FROM (SELECT id, event_type FROM {t} WHERE {where} ORDER BY id "
        "LIMIT %(limit)s) AS m GROUP BY event_type) AS g"
    ).format(t=table.ident, where=where)
    return Query(
        statement,
        {**params, "first": ids.first, "past": ids.past, "limit": limit},
        first_row(lambda r: r or ({}, 0, None, None)),
    )


class HalfDetached(SchemaError):
    """A partition of the table is pending detach (a run of `outbox maintain` was
    interrupted in its DETACH ... CONCURRENTLY, or its session ended there) where a replay
    reads: the table leaves its rows out while it is so. `outbox maintain` finishes it."""


def half_detached_message(table: Table, names: Sequence[str], then: str) -> str:
    """What a preview and a replay say of partitions `names` pending detach, and what to do
    once `outbox maintain` has finished them: `then`."""
    return (
        f"partition {', '.join(shown(name) for name in names)} of table {shown(table)} is half "
        "detached (a run of outbox maintain was interrupted), so its rows cannot be read "
        f"through the table; run `outbox maintain --table {shown_argument(table)}` to finish "
        f"it, then {then}"
    )


@dataclass(frozen=True)
class _Detaching:
    """A partition pending detach: its schema and name, and its ids [low, past)."""

    schema: str
    name: str
    low: int
    past: int


def _detaching(table: Table) -> Query[list[_Detaching]]:
    """The table's partitions pending detach (none, but for an interrupted run), from the
    catalog: no partition is opened."""
    statement = sql.SQL(
        """SELECT n.nspname, c.relname,
       substring(pg_get_expr(c.relpartbound, c.oid) FROM {first})::bigint,
       substring(pg_get_expr(c.relpartbound, c.oid) FROM {to})::bigint
  FROM pg_inherits AS i
  JOIN pg_class AS c ON c.oid = i.inhrelid
  JOIN pg_namespace AS n ON n.oid = c.relnamespace
 WHERE i.inhparent = {t}::regclass AND i.inhdetachpending
 ORDER BY 3"""
    ).format(t=table.regclass_literal, first=sql.Literal(FIRST_ID), to=sql.Literal(PAST_ID))
    return Query(
        statement,
        None,
        lambda rows: [_Detaching(str(a), str(b), int(c), int(d)) for a, b, c, d in rows],
    )


def _holds_any(leaf: _Detaching, f: ReplayFilter) -> Query[bool]:
    """Whether the partition, read itself (the table leaves it out), holds a row of `f`: a
    scan of that partition at worst, made only in the state an interrupted run left."""
    where, params = _where(f)
    statement = sql.SQL("SELECT EXISTS (SELECT FROM {leaf} WHERE {where})").format(
        leaf=Table(leaf.schema, leaf.name).ident, where=where
    )
    return Query(
        statement,
        {**params, "first": leaf.low, "past": leaf.past},
        first_row(lambda row: bool(row and row[0])),
    )


def refuse_half_detached(
    table: Table,
    f: ReplayFilter,
    first: int | None,
    last: int | None,
    then: str = "run this replay again",
) -> Steps[None]:
    """HalfDetached, unless no partition pending detach holds a row of `f` or lies between
    the ids `first` and `last` the replay would go through (where `send_batch` stops).
    Counted without its rows, a window across such a partition was shown smaller than it
    is, and one it alone held was said to match nothing, or to be gone."""
    for leaf in (yield from step(_detaching(table))):
        between = first is not None and last is not None and leaf.low <= last and first < leaf.past
        if between or (yield from step(_holds_any(leaf, f))):
            raise HalfDetached(half_detached_message(table, [leaf.name], then))


def preview(table: Table, f: ReplayFilter, *, limit: int | None = None) -> Steps[Preview]:
    """Count what `f` matches (at most `limit`), by type, with the first and last ids: one
    read of the window's id range, changing nothing. HalfDetached when a partition an
    interrupted run of `outbox maintain` left pending detach holds rows `f` matches, or
    lies between the first and the last id the replay would send: the count would leave its
    rows out, and the replay stops there (`send_batch`)."""
    ids = yield from window(table, f.since, f.until)
    by_type: dict[str, int] = {}
    count, first, last = 0, None, None
    if not ids.empty:
        found, count, first, last = yield from step(_preview_query(table, f, ids, limit))
        by_type, count = dict(found), int(count)
    yield from refuse_half_detached(table, f, first, last)
    if count:
        return Preview(f, ids, count, by_type, first, last)
    oldest = yield from step(_oldest_kept(table))
    if oldest is None:
        return Preview(f, ids, 0, emptied=True)
    created_at, older_gone = oldest
    return Preview(f, ids, 0, oldest_kept=created_at if older_gone else None)


# -- sending again -----------------------------------------------------------------------


def next_number(table: Table) -> Query[int]:
    """A new replay's number: the table's counter, 1, 2, ..."""
    statement = sql.SQL("SELECT nextval({s}::regclass)").format(
        s=sql.Literal(table.sibling("replays").as_string(None))
    )
    return Query(statement, None, first_row(_integer))


def _integer(row: Row | None) -> int:
    assert row is not None
    return int(row[0])


@dataclass(frozen=True)
class Batch:
    """One batch's outcome: rows sent again, and the last id the batch reached."""

    count: int
    through_id: int | None  # None: no row left in the window
    by_type: dict[str, int]


def _batch_query(
    table: Table,
    f: ReplayFilter,
    *,
    number: int,
    after: int,
    past: int,
    size: int,
    actor: str | None,
    reason: str | None,
    via: str,
    confirmed: int | None,
    batch: int,
    reconcile: Mapping[str, Any] | None,
) -> Query[Batch]:
    """Up to `size` rows of the filter from id `after` on (and before `past`), back to
    pending under replay `number`, and the batch's audit record: one statement. A row that
    stopped matching between the pick and the update (requeued, replayed by another) is left
    as it is."""
    where, params = _where(f)
    statement = sql.SQL(
        """WITH picked AS (
    SELECT id FROM {t} WHERE {where} ORDER BY id LIMIT %(size)s
), changed AS (
    UPDATE {t} AS o
       SET status = 'pending', available_at = now(), attempts = 0, replay = %(replay)s,
           lease_owner = NULL, lease_until = NULL
      FROM picked
     WHERE o.id = picked.id AND o.status = %(status)s
    RETURNING o.id, o.event_type
), recorded AS (
    INSERT INTO {a} (actor, action, message_ids, filter, requested, count)
    SELECT coalesce(%(actor)s::text, current_user), {action},
           array_agg(id ORDER BY id),
           %(filter)s::jsonb || jsonb_build_object('through_id', (SELECT max(id) FROM picked)),
           (SELECT count(*) FROM picked), count(*)
      FROM changed HAVING count(*) > 0
    RETURNING id
)
SELECT (SELECT count(*) FROM changed), (SELECT max(id) FROM picked),
       (SELECT coalesce(jsonb_object_agg(event_type, n), '{{}}')
          FROM (SELECT event_type, count(*) AS n FROM changed GROUP BY event_type) AS g),
       (SELECT count(*) FROM recorded),
       -- Idle workers wake as they do for an insert (delivered at commit), not at their poll,
       -- and, told it is a replay, forget their claim windows (outbox.claim_window.ClaimWindow):
       -- the rows may lie below where their claims and head checks look.
       (SELECT count(pg_notify({channel}, {notice}))
          FROM (SELECT 1 FROM changed LIMIT 1) AS woken)"""
    ).format(
        t=table.ident,
        where=where,
        a=table.sibling("actions"),
        action=sql.Literal(ACTION),
        channel=table.channel_sql,  # the trigger's, however the table is spelled
        notice=sql.Literal(REPLAY_NOTICE),
    )
    recorded = {
        "via": via,
        "replay": number,
        "filter": f.to_json(),
        "reason": reason,
        "past_id": past,
        "confirmed": confirmed,
        "batch": batch,  # the batch size asked for, which a resume keeps (`size` may be less)
    }
    if reconcile is not None:
        recorded["reconcile"] = dict(reconcile)
    return Query(
        statement,
        {
            **params,
            "first": after,
            "past": past,
            "size": size,
            "replay": number,
            "actor": actor,
            "filter": Jsonb(recorded),
        },
        first_row(lambda r: Batch(int(r[0]), r[1], dict(r[2])) if r else Batch(0, None, {})),
    )


def beside_retirement(table: Table, low: int, past: int) -> Steps[list[str] | None]:
    """Wait for a run of `outbox maintain` to end, and keep the next from beginning until
    the batch's transaction ends (its lock, shared: replays go on side by side); then the
    partitions of the table pending detach that hold ids from `low` to before `past`, if
    any (None: none).

    A batch reads its rows through the table, in id order, and the replay moves past the
    last id it read. A partition a run is detaching (DETACH ... CONCURRENTLY) is left out
    of what the table holds for the detach's length: a batch then read past its ids, and
    when the run found a row there unfinished after all (one this replay had just sent
    again) and attached it back, its other rows stayed done, never sent again. A partition
    still pending detach while no run holds the lock is one an interrupted run left.

    The catalog is read in a statement of its own, begun once the lock is held: a statement
    sees what was committed when it began (READ COMMITTED), and the one that waited would
    miss a partition the run it waited for left pending detach as it ended."""
    yield from step(shared_run_lock(table))
    statement = sql.SQL(
        """SELECT array_agg(c.relname::text ORDER BY c.relname)
  FROM pg_inherits AS i JOIN pg_class AS c ON c.oid = i.inhrelid
 WHERE i.inhparent = {t}::regclass AND i.inhdetachpending
   AND substring(pg_get_expr(c.relpartbound, c.oid) FROM {first})::bigint < %(past)s
   AND substring(pg_get_expr(c.relpartbound, c.oid) FROM {to})::bigint > %(low)s"""
    ).format(t=table.regclass_literal, first=sql.Literal(FIRST_ID), to=sql.Literal(PAST_ID))
    found = yield from step(
        Query(
            statement,
            {"low": low, "past": past},
            first_row(lambda row: None if row is None else row[0]),
        )
    )
    return found


def shared_run_lock(table: Table) -> Query[None]:
    """The run's lock, shared, until the transaction ends: waits for a run of `outbox
    maintain` to end and keeps the next from beginning (replays and comparisons go on side
    by side). Whatever is to see what the run left is read in a later statement."""
    statement = sql.SQL("SELECT pg_advisory_xact_lock_shared({run})").format(run=run_lock(table))
    return Query(statement, None, lambda rows: None)


def _hold_off(table: Table) -> Query[None]:
    statement = sql.SQL("SELECT pg_advisory_lock_shared({key})").format(key=replays_lock(table))
    return Query(statement, None, lambda rows: None)


def _let_go(table: Table) -> Query[None]:
    statement = sql.SQL("SELECT pg_advisory_unlock_shared({key})").format(key=replays_lock(table))
    return Query(statement, None, lambda rows: None)


@contextmanager
def holding_off_retirement(conn: psycopg.Connection[Any], table: Table) -> Iterator[None]:
    """A replay running on `conn` (autocommit; its preview, its batches): the table's
    replays lock held shared (partition_maintenance.replays_lock), so that no run of `outbox
    maintain` retires a partition meanwhile; replays go on side by side. A run retiring
    when it is asked for is waited for (its retirement is what the preview must see). The
    lock goes with the session if it ends first."""
    perform(conn, step(_hold_off(table)))
    try:
        yield
    finally:
        if not conn.closed and not conn.broken:
            perform(conn, step(_let_go(table)))


@asynccontextmanager
async def holding_off_retirement_async(
    conn: psycopg.AsyncConnection[Any], table: Table
) -> AsyncIterator[None]:
    """`holding_off_retirement` on an async connection."""
    await perform_async(conn, step(_hold_off(table)))
    try:
        yield
    finally:
        if not conn.closed and not conn.broken:
            await perform_async(conn, step(_let_go(table)))


@dataclass
class Progress:
    """A replay under way: its number, where it stands, what it sent."""

    number: int
    filter: ReplayFilter
    next_id: int
    past_id: int
    left: int | None  # rows it may still send, None: no bound
    confirmed: int | None = None  # rows the person confirmed, all batches together
    reason: str | None = None  # why, as recorded (a resumed replay keeps it)
    batch: int = DEFAULT_BATCH  # rows per batch, as recorded (a resumed replay keeps it)
    # A replay of `outbox reconcile --replay`: what its comparison read (the consumer and
    # the inbox table), as recorded. Its filter holds only the missing ids of the chunk
    # being sent; what it has left to send is found again by comparing the rest of its
    # window with the inbox.
    reconcile: dict[str, Any] | None = None
    sent: int = 0
    batches: int = 0  # counted with `sent`, so the two always tell of the same batches
    resumed: bool = False  # read back from the audit log (`resume_point`): batches recorded
    by_type: dict[str, int] = field(default_factory=dict)

    @property
    def finished(self) -> bool:
        return self.next_id >= self.past_id or (self.left is not None and self.left <= 0)

    def shortfall(self) -> str:
        """What the closing line adds when the replay sent fewer rows than were confirmed
        (its window walked to its end): how many, and why; else nothing."""
        if self.confirmed is None or self.left is None or self.left <= 0:
            return ""
        return (
            f"; {self.left} of the {self.confirmed} confirmed not sent: they no longer matched "
            "when their batch came (sent again by another replay, requeued, or deleted: "
            "`outbox purge`, a partition dropped by hand)"
        )


def start(table: Table, shown: Preview) -> Steps[Progress]:
    """A new replay of what `shown` previewed: its number drawn, bounded to the rows shown
    (no id past its last one, no more than its count)."""
    number = yield from step(next_number(table))
    past = (shown.last_id + 1) if shown.last_id is not None else shown.ids.first
    first = shown.first_id if shown.first_id is not None else shown.ids.first
    return Progress(number, shown.filter, first, past, shown.count, confirmed=shown.count)


def send_batch(
    table: Table,
    progress: Progress,
    *,
    batch: int | None = None,
    actor: str | None = None,
    reason: str | None = None,
    via: str = "outbox replay",
    then: Callable[[], str] | None = None,
) -> Steps[Batch]:
    """The next batch of a replay (`batch` rows, else the replay's own batch size); `progress`
    moves past it. Run it in one transaction (`perform(..., transaction=True)`): the rows
    sent again and the notes taken off their partitions commit together, so a replay stopped
    between the two (its session gone) leaves no pending row in a partition `outbox stats`
    skips. Refused at a half-detached partition (HalfDetached), it says what to do once
    `outbox maintain` has finished it: `then()`, the caller's own way to go on (`outbox
    reconcile --replay` resumes by its own command), else `outbox replay`'s."""
    if batch is None:
        batch = progress.batch
    size = batch if progress.left is None else min(batch, progress.left)
    half_detached = yield from beside_retirement(table, progress.next_id, progress.past_id)
    if half_detached:
        raise HalfDetached(
            f"replay {progress.number}: "
            + half_detached_message(
                table, half_detached, _going_on(table, progress) if then is None else then()
            )
        )
    done = yield from step(
        _batch_query(
            table,
            progress.filter,
            number=progress.number,
            after=progress.next_id,
            past=progress.past_id,
            size=size,
            actor=actor,
            reason=reason,
            via=via,
            confirmed=progress.confirmed,
            batch=batch,
            reconcile=progress.reconcile,
        )
    )
    if done.count and done.through_id is not None:
        # Rows of partitions `outbox maintain` noted finished are unfinished again (in the
        # batch's transaction: maintenance cannot note them again before it commits, since
        # noting waits for the lock its UPDATE holds on them).
        yield from forget_finished(table, progress.next_id, done.through_id)
    progress.sent += done.count
    progress.batches += 1
    for name, n in done.by_type.items():
        progress.by_type[name] = progress.by_type.get(name, 0) + n
    if done.through_id is None:
        progress.next_id = progress.past_id
    else:
        progress.next_id = done.through_id + 1
        if progress.left is not None:
            progress.left -= done.count
    return done


def _going_on(table: Table, progress: Progress) -> str:
    """What `outbox replay` does once `outbox maintain` has finished a detach. A replay that
    recorded no batch yet has nothing to resume (`--resume` would answer NoSuchReplay): it
    is run again."""
    if progress.batches or progress.resumed:
        go_on = f"outbox replay --table {shown_argument(table)} --resume {progress.number}"
        return f"go on with `{go_on}`"
    return "run this replay again"


# -- resuming ----------------------------------------------------------------------------


class NoSuchReplay(LookupError):
    """`--resume N` names no replay that recorded a batch."""


def _last_record(table: Table, number: int) -> Query[Row | None]:
    statement = sql.SQL(
        "SELECT filter, (SELECT sum(count) FROM {a} WHERE action = {action} "
        "AND filter->>'replay' = %(n)s) FROM {a} WHERE action = {action} "
        "AND filter->>'replay' = %(n)s ORDER BY id DESC LIMIT 1"
    ).format(a=table.sibling("actions"), action=sql.Literal(ACTION))
    return Query(statement, {"n": str(number)}, first_row(lambda r: r))


def resume_point(table: Table, number: int) -> Steps[Progress]:
    """Replay `number` as its last recorded batch left it, to go on from the next id with
    the same filter, reason and batch size and what is left of the count confirmed
    (NoSuchReplay if it recorded no batch). A record from before batch sizes were kept
    gives the default."""
    row = yield from step(_last_record(table, number))
    if row is None:
        raise NoSuchReplay(f"replay {number} recorded no batch in {shown(table)}'s audit log")
    recorded, sent = row
    confirmed = recorded.get("confirmed")
    reconcile = recorded.get("reconcile")
    if reconcile is None and recorded.get("via") == "outbox reconcile":
        reconcile = {}  # recorded before the consumer was: a reconcile's replay all the same
    return Progress(
        number,
        ReplayFilter.from_json(recorded["filter"]),
        next_id=int(recorded["through_id"]) + 1,
        past_id=int(recorded["past_id"]),
        left=None if confirmed is None else max(0, int(confirmed) - int(sent or 0)),
        confirmed=confirmed,
        reason=recorded.get("reason"),
        batch=int(recorded.get("batch", DEFAULT_BATCH)),
        reconcile=reconcile,
        resumed=True,
    )


def with_ids(f: ReplayFilter, ranges: Sequence[tuple[int, int]]) -> ReplayFilter:
    """`f` narrowed to these inclusive id ranges."""
    return replace(f, ids=tuple(ranges))


# -- for a screen: the window's done messages, and a replay in one call --------------------


@dataclass(frozen=True)
class DoneRow:
    """A message of the window, as a list of them shows it."""

    id: int
    created_at: datetime
    event_type: str
    aggregate_type: str
    aggregate_id: str
    replay: int | None


def _listing_query(table: Table, f: ReplayFilter, ids: IdRange, limit: int) -> Query[list[DoneRow]]:
    where, params = _where(f)
    statement = sql.SQL(
        "SELECT id, created_at, event_type, aggregate_type, aggregate_id, replay FROM {t} "
        "WHERE {where} ORDER BY id LIMIT %(limit)s"
    ).format(t=table.ident, where=where)
    return Query(
        statement,
        {**params, "first": ids.first, "past": ids.past, "limit": limit},
        lambda rows: [DoneRow(*r) for r in rows],
    )


def listing(table: Table, f: ReplayFilter, *, limit: int = 200) -> Steps[list[DoneRow]]:
    """The first `limit` messages `f` matches, oldest first."""
    ids = yield from window(table, f.since, f.until)
    if ids.empty:
        return []
    rows = yield from step(_listing_query(table, f, ids, limit))
    return rows


async def replay_confirmed(
    conn: psycopg.AsyncConnection[Any],
    table: Table,
    shown: Preview,
    *,
    batch: int = DEFAULT_BATCH,
    actor: str | None = None,
    reason: str | None = None,
    via: str = "outbox replay",
) -> Progress:
    """Send again what `shown` previewed (and a person confirmed), every batch in turn,
    each in a transaction of its own (`send_batch`), retirement held off meanwhile
    (`holding_off_retirement`)."""
    async with holding_off_retirement_async(conn, table):
        progress = await perform_async(conn, start(table, shown))
        while not progress.finished:
            steps = send_batch(table, progress, batch=batch, actor=actor, reason=reason, via=via)
            await perform_async(conn, steps, transaction=True)
    return progress
