"""The partitioned layout: an outbox table partitioned by range of `id`, and how its hot
statements address only the partitions that can hold the rows they want.

Partition k holds the ids [k * size, (k + 1) * size): which partition an id lives in is
arithmetic, so a statement can name its id range as constants and PostgreSQL prunes every
other partition while planning it. A statement over the parent without such a range plans,
locks and opens every partition (hundreds, most of them empty ahead or done history).

The partition size is recorded in `<table>_layout` (schema v6), one row, read back by the
workers, the checks and maintenance: a table of its own rather than the table's comment,
which holds the schema version, so that it is typed and checked by constraints.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from functools import partial

import psycopg
from psycopg import sql

from outbox.plumbing.errors import SchemaError
from outbox.runner import Query, Row, Steps, fetch, fetch_async, first_row, no_rows, step
from outbox.table import Table, clipped, shown, shown_argument, shown_sql_name, text_constant

# A partition holds a million ids by default: at 1,000 messages a second, a partition every
# 17 minutes, so a retention of hours retires a few dozen at a time and the claim's window
# (below) is one or two partitions.
DEFAULT_PARTITION_SIZE = 1_000_000
# Partitions made ahead of the highest id: 16 million ids at the default size, four and a half
# hours at 1,000 messages a second: far more than a burst at any producer's top rate takes
# between two maintenance runs (the operator's purge timer, the workers' own check).
DEFAULT_PARTITIONS_AHEAD = 16
PARTITION_SIZE_RANGE = (100, 10**12)
# At most a thousand ahead: each ATTACH makes every session reload the parent's partitions,
# so making them slows as they grow (10,000 took 24 minutes on 2 cores), and a statement on
# the parent not bounded to a few partitions locks them all, past the default lock table
# (max_locks_per_transaction 64 a session) long before 10,000. A thousand at the default
# size is a billion ids.
PARTITIONS_AHEAD_RANGE = (1, 1_000)

# The comment `outbox maintain` gives a partition in which it found nothing unfinished, with
# the time it found so (outbox.operations.partition_maintenance): a snapshot's statements
# leave such partitions out (outbox.stats.unfinished_window), and a replay that sends rows of
# one again takes the note off first.
FINISHED_NOTE = "outbox-dispatcher: nothing unfinished since "
# What `outbox maintain` adds to that note, in the same comment, just before it detaches the
# partition to retire it: a table detached (or left pending detach) that carries it was
# detached by a run that had found it finished for the retention, and the next run may drop
# it (once nothing in it is unfinished). A partition without it, detached by hand (or noted
# finished by a worker's keeper and then detached by hand), is never a run's to drop.
RETIRING_MARK = "; retiring"

# Why a table with a DEFAULT partition is refused (the check, and every reader of the bounds).
_DEFAULT_PARTITION = (
    "it has a DEFAULT partition, which blocks DETACH ... CONCURRENTLY and hides a missed "
    "maintenance until it fails; move its rows to ranged partitions and drop it"
)

_BOUND = re.compile(r"^FOR VALUES FROM \('?(-?\d+)'?\) TO \('?(-?\d+)'?\)$")


@dataclass(frozen=True)
class Layout:
    """What the statements need to know of a partitioned table."""

    partition_size: int
    partitions_ahead: int
    # Every partition is `<table>_p<k>` holding ids k x size to (k + 1) x size - 1, as
    # `outbox migrate` and maintenance make them, in the table's own schema: a statement
    # whose rows are all in one partition may then name that partition itself (see
    # `leaf_of`). Read by the check.
    named_leaves: bool = field(default=False, compare=False)
    # A plain table converted in place (outbox.operations.conversion) is one partition,
    # `<table>_p0`, holding every id below this (a multiple of the size); 0 when there is none.
    converted_below: int = field(default=0, compare=False)
    # The partitions missing between the lowest and the highest, by number (from the
    # converted table's bound when it is there): retired while one below them was pinned
    # (a dead row), or dropped by hand. They hold no row, and a statement naming one
    # fails: `leaves` leaves them out, and the window steps over them.
    # Read by the check, again whenever a statement meets a partition that is gone.
    gaps: frozenset[int] = field(default=frozenset(), compare=False)
    # The schema the table and its partitions are in, as the check found it: statements name
    # the partitions in it whatever the search_path reaches first, a table named without
    # its schema too (None: as the table is named).
    schema: str | None = field(default=None, compare=False)

    def partition_of(self, message_id: int) -> int:
        return message_id // self.partition_size

    def leaf_of(self, table: Table, within: tuple[int, int]) -> Table | None:
        """The partition itself when `within` is exactly one partition (and they are all
        named as ours): a statement on it plans and runs as on a plain table, with none of
        the partitioned parent's planning or its Append pruned row by row."""
        low, high = within
        if not self.named_leaves or high - low != self.partition_size:
            return None
        if low < self.converted_below:
            return None  # inside the converted table: the parent prunes to it
        return partition_table(table, low // self.partition_size, self.schema)

    def leaves(self, table: Table, within: tuple[int, int]) -> tuple[Table, ...] | None:
        """The partitions themselves that make up `within` (whole partitions), when each
        can be named (see `leaf_of`)."""
        size = self.partition_size
        found = [
            self.leaf_of(table, (low, low + size))
            for low in range(*within, size)
            if low // size not in self.gaps
        ]
        return None if None in found else tuple(t for t in found if t is not None)

    def present_from(self, low: int) -> int:
        """The first id of the first partition from `low` (a partition's first id) on that
        is not a gap."""
        size = self.partition_size
        while low // size in self.gaps:
            low += size
        return low

    def span(self, ids: Iterable[int]) -> tuple[int, int]:
        """The id range, whole partitions, that holds every one of `ids` (not empty)."""
        values = list(ids)
        size = self.partition_size
        return min(values) // size * size, (max(values) // size + 1) * size


def layout_table(table: Table) -> sql.Composable:
    return table.sibling("layout")


def layout_statements(table: Table) -> list[sql.Composed]:
    """Schema v6: the table that records a partitioned layout (one row, or none for a plain
    table)."""
    return [
        sql.SQL(
            """CREATE TABLE IF NOT EXISTS {l} (
    single           boolean PRIMARY KEY DEFAULT true CHECK (single),
    partition_size   bigint  NOT NULL CHECK (partition_size > 0),
    partitions_ahead integer NOT NULL CHECK (partitions_ahead > 0)
)"""
        ).format(l=layout_table(table))
    ]


def read_layout(table: Table) -> Query[Layout | None]:
    statement = sql.SQL(
        "SELECT partition_size, partitions_ahead FROM {l} WHERE to_regclass({t}) IS NOT NULL"
    ).format(l=layout_table(table), t=table.regclass_literal)
    return Query(statement, None, first_row(_parse_layout))


def _parse_layout(row: Row | None) -> Layout | None:
    return None if row is None else Layout(int(row[0]), int(row[1]))


def record_layout(table: Table, layout: Layout) -> sql.Composed:
    return sql.SQL(
        "INSERT INTO {l} (partition_size, partitions_ahead) VALUES ({size}, {ahead}) "
        "ON CONFLICT (single) DO UPDATE SET partitions_ahead = excluded.partitions_ahead"
    ).format(
        l=layout_table(table),
        size=sql.Literal(layout.partition_size),
        ahead=sql.Literal(layout.partitions_ahead),
    )


def partitioned_parent(table: Table, columns: sql.Composable) -> list[sql.Composed]:
    """The parent of a new partitioned table. Its id comes from a sequence it owns, not an
    identity: identity on a partitioned table needs PostgreSQL 17, and the layout serves 15."""
    sequence = table.sibling("id_seq")
    sequence_name = text_name(table, "id_seq")
    return [
        sql.SQL("CREATE SEQUENCE IF NOT EXISTS {s} AS bigint").format(s=sequence),
        sql.SQL(
            """CREATE TABLE IF NOT EXISTS {t} (
    id             bigint      NOT NULL DEFAULT nextval({seq}::regclass),
{columns},
    PRIMARY KEY (id)
) PARTITION BY RANGE (id)"""
        ).format(t=table.ident, seq=sequence_name, columns=columns),
        sql.SQL("ALTER SEQUENCE {s} OWNED BY {t}.id").format(s=sequence, t=table.ident),
    ]


def text_name(table: Table, suffix: str) -> sql.Composable:
    """A sibling's qualified name as a string constant (for `::regclass`)."""
    sibling = Table(table.schema, table.derived_name(suffix))
    return sibling.regclass_literal


def in_schema(table: Table, schema: str | None) -> Table:
    """`table` named in `schema`, the one the catalog holds it in (`home_schema`, the check's
    `Layout.schema`), or as it is named for None. What is named after the table, its
    partitions and its layout's table, is named in that schema: found there whatever the
    search_path reaches first. Named without a schema, as the table may be, each was the
    first table of its name along the search_path, which may be another one in a schema
    before the table's (the role's own): read, noted, detached, dropped or attached in the
    partition's stead, or its layout read for the table's."""
    return table if schema is None else Table(schema, table.name)


def partition_table(table: Table, index: int, schema: str | None = None) -> Table:
    """Partition `index` of `table`, named in `schema` (see `in_schema`), or as the table
    is named for None."""
    return Table(in_schema(table, schema).schema, table.derived_name(f"p{index}"))


def partition_named(table: Table, name: str, schema: str | None = None) -> Table:
    """The partition of `table` named `name` (as the catalog holds it), in `schema` (see
    `in_schema`)."""
    return Table(in_schema(table, schema).schema, name)


# -- reading the partitions ------------------------------------------------------------------


@dataclass(frozen=True)
class Partition:
    name: str
    low: int  # first id
    high: int  # past the last id
    # The schema it is in when that is not its table's (None: its table's). An earlier
    # version made the partitions of a table named without its schema in the search_path's
    # first schema: statements naming them as the table's siblings miss them, and `outbox
    # migrate` moves them home (`move_home`).
    elsewhere: str | None = None


def read_partitions(table: Table) -> Query[list[Partition] | None]:
    """The leaf partitions in id order, or None for a table that is not partitioned.

    A bound is deparsed without its partition (`pg_get_expr(..., 0)`: it names no column):
    given the partition's oid, pg_get_expr opens each one, a lock and a cache entry each,
    which cost 8.8 ms on 230 partitions against 2.9 ms (a worker's first read of them)."""
    statement = sql.SQL(
        """SELECT c.relkind = 'p',
       (SELECT array_agg(ARRAY[p.relname::text, pg_get_expr(p.relpartbound, 0),
                               CASE WHEN p.relnamespace <> c.relnamespace
                                    THEN (SELECT nspname::text FROM pg_namespace
                                           WHERE oid = p.relnamespace) END]
                         ORDER BY p.relname)
          FROM pg_inherits i JOIN pg_class p ON p.oid = i.inhrelid
         WHERE i.inhparent = c.oid)
  FROM pg_class c WHERE c.oid = {t}::regclass"""
    ).format(t=table.regclass_literal)
    return Query(statement, None, first_row(partial(_parse_partitions, table)))


def _parse_partitions(table: Table, row: Row | None) -> list[Partition] | None:
    if row is None or not row[0]:
        return None
    found = []
    for name, bound, elsewhere in row[1] or ():
        match = _BOUND.match(str(bound))
        if match is None:
            raise unusable_bound(table, str(name), bound)
        found.append(Partition(str(name), int(match.group(1)), int(match.group(2)), elsewhere))
    return sorted(found, key=lambda p: p.low)


def unusable_bound(table: Table, name: str, bound: object) -> SchemaError:
    """The error for a partition whose bound is not a range of ids, met by a command that
    reads the bounds without the check first (`outbox stats`, `outbox partitions`, ...):
    the check's own reason for a DEFAULT partition, one line."""
    reason = (
        _DEFAULT_PARTITION
        if str(bound).strip().upper() == "DEFAULT"
        else f"partition {shown(name)} is not a range of ids ({bound})"
    )
    return SchemaError(f"table {shown(table)} cannot be served: {reason}")


def last_id_given(table: Table) -> sql.Composable:
    """SQL: the last id the table's sequence gave (0 before its first), or NULL when this
    role may not read the sequence (SELECT or USAGE on it) or the id has none of its own.
    Never 0 then: read as 0, it put the newest ids in partition 0, and the claims' window and
    the ids left ahead with them (PostgreSQL 18's pg_sequence_last_value answers NULL to a
    role without the privilege, 15 raises; the CASE asks neither).

    A sequence whose next value is not drawn yet (new, or moved by `ALTER SEQUENCE ...
    RESTART [WITH n]` or `setval(..., false)`) is read as the id before its next one:
    pg_sequence_last_value answers NULL for it until the next nextval, and read as 0 (as
    it was) a restarted sequence left the partitions ahead and the ids left ahead counted
    from 0. Its next id is the sequence's own last_value (`_NEXT_ID_NOT_DRAWN`), read only
    then: the common case stays one function call."""
    sequence = sql.SQL("pg_get_serial_sequence({t}, 'id')").format(t=table.regclass_literal)
    return sql.SQL(
        "(CASE WHEN has_sequence_privilege({s}, 'SELECT, USAGE')"
        " THEN coalesce(pg_sequence_last_value({s}), {not_drawn}) END)"
    ).format(s=sequence, not_drawn=_NEXT_ID_NOT_DRAWN.format(s=sequence))


# The id before a sequence's next one while that is not drawn yet (is_called false), where
# its last_value is that next id. The sequence's relation is named at run time
# (pg_get_serial_sequence), and a statement cannot read a relation named by a value but
# through a function that runs a query of its text: ts_stat, which every build has (the XML
# functions need libxml, which some builds lack), runs it and hands the value back as the
# one word of a tsvector (no `%` in it: a statement with parameters would take it for one).
# Reading the relation needs SELECT on it; a role with USAGE alone
# gets the sequence's START, where a plain RESTART puts it.
_NEXT_ID_NOT_DRAWN = sql.SQL(
    """(SELECT CASE WHEN has_sequence_privilege({s}, 'SELECT')
             THEN (SELECT w.word::bigint FROM ts_stat(
                     'SELECT to_tsvector(''pg_catalog.simple'', last_value::text) FROM ' || {s})
                   AS w)
             ELSE q.seqstart END - q.seqincrement
   FROM pg_catalog.pg_sequence AS q WHERE q.seqrelid = {s}::regclass)"""
)


@dataclass(frozen=True)
class InUse:
    """The highest id in use on a partitioned table (`in_use`): the sequence's last id, or
    past it a row a producer wrote with an id of its own."""

    last_given: int | None  # the sequence's (`last_id_given`), None when unreadable
    # The highest partition wholly past it holding a row all the same (`written_past`).
    written_past: Partition | None

    @property
    def highest(self) -> int | None:
        """What the partitions ahead count from: the sequence's last id, or the first id of
        the partition written past it (whole partitions are counted, so its first id says
        as much as the row's own)."""
        if self.last_given is None:
            return None
        return max(self.last_given, self.written_past.low if self.written_past else 0)


def in_use(table: Table) -> Query[InUse]:
    """The highest id in use, as the snapshot's window (outbox.stats.unfinished_window) and
    the claims' find it: the sequence's last id, and the highest partition past it that
    holds a row (its file's size, `written_past`), no partition opened. `outbox partitions`
    and `outbox maintain` count the partitions made ahead from it."""
    statement = sql.SQL(
        """SELECT s.last, w.relname, w.low, w.high
  FROM (SELECT {last} AS last) AS s
  LEFT JOIN LATERAL (
    SELECT p.relname::text AS relname, b.low, b.high
      FROM pg_inherits AS i JOIN pg_class AS p ON p.oid = i.inhrelid,
           LATERAL (SELECT substring(pg_get_expr(p.relpartbound, 0) FROM {first})::bigint AS low,
                           substring(pg_get_expr(p.relpartbound, 0) FROM {past})::bigint AS high)
             AS b
     WHERE i.inhparent = {t}::regclass AND {written}
     ORDER BY b.low DESC LIMIT 1) AS w ON true"""
    ).format(
        last=last_id_given(table),
        first=sql.Literal(FIRST_ID),
        past=sql.Literal(PAST_ID),
        t=table.regclass_literal,
        written=written_past(sql.SQL("p.oid"), sql.SQL("b.low"), sql.SQL("s.last")),
    )

    def parse(row: Row | None) -> InUse:
        if row is None or row[0] is None:
            return InUse(None, None)
        last, name, low, high = row
        past = Partition(str(name), int(low), int(high)) if name is not None else None
        return InUse(int(last), past)

    return Query(statement, None, first_row(parse))


class SequenceUnreadable(psycopg.errors.InsufficientPrivilege):
    """This role may not read the sequence the table's ids come from (`last_id_given`),
    met after the check let it through (a REVOKE since): a refusal like the server's."""


def sequence_problem(table: Table) -> Query[str | None]:
    """Why this role cannot read the last id the table's sequence gave, naming the GRANT
    that fixes it; None when it can."""
    # The sequence's schema and name apart: the GRANT offered names it as SQL reads it, on
    # one line (shown_sql_name), whatever characters the table's name holds.
    statement = sql.SQL(
        "SELECT s.name, has_sequence_privilege(s.name, 'SELECT, USAGE'),"
        " quote_ident(n.nspname), n.nspname, quote_ident(c.relname), c.relname,"
        " quote_ident(current_user), current_user"
        " FROM (SELECT pg_get_serial_sequence({t}, 'id') AS name) AS s"
        " LEFT JOIN pg_class AS c ON c.oid = s.name::regclass"
        " LEFT JOIN pg_namespace AS n ON n.oid = c.relnamespace"
    ).format(t=table.regclass_literal)

    def parse(row: Row | None) -> str | None:
        assert row is not None
        name, readable, *names = row
        if name is None:
            return (
                "its id has no sequence of its own (pg_get_serial_sequence finds none), "
                "which the claims read the newest id from"
            )
        if readable:
            return None
        schema, relname, role = (shown_sql_name(*map(str, names[i : i + 2])) for i in (0, 2, 4))
        name = f"{schema}.{relname}"
        return (
            f"role {role} may not read {name}, the sequence its ids come from, which the "
            f"claims and the partitions ahead are read from; GRANT SELECT ON SEQUENCE {name} "
            f"TO {role} (outbox migrate and outbox maintain grant it to every role that may "
            "UPDATE the table)"
        )

    return Query(statement, None, first_row(parse))


async def sequence_unreadable(
    conn: psycopg.AsyncConnection[tuple[object, ...]], table: Table
) -> SequenceUnreadable:
    problem = await fetch_async(conn, sequence_problem(table))
    return SequenceUnreadable(f"table {shown(table)} cannot be served: {problem or 'no last id'}")


def _last_id_given(table: Table) -> Query[int | None]:
    """The sequence's last value alone: what a worker's upkeep reads every 30 seconds. It
    opens no partition, where max(id) over the parent opens every one (in a new session,
    the first such statement over 230 partitions cost about 100 ms of planning, as a drain
    began). Ids a producer wrote of its own past the sequence are seen by `outbox maintain`
    (`_highest_apart`)."""
    statement = sql.SQL("SELECT {last}").format(last=last_id_given(table))
    return Query(statement, None, first_row(lambda row: None if row is None else row[0]))


async def _last_id(conn: psycopg.AsyncConnection[tuple[object, ...]], table: Table) -> int:
    last = await fetch_async(conn, _last_id_given(table))
    if last is None:
        raise await sequence_unreadable(conn, table)
    return int(last)


# The most partitions one run makes, as a multiple of the partitions kept ahead (plus the one
# holding the newest ids): a run finds at most a target's worth missing, and a few more where
# the producers outran the last run. Past it the sequence has jumped (a RESTART, or inserts
# that no partition took, each spending its id, in a loop): making every partition up to it
# was a statement after another for hours (a million partitions of 1,000 ids behind an id of
# a billion), and at the top of the bigint range an error that stopped every run.
MAKE_AT_ONCE_FACTOR = 4
# A partition's bounds are bigints: the last one ends at most here.
# The highest id a bigint holds: no partition may reach past it.
TOP_ID = 2**63 - 1


class TooFarAhead(SchemaError):
    """The ids given lie too far past the partitions made to make every one up to them
    (`missing_ahead`): the message says why and what to do."""


def _sequence_literal(table: Table) -> str:
    """The table's sequence (`<table>_id_seq`) as a string constant for setval."""
    name = sql.Identifier(*filter(None, (table.schema, table.derived_name("id_seq"))))
    return "'" + name.as_string(None).replace("'", "''") + "'"


def missing_ahead(
    table: Table, existing: list[Partition], highest_id: int, layout: Layout
) -> list[tuple[int, int, int]]:
    """(index, low, high) of each partition to make so that `partitions_ahead` whole
    partitions lie past the one holding `highest_id` (none past the bigint range).
    TooFarAhead when that is more than MAKE_AT_ONCE_FACTOR times the target."""
    size = layout.partition_size
    first = existing[-1].high // size if existing else 0
    last = min(highest_id // size + layout.partitions_ahead, TOP_ID // size - 1)
    limit = MAKE_AT_ONCE_FACTOR * (layout.partitions_ahead + 1)
    if last + 1 - first > limit:
        top = first * size
        # setval's last id given, so that the next is `top` (no id before 1).
        last_given = f"{top - 1}" if top > 0 else "1, false"
        raise TooFarAhead(
            f"table {shown(table)}: the last id given, {highest_id}, lies "
            f"{highest_id // size - first + 1} partitions past those made (ids below {top}); "
            f"making them all is refused (at most {limit} a run). No row can hold an id no "
            "partition took: if the sequence was not moved on purpose, `SELECT setval("
            f"{shown(_sequence_literal(table))}, {last_given})` (its next id "
            f"{max(top, 1)}) and run again"
        )
    return [(k, k * size, (k + 1) * size) for k in range(first, last + 1)]


def make_partition(
    table: Table, index: int, low: int, high: int, schema: str | None = None
) -> list[sql.Composed]:
    """A partition made on its own, then attached: ATTACH takes the parent's SHARE UPDATE
    EXCLUSIVE lock (producers and workers go on), where CREATE TABLE ... PARTITION OF takes
    its ACCESS EXCLUSIVE one. The CHECK spares ATTACH its scan (the table is empty anyway);
    ATTACH builds the parent's indexes on it. Before it is attached, it gets the parent's
    owner and privileges (see `carry_privileges`), so that no session ever finds it attached
    without them.

    A table of the partition's name found first is attached only if it is what these
    statements make and nothing more (`_in_the_way`): what `outbox maintain`, whose statements
    each commit on their own, left when it was stopped between making and attaching it.

    `schema`: the table's, as found in the catalog (`Layout.schema`): the partition is named
    in it, so that a table of its name in a schema before it along the search_path is
    neither taken for it nor attached (see `in_schema`)."""
    leaf = partition_table(table, index, schema)
    return [
        _in_the_way(table, leaf, index, low, high),
        _create_partition(table, leaf, low, high),
        carry_privileges(table, leaf),
        sql.SQL(
            "ALTER TABLE {t} ATTACH PARTITION {leaf} FOR VALUES FROM ({low}) TO ({high})"
        ).format(t=table.ident, leaf=leaf.ident, low=sql.Literal(low), high=sql.Literal(high)),
    ]


def _create_partition(table: Table, leaf: Table, low: int, high: int) -> sql.Composed:
    """The partition's table, in its parent's schema. A table named without its schema is
    found along the search_path, but CREATE TABLE puts a table in the path's first schema,
    which may not be the parent's (a schema named after the role, made after the parent):
    there the partition's name would be found by sessions of that role only, and every
    claim of another that names it would fail. A partition named without its schema (its
    table's not known) is made in the parent's, looked up when the statement runs."""
    create = sql.SQL(
        "CREATE TABLE IF NOT EXISTS {leaf} (LIKE {t} INCLUDING DEFAULTS INCLUDING CONSTRAINTS,"
        " CONSTRAINT {check} CHECK (id >= {low} AND id < {high}))"
    )
    parts = {
        "t": table.ident,
        "check": sql.Identifier(range_check_name(leaf.name)),
        "low": sql.Literal(low),
        "high": sql.Literal(high),
    }
    if leaf.schema is not None:
        return create.format(leaf=leaf.ident, **parts)
    # format()'s template: the schema its %I, every other % doubled.
    template = create.format(leaf=sql.SQL("{schema}.") + leaf.ident, **parts).as_string(None)
    template = template.replace("%", "%%").replace("{schema}", "%I", 1)
    body = sql.SQL(
        "BEGIN EXECUTE format({template}, (SELECT n.nspname FROM pg_class c JOIN pg_namespace n"
        " ON n.oid = c.relnamespace WHERE c.oid = {t}::regclass)); END"
    ).format(template=sql.Literal(template), t=table.regclass_literal)
    return sql.SQL("DO {body}").format(body=sql.Literal(body.as_string(None)))


def range_check_name(partition: str) -> str:
    """The name of a partition's range CHECK, `<partition>_range`, as the catalog holds it:
    cut as PostgreSQL cuts a name (`clipped`), so that the name looked for is the one made."""
    return clipped(f"{partition}_range")


def _in_the_way(table: Table, leaf: Table, index: int, low: int, high: int) -> sql.Composed:
    """A DO block that refuses, in one line naming it, a relation of the partition's name
    that is not what `make_partition` makes: another kind of relation, a partition already,
    other columns or CHECK constraints than the parent's (and the partition's range CHECK),
    indexes, triggers, row security or rules of its own (attached, they would act on the
    partition's rows unseen by the layout), or rows. Attached, its rows would join the table
    unchecked by anything the layout knows (ATTACH scans them for the bound alone), or ATTACH
    would fail in PostgreSQL's words."""
    # How PostgreSQL deparses the range CHECK: a bound past int4 becomes '<n>'::bigint.
    deparsed = rf"^CHECK \(\(\(id >= '?{low}'?(::bigint)?\) AND \(id < '?{high}'?(::bigint)?\)\)\)$"
    body = sql.SQL(
        """DECLARE
  found regclass := to_regclass({leaf});
  why text;
  filled boolean;
BEGIN
  IF found IS NULL THEN
    RETURN;
  END IF;
  SELECT CASE
    WHEN c.relkind <> 'r' THEN 'it is not a plain table'
    WHEN c.relispartition THEN 'it is a partition already'
    WHEN {columns} IS DISTINCT FROM {parent_columns} THEN 'its columns are not those of ' || {shown}
    WHEN {checks} IS DISTINCT FROM {parent_checks}
      OR EXISTS (SELECT FROM pg_constraint k
                  WHERE k.conrelid = found AND k.contype = 'c' AND k.conname = {check}
                    AND pg_get_constraintdef(k.oid) !~ {deparsed})
      THEN 'its CHECK constraints are not those of ' || {shown}
    WHEN EXISTS (SELECT FROM pg_index i WHERE i.indrelid = found) THEN 'it has indexes'
    WHEN EXISTS (SELECT FROM pg_trigger g WHERE g.tgrelid = found AND NOT g.tgisinternal)
      THEN 'it has triggers'
    WHEN c.relrowsecurity OR EXISTS (SELECT FROM pg_policy p WHERE p.polrelid = found)
      THEN 'it has row security'
    WHEN EXISTS (SELECT FROM pg_rewrite r WHERE r.ev_class = found) THEN 'it has rules'
  END INTO why FROM pg_class c WHERE c.oid = found;
  IF why IS NULL THEN
    EXECUTE 'SELECT EXISTS (SELECT FROM ' || found::text || ')' INTO filled;
    IF filled THEN
      why := 'it holds rows';
    END IF;
  END IF;
  IF why IS NOT NULL THEN
    RAISE EXCEPTION USING ERRCODE = 'duplicate_table', MESSAGE = {prefix} || why || {advice};
  END IF;
END"""
    ).format(
        leaf=leaf.regclass_literal,
        columns=_columns(sql.SQL("found")),
        parent_columns=_columns(sql.SQL("{t}::regclass").format(t=table.regclass_literal)),
        checks=_checks(sql.SQL("found"), except_name=range_check_name(leaf.name)),
        parent_checks=_checks(sql.SQL("{t}::regclass").format(t=table.regclass_literal)),
        check=sql.Literal(range_check_name(leaf.name)),
        deparsed=sql.Literal(deparsed),
        shown=sql.Literal(shown(table)),
        # The table in the way as the statements name it: in the table's schema when that is
        # known, so that the advice to drop it can never be taken for a table of its name
        # earlier on the search_path.
        prefix=sql.Literal(
            f"table {shown(leaf)} is in the way of partition {index} of {shown(table)} "
            f"(ids {low} to {high - 1}): "
        ),
        advice=sql.Literal("; rename or drop it, then run this again"),
    )
    return sql.SQL("DO {body}").format(body=sql.Literal(body.as_string(None)))


def _columns(relation: sql.Composable) -> sql.Composed:
    """SQL: a relation's columns (name, type, NOT NULL), in name order."""
    return sql.SQL(
        "ARRAY(SELECT a.attname::text || ' ' || format_type(a.atttypid, a.atttypmod)"
        " || CASE WHEN a.attnotnull THEN ' not null' ELSE '' END FROM pg_attribute a"
        " WHERE a.attrelid = {r} AND a.attnum > 0 AND NOT a.attisdropped ORDER BY 1)"
    ).format(r=relation)


def _checks(relation: sql.Composable, except_name: str | None = None) -> sql.Composed:
    """SQL: a relation's CHECK constraints (name, definition), in name order."""
    return sql.SQL(
        "ARRAY(SELECT k.conname::text || ' ' || pg_get_constraintdef(k.oid) FROM pg_constraint k"
        " WHERE k.conrelid = {r} AND k.contype = 'c' AND k.conname::text <> {name} ORDER BY 1)"
    ).format(r=relation, name=sql.Literal(except_name or ""))


def carry_privileges(table: Table, leaf: Table | None = None) -> sql.Composed:
    """One statement that gives the partition `leaf` (made, not attached yet) the parent's
    owner and the privileges granted on the parent, or, without `leaf`, gives every
    partition of the table the privileges it lacks of those (partitions made before
    partitions carried them, or before a GRANT on the parent), and the id's sequence to the
    roles that may update the table (`_SEQUENCE_TO_UPDATERS`).

    Grants on a partitioned table cover what goes through it, not a statement that names
    a partition itself, as the claims, finalizes and window readings do: a worker whose role
    has its grants on the parent alone would be refused at its first partition. A DO block,
    so that the parent's ACL is read (aclexplode) in the transaction that grants it; every
    name reaches the GRANT as a regclass, which prints itself quoted."""
    parent = table.regclass_literal
    targets = (
        sql.SQL("{leaf}::regclass").format(leaf=leaf.regclass_literal)
        if leaf is not None
        else sql.SQL("SELECT inhrelid FROM pg_inherits WHERE inhparent = {t}::regclass").format(
            t=parent
        )
    )
    # The owner too, for a partition made by a superuser or a member of the owner's role
    # (ATTACH needs the parent's ownership): the parent's owner may then name it as well.
    owner = sql.SQL(
        """  SELECT leaf.oid::regclass AS leaf, pg_get_userbyid(parent.relowner) AS owner
    INTO o FROM pg_class leaf, pg_class parent
   WHERE leaf.oid = {leaf}::regclass AND parent.oid = {t}::regclass
     AND leaf.relowner <> parent.relowner;
  IF FOUND THEN
    EXECUTE 'ALTER TABLE ' || o.leaf::text || ' OWNER TO ' || quote_ident(o.owner);
  END IF;
"""
    )
    body = sql.SQL(
        """DECLARE
  o record;
  g record;
BEGIN
{owner}  FOR g IN
    SELECT leaf.oid::regclass AS leaf, a.privilege_type AS privilege,
           CASE WHEN a.grantee = 0 THEN 'PUBLIC' ELSE quote_ident(pg_get_userbyid(a.grantee))
           END AS grantee,
           CASE WHEN a.is_grantable THEN ' WITH GRANT OPTION' ELSE '' END AS option
      FROM pg_class parent CROSS JOIN LATERAL aclexplode(parent.relacl) a
      JOIN pg_class leaf ON leaf.oid IN ({targets})
     WHERE parent.oid = {t}::regclass AND a.grantee <> parent.relowner
       AND NOT EXISTS (
             SELECT FROM aclexplode(coalesce(leaf.relacl, acldefault('r', leaf.relowner))) b
              WHERE b.grantee = a.grantee AND b.privilege_type = a.privilege_type
                AND (b.is_grantable OR NOT a.is_grantable))
     ORDER BY 1, 3, 2
  LOOP
    EXECUTE 'GRANT ' || g.privilege || ' ON TABLE ' || g.leaf::text || ' TO ' || g.grantee
            || g.option;
  END LOOP;
{sequence}END"""
    ).format(
        owner=owner.format(leaf=leaf.regclass_literal, t=parent)
        if leaf is not None
        else sql.SQL(""),
        targets=targets,
        t=parent,
        sequence=_SEQUENCE_TO_UPDATERS.format(t=parent) if leaf is None else sql.SQL(""),
    )
    return sql.SQL("DO {body}").format(body=sql.Literal(body.as_string(None)))


# The sequence's SELECT to every role that may UPDATE the table (a worker's grant) and may
# neither read nor use the sequence yet: the claims' window and the ids left ahead are read
# from its last value (`last_id_given`). SELECT reads it and draws no id.
_SEQUENCE_TO_UPDATERS = sql.SQL(
    """  FOR g IN
    SELECT DISTINCT seq.oid::regclass AS seq,
           CASE WHEN a.grantee = 0 THEN 'PUBLIC' ELSE quote_ident(pg_get_userbyid(a.grantee))
           END AS grantee
      FROM pg_class parent CROSS JOIN LATERAL aclexplode(parent.relacl) a
      JOIN pg_class seq ON seq.oid = pg_get_serial_sequence({t}, 'id')::regclass
     WHERE parent.oid = {t}::regclass AND a.privilege_type = 'UPDATE'
       AND a.grantee <> seq.relowner
       AND NOT EXISTS (
             SELECT FROM aclexplode(coalesce(seq.relacl, acldefault('s', seq.relowner))) b
              WHERE b.grantee = a.grantee AND b.privilege_type IN ('SELECT', 'USAGE'))
  LOOP
    EXECUTE 'GRANT SELECT ON SEQUENCE ' || g.seq::text || ' TO ' || g.grantee;
  END LOOP;
"""
)


def make_first(conn: psycopg.Connection[tuple[object, ...]], table: Table, layout: Layout) -> int:
    """For a table without partitions (a new one), make the one the next id goes to, so
    that the table takes inserts from the caller's commit on; and give every partition the
    privileges on the parent it lacks (`outbox migrate` run again after a GRANT on the
    parent). How many partitions were made (0 or 1). The caller's transaction holds the
    upkeep lock (`upkeep_lock`), as `outbox migrate` does. The partitions ahead come after
    it commits, each in a transaction of its own (`make_ahead_apart`)."""
    existing = fetch(conn, read_partitions(table)) or []
    missing = [] if existing else missing_ahead(table, [], _given_or_zero(conn, table), layout)
    schema = fetch(conn, home_schema(table)) if missing else None  # see `in_schema`
    for index, low, high in missing[:1]:
        for statement in make_partition(table, index, low, high, schema):
            conn.execute(statement)
    conn.execute(carry_privileges(table))
    return len(missing[:1])


# How often `make_ahead_apart` tells its progress, in partitions made.
PROGRESS_EVERY = 100
# How many partitions one statement of `_highest_apart` reads the highest id of.
_READ_AT_ONCE = 8


def make_ahead_apart(
    conn: psycopg.Connection[tuple[object, ...]],
    table: Table,
    layout: Layout,
    progress: Callable[[int, int], None] | None = None,
) -> int:
    """Make the partitions missing ahead of the highest id each in a transaction of its own,
    as the workers' keepers and `outbox maintain` do, and read that id a few partitions a
    statement. Made all in one transaction, every partition's locks (the table, its TOAST
    table, the indexes ATTACH builds) were held to its end, and so were those of every
    partition max(id) over the parent opened: --partitions-ahead 10000, then the most allowed,
    ran out of the server's lock table (`out of shared memory`, max_locks_per_transaction
    64) after 1m40s and made none, and a rerun on a table with thousands of partitions
    failed in its max(id). Now no transaction holds the locks of more than a few, and a run
    stopped half way leaves a table served by what it made, which the next run completes.

    `conn` is in no transaction (autocommit): the upkeep lock (`upkeep_lock`) is held for
    the session meanwhile, so that no keeper or `outbox maintain` makes one of them at the
    same time. `progress(made, of)` is called every PROGRESS_EVERY partitions made. How
    many were made."""
    lock = upkeep_lock(table)
    with conn.transaction():  # a session's lock, held past this transaction's end
        conn.execute(sql.SQL("SELECT pg_advisory_lock({l})").format(l=lock))
    try:
        existing = fetch(conn, read_partitions(table)) or []
        schema = fetch(conn, home_schema(table))  # see `in_schema`
        highest = _highest_apart(conn, table, existing, schema)
        missing = missing_ahead(table, existing, highest, layout)
        for made, (index, low, high) in enumerate(missing, 1):
            with conn.transaction():
                for statement in make_partition(table, index, low, high, schema):
                    conn.execute(statement)
            if progress is not None and made % PROGRESS_EVERY == 0 and made < len(missing):
                progress(made, len(missing))
        return len(missing)
    finally:
        if not conn.closed:
            with conn.transaction():
                conn.execute(sql.SQL("SELECT pg_advisory_unlock({l})").format(l=lock))


def _given_or_zero(conn: psycopg.Connection[tuple[object, ...]], table: Table) -> int:
    return int(fetch(conn, _last_id_given(table)) or 0)


def _highest_apart(
    conn: psycopg.Connection[tuple[object, ...]],
    table: Table,
    existing: list[Partition],
    schema: str,
) -> int:
    """The highest id given: the sequence's last value, or a higher id in the table (one a
    producer wrote of its own; every id when the role may not read the sequence). max(id)
    over the parent plans, and locks to its transaction's end, every partition and its
    indexes: here the partitions past the sequence's last id are read from the top down,
    _READ_AT_ONCE a statement (each pruned to them by its constant range), until one holds
    a row."""
    floor = _given_or_zero(conn, table)
    above = [p for p in existing if p.high - 1 > floor]
    while above:
        chunk, above = above[-_READ_AT_ONCE:], above[:-_READ_AT_ONCE]
        statement = sql.SQL("SELECT max(id) FROM {t} WHERE id >= {low} AND id < {high}").format(
            t=in_schema(table, schema).ident,
            low=sql.Literal(chunk[0].low),
            high=sql.Literal(chunk[-1].high),
        )
        with conn.transaction():
            found = fetch(conn, Query(statement, None, _first))
        if isinstance(found, int):
            return max(found, floor)
    return floor


def move_home(table: Table) -> Steps[list[str]]:
    """Move the table's partitions found in another schema (`Partition.elsewhere`) into its
    own (a brief lock on each one moved, none on the parent); the names moved, as
    `schema.name`. `outbox migrate` and `outbox maintain` do it first: until then the
    workers' statements reach such a partition through the parent (`check` names no
    partition), correct and slower. A table of the same name in the table's schema is
    refused in one line: which of the two holds the rows is for a person to say."""
    away = [p for p in (yield from step(read_partitions(table))) or () if p.elsewhere]
    if not away:
        return []
    home = yield from step(home_schema(table))
    moved = []
    for leaf in away:
        there = Table(leaf.elsewhere, leaf.name)
        if (yield from step(_exists(Table(home, leaf.name)))):
            raise SchemaError(
                f"partition {shown(there)} of table {shown(table)} belongs in schema "
                f"{shown(home)}, where another table named {shown(leaf.name)} is in the way; "
                "rename or drop one of the two"
            )
        move = sql.SQL("ALTER TABLE {leaf} SET SCHEMA {home}").format(
            leaf=there.ident, home=sql.Identifier(home)
        )
        yield from step(Query(move, None, no_rows))
        moved.append(shown(there))
    return moved


def _exists(table: Table) -> Query[bool]:
    statement = sql.SQL("SELECT to_regclass({t}) IS NOT NULL").format(t=table.regclass_literal)
    return Query(statement, None, first_row(lambda row: bool(row and row[0])))


def home_schema(table: Table) -> Query[str]:
    """The schema the table is in, as the catalog holds it (see `in_schema`)."""
    statement = sql.SQL(
        "SELECT n.nspname::text FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
        "WHERE c.oid = {t}::regclass"
    ).format(t=table.regclass_literal)
    return Query(statement, None, first_row(lambda row: str(row[0]) if row else ""))


def _partitioning(table: Table) -> Query[Row | None]:
    """How a partitioned table is partitioned: (strategy, key columns, has a DEFAULT
    partition, partitions, the parent's indexes some partition lacks, its schema); no row
    for a table that is not partitioned."""
    statement = sql.SQL(
        """SELECT pt.partstrat::text,
       ARRAY(SELECT coalesce(a.attname::text, 'an expression')
               FROM unnest(pt.partattrs::int2[]) AS k(attnum)
               LEFT JOIN pg_attribute a ON a.attrelid = pt.partrelid AND a.attnum = k.attnum),
       pt.partdefid <> 0,
       n.partitions,
       ARRAY(SELECT c.relname::text FROM pg_index pi JOIN pg_class c ON c.oid = pi.indexrelid
              WHERE pi.indrelid = pt.partrelid
                AND (SELECT count(*) FROM pg_inherits i WHERE i.inhparent = pi.indexrelid)
                    < n.partitions
              ORDER BY c.relname),
       (SELECT n.nspname::text FROM pg_class t JOIN pg_namespace n ON n.oid = t.relnamespace
         WHERE t.oid = pt.partrelid)
  FROM pg_partitioned_table pt,
       LATERAL (SELECT count(*) AS partitions FROM pg_inherits WHERE inhparent = pt.partrelid) n
 WHERE pt.partrelid = {t}::regclass"""
    ).format(t=table.regclass_literal)
    return Query(statement, None, first_row(lambda row: row))


def partitioning_problem(row: Row | None, layout: Layout | None, table: Table) -> str | None:
    """Why a partitioned table cannot be served well, or None (also for a plain table)."""
    if row is None:
        return None
    strategy, key, has_default, count, lacking, _ = row
    if strategy != "r" or list(key) != ["id"]:
        how = {"r": "range", "l": "list", "h": "hash"}.get(str(strategy), str(strategy))
        return (
            f"it is partitioned by {how} of {', '.join(key)}; the claim and retention need "
            "a range of id"
        )
    if has_default:
        return _DEFAULT_PARTITION
    if lacking:
        return (
            f"index {', '.join(shown(str(n)) for n in lacking)} is missing on some of its "
            f"{count} partitions; create it on each partition and ATTACH it"
        )
    if layout is None:
        return (
            "its partition size is not recorded; run `outbox migrate --table "
            f"{shown_argument(table)} --partition-size N` with its partitions' size"
        )
    return None


async def check(conn: psycopg.AsyncConnection[tuple[object, ...]], table: Table) -> Layout | None:
    """The table's layout (None: plain); ValueError naming why a partitioned table cannot be
    served."""
    row = await fetch_async(conn, _partitioning(table))
    # The layout's table in the table's schema (see `in_schema`).
    layout = (
        await fetch_async(conn, read_layout(in_schema(table, str(row[5]))))
        if row is not None
        else None
    )
    problem = partitioning_problem(row, layout, table)
    if problem:
        raise ValueError(problem)
    if row is None or layout is None:
        return None
    problem = await fetch_async(conn, sequence_problem(table))
    if problem:
        raise ValueError(problem)
    leaves = await fetch_async(conn, read_partitions(table)) or []
    size = layout.partition_size
    first = leaves[0] if leaves else None
    converted = (
        first.high
        if first is not None
        and first.name == table.derived_name("p0")
        and first.low == 0
        and first.high % size == 0
        and first.high > size
        else 0
    )
    numbers = {p.low // size for p in leaves if p.high > converted and p.low % size == 0}
    # Missing from the first partition past the converted table on when it is there (a dead
    # row pins it while those right above it are retired): they lie between two partitions
    # like any other gap, where counted from the lowest one left past it they were named by
    # every reading from the converted table up, and every claim failed on them for good.
    lowest = converted // size if converted else min(numbers, default=0)
    gaps = frozenset(range(lowest, max(numbers))) - numbers if numbers else frozenset()
    named = all(
        p.elsewhere is None
        and p.name == table.derived_name(f"p{p.low // size}")
        and p.low % size == 0
        and p.high - p.low == size
        for p in leaves
        if p.high > converted
    )
    return replace(
        layout, named_leaves=named, converted_below=converted, gaps=gaps, schema=str(row[5])
    )


def upkeep_lock(table: Table) -> sql.Composable:
    """The advisory lock key of a table's partition upkeep: a worker making partitions ahead
    and `outbox maintain` hold it, so that one of them at a time makes or retires them."""
    return table_lock_key(table, "outbox-dispatcher partitions ")


def table_lock_key(table: Table, purpose: str) -> sql.Composable:
    """An advisory lock key of `purpose` for the table, the same however each session names
    it: `outbox` and `public.outbox` are one table, and a worker, an `outbox maintain` and a
    replay given either spelling must meet on one lock. The table's schema and name as the
    catalog holds them; as given while there is no such table yet (a first migrate)."""
    return sql.SQL(
        "hashtextextended({purpose} || coalesce((SELECT quote_ident(n.nspname) || '.' ||"
        " quote_ident(c.relname) FROM pg_class AS c JOIN pg_namespace AS n"
        " ON n.oid = c.relnamespace WHERE c.oid = to_regclass({t})), {given}), 0)"
    ).format(
        purpose=text_constant(purpose),
        t=table.regclass_literal,
        given=text_constant(str(table)),
    )


# A worker tops partitions up once fewer ids than this share of the target are left ahead
# (`outbox maintain` always tops up): partitions then come a quarter of the target at a time,
# not one by one, and a worker started on a table provided for does no DDL. Each ATTACH makes
# every session reload the table's partitions and replan its statements on it: a worker that
# made 30 partitions as it started a drain of 30,000 rows cost the database about 1.9 s of
# CPU for it, against 1.3 s without. The alert (OutboxPartitionsRunningOut) fires below a
# quarter.
TOP_UP_BELOW = 0.75
# Above this share of the target left ahead, a top-up makes one partition a pass and the
# worker's keeper paces its passes (worker.partition_keeper): with 1,000-id partitions, 150
# made back to back in 1.9 s as a worker started a drain of 150,000 rows slowed that drain
# by a quarter. Below it (where the alert fires) producers are near the end of what is made,
# and every partition missing is made at once.
ALL_AT_ONCE_BELOW = 0.25


@dataclass(frozen=True)
class TopUp:
    made: int  # partitions made by this pass
    left: int  # ids left ahead after it
    more: bool  # partitions still missing: the top-up goes on at the next pass


async def keep_ahead(
    conn: psycopg.AsyncConnection[tuple[object, ...]],
    table: Table,
    layout: Layout,
    *,
    topping_up: bool = False,
) -> TopUp:
    """A worker's upkeep: once fewer than TOP_UP_BELOW of the target are left ahead (or
    `topping_up`, a top-up begun by an earlier pass), make the partitions missing, if no
    other session is at it (an advisory lock: one replica at a time, the others skip). One
    partition a pass while more than ALL_AT_ONCE_BELOW of the target is left, else all of
    them. Raises psycopg.errors.InsufficientPrivilege for a role that may not create
    tables."""
    target = layout.partition_size * layout.partitions_ahead
    left = await ids_ahead(conn, table, layout)
    if left >= target * TOP_UP_BELOW and not topping_up:
        return TopUp(0, left, more=False)  # the common pass: two lookups, no lock, no bound
    lock = upkeep_lock(table)
    got = await fetch_async(
        conn, Query(sql.SQL("SELECT pg_try_advisory_lock({l})").format(l=lock), None, _first)
    )
    if not got:
        return TopUp(0, left, more=False)  # another session is at it
    try:
        existing = await fetch_async(conn, read_partitions(table)) or []
        highest = await _last_id(conn, table)
        top = existing[-1].high if existing else 0
        missing = missing_ahead(table, existing, highest, layout)
        if top - 1 - highest >= target * TOP_UP_BELOW and not topping_up:
            missing = []  # topped up meanwhile (`outbox maintain`, another replica)
        now = missing if top - 1 - highest < target * ALL_AT_ONCE_BELOW else missing[:1]
        for index, low, high in now:
            async with conn.transaction():
                for statement in make_partition(table, index, low, high, layout.schema):
                    await conn.execute(statement)
                top = high
        return TopUp(len(now), max(top - 1 - highest, 0), more=len(now) < len(missing))
    finally:
        await conn.execute(sql.SQL("SELECT pg_advisory_unlock({l})").format(l=lock))


async def ids_ahead(
    conn: psycopg.AsyncConnection[tuple[object, ...]], table: Table, layout: Layout | None = None
) -> int:
    """Ids the partitions made take past the highest one given: how far producers are
    from an insert no partition takes."""
    return max(await made_top(conn, table, layout) - 1 - await _last_id(conn, table), 0)


async def made_top(
    conn: psycopg.AsyncConnection[tuple[object, ...]], table: Table, layout: Layout | None = None
) -> int:
    """Past the last id of the highest partition made (0: none): from the partitions' names
    when they say it, else from their bounds."""
    top = await _top_by_name(conn, table, layout) if layout is not None else None
    if top is None:
        existing = await fetch_async(conn, read_partitions(table)) or []
        top = existing[-1].high if existing else 0
    return top


# The highest `<table>_p<k>` attached to the table, read from the partitions' names: reading
# it from their bounds deparses every one (pg_get_expr), about 8 ms on 230 partitions, which
# every replica's keeper paid each pass.
_HIGHEST_NAMED = sql.SQL(
    """SELECT max(substr(c.relname, {skip})::bigint)
  FROM pg_inherits AS i JOIN pg_class AS c ON c.oid = i.inhrelid
 WHERE i.inhparent = {t}::regclass AND starts_with(c.relname, {prefix})
   AND substr(c.relname, {skip}) ~ '^[0-9]+$'"""
)


async def _top_by_name(
    conn: psycopg.AsyncConnection[tuple[object, ...]], table: Table, layout: Layout
) -> int | None:
    """Past the last id of the highest partition, from the names alone, when every
    partition is named as ours (`Layout.named_leaves`) and no name of the table's partitions
    can be cut short to fit PostgreSQL's limit; else None (read the bounds)."""
    prefix, far = f"{table.name}_p", 10**18  # past any index a partition size gives
    if not layout.named_leaves or partition_table(table, far).name != f"{prefix}{far}":
        return None
    statement = _HIGHEST_NAMED.format(
        t=table.regclass_literal,
        prefix=sql.Literal(prefix),
        skip=sql.Literal(len(prefix) + 1),
    )
    highest = await fetch_async(conn, Query(statement, None, _first))
    if not isinstance(highest, int):
        return None  # no partition named so: read the bounds
    return max((highest + 1) * layout.partition_size, layout.converted_below)


def _first(rows: list[Row]) -> object:
    return rows[0][0] if rows else None


# The payload of a replay's NOTIFY (an insert's is empty): workers forget their claim window.
REPLAY_NOTICE = "replay"
# The payload of the NOTIFY a plain table's conversion to this layout sends as it commits
# (outbox.operations.conversion): its workers learn the layout at once.
LAYOUT_NOTICE = "layout"


# A partition's first id and the id past its last, from its bound as pg_get_expr deparses it.
FIRST_ID = r"FROM \('?(-?[0-9]+)"
PAST_ID = r"TO \('?(-?[0-9]+)"


def written_past(oid: sql.Composable, low: sql.Composable, last: sql.Composable) -> sql.Composable:
    """SQL: whether the partition `oid`, whose ids start at `low`, lies wholly past `last`
    (the sequence's last id) and holds a row all the same: one a producer wrote with an id
    of its own. Its file's size says so, exact from the insert on (committed or not), where
    planning such partitions would cost as much as opening them. The one test of it: the
    claims' window (`ClaimWindow.read`) and the snapshot's (outbox.stats.unfinished_window)."""
    return sql.SQL("({low} > {last} AND pg_relation_size({oid}) > 0)").format(
        oid=oid, low=low, last=last
    )
