"""Converting a plain outbox table to the partitioned layout online: `outbox migrate
--partition-size N` on a plain table. The table itself becomes the first partition,
`<table>_p0`, without being rewritten, and without being scanned under a lock that stops
producers or workers.

1. **bound**: a CHECK constraint `<table>_p0_range` (`id >= 0 AND id < B`) is added NOT
   VALID, a catalog change under a moment of ACCESS EXCLUSIVE lock. B, the first partition's
   upper bound, is a partition boundary `partitions_ahead` whole partitions past the highest
   id: the room the layout keeps ahead anyway, here for what producers insert until the swap;
2. **validate**: the constraint is validated, a scan of the table under SHARE UPDATE
   EXCLUSIVE, which inserts, claims and finalizes go on through;
3. **swap**, one short transaction whose ACCESS EXCLUSIVE lock is asked for with a short
   `lock_timeout` and retried: the table and its indexes are renamed `<table>_p0...`; the
   id's identity is dropped (PostgreSQL attaches no table with one) and its default becomes
   `<table>_id_seq`, set past every id drawn, B or later; a partitioned parent takes the
   table's name, its columns, defaults, constraints and indexes; the old table is attached
   for the ids [0, B), without a scan (the validated CHECK implies the bound), and its
   indexes are attached to the parent's, not rebuilt, which take their old names; the
   NOTIFY trigger, the schema version's comment and the grants move to the parent (a role
   that may insert may use the sequence, one that may update may read it; one that may read
   may read `<table>_layout`); the
   layout is recorded, the partition for the next ids is made, and a NOTIFY `layout` tells
   the running workers, which claim partition by partition from then on;
4. the partitions ahead are made, each on its own (`outbox migrate` with the layout, as on
   any partitioned table).

Every step finds out from the catalog whether it is done, so the command run again after a
crash at any point goes on from where it stopped. A constraint left by a run that stopped
before the swap is replaced when the ids have come near its bound (producers would fail on
it) or when its bound is no partition boundary of the layout asked for (a run with another
--partition-size), and it can be dropped by hand to undo the conversion until the swap. A
run that gives up before the swap (the lock not had, the bound overtaken, an error) drops
its constraint itself, for nothing else would until inserts failed on it; if even that
fails, its error says the constraint is left, and how to drop it.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import psycopg
from psycopg import sql

from outbox import partitions
from outbox.partitions import (
    TOP_ID,
    Layout,
    make_partition,
    partition_table,
    range_check_name,
    record_layout,
)
from outbox.plumbing.text import counted
from outbox.runner import fetch, perform
from outbox.schema import SchemaError, migrate, notify_trigger_statements
from outbox.session import home_first, session_settings
from outbox.table import Table, shown, text_constant

Conn = psycopg.Connection[Any]

# The swap asks for its ACCESS EXCLUSIVE lock for at most this long: while it waits, every
# statement on the table queues behind it, so a producer stalls this long at worst for each
# attempt that does not get the lock (a long transaction on the table holds it off).
SWAP_LOCK_TIMEOUT = timedelta(milliseconds=500)
# Attempts at each locking step before the command gives up (saying so, nothing half-done),
# with a pause between them in which the queued statements run.
SWAP_ATTEMPTS = 20
SWAP_PAUSE = timedelta(seconds=1)
# Attempts at dropping the constraint again when the command gives up before the swap.
UNDO_ATTEMPTS = 3
# Bounds added by one run before it gives up: producers that take the room left under a
# bound before it is validated (or a stopped run's bound) get a new bound, a few times.
BOUND_RUNS = 3
# The name of the conversion's NOTIFY payload, heard by the workers.
LAYOUT_NOTICE = partitions.LAYOUT_NOTICE

# What aclexplode() names a table's privileges (MAINTAIN: PostgreSQL 17).
_PRIVILEGES = frozenset(
    ("SELECT", "INSERT", "UPDATE", "DELETE", "TRUNCATE", "REFERENCES", "TRIGGER", "MAINTAIN")
)
_BOUND = re.compile(r"id >= 0\)? AND \(?id < '?(\d+)'?")


@dataclass
class Converted:
    """What a conversion did, for the command to say."""

    table: Table
    first_partition: str
    first_high: int  # the first partition holds ids [0, first_high)
    next_id: int  # the sequence's next id
    validate_seconds: float = 0.0  # the scan, producers going on
    bound_lock_seconds: float = 0.0  # ACCESS EXCLUSIVE held to add the constraint
    swap_lock_seconds: float = 0.0  # ACCESS EXCLUSIVE held for the swap
    swap_attempts: int = 0
    scanned: bool = True  # False: ATTACH found the bound implied by the validated CHECK
    indexes: list[str] = field(default_factory=list)  # attached to the parent's, by name
    trigger_moved: bool = False
    grants: int = 0
    steps: list[str] = field(default_factory=list)  # what this run did, in order

    def describe(self) -> list[str]:
        """One line a step, for the command's output."""
        lines = [f"{shown(self.table)}: converted to the partitioned layout:"]
        if "bound" in self.steps:
            lines.append(
                f"  added CHECK {shown(range_check_name(self.first_partition))} "
                f"(ids 0 to {self.first_high - 1}) "
                f"NOT VALID, holding the exclusive lock {self.bound_lock_seconds * 1000:.0f} ms"
            )
        if "validate" in self.steps:
            lines.append(
                f"  validated it in {self.validate_seconds:.2f} s (writes went on meanwhile)"
            )
        scan = "without a scan" if not self.scanned else "with a scan"
        lines.append(
            f"  swapped in {self.swap_lock_seconds * 1000:.0f} ms under the exclusive lock "
            f"(attempt {self.swap_attempts}): {shown(self.table)} is partitioned by range of id, "
            f"{shown(self.first_partition)} is the old table, attached {scan} for ids 0 to "
            f"{self.first_high - 1}; {counted(len(self.indexes), 'index', 'indexes')} "
            "attached, not rebuilt "
            f"({', '.join(map(shown, self.indexes))}); "
            + ("NOTIFY trigger moved; " if self.trigger_moved else "")
            + f"{counted(self.grants, 'grant')} carried; new ids from {self.next_id}"
        )
        return lines


def migrate_converting(
    conn: Conn, table: Table, ordering: str | None, layout: Layout | None
) -> tuple[int, int, Converted | None]:
    """`outbox migrate`: `schema.migrate`, and with a layout, a plain table first migrated
    as it is, converted, then given its partitions ahead like any partitioned table; (the
    version before, after, what the conversion did if it ran)."""
    if layout is None or not _plain(conn, table):
        return (*migrate(conn, table, ordering, layout=layout), None)
    _refuse_negative_ids(conn, table)  # before its migration too: nothing changed then
    before, _ = migrate(conn, table, ordering)
    converted = convert(conn, table, layout)
    _, after = migrate(conn, table, ordering, layout=layout)
    return before, after, converted


def _plain(conn: Conn, table: Table) -> bool:
    row = conn.execute(
        sql.SQL("SELECT relkind = 'r' FROM pg_class WHERE oid = to_regclass({t})").format(
            t=table.regclass_literal
        )
    ).fetchone()
    return row is not None and bool(row[0])


def refusals(conn: Conn, table: Table) -> list[str]:
    """What of the table the conversion could not carry to the partitioned one, one phrase
    each: the table is refused before anything changes."""
    t = table.regclass_literal
    rows = conn.execute(
        sql.SQL(
            """SELECT 'trigger ' || tgname || ' (only the NOTIFY trigger moves to the partitioned '
       || 'table)' FROM pg_trigger WHERE tgrelid = {t}::regclass AND NOT tgisinternal
   AND tgname <> {notify}
UNION ALL
SELECT 'foreign key ' || conname || ' (a partition keeps it, the partitioned table would not)'
  FROM pg_constraint WHERE contype = 'f' AND ({t}::regclass IN (conrelid, confrelid))
UNION ALL
SELECT 'unique index ' || c.relname || ' without id (a partitioned table cannot enforce it)'
  FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
 WHERE i.indrelid = {t}::regclass AND i.indisunique AND NOT i.indisprimary
   AND NOT EXISTS (SELECT FROM pg_attribute a WHERE a.attrelid = i.indrelid
                      AND a.attname = 'id' AND a.attnum = ANY (i.indkey::int2[]))
UNION ALL
SELECT 'membership of publication ' || p.pubname || ' (it would follow the old table)'
  FROM pg_publication_rel r JOIN pg_publication p ON p.oid = r.prpubid
 WHERE r.prrelid = {t}::regclass
UNION ALL
SELECT 'row-level security (the partitioned table would not have it on)' FROM pg_class
 WHERE oid = {t}::regclass AND (relrowsecurity OR relforcerowsecurity)
UNION ALL
SELECT 'policy ' || polname || ' (the partitioned table would not have it)'
  FROM pg_policy WHERE polrelid = {t}::regclass
UNION ALL
SELECT 'column grants on ' || string_agg(attname, ', ' ORDER BY attnum)
       || ' (the partitioned table would not have them)'
  FROM pg_attribute WHERE attrelid = {t}::regclass AND cardinality(attacl) > 0
HAVING count(*) > 0
UNION ALL
(SELECT 'table inheritance' FROM pg_inherits
  WHERE {t}::regclass IN (inhrelid, inhparent) LIMIT 1)"""
        ).format(t=t, notify=sql.Literal(_notify_name(table)))
    ).fetchall()
    return [str(row[0]) for row in rows]


def _notify_name(table: Table) -> str:
    return f"{table.name}_notify"


def convert(
    conn: Conn,
    table: Table,
    layout: Layout,
    *,
    lock_timeout: timedelta = SWAP_LOCK_TIMEOUT,
    attempts: int = SWAP_ATTEMPTS,
    pause: timedelta = SWAP_PAUSE,
    before_swap: Callable[[], None] | None = None,
) -> Converted | None:
    """Convert the plain table `table` (at the current schema version: `outbox migrate` it
    first) to `layout`, online (see the module). `conn` must be in autocommit. SchemaError
    when the table cannot be converted, or the exclusive lock was not had in `attempts`
    tries, or its bound was overtaken: the constraint it added is dropped again (or the
    error says it is left, and how to drop it), and running it again starts over.
    `before_swap` is called once the constraint is valid, just before the swap's first
    attempt. None when the table is partitioned already (another run converted it)."""
    if not conn.autocommit:
        raise ValueError("convert needs an autocommit connection")
    # One conversion of a table at a time (every replica may run `outbox migrate` at start):
    # the others wait, then find it partitioned. Keyed on the table as the catalog holds it,
    # not as it was named: a run given `outbox` and one given `public.outbox` went on at
    # once, and the later swap failed on the first's (relation "outbox_p0" already exists).
    home = partitions.in_schema(table, fetch(conn, partitions.home_schema(table)) or None)
    lock = sql.SQL("hashtextextended({n}, 0)").format(
        n=text_constant(f"outbox-dispatcher convert {home}")
    )
    conn.execute(sql.SQL("SELECT pg_advisory_lock({l})").format(l=lock))
    try:
        if fetch(conn, partitions.read_partitions(table)) is not None:
            return None
        with _home_first(conn, table):
            return _convert(conn, table, layout, lock_timeout, attempts, pause, before_swap)
    finally:
        conn.execute(sql.SQL("SELECT pg_advisory_unlock({l})").format(l=lock))


@contextmanager
def _home_first(conn: Conn, table: Table) -> Iterator[None]:
    """For a table named without its schema, the schema it is in first along the session's
    search_path while it is converted. What the conversion makes is named as the table is
    (the partitioned table, its sequence, its partitions, the tables and functions that go
    with it), and CREATE puts a table named without its schema in the path's first schema,
    which may not be the table's: a schema of the role's own ("$user") made after the table
    took the new parent and its partitions, the old table staying behind as the first
    partition, and the command failed after the swap. What a name the conversion reads finds
    is unchanged for the table itself (it is the first of its name along the path), and is
    the table's own for the rest."""
    path = perform(conn, home_first(table))
    try:
        yield
    finally:
        # Not over a failure that broke the connection: it is not used again, and its own
        # error is the one to tell.
        if path is not None:
            with suppress(psycopg.OperationalError):
                fetch(conn, session_settings({"search_path": path}))


def _convert(
    conn: Conn,
    table: Table,
    layout: Layout,
    lock_timeout: timedelta,
    attempts: int,
    pause: timedelta,
    before_swap: Callable[[], None] | None,
) -> Converted:
    _refuse_negative_ids(conn, table)
    refused = refusals(conn, table)
    if refused:
        raise SchemaError(
            f"table {shown(table)} cannot be converted to partitions: it has {'; '.join(refused)}; "
            "drop it, convert, and make it again on the partitioned table"
        )
    try:
        return _steps(conn, table, layout, lock_timeout, attempts, pause, before_swap)
    except Exception as exc:
        left, outcome = _take_bound_off(conn, table, lock_timeout, pause)
        if isinstance(exc, SchemaError) or left:
            raise SchemaError(f"{exc}; {outcome}") from exc
        raise  # PostgreSQL's own error, the table as it was
    except KeyboardInterrupt as exc:
        # Stopped by hand (a VALIDATE of a big table takes minutes): its statement is
        # cancelled, and the constraint goes too, as when the command gives up. Said either
        # way: left to the command's generic line, a run whose constraint was dropped said
        # that it kept the steps it had finished. A second Ctrl-C stops the drop too.
        try:
            swapped = fetch(conn, partitions.read_partitions(table)) is not None
            outcome = "" if swapped else _take_bound_off(conn, table, lock_timeout, pause)[1]
        except KeyboardInterrupt:
            swapped, outcome = False, _bound_left(table, None, certain=False)
        if swapped:  # stopped as the swap committed: the command's own line says what stays
            raise exc from None
        raise SchemaError(f"table {shown(table)}: interrupted; {outcome}") from exc


def _steps(
    conn: Conn,
    table: Table,
    layout: Layout,
    lock_timeout: timedelta,
    attempts: int,
    pause: timedelta,
    before_swap: Callable[[], None] | None,
) -> Converted:
    first = partition_table(table, 0)
    done = Converted(table, first.name, 0, 0)
    bounds_added = 0
    while True:
        bound = _bound(conn, table)
        last = _last_id(conn, table)
        size = layout.partition_size
        # The first partition's bound leaves a whole partition of bigint ids past it, for
        # the ids after the swap (outbox.partitions makes none past 2**63 - 1 either): a bound
        # past bigint became a numeric CHECK, which the next step could not read as its own.
        ceiling = (TOP_ID // size - 1) * size
        if last >= ceiling:
            raise SchemaError(
                f"table {shown(table)} cannot be converted to partitions of {size} ids: its "
                f"highest id, {last}, leaves no whole partition of bigint ids after the first "
                "(ids up to 2^63 - 1); give a smaller --partition-size"
            )
        room = min(size * layout.partitions_ahead, ceiling - last)
        # A bound left by a stopped run asked for another --partition-size may be no
        # boundary of this layout: the first partition would end inside the one the swap
        # makes next, whose ATTACH fails on the overlap. Replaced too.
        if bound is None or bound[0] - last < room // 2 or bound[0] % size:
            if bounds_added == BOUND_RUNS:
                raise SchemaError(
                    f"table {shown(table)}: producers took the ids up to the first partition's "
                    f"bound before it could be validated, {BOUND_RUNS} times; run this again with "
                    "a larger --partitions-ahead (the room left for them), or when they are "
                    "quieter"
                )
            bounds_added += 1
            high = min((last // size + 1 + layout.partitions_ahead) * size, ceiling)
            done.bound_lock_seconds = _locked(
                conn, table, _bound_statements(table, bound, high), lock_timeout, attempts, pause
            )[0]
            done.steps.append("bound")
            continue
        high, valid = bound
        done.first_high = high
        if not valid:
            started = time.perf_counter()
            conn.execute(
                sql.SQL("ALTER TABLE {t} VALIDATE CONSTRAINT {c}").format(
                    t=table.ident, c=sql.Identifier(_bound_name(table))
                )
            )
            done.validate_seconds = time.perf_counter() - started
            done.steps.append("validate")
            continue
        if before_swap is not None:
            before_swap()
        _swap(conn, table, layout, done, lock_timeout, attempts, pause)
        return done


def _take_bound_off(
    conn: Conn, table: Table, lock_timeout: timedelta, pause: timedelta
) -> tuple[bool, str]:
    """After the command gave up before the swap: the constraint it added (or found) is
    dropped, since nothing else would, and producers' inserts would fail on it once the ids
    reach its bound. Under the same short lock timeout, a few tries; (whether it is left,
    what became of it)."""
    name = _bound_name(table)
    bound: tuple[int, bool] | None = None
    try:
        bound = _bound(conn, table)
        if bound is None:
            return False, "the table is as it was"
        drop = sql.SQL("ALTER TABLE {t} DROP CONSTRAINT IF EXISTS {c}").format(
            t=table.ident, c=sql.Identifier(name)
        )
        _locked(conn, table, [drop], lock_timeout, UNDO_ATTEMPTS, pause)
    except (SchemaError, psycopg.Error):
        return True, _bound_left(table, bound)
    return False, f"the CHECK {shown(name)} was dropped again: the table is as it was"


def _bound_left(table: Table, bound: tuple[int, bool] | None, *, certain: bool = True) -> str:
    """What a run that could not drop its constraint says of it (`bound` if it was read;
    not `certain` when it was stopped while dropping it)."""
    name = _bound_name(table)
    by_hand = sql.SQL("ALTER TABLE {t} DROP CONSTRAINT {c}").format(
        t=table.ident, c=sql.Identifier(name)
    )
    reach = f"reach {bound[0]}" if bound is not None else "reach its bound"
    return (
        f"the CHECK {shown(name)} {'is' if certain else 'may be'} left on it, and inserts will "
        f"fail on it once the ids {reach}: "
        f"drop it ({by_hand.as_string(None)}) or run this again to finish the conversion"
    )


def stopped_conversion(conn: Conn, table: Table) -> str | None:
    """What a conversion stopped before its end (killed, say, while it validated) left on a
    plain table: its CHECK on the first partition's bound, which fails every insert once the
    ids reach it, said as `_bound_left` says it; None when there is none."""
    if fetch(conn, partitions.read_partitions(table)) is not None:
        return None
    bound = _bound(conn, table)
    if bound is None:
        return None
    return f"a conversion of table {shown(table)} was stopped: {_bound_left(table, bound)}"


def _bound_name(table: Table) -> str:
    return range_check_name(partition_table(table, 0).name)


def _bound(conn: Conn, table: Table) -> tuple[int, bool] | None:
    """The first partition's bound as a constraint on the plain table: (upper bound, valid)."""
    row = conn.execute(
        sql.SQL(
            "SELECT pg_get_constraintdef(oid), convalidated FROM pg_constraint "
            "WHERE conrelid = {t}::regclass AND conname = {c}"
        ).format(t=table.regclass_literal, c=sql.Literal(_bound_name(table)))
    ).fetchone()
    if row is None:
        return None
    match = _BOUND.search(str(row[0]))
    if match is None:
        raise SchemaError(
            f"table {shown(table)} has a constraint {shown(_bound_name(table))} that is not the "
            f"conversion's ({row[0]}); drop or rename it, then run this again"
        )
    return int(match.group(1)), bool(row[1])


def _bound_statements(table: Table, old: tuple[int, bool] | None, high: int) -> list[sql.Composed]:
    name = sql.Identifier(_bound_name(table))
    drop = [sql.SQL("ALTER TABLE {t} DROP CONSTRAINT {c}").format(t=table.ident, c=name)]
    return [
        *(drop if old is not None else []),
        sql.SQL(
            "ALTER TABLE {t} ADD CONSTRAINT {c} CHECK (id >= 0 AND id < {high}) NOT VALID"
        ).format(t=table.ident, c=name, high=sql.Literal(high)),
    ]


def _refuse_negative_ids(conn: Conn, table: Table) -> None:
    """Refuse a table holding an id below 0 in one line naming the lowest: the partitions
    hold ids from 0 up (partition k: k x size on), and the first one's range CHECK failed
    its validation in PostgreSQL's words, naming no row. Its primary key's first entry."""
    row = conn.execute(sql.SQL("SELECT min(id) FROM {t}").format(t=table.ident)).fetchone()
    lowest = None if row is None else row[0]
    if lowest is not None and int(lowest) < 0:
        raise SchemaError(
            f"table {shown(table)} cannot be converted to partitions: its lowest id is {lowest}, "
            "and the partitions hold ids from 0 up; give those rows ids of 0 or more (or delete "
            "them) and run this again; nothing was changed"
        )


def _last_id(conn: Conn, table: Table) -> int:
    """The highest id given: the sequence's last value (ids drawn by transactions still
    open count), or the highest row's if it is higher (one inserted with its own id)."""
    row = conn.execute(
        sql.SQL(
            "SELECT greatest(coalesce(pg_sequence_last_value(pg_get_serial_sequence({t}, 'id')), "
            "0), coalesce((SELECT max(id) FROM {ident}), 0))"
        ).format(t=table.regclass_literal, ident=table.ident)
    ).fetchone()
    return int(row[0]) if row else 0


def _locked(
    conn: Conn,
    table: Table,
    statements: list[sql.Composed] | Callable[[], None],
    lock_timeout: timedelta,
    attempts: int,
    pause: timedelta,
) -> tuple[float, int]:
    """Run `statements` in one transaction under the table's ACCESS EXCLUSIVE lock, asked
    for with `lock_timeout` and retried up to `attempts` times; (seconds the lock was held,
    the attempt that had it)."""
    timeout = f"{max(1, round(lock_timeout / timedelta(milliseconds=1)))}ms"
    for attempt in range(1, attempts + 1):
        try:
            with conn.transaction():
                conn.execute(sql.SQL("SET LOCAL lock_timeout = {}").format(sql.Literal(timeout)))
                conn.execute(
                    sql.SQL("LOCK TABLE {t} IN ACCESS EXCLUSIVE MODE").format(t=table.ident)
                )
                held = time.perf_counter()
                if callable(statements):
                    statements()
                else:
                    for statement in statements:
                        conn.execute(statement)
            return time.perf_counter() - held, attempt
        except psycopg.errors.LockNotAvailable:
            if attempt < attempts:
                time.sleep(pause.total_seconds())
    raise SchemaError(
        f"table {shown(table)}: could not take its exclusive lock within {timeout} in {attempts} "
        "attempts (a long transaction on it? see pg_locks and pg_stat_activity)"
    )


def _swap(
    conn: Conn,
    table: Table,
    layout: Layout,
    done: Converted,
    lock_timeout: timedelta,
    attempts: int,
    pause: timedelta,
) -> None:
    first = partition_table(table, 0)
    high = done.first_high
    notices: list[str] = []

    def heard(diag: psycopg.errors.Diagnostic) -> None:
        notices.append(diag.message_primary or "")

    def statements() -> None:
        notices.clear()
        t, p0 = table.ident, first.ident
        # What the swap needs to know, read under the lock in one round trip (a pipeline:
        # producers wait while the lock is held, so it is held for few round trips).
        with conn.pipeline():
            reads = [conn.execute(q) for q in _facts(table)]
        ((identity, owner, comment, last, trigger),) = reads[0].fetchall()
        sequence = _sequence(table, None if identity else reads[1].fetchone())
        indexes = [str(row[0]) for row in reads[2].fetchall()]
        grants = [(row[0], str(row[1]), bool(row[2])) for row in reads[3].fetchall()]
        done.next_id = max(high, int(last) + 1)
        size = layout.partition_size
        before: list[sql.Composed] = [
            sql.SQL("ALTER TABLE {t} RENAME TO {p0}").format(t=t, p0=sql.Identifier(first.name))
        ]
        for name in indexes:
            before.append(
                sql.SQL("ALTER INDEX {i} RENAME TO {new}").format(
                    i=Table(table.schema, name).ident,
                    new=sql.Identifier(_partition_index_name(table, name)),
                )
            )
        if identity:
            before.append(sql.SQL("ALTER TABLE {p0} ALTER id DROP IDENTITY").format(p0=p0))
            before.append(sql.SQL("CREATE SEQUENCE {s} AS bigint").format(s=sequence.ident))
        default = sql.SQL("nextval({s}::regclass)").format(s=sequence.regclass_literal)
        before += [
            # Only ever forward: a nextval of the sequence itself meanwhile is never reused.
            sql.SQL(
                "SELECT setval({s}::regclass, greatest({v}, (SELECT last_value FROM {seq})))"
            ).format(
                s=sequence.regclass_literal, v=sql.Literal(done.next_id - 1), seq=sequence.ident
            ),
            sql.SQL(
                "CREATE TABLE {t} (LIKE {p0} INCLUDING DEFAULTS INCLUDING CONSTRAINTS "
                "INCLUDING INDEXES INCLUDING COMMENTS INCLUDING STORAGE INCLUDING COMPRESSION "
                "INCLUDING GENERATED INCLUDING STATISTICS) PARTITION BY RANGE (id)"
            ).format(t=t, p0=p0),
            sql.SQL("ALTER TABLE {t} DROP CONSTRAINT {c}").format(
                t=t, c=sql.Identifier(_bound_name(table))
            ),
            *(
                sql.SQL("ALTER TABLE {t} ALTER id SET DEFAULT {d}").format(t=target, d=default)
                for target in (t, p0)
            ),
            sql.SQL("ALTER TABLE {t} OWNER TO {o}").format(t=t, o=sql.Identifier(owner)),
            sql.SQL("ALTER SEQUENCE {s} OWNER TO {o}").format(
                s=sequence.ident, o=sql.Identifier(owner)
            ),
            sql.SQL("ALTER SEQUENCE {s} OWNED BY {t}.id").format(s=sequence.ident, t=t),
            sql.SQL("ALTER TABLE {t} ATTACH PARTITION {p0} FOR VALUES FROM (0) TO ({h})").format(
                t=t, p0=p0, h=sql.Literal(high)
            ),
        ]
        _all(conn, before)
        renames, done.indexes = _parent_index_names(conn, table, indexes)
        after = [*renames]
        done.trigger_moved = bool(trigger)
        if trigger:
            after.append(
                sql.SQL("DROP TRIGGER {trg} ON {p0}").format(
                    trg=sql.Identifier(_notify_name(table)), p0=p0
                )
            )
            after += notify_trigger_statements(table)
        after += [
            sql.SQL("COMMENT ON TABLE {t} IS {c}").format(t=t, c=sql.Literal(comment)),
            sql.SQL("COMMENT ON TABLE {p0} IS NULL").format(p0=p0),
            *_grant_statements(table, sequence, grants),
            record_layout(table, layout),
            # The partitions from the bound up to the one the next id goes to (one, unless
            # ids were drawn past the bound): inserts go on the moment the swap commits.
            *(
                statement
                for k in range(high // size, done.next_id // size + 1)
                for statement in make_partition(table, k, k * size, (k + 1) * size)
            ),
            sql.SQL("SELECT pg_notify({c}, {p})").format(
                c=table.channel_sql, p=sql.Literal(LAYOUT_NOTICE)
            ),
        ]
        _all(conn, after)
        done.grants = len(grants)

    conn.add_notice_handler(heard)
    try:
        conn.execute("SET client_min_messages = debug1")
        try:
            done.swap_lock_seconds, done.swap_attempts = _locked(
                conn, table, statements, lock_timeout, attempts, pause
            )
        finally:
            conn.execute("RESET client_min_messages")
    finally:
        conn.remove_notice_handler(heard)
    done.scanned = not any("is implied by existing constraints" in n for n in notices)
    done.steps.append("swap")


def _all(conn: Conn, statements: list[sql.Composed]) -> None:
    """Statements sent together: one round trip, not one each."""
    with conn.pipeline():
        for statement in statements:
            conn.execute(statement)


def _facts(table: Table) -> list[sql.Composed]:
    """What the swap reads of the plain table: (the id is an identity, its owner, its
    comment, the highest id given, it has the NOTIFY trigger); the sequence of an id with a
    sequence default (not an identity); its indexes; its grants but its owner's, as
    (grantee or None for PUBLIC, privilege, with grant option)."""
    t = table.regclass_literal
    return [
        sql.SQL(
            "SELECT a.attidentity <> '', pg_get_userbyid(c.relowner), "
            "obj_description(c.oid, 'pg_class'), greatest(coalesce(pg_sequence_last_value("
            "pg_get_serial_sequence({t}, 'id')), 0), coalesce((SELECT max(id) FROM {ident}), 0)), "
            "EXISTS (SELECT FROM pg_trigger WHERE tgrelid = c.oid AND tgname = {notify}) "
            "FROM pg_class c JOIN pg_attribute a ON a.attrelid = c.oid AND a.attname = 'id' "
            "WHERE c.oid = {t}::regclass"
        ).format(t=t, ident=table.ident, notify=sql.Literal(_notify_name(table))),
        sql.SQL(
            "SELECT n.nspname, c.relname FROM pg_class c JOIN pg_namespace n "
            "ON n.oid = c.relnamespace WHERE c.oid = pg_get_serial_sequence({t}, 'id')::regclass"
        ).format(t=t),
        sql.SQL(
            "SELECT c.relname FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid "
            "WHERE i.indrelid = {t}::regclass ORDER BY c.relname"
        ).format(t=t),
        sql.SQL(
            "SELECT CASE WHEN a.grantee = 0 THEN NULL ELSE pg_get_userbyid(a.grantee) END, "
            "a.privilege_type, a.is_grantable FROM pg_class c, aclexplode(c.relacl) a "
            "WHERE c.oid = {t}::regclass AND a.grantee <> c.relowner ORDER BY 1, 2"
        ).format(t=t),
    ]


def _sequence(table: Table, found: tuple[Any, ...] | None) -> Table:
    """The id's sequence after the swap: the one it has as a default, or, for an identity
    (whose sequence goes with it, whatever its name), `<table>_id_seq` made anew."""
    if found is not None:
        return Table(str(found[0]), str(found[1]))
    return Table(table.schema, table.derived_name("id_seq"))


def _partition_index_name(table: Table, name: str) -> str:
    """The old table's index `outbox_ready` becomes its partition's `outbox_p0_ready`."""
    prefix = f"{table.name}_"
    suffix = name[len(prefix) :] if name.startswith(prefix) else name
    return partition_table(table, 0).derived_name(suffix)


def _parent_index_names(
    conn: Conn, table: Table, names: list[str]
) -> tuple[list[sql.Composed], list[str]]:
    """The renames that give the parent's indexes, made like the old table's, the old names
    (each found by the partition index ATTACH attached to it), and those names. Through
    temporary names first, so that no rename meets a name another index still holds."""
    renamed = {_partition_index_name(table, name): name for name in names}
    rows = conn.execute(
        sql.SQL(
            "SELECT child.relname, parent.relname FROM pg_inherits i "
            "JOIN pg_class child ON child.oid = i.inhrelid "
            "JOIN pg_class parent ON parent.oid = i.inhparent "
            "WHERE i.inhrelid = ANY (SELECT indexrelid FROM pg_index "
            "WHERE indrelid = {p0}::regclass) ORDER BY child.relname"
        ).format(p0=partition_table(table, 0).regclass_literal)
    ).fetchall()
    pairs = [(renamed[str(child)], str(parent)) for child, parent in rows if str(child) in renamed]
    temporary = [table.derived_name(f"converting_{step}") for step in range(len(pairs))]
    statements = [
        sql.SQL("ALTER INDEX {i} RENAME TO {tmp}").format(
            i=Table(table.schema, parent).ident, tmp=sql.Identifier(tmp)
        )
        for (_, parent), tmp in zip(pairs, temporary, strict=True)
    ] + [
        sql.SQL("ALTER INDEX {i} RENAME TO {name}").format(
            i=Table(table.schema, tmp).ident, name=sql.Identifier(name)
        )
        for (name, _), tmp in zip(pairs, temporary, strict=True)
    ]
    return statements, [name for name, _ in pairs]


def _grant_statements(
    table: Table, sequence: Table, grants: list[tuple[str | None, str, bool]]
) -> list[sql.Composed]:
    """The old table's grants on the parent; the sequence to whoever may insert (its
    default calls nextval, which an identity did not need) and to whoever may update (a
    worker: its claims read the last id given, outbox.partitions.last_id_given),
    `<table>_layout` to whoever may read (the workers' check reads it)."""
    layout = partitions.layout_table(table)
    statements = []
    for grantee, privilege, grantable in grants:
        if privilege not in _PRIVILEGES:
            raise SchemaError(f"table {shown(table)} has a grant of {privilege!r}, unknown here")
        to = sql.SQL("PUBLIC") if grantee is None else sql.Identifier(grantee)
        option = sql.SQL(" WITH GRANT OPTION") if grantable else sql.SQL("")
        statements.append(
            sql.SQL("GRANT {p} ON {t} TO {to}{o}").format(
                p=sql.SQL(privilege), t=table.ident, to=to, o=option
            )
        )
        if privilege == "INSERT":
            statements.append(
                sql.SQL("GRANT USAGE ON SEQUENCE {s} TO {to}").format(s=sequence.ident, to=to)
            )
        if privilege == "UPDATE":  # a worker: its claims read the sequence's last id
            statements.append(
                sql.SQL("GRANT SELECT ON SEQUENCE {s} TO {to}").format(s=sequence.ident, to=to)
            )
        if privilege == "SELECT":
            statements.append(sql.SQL("GRANT SELECT ON {l} TO {to}").format(l=layout, to=to))
    return statements
