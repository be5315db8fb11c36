"""Upkeep of a partitioned outbox table (outbox.partitions): what each partition holds, and
`outbox maintain`, which makes partitions ahead, retires finished ones whole and analyzes
the parent.

A partition is retired when every row in it has been done for the retention: DETACH
PARTITION ... CONCURRENTLY (producers and workers go on), then DROP (one statement for all
a run retires), where a DELETE of the
same rows would leave hours of vacuum behind. A pending, processing or dead row pins its
partition (a dead one until it is requeued or skipped). When a partition is first seen with
nothing unfinished, maintenance notes the time in the partition's comment: every `done_at`
in it is older than that, so it can go once the note is older than the retention, without
reading a row.

A run interrupted half-way is finished by the next: a partition left pending detach (the
DETACH ... CONCURRENTLY cancelled or its session gone) is finalized, and one a run detached
and did not drop (`<table>_p<k>` below the newest partition, attached to nothing, its note
marked retiring: a run marks it just before its detach) is dropped, or attached back if a
row in it is unfinished. A detach no run began (by hand) is never dropped: finalized, it is
attached back; detached by hand, it is left so unless a row in it is unfinished. A detach
that fails before it begins (a lock waited for in vain, a cancel) leaves the partition
attached: its mark is taken off as the run ends, or else as the next one begins, so that a
detach by hand later is not taken for a run's leftover.

The run is written once as `Steps` (outbox.runner), so the CLI runs it on a sync connection
(`maintain`) and the operator on its pooled async ones (`maintain_async`), both in
autocommit: DETACH ... CONCURRENTLY cannot run inside a transaction block. One run at a
time per table (an advisory lock of its own, `run_lock`); while it makes partitions ahead it
also holds the lock a worker holds to make them (outbox.partitions.upkeep_lock), and lets it
go before it retires any: each DETACH ... CONCURRENTLY waits for every transaction on the
parent, and the workers' keepers must be able to make partitions meanwhile. Both are
released before it returns, whatever happened, leaving the session's settings as it found
them.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any

import psycopg
from psycopg import sql

from outbox.partitions import (
    FINISHED_NOTE,
    RETIRING_MARK,
    InUse,
    Layout,
    Partition,
    SequenceUnreadable,
    TooFarAhead,
    carry_privileges,
    home_schema,
    in_schema,
    in_use,
    make_partition,
    missing_ahead,
    move_home,
    partition_named,
    read_layout,
    read_partitions,
    sequence_problem,
    table_lock_key,
    upkeep_lock,
)
from outbox.plumbing.errors import SchemaError
from outbox.plumbing.text import counted, printable_name
from outbox.runner import Query, Row, Steps, first_row, no_rows, perform, perform_async, step
from outbox.schema import VERSION_COMMENT, shape_problems
from outbox.stats import COUNT_LIMIT, STALE_FRACTION
from outbox.table import Table, shown, shown_argument

_DONE_NOTE = FINISHED_NOTE
# The note's time, and the mark a run adds to it as it detaches the partition to retire it.
_NOTE = re.compile("^" + re.escape(_DONE_NOTE) + r"(.+?)(?:" + re.escape(RETIRING_MARK) + ")?$")

Conn = psycopg.Connection[Any]

# As long as `outbox purge` keeps done rows by default.
DEFAULT_RETENTION = timedelta(days=7)


class NotPartitioned(RuntimeError):
    """The table is not one `outbox migrate --partition-size` made."""


@dataclass(frozen=True)
class PartitionState:
    name: str
    low: int  # first id
    high: int  # past the last id
    pending: int
    processing: int
    dead: int
    done_estimate: int  # the planner's row estimate less the unfinished rows, or a count
    done_figure: str  # how done_estimate was had: one of DONE_FIGURES
    oldest_created_at: datetime | None  # of its first row
    done_since: datetime | None  # first seen with nothing unfinished
    retirable: bool
    why_not: str | None
    # Wholly past the sequence's last id, it holds a row a producer wrote with an id of its
    # own: the highest id in use is in it (outbox.partitions.in_use).
    written_past: bool = False

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        for key in ("oldest_created_at", "done_since"):
            d[key] = d[key].isoformat() if d[key] is not None else None
        return d


# How a partition's done rows were had: the planner's estimate (`~`) while its statistics are
# to be trusted, else counted: exactly, or up to COUNT_LIMIT rows (a lower bound, `≥`).
ESTIMATE, COUNTED, AT_LEAST = "estimate", "count", "at least"
DONE_FIGURES = (ESTIMATE, COUNTED, AT_LEAST)

# A partition's statistics are trusted as `outbox stats` trusts them: analyzed (or vacuumed),
# and changed by at most STALE_FRACTION of the rows counted then. An ANALYZE of the parent
# while its partitions were empty (the first `outbox maintain`) leaves them at 0 rows: read as
# the estimate, a partition of a thousand done rows was listed `~0` and retired as `0 rows`.
_TRUSTED = sql.SQL(
    """c.reltuples >= 0
   AND coalesce(pg_stat_get_mod_since_analyze(c.oid), 0) <= c.reltuples * {stale}"""
).format(stale=sql.Literal(STALE_FRACTION))


def _statement(statement: sql.Composed) -> Query[None]:
    return Query(statement, None, no_rows)


def _value(statement: sql.Composed, parse: Callable[[Any], Any] = lambda v: v) -> Query[Any]:
    """A statement of one row of one column."""
    return Query(statement, None, first_row(lambda row: parse(row[0] if row else None)))


def _layout(table: Table) -> Steps[tuple[Layout, list[Partition]]]:
    """The layout, with the schema the table is in (`Layout.schema`), read from the layout's
    table in that schema, and the partitions. Every statement of a run names the partitions
    in that schema (`_home`, outbox.partitions.in_schema): named as a table named without its
    schema is, each was the first table of its name along the search_path, maybe another
    one in a schema before the table's (the role's own), which was read in its stead, noted,
    detached (the run failed), attached as a partition made ahead, or dropped as one left
    detached."""
    leaves = yield from step(read_partitions(table))
    # Before the layout is read: on a partitioned table that is no outbox table its table is
    # missing, and that was said as a table at an older schema, to be migrated.
    yield from refuse_no_outbox_table(table)
    schema = (yield from step(home_schema(table))) if leaves is not None else None
    layout = (
        (yield from step(read_layout(in_schema(table, schema)))) if leaves is not None else None
    )
    convert = f"`outbox migrate --table {shown_argument(table)} --partition-size N`"
    if leaves is None:
        raise NotPartitioned(
            f"table {shown(table)} has no partitions: it is a plain table, not partitioned by "
            f"`outbox migrate --partition-size`; {convert} converts it online"
        )
    if layout is None:
        raise NotPartitioned(
            f"table {shown(table)} is not partitioned by `outbox migrate --partition-size`: "
            f"its partition size is not recorded; run {convert} with its partitions' size"
        )
    return replace(layout, schema=schema), leaves


def refuse_no_outbox_table(table: Table) -> Steps[None]:
    """Refuse, as `outbox migrate` refuses it, a table that is no outbox table (no schema
    version of ours, and columns an outbox table cannot have: `CREATE TABLE orders (id
    int)`). Told it was a plain table that `outbox migrate --partition-size` converts (or, a
    partitioned one, a table at an older schema), one ran that, which then refused it. One
    catalog statement."""
    rows = yield from step(
        Query(
            sql.SQL(
                """SELECT v.ours, a.attname, format_type(a.atttypid, a.atttypmod), a.attnotnull,
       a.attidentity <> '' OR a.atthasdef
  FROM (SELECT coalesce(obj_description({t}::regclass, 'pg_class') ~ {version}, false)
               AS ours) AS v
  LEFT JOIN pg_attribute AS a
    ON a.attrelid = {t}::regclass AND a.attnum > 0 AND NOT a.attisdropped"""
            ).format(t=table.regclass_literal, version=sql.Literal(VERSION_COMMENT)),
            None,
            list,
        )
    )
    ours = not rows or bool(rows[0][0])
    # (name, type, NOT NULL, has a default) of each column, as outbox.schema reads them.
    columns = [tuple(row[1:]) for row in rows if row[1] is not None]
    problems = None if ours else shape_problems(columns)
    if problems:
        raise SchemaError(f"table {shown(table)} exists but is not an outbox table ({problems})")


def _home(table: Table, layout: Layout) -> Table:
    """The table named in its schema (`Layout.schema`): what the statements that name a
    partition are given, so that they name it there (`_leaf`)."""
    return in_schema(table, layout.schema)


def _in_use(table: Table) -> Steps[InUse]:
    """The highest id in use: the sequence's last value (never behind an insert in flight,
    and no scan of the parent), and the partition past it a producer wrote a row of its own
    id to, as `outbox stats` and the claims find it. A role that may not read the sequence
    is refused, naming the GRANT: read as 0, every partition would seem made ahead."""
    found = yield from step(in_use(table))
    if found.last_given is None:
        problem = yield from step(sequence_problem(table))
        raise SequenceUnreadable(f"table {shown(table)} cannot be served: {problem}")
    return found


def _leaf(table: Table, name: str) -> sql.Composable:
    """The partition `name` of `table`, given in its schema (`_home`)."""
    return partition_named(table, name).ident


def _state_query(table: Table, leaf: Partition) -> Query[Row]:
    """One partition, read directly (its partial indexes count what is unfinished). Its rows
    are [0, the planner's estimate] while its statistics are trusted, else [1, its done rows
    counted up to COUNT_LIMIT]: the count is a subquery only that branch refers to, so
    PostgreSQL runs it only then."""
    # One an earlier version left in another schema is read there (`outbox maintain` moves
    # it home before it reads).
    at = partition_named(table, leaf.name, leaf.elsewhere)
    leaf_ident, name = at.ident, at.regclass_literal
    statement = sql.SQL(
        """SELECT count(*) FILTER (WHERE status = 'pending'),
       count(*) FILTER (WHERE status = 'processing'),
       (SELECT count(*) FROM {leaf} WHERE status = 'dead'),
       (SELECT CASE WHEN {trusted} THEN ARRAY[0, c.reltuples::bigint]
                    ELSE ARRAY[1, (SELECT count(*) FROM
                                   (SELECT FROM {leaf} WHERE status = 'done' LIMIT {limit}) AS d)]
               END
          FROM pg_class AS c WHERE c.oid = {name}::regclass),
       (SELECT created_at FROM {leaf} ORDER BY id LIMIT 1),
       obj_description({name}::regclass, 'pg_class')
  FROM {leaf} WHERE status IN ('pending', 'processing')"""
    ).format(leaf=leaf_ident, name=name, trusted=_TRUSTED, limit=sql.Literal(COUNT_LIMIT))
    return Query(statement, None, first_row(lambda row: row or ()))


def _state(table: Table, leaf: Partition, used: InUse, made_past: int) -> Steps[PartitionState]:
    """`made_past`: past the last id of the highest partition made."""
    row = yield from step(_state_query(table, leaf))
    pending, processing, dead, (by_count, rows), oldest, comment = row
    done_since = _noted_since(comment)
    unfinished = int(pending) + int(processing) + int(dead)
    # Ids given past every partition made (inserts no partition took spend theirs: producers
    # outran the partitions) hold no row: the highest partition made holds the newest ids
    # then. Counted from the sequence alone, every partition was finished and old, and a run
    # retired them all, leaving the table none to insert into or claim from.
    current = _newest_given(used, made_past)
    written = _written_past(leaf, used)
    why_not = None
    if written:
        # Never retired while the sequence is behind it: its ids are the producers' next.
        why_not = f"it holds a row written with an id past the sequence's last, {current}"
    elif leaf.high > current:
        why_not = "it holds the newest ids" if leaf.low <= current else "made ahead"
    elif dead:
        pin = "pins it until it is" if dead == 1 else "pin it until they are"
        why_not = f"{counted(dead, 'dead row')} {pin} requeued or skipped"
    elif unfinished:
        are = "is" if unfinished == 1 else "are"
        why_not = f"{counted(unfinished, 'row')} {are} not done yet"
    if not by_count:
        done, figure = max(int(rows) - unfinished, 0), ESTIMATE
    else:
        done, figure = int(rows), AT_LEAST if rows >= COUNT_LIMIT else COUNTED
    return PartitionState(
        leaf.name, leaf.low, leaf.high, int(pending), int(processing), int(dead),
        done, figure, oldest, done_since if not unfinished else None, why_not is None, why_not,
        written,
    )  # fmt: skip


def _newest_given(used: InUse, made_past: int) -> int:
    """The newest id given that a partition made can hold (see `_state`)."""
    return min(int(used.last_given or 0), made_past - 1)


def _written_past(leaf: Partition, used: InUse) -> bool:
    return used.written_past is not None and used.written_past.name == leaf.name


def _made_ahead(leaf: Partition, used: InUse, made_past: int) -> bool:
    """Wholly past the newest id given, and no row written past it: what `_state` calls
    made ahead, known without reading the partition."""
    return leaf.low > _newest_given(used, made_past) and not _written_past(leaf, used)


def _noted_since(comment: object) -> datetime | None:
    """The time maintenance's note in a partition's comment gives, or None: no note, or one
    whose time is not one (written by hand, say), which is no note either. A run notes the
    partition again, and the listing shows it finished since no known time (a bare `yes`);
    read as a time, it ended both commands in a traceback."""
    note = _NOTE.match(str(comment or ""))
    try:
        since = datetime.fromisoformat(note.group(1)) if note else None
    except ValueError:
        return None
    return since if since is not None and since.tzinfo is not None else None


def _states(table: Table) -> Steps[list[PartitionState]]:
    layout, leaves = yield from _layout(table)
    used = yield from _in_use(table)
    made_past = max((leaf.high for leaf in leaves), default=0)
    states = []
    for leaf in leaves:
        states.append((yield from _state(_home(table, layout), leaf, used, made_past)))
    return states


def partition_states(conn: Conn, table: Table) -> list[PartitionState]:
    """Every partition, oldest first: `outbox partitions`."""
    return perform(conn, _states(table))


@dataclass(frozen=True)
class Maintained:
    made: int
    retired: list[str]
    rows_retired: int
    rows_estimated: bool  # some of them from the planner's statistics (`~` in the listing)
    kept: list[PartitionState]  # finished, but not for the retention yet
    moved: list[str]  # partitions moved into the table's schema (outbox.partitions.move_home)
    # Partitions found detached or pending detach and attached back: one a row in it is
    # unfinished, or one whose detach no run began (by hand), which is not a run's to drop.
    attached_back: list[str] = field(default_factory=list)
    # Why this run retired no partition though it may have (a replay running: see
    # `replays_lock`), in one line; None: it retired what retention allowed.
    held_off: str | None = None


class NotTableOwner(psycopg.errors.InsufficientPrivilege):
    """The connected role does not own the table: it may not make, note, detach or drop its
    partitions, nor analyze it (`outbox maintain` runs as the table's owner)."""


def _owner_check(table: Table) -> Steps[None]:
    """Refuse a run by a role that does not own the table, before it changes anything: it
    failed part-way otherwise, on whichever statement came first, with PostgreSQL's words
    for it (`permission denied for schema public`, `must be owner of table outbox_p0`, with
    the PL/pgSQL context), never saying that the run needs the table's owner."""
    role, owner, owns = yield from step(
        Query(
            sql.SQL(
                "SELECT current_user, pg_get_userbyid(relowner),"
                " pg_has_role(current_user, relowner, 'USAGE')"
                " FROM pg_class WHERE oid = {t}::regclass"
            ).format(t=table.regclass_literal),
            None,
            first_row(lambda row: row or ("", "", True)),
        )
    )
    if not owns:
        raise NotTableOwner(
            f"role {printable_name(str(role))} does not own table {shown(table)}: outbox "
            "maintain makes, detaches and drops its partitions and analyzes it, which only its "
            f"owner may; run it as {printable_name(str(owner))} (or a role that is a member of "
            f"{printable_name(str(owner))})"
        )


class UpkeepBusy(RuntimeError):
    """Another session holds the table's upkeep lock (a worker making partitions ahead, or
    another run of `outbox maintain`) or its run lock (another run, or a replay's batch),
    and the caller asked not to wait for it."""


# The longest any statement of a run may take once it holds its lock. A DETACH ...
# CONCURRENTLY (or its FINALIZE) waits for every transaction older than it on the parent:
# one session idle in a transaction would hold the run for as long as it lasts. Cancelled
# there, the partition is left pending detach and the next run finishes it
# (`_finish_detaches`).
STATEMENT_TIMEOUT = timedelta(minutes=1)


@dataclass
class _Session:
    """The settings a run changes, as it found them (`_end` puts them back; None: not read
    yet), and the advisory locks it holds (`_end` releases those)."""

    synchronous_commit: str | None = None
    statement_timeout: str | None = None
    holds_run_lock: bool = False
    holds_upkeep_lock: bool = False
    holds_replays_lock: bool = False
    # The table (in its schema, `_home`) of which this run marked a partition retiring and
    # has not seen its DETACH end: if the run stops there, the mark is taken off a partition
    # still attached (`_unmark_attached`).
    retiring_in: Table | None = None


def run_lock(table: Table) -> sql.Composable:
    """The advisory lock key of a table's `outbox maintain` runs, held for the whole run: one
    run at a time finishes what an interrupted one left and retires (two would detach the same
    partition, or finalize one the other is detaching). The workers' keepers never take it:
    they take the upkeep lock (outbox.partitions.upkeep_lock), which a run holds only while
    it makes partitions ahead. A replay's batches hold it shared (outbox.operations.replay):
    a run does not detach a partition under one."""
    return table_lock_key(table, "outbox-dispatcher maintain ")


def replays_lock(table: Table) -> sql.Composable:
    """The advisory lock key of a table's running replays (outbox.operations.replay): each
    holds it shared on its own session from before its preview to its last batch, and a run
    of `outbox maintain` tries it exclusively before it retires a partition. Held by a
    replay, the run retires nothing (`Maintained.held_off`): the replay may still send rows
    of any partition in its window. A replay stopped and never resumed holds nothing: the
    lock goes with its session."""
    return table_lock_key(table, "outbox-dispatcher replays ")


def _replays_running(table: Table) -> Query[list[int]]:
    """The sessions (their pids) holding the table's replays lock: the replays running."""
    statement = sql.SQL(
        """SELECT coalesce(array_agg(DISTINCT pid ORDER BY pid), '{{}}') FROM pg_locks
 WHERE locktype = 'advisory' AND granted AND objsubid = 1
   AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
   AND ((classid::bigint << 32) | objid::bigint) = {key}"""
    ).format(key=replays_lock(table))
    return Query(statement, None, first_row(lambda row: [int(p) for p in row[0]] if row else []))


def _hold_off_replays(table: Table, session: _Session) -> Steps[str | None]:
    """The replays lock, tried (never waited for): None once this run holds it (until its
    end: a replay beginning meanwhile waits for the run to end before its preview), else
    which replay keeps this run from retiring."""
    got = yield from step(
        _value(sql.SQL("SELECT pg_try_advisory_lock({key})").format(key=replays_lock(table)), bool)
    )
    if got:
        session.holds_replays_lock = True
        return None
    pids = yield from step(_replays_running(table))
    which = (
        f" (the session{'s' if len(pids) > 1 else ''} of pid{'s' if len(pids) > 1 else ''} "
        f"{', '.join(map(str, pids))})"
        if pids
        else ""
    )
    return (
        f"a replay is running{which}, which may still send rows of any partition in its "
        "window; the next run after it ends retires them"
    )


def _begin(
    table: Table,
    waiting: Callable[[], None] | None,
    session: _Session,
    sessions_timeout: bool = False,
) -> Steps[None]:
    """Take the run's lock, then the upkeep lock, noting each in `session` as it is had (for
    `_end`, whatever happens): if another session holds one, raise UpkeepBusy when `waiting`
    is None (the operator: its next round comes), else call `waiting` (the CLI says what it
    waits for) and wait. Then bound each statement (STATEMENT_TIMEOUT, or as the session has
    it if `sessions_timeout`: the command's --statement-timeout), and commit without
    waiting for the WAL to be flushed: each DDL statement commits on its own, and a flush
    per commit was most of a retirement's time. A commit lost to a crash of the server is
    only maintenance to do again (a partition still attached, or still there), and the
    producers' own commits flush everything before them."""
    sync, timeout = yield from step(
        Query(
            sql.SQL(
                "SELECT current_setting('synchronous_commit'), current_setting('statement_timeout')"
            ).format(),
            None,
            first_row(lambda row: row or ()),
        )
    )
    session.synchronous_commit, session.statement_timeout = str(sync), str(timeout)
    said: list[bool] = []

    def busy() -> None:  # the lock is taken
        if waiting is None:
            raise UpkeepBusy(
                f"the partition upkeep lock of table {shown(table)} is held (a worker making "
                "partitions ahead, another outbox maintain, or a replay's batch): skipped "
                "this round"
            )
        if not said:  # said once, whichever of the two locks it waits for
            said.append(True)
            waiting()

    yield from _take(run_lock(table), busy)
    session.holds_run_lock = True
    yield from _take(upkeep_lock(table), busy)
    session.holds_upkeep_lock = True
    bound = (
        session.statement_timeout
        if sessions_timeout
        else f"{int(STATEMENT_TIMEOUT.total_seconds() * 1000)}ms"
    )
    yield from step(
        _statement(
            sql.SQL(
                "SELECT set_config('synchronous_commit', 'off', false), "
                "set_config('statement_timeout', {timeout}, false)"
            ).format(timeout=sql.Literal(bound))
        )
    )


def _take(key: sql.Composable, busy: Callable[[], None]) -> Steps[None]:
    """An advisory lock: tried, and if it is taken, `busy` is called (it raises, or says the
    run waits) and the lock waited for."""
    got = yield from step(
        _value(sql.SQL("SELECT pg_try_advisory_lock({key})").format(key=key), bool)
    )
    if not got:
        busy()
        yield from step(_statement(sql.SQL("SELECT pg_advisory_lock({key})").format(key=key)))


def _let_go_of_upkeep(table: Table, session: _Session) -> Steps[None]:
    """Release the upkeep lock once the run's partitions are made: what follows (each
    DETACH ... CONCURRENTLY waiting for every transaction on the parent) would keep the
    workers' keepers from making partitions ahead for as long as it lasts, and a retirement
    of many partitions beside a busy table lasts."""
    yield from step(
        _statement(sql.SQL("SELECT pg_advisory_unlock({key})").format(key=upkeep_lock(table)))
    )
    session.holds_upkeep_lock = False


def _end(table: Table, session: _Session) -> Query[None]:
    """The session as `_begin` found it: its settings back, the locks it holds released."""
    undo: list[sql.Composable] = []
    if session.synchronous_commit is not None and session.statement_timeout is not None:
        undo.append(
            sql.SQL(
                "set_config('synchronous_commit', {sync}, false), "
                "set_config('statement_timeout', {timeout}, false)"
            ).format(
                sync=sql.Literal(session.synchronous_commit),
                timeout=sql.Literal(session.statement_timeout),
            )
        )
    for held, key in (
        (session.holds_replays_lock, replays_lock(table)),
        (session.holds_upkeep_lock, upkeep_lock(table)),
        (session.holds_run_lock, run_lock(table)),
    ):
        if held:
            undo.append(sql.SQL("pg_advisory_unlock({key})").format(key=key))
    return _statement(
        sql.SQL("SELECT {undo}").format(undo=sql.SQL(", ").join(undo or [sql.SQL("1")]))
    )


def maintain(
    conn: Conn,
    table: Table,
    *,
    retention: timedelta,
    waiting: Callable[[], None] | None = None,
    sessions_timeout: bool = False,
) -> Maintained:
    """Make partitions ahead, retire those finished for `retention`, ANALYZE the parent.
    Another session holding the run's lock or the upkeep lock: UpkeepBusy, or if `waiting`
    is given, that is called and the run waits for the lock. Each of the run's statements
    is bounded by STATEMENT_TIMEOUT, or if `sessions_timeout` by the session's own setting
    (a command's --statement-timeout: the user's bound, which the run must not replace).

    `conn` must be in autocommit: DETACH ... CONCURRENTLY runs outside a transaction. A wait
    for a lock that the session's `lock_timeout` ends raises UpkeepBusy too, nothing
    changed: it is no lock on the table, which PostgreSQL's lock timeout would suggest."""
    session = _Session()
    try:
        try:
            perform(conn, _begin(table, waiting, session, sessions_timeout))
        except psycopg.errors.LockNotAvailable as exc:  # only the advisory locks' waits take one
            raise UpkeepBusy(f"the partition upkeep lock of table {shown(table)} is held") from exc
        return perform(conn, _maintaining(table, retention, session))
    finally:
        try:
            if session.retiring_in is not None:
                # Failing, the run's own error is the one to say: the next run's start
                # takes the mark off (`_maintaining`).
                with contextlib.suppress(psycopg.Error):
                    perform(conn, step(_unmark_attached(session.retiring_in)))
        finally:
            perform(conn, step(_end(table, session)))


async def maintain_async(
    conn: psycopg.AsyncConnection[Any],
    table: Table,
    *,
    retention: timedelta,
    dropped: Callable[[int], None] | None = None,
) -> Maintained:
    """`maintain` on an async connection in autocommit (the operator's pooled ones); it
    never waits for a lock (UpkeepBusy). `dropped` is told the rows of the partitions
    retired once they are dropped: gone, even if the run fails or is cancelled after."""
    session = _Session()
    try:
        await perform_async(conn, _begin(table, None, session))
        return await perform_async(conn, _maintaining(table, retention, session, dropped))
    finally:
        try:
            if session.retiring_in is not None:
                # Failing, the run's own error is the one to say: the next run's start
                # takes the mark off (`_maintaining`).
                with contextlib.suppress(psycopg.Error):
                    await perform_async(conn, step(_unmark_attached(session.retiring_in)))
        finally:
            await perform_async(conn, step(_end(table, session)))


def _maintaining(
    table: Table,
    retention: timedelta,
    session: _Session,
    dropped: Callable[[int], None] | None = None,
) -> Steps[Maintained]:
    layout, leaves = yield from _layout(table)
    yield from _owner_check(table)
    moved = yield from move_home(table)
    if moved:
        layout, leaves = yield from _layout(table)
    # Every statement below that names a partition names it in the table's schema.
    home = _home(table, layout)
    # What an interrupted run left half-done first: a mark its failed detach left on a
    # partition still attached taken off, pending detaches finished, then every partition a
    # run detached to retire and did not drop is dropped (or attached back).
    yield from step(_unmark_attached(home))
    half_detached = yield from _finish_detaches(home)
    found = yield from _detached_orphans(home, layout, leaves)
    leftovers = [leaf for leaf, marked in found if marked]
    # Detached by hand before this run (noted, not marked): kept detached, but a row in it
    # that is unfinished must not stay out of the table, undelivered.
    attached_back = []
    for leaf in [leaf for leaf, marked in found if not marked]:
        if leaf.name in half_detached:
            continue  # attached back below, whatever its rows
        if (yield from _finished_or_attached_back(home, leaf, counted_rows=False)) is None:
            attached_back.append(leaf.name)
    # A detach finished that no run began (no retiring mark: someone began it by hand, or a
    # run of an earlier version that marked nothing) is no leftover to drop, whatever its
    # rows: it is attached back whole, and retired below like any other partition when it
    # is finished for the retention. Finished and dropped as it was, a partition a keeper
    # had noted finished a minute before went at once whatever the retention.
    orphans = {leaf.name for leaf in leftovers}
    for leaf in leaves:
        if leaf.name in half_detached and leaf.name not in orphans:
            yield from _attach_back(home, leaf)
            attached_back.append(leaf.name)
    leaves = [leaf for leaf in leaves if leaf.name not in orphans]
    too_far: TooFarAhead | None = None
    try:
        made = yield from _make_ahead(table, layout, leaves)
    except TooFarAhead as exc:
        # Said once the run has retired what it may: retention goes on regardless.
        made, too_far = 0, exc
    # Nothing below makes a partition: the workers' keepers may make theirs while this run
    # waits on each DETACH ... CONCURRENTLY. Those waits add up (one partition of a table
    # can be pending detach at a time): beside a session of 0.8 s transactions on the
    # parent, 99 partitions took 80 s, and the keepers found the lock taken all along.
    yield from _let_go_of_upkeep(table, session)
    # A replay running may still send rows of any partition in its window, between two of
    # its batches: none is retired under it. What an interrupted run left detached is out of
    # the table already, and finished below as ever.
    replaying = yield from _hold_off_replays(table, session)
    held: list[str] = []
    used = yield from _in_use(table)
    # Those this run made ahead lie past it: the highest of the others is kept if the ids
    # went past them all (`_state`), one run's delay, never a partition too few.
    made_past = max((leaf.high for leaf in leaves), default=0)
    now = _value(sql.SQL("SELECT clock_timestamp()").format())
    retired: list[str] = []
    rows, estimated = 0, False
    kept = []
    for leaf in [*leftovers, *leaves]:
        if leaf in leftovers:
            count = yield from _finished_or_attached_back(home, leaf)
            if count is None:
                attached_back.append(leaf.name)
        elif _made_ahead(leaf, used, made_past):
            continue  # known from its bounds: no statement (a run read every one of them)
        else:
            state = yield from _state(home, leaf, used, made_past)
            if not state.retirable:
                if state.why_not and "made ahead" not in state.why_not:
                    yield from _forget_note(home, leaf.name)  # unfinished again (a replay)
                continue
            if state.done_since is None:
                yield from step(_note_finished(home, leaf.name))
                state = yield from _state(home, leaf, used, made_past)
                if state.done_since is None:
                    continue  # busy, or unfinished after all: looked at again next run
            if state.done_since > (yield from step(now)) - retention:
                kept.append(state)
                continue
            if replaying is not None:
                held.append(leaf.name)
                continue
            count = yield from _retire(home, leaf, state.done_since, session)
            if count is None:
                attached_back.append(leaf.name)
        if count is not None:
            retired.append(leaf.name)
            rows += count[0]
            estimated = estimated or count[1]
    if retired:
        # One DROP for them all: a transaction that drops a table always waits for its WAL
        # to be flushed, and a flush per partition was most of the drops' time. A run cut
        # short before it leaves them detached, and the next run drops them.
        names = sql.SQL(", ").join(_leaf(home, name) for name in retired)
        yield from step(_statement(sql.SQL("DROP TABLE {names}").format(names=names)))
        if dropped is not None:
            dropped(rows)
    # Autovacuum never analyzes a partitioned parent: the planner's view of it comes from here.
    yield from step(_statement(sql.SQL("ANALYZE {t}").format(t=table.ident)))
    if too_far is not None:
        raise too_far
    held_off = None
    if held:
        kept_back = ", ".join(shown(name) for name in held)
        held_off = f"kept {kept_back}, finished for the retention: {replaying}"
    return Maintained(made, retired, rows, estimated, kept, moved, attached_back, held_off)


def _make_ahead(table: Table, layout: Layout, leaves: list[Partition]) -> Steps[int]:
    """The partitions missing ahead of the highest id in use (a row written past the
    sequence's last id counts, as `outbox stats` counts it), each created on its own, then
    attached (outbox.partitions.make_partition), and the parent's privileges given to every
    partition lacking them (one made before a GRANT on the parent); how many were made."""
    highest = (yield from _in_use(table)).highest
    missing = missing_ahead(table, leaves, int(highest or 0), layout)
    for index, low, high in missing:
        for statement in make_partition(table, index, low, high, layout.schema):
            yield from step(_statement(statement))
    yield from step(_statement(carry_privileges(table)))
    return len(missing)


def _noted(table: Table) -> Query[set[str]]:
    """The partitions noted finished, by name, from the catalog (no partition opened)."""
    statement = sql.SQL(
        """SELECT c.relname FROM pg_inherits AS i
  JOIN pg_class AS c ON c.oid = i.inhrelid
  JOIN pg_description AS d
    ON d.objoid = c.oid AND d.classoid = 'pg_class'::regclass AND d.objsubid = 0
 WHERE i.inhparent = {t}::regclass AND starts_with(d.description, {note})"""
    ).format(t=table.regclass_literal, note=sql.Literal(_DONE_NOTE))
    return Query(statement, None, lambda rows: {str(row[0]) for row in rows})


def _noting(table: Table) -> Steps[int]:
    layout, leaves = yield from _layout(table)
    home = _home(table, layout)
    noted = yield from step(_noted(table))
    used = yield from _in_use(table)
    made_past = max((leaf.high for leaf in leaves), default=0)
    looked = 0
    for leaf in leaves:
        if leaf.name in noted:
            continue
        state = yield from _state(home, leaf, used, made_past)
        if not state.retirable:
            break  # the window of unfinished partitions starts here
        yield from step(_note_finished(home, leaf.name))
        looked += 1
    return looked


async def note_finished_async(conn: psycopg.AsyncConnection[Any], table: Table) -> int:
    """Note finished the partitions from the oldest one not noted up to the first holding an
    unfinished row (or the newest ids), as `outbox maintain` does: the workers' partition
    keeper runs it, so that `outbox stats` (and the operator's backlog read) looks only at
    the partitions that can hold unfinished rows whether or not maintenance ever ran. Each
    pass looks at the partitions finished since the last one, not at every partition. How
    many were noted (or found busy and left for later). `conn` in autocommit; the table's
    owner only (COMMENT ON TABLE): psycopg.errors.InsufficientPrivilege otherwise."""
    return await perform_async(conn, _noting(table))


# How long noting a partition finished waits for its SHARE lock (`_note_finished`): a
# session holding ROW EXCLUSIVE on it is writing a row there (an insert or a replay not
# committed yet) and may hold it for as long as its transaction lasts; the partition is
# noted at a later run instead.
NOTE_LOCK_TIMEOUT = "100ms"


def _note_finished(table: Table, name: str) -> Query[None]:
    """Note the partition finished since now, if nothing in it is unfinished, in one
    transaction (a DO block: a lock it cannot have leaves the partition as it was).

    Under `LOCK ... IN SHARE MODE` the recount sees every row: an uncommitted insert or a
    replay's UPDATE holds ROW EXCLUSIVE on the partition, which conflicts with it, so
    neither can commit a row the recount missed, and the note's time is taken under the
    lock (later than every `done_at` in it). Read without it, a producer's row committed
    after the reading was left out of `outbox stats` until the next run, and a replay that
    took the note off between reading and noting had it written back.

    What remains: the partition is below the sequence's last value, so every id it can
    take was drawn already; an insert that drew its id before the lock and routes its row
    after it (a statement in the microseconds between, or a producer that draws ids ahead
    and inserts them later) lands in a noted partition. The next run finds it unfinished
    and takes the note off, and retiring never drops it (`_finished_or_attached_back`
    looks again after the detach): `outbox stats` leaves that row out until then.

    A note a run marked retiring is kept as it is: a worker's keeper that read the
    partitions before the run marked and detached one would take the mark off, and the
    run's leftover would never be dropped."""
    leaf = _leaf(table, name)
    body = sql.SQL(
        """BEGIN
  PERFORM set_config('lock_timeout', {timeout}, true);
  LOCK TABLE {leaf} IN SHARE MODE;
  IF NOT EXISTS (SELECT FROM {leaf} WHERE status IN ('pending', 'processing'))
     AND NOT EXISTS (SELECT FROM {leaf} WHERE status = 'dead')
     AND right(coalesce(obj_description({name}::regclass, 'pg_class'), ''), {marked})
         <> {mark} THEN
    EXECUTE 'COMMENT ON TABLE ' || {name}::regclass::text || ' IS '
      || quote_literal({note} || to_char(clock_timestamp() AT TIME ZONE 'UTC',
                                         'YYYY-MM-DD"T"HH24:MI:SS.US"+00:00"'));
  END IF;
EXCEPTION WHEN lock_not_available THEN
  NULL;  -- a row is being written there: noted at a later run
END"""
    ).format(
        timeout=sql.Literal(NOTE_LOCK_TIMEOUT),
        leaf=leaf,
        name=partition_named(table, name).regclass_literal,
        note=sql.Literal(_DONE_NOTE),
        marked=sql.Literal(len(RETIRING_MARK)),
        mark=sql.Literal(RETIRING_MARK),
    )
    # The body holds no placeholder character (identifiers spell theirs escaped).
    return _statement(sql.SQL("DO {body}").format(body=sql.Literal(body.as_string(None))))


def _forget_note(table: Table, name: str) -> Steps[None]:
    """Take maintenance's note off (rows in it are unfinished again): always safe, since
    a partition without it is only looked in by `outbox stats` and noted again later."""
    regclass = partition_named(table, name).regclass_literal
    current = yield from step(
        _value(sql.SQL("SELECT obj_description({n}::regclass, 'pg_class')").format(n=regclass))
    )
    if not _NOTE.match(str(current or "")):
        return  # no note, or a comment of someone's own
    yield from step(
        _statement(sql.SQL("COMMENT ON TABLE {leaf} IS NULL").format(leaf=_leaf(table, name)))
    )


# The rows a detached partition held, and whether that is the planner's estimate.
_Held = tuple[int, bool]


def _retire(
    table: Table, leaf: Partition, since: datetime, session: _Session
) -> Steps[_Held | None]:
    """Mark the partition's note as retiring (`since`, the note's own time), detach without
    blocking the parent's users and check again; the rows it held, or None if a row became
    unfinished meanwhile (attached back). The mark is what lets the next run drop it if
    this one stops before it does (`_detached_orphans`): a table detached without it, by
    hand, is never dropped. A DETACH that fails ends the run (its error is not sent here),
    and the run's end takes the mark off if the partition is still attached
    (`session.retiring_in`)."""
    # Noted before the mark is written: a run stopped while the COMMENT is under way (and
    # committed) still takes the mark off as it ends.
    session.retiring_in = table
    yield from step(
        _statement(
            sql.SQL("COMMENT ON TABLE {leaf} IS {note}").format(
                leaf=_leaf(table, leaf.name),
                note=sql.Literal(_DONE_NOTE + since.isoformat() + RETIRING_MARK),
            )
        )
    )
    yield from step(
        _statement(
            sql.SQL("ALTER TABLE {t} DETACH PARTITION {leaf} CONCURRENTLY").format(
                t=table.ident, leaf=_leaf(table, leaf.name)
            )
        )
    )
    session.retiring_in = None
    return (yield from _finished_or_attached_back(table, leaf))


# How long taking a retiring mark off waits for a partition's lock (`_unmark_attached`): a
# session holding one that COMMENT ON waits for leaves the mark to the next run's start. An
# autovacuum of the partition gives way to a lock request waiting deadlock_timeout (1s by
# default).
UNMARK_LOCK_TIMEOUT = "2s"


def _unmark_attached(table: Table) -> Query[None]:
    """Take the retiring mark off the note of every partition still attached and not
    pending detach, in one transaction (a DO block): a run marked it and its DETACH failed
    before it began (a lock waited for in vain, a cancel, PostgreSQL refusing it), or the
    run ended between the two. Left on, a detach by hand later looked like a run's leftover
    and the next run dropped the partition. Pending detach, the mark stays: that is the
    run's leftover, finished and dropped by the next run. Only a run holding the run's lock
    calls it: no other run is between its mark and its detach."""
    body = sql.SQL(
        """DECLARE
  marked record;
BEGIN
  PERFORM set_config('lock_timeout', {timeout}, true);
  FOR marked IN
    SELECT i.inhrelid::regclass AS leaf, d.description AS note FROM pg_inherits AS i
      JOIN pg_description AS d
        ON d.objoid = i.inhrelid AND d.classoid = 'pg_class'::regclass AND d.objsubid = 0
     WHERE i.inhparent = {t}::regclass AND NOT i.inhdetachpending
       AND starts_with(d.description, {note}) AND right(d.description, {marked}) = {mark}
  LOOP
    EXECUTE 'COMMENT ON TABLE ' || marked.leaf::text || ' IS '
      || quote_literal(left(marked.note, -{marked}));
  END LOOP;
EXCEPTION WHEN lock_not_available THEN
  NULL;  -- a partition locked meanwhile: its mark is taken off at the next run's start
END"""
    ).format(
        timeout=sql.Literal(UNMARK_LOCK_TIMEOUT),
        t=table.regclass_literal,
        note=sql.Literal(_DONE_NOTE),
        marked=sql.Literal(len(RETIRING_MARK)),
        mark=sql.Literal(RETIRING_MARK),
    )
    # The body holds no placeholder character (identifiers spell theirs escaped).
    return _statement(sql.SQL("DO {body}").format(body=sql.Literal(body.as_string(None))))


def _finished_or_attached_back(
    table: Table, leaf: Partition, *, counted_rows: bool = True
) -> Steps[_Held | None]:
    """A detached partition: the rows it holds if none is unfinished (it is to be dropped;
    not counted unless `counted_rows`: 0 then), else None, attached back."""
    ident = _leaf(table, leaf.name)
    # Through the partial indexes, and the row count from the statistics when they are to be
    # trusted (`_TRUSTED`): counting a partition of a million rows would cost more than
    # dropping it.
    unfinished, total = yield from step(
        Query(
            sql.SQL(
                """SELECT EXISTS (SELECT FROM {leaf} WHERE status IN ('pending', 'processing'))
       OR EXISTS (SELECT FROM {leaf} WHERE status = 'dead'),
       (SELECT CASE WHEN {trusted} THEN c.reltuples::bigint ELSE -1 END
          FROM pg_class AS c WHERE c.oid = {name}::regclass)"""
            ).format(
                leaf=ident,
                name=partition_named(table, leaf.name).regclass_literal,
                trusted=_TRUSTED,
            ),
            None,
            first_row(lambda row: (bool(row[0]), int(row[1])) if row else (False, 0)),
        )
    )
    estimated = total >= 0
    if not estimated and counted_rows:  # never analyzed, or changed much since: count it
        total = yield from step(
            _value(sql.SQL("SELECT count(*) FROM {leaf}").format(leaf=ident), int)
        )
    if unfinished:
        yield from _attach_back(table, leaf)
        return None
    return int(total), estimated


def _attach_back(table: Table, leaf: Partition) -> Steps[None]:
    """Attach a detached partition back where it was, without maintenance's note (a row in
    it is unfinished, or no run meant to retire it): `outbox stats` looks in it again, and
    a run notes it again once it is finished."""
    yield from step(
        _statement(
            sql.SQL(
                "ALTER TABLE {t} ATTACH PARTITION {leaf} FOR VALUES FROM ({l}) TO ({h})"
            ).format(
                t=table.ident,
                leaf=_leaf(table, leaf.name),
                l=sql.Literal(leaf.low),
                h=sql.Literal(leaf.high),
            )
        )
    )
    yield from _forget_note(table, leaf.name)


def _finish_detaches(table: Table) -> Steps[set[str]]:
    """A DETACH ... CONCURRENTLY interrupted (a cancel, a crash) leaves its partition
    half-detached: finish it (a second one fails while it is so), the names finished. One a
    run marked retiring is then dropped or attached back as a run's leftover; any other is
    attached back (`_maintaining`)."""
    pending = yield from step(
        Query(
            sql.SQL(
                "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
                "WHERE i.inhparent = {t}::regclass AND i.inhdetachpending"
            ).format(t=table.regclass_literal),
            None,
            lambda rows: {str(row[0]) for row in rows},
        )
    )
    for name in sorted(pending):
        yield from step(
            _statement(
                sql.SQL("ALTER TABLE {t} DETACH PARTITION {leaf} FINALIZE").format(
                    t=table.ident, leaf=_leaf(table, name)
                )
            )
        )
    return set(pending)


def _detached_orphans(
    table: Table, layout: Layout, leaves: list[Partition]
) -> Steps[list[tuple[Partition, bool]]]:
    """Partitions detached and not dropped that carry maintenance's note, each with whether
    its note carries the retiring mark: tables named as partition k (`<table>_p<k>`, or its
    shortened form for a long table name) below the newest partition, attached to nothing.
    Marked, a run detached it to retire it and did not drop it (its session ended between
    the two): it is the next run's to drop. Unmarked, someone detached it by hand (a
    partition the workers' keepers or a run had noted finished): not ours to drop, kept
    detached unless a row in it is unfinished. Read by the note alone, one detached by hand
    a minute after a keeper noted it was dropped by the next run whatever the retention.
    Its ids, and so
    k, are those of its range CHECK (which every partition made or converted carries, under
    a name shortened as its table's may be: a converted table's first partition holds many
    partition sizes), else k is read from the name's end. Read by the name's prefix alone,
    a long table name's partitions (`<prefix>_<digest>`) were never found, and were left
    detached for good."""
    if not leaves:
        return []
    candidates = yield from step(
        Query(
            sql.SQL(
                "SELECT c.relname, ARRAY(SELECT pg_get_constraintdef(k.oid)"
                " FROM pg_constraint k WHERE k.conrelid = c.oid AND k.contype = 'c'),"
                " right(obj_description(c.oid, 'pg_class'), {marked}) = {mark}"
                " FROM pg_class c WHERE c.relkind = 'r' AND NOT c.relispartition "
                "AND c.relnamespace = "
                "(SELECT relnamespace FROM pg_class WHERE oid = {t}::regclass) "
                "AND starts_with(obj_description(c.oid, 'pg_class'), {note})"
            ).format(
                t=table.regclass_literal,
                note=sql.Literal(_DONE_NOTE),
                marked=sql.Literal(len(RETIRING_MARK)),
                mark=sql.Literal(RETIRING_MARK),
            ),
            None,
            lambda rows: [
                (str(row[0]), [str(c) for c in row[1] or []], bool(row[2])) for row in rows
            ],
        )
    )
    size, top = layout.partition_size, leaves[-1].low
    found = []
    for name, checks, marked in candidates:
        bounds = [b for b in map(_RANGE_CHECK.search, checks) if b is not None]
        if bounds:
            low, high = int(bounds[0].group(1)), int(bounds[0].group(2))
            index = low // size
        else:
            suffix = name.removeprefix(table.derived_name("p"))
            if not suffix.isdigit():
                continue
            index = int(suffix)
            low, high = index * size, (index + 1) * size
        if table.derived_name(f"p{index}") == name and low < top:
            found.append((Partition(name, low, high), marked))
    return sorted(found, key=lambda p: p[0].low)


# A range CHECK as pg_get_constraintdef shows it: CHECK (((id >= 0) AND (id < 400))).
_RANGE_CHECK = re.compile(r"id >= '?(-?\d+)'?\S*\)? AND \(?id < '?(-?\d+)")


def forget_finished(table: Table, low: int, high: int) -> Steps[None]:
    """Take maintenance's note off the partitions holding ids `low` to `high` (inclusive):
    a replay sent rows of them again, so they are unfinished once more (a snapshot looks
    in them again, outbox.stats.unfinished_window). Run it in the transaction that sends
    them (outbox.operations.replay.send_batch), so the rows and the notes change together.
    The partitions are found by their bounds: a converted table's first one holds many
    partition sizes of ids. Nothing on a plain table."""
    leaves = yield from step(read_partitions(table))
    names = [leaf.name for leaf in leaves or () if leaf.low <= high and low < leaf.high]
    if not names:
        return
    noted = yield from step(
        Query(
            sql.SQL(
                "SELECT c.relname FROM pg_class AS c JOIN pg_description AS d ON d.objoid = c.oid"
                " AND d.classoid = 'pg_class'::regclass AND d.objsubid = 0"
                " WHERE c.relnamespace ="
                " (SELECT relnamespace FROM pg_class WHERE oid = {t}::regclass)"
                " AND c.relname = ANY(%(names)s) AND starts_with(d.description, {note})"
            ).format(t=table.regclass_literal, note=sql.Literal(_DONE_NOTE)),
            {"names": names},
            lambda rows: [str(row[0]) for row in rows],
        )
    )
    home = in_schema(table, (yield from step(home_schema(table))) if noted else None)
    for name in noted:
        yield from _forget_note(home, name)
