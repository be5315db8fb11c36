"""The outbox table's schema, its versioned migrations, and the checks run before using a table.

The schema version is kept in the table's comment (`outbox-dispatcher schema vN`), so one
database can hold several outbox tables, each at its own version, with no extra objects.
Migrations run under a transaction-scoped advisory lock so that many replicas may run
`outbox migrate` at start-up at the same time.
"""

from __future__ import annotations

import itertools
import re
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from functools import partial

import psycopg
from psycopg import sql

from outbox import destinations, partitions, siblings
from outbox.plumbing.errors import SchemaError as SchemaError
from outbox.plumbing.text import counted
from outbox.runner import Query, Row, fetch, fetch_async, first_row, perform
from outbox.table import Table, shown, shown_argument, text_constant

SCHEMA_VERSION = 7
# The table comment that says it is an outbox table, and at which version (a regular
# expression Python and PostgreSQL read alike).
VERSION_COMMENT = r"^outbox-dispatcher schema v(\d+)$"
_VERSION_COMMENT = re.compile(VERSION_COMMENT)

# What `migrate` changed beyond the version steps, one phrase each, for the line `outbox
# migrate` prints (`noting_changes`): a table at the current version may still have had its
# index built, its layout recorded, partitions made. Collected aside, not returned, because
# the command reaches `migrate` through the conversion (outbox.operations.conversion), which
# returns the versions only.
_CHANGES: ContextVar[list[str] | None] = ContextVar("outbox_migrate_changes", default=None)
# Where a long `migrate` tells how far it is meanwhile (thousands of partitions made ahead
# take minutes): a line to standard error within `noting_changes`, nothing outside it.
_PROGRESS: ContextVar[Callable[[str], None] | None] = ContextVar(
    "outbox_migrate_progress", default=None
)


def _to_stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


@contextmanager
def noting_changes(progress: Callable[[str], None] | None = _to_stderr) -> Iterator[list[str]]:
    """The changes the `migrate` calls made within, in order (committed once they return);
    `progress` hears a line now and then while a long one runs."""
    changes: list[str] = []
    token = _CHANGES.set(changes)
    told = _PROGRESS.set(progress)
    try:
        yield changes
    finally:
        _PROGRESS.reset(told)
        _CHANGES.reset(token)


def _changed(phrase: str) -> None:
    changes = _CHANGES.get()
    if changes is not None:
        changes.append(phrase)


# The columns every component relies on: a contract. Extra columns are allowed.
REQUIRED_COLUMNS = (
    "id",
    "aggregate_type",
    "aggregate_id",
    "event_type",
    "payload",
    "created_at",
    "status",
    "available_at",
    "attempts",
    "lease_owner",
    "lease_until",
    "lease_version",
    "last_error",
    "done_at",
)


# What each column must be for the statements in outbox/queries.py and outbox/producer.py
# to work: (type as format_type() spells it, NOT NULL, has a default the producer relies on).
# A table adopted or used with anything else would fail every claim or insert, for ever.
COLUMN_SHAPES: dict[str, tuple[str, bool, bool]] = {
    "id": ("bigint", True, True),  # the default: an identity (or a sequence)
    "aggregate_type": ("text", True, False),
    "aggregate_id": ("text", True, False),
    "event_type": ("text", True, False),
    "payload": ("jsonb", True, False),
    "created_at": ("timestamp with time zone", True, True),
    "status": ("text", True, True),
    "available_at": ("timestamp with time zone", True, True),
    "attempts": ("integer", True, True),
    "lease_owner": ("text", False, False),
    "lease_until": ("timestamp with time zone", False, False),
    "lease_version": ("bigint", True, True),
    "last_error": ("text", False, False),
    "done_at": ("timestamp with time zone", False, False),
}
assert tuple(COLUMN_SHAPES) == REQUIRED_COLUMNS

# Columns the later migration steps add: a hand-made table adopted by `outbox migrate` need
# not have them (migrate adds them), but a migrated table in use must.
ADDED_COLUMNS: dict[str, tuple[str, bool, bool]] = {
    "errors": ("jsonb", False, False),  # v3
    "headers": ("jsonb", False, False),  # v4
    "replay": ("integer", False, False),  # v6
}


# Every column but the id, as v1 creates them (a partitioned table's parent has the same).
_COLUMNS_AFTER_ID = sql.SQL(
    """    aggregate_type text        NOT NULL,
    aggregate_id   text        NOT NULL,
    event_type     text        NOT NULL,
    payload        jsonb       NOT NULL,
    created_at     timestamptz NOT NULL DEFAULT now(),
    -- dispatcher state: see docs/protocol.md
    status         text        NOT NULL DEFAULT 'pending'
                   CHECK (status IN ('pending', 'processing', 'done', 'dead')),
    available_at   timestamptz NOT NULL DEFAULT now(),
    attempts       integer     NOT NULL DEFAULT 0,
    lease_owner    text,
    lease_until    timestamptz,
    lease_version  bigint      NOT NULL DEFAULT 0,
    last_error     text,
    done_at        timestamptz"""
)


def _v1(table: Table) -> list[sql.Composed]:
    t = table.ident
    return [
        *table.create_schema(),
        sql.SQL(
            """CREATE TABLE IF NOT EXISTS {t} (
    id             bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
{columns}
)"""
        ).format(t=t, columns=_COLUMNS_AFTER_ID),
        # The claim walks this index in order: ready rows first, oldest availability first.
        sql.SQL(
            "CREATE INDEX IF NOT EXISTS {i} ON {t} (available_at, id) WHERE status = 'pending'"
        ).format(i=table.index_name("ready"), t=t),
        # Reaping, re-claiming and counting expired leases.
        sql.SQL(
            "CREATE INDEX IF NOT EXISTS {i} ON {t} (lease_until) WHERE status = 'processing'"
        ).format(i=table.index_name("leased"), t=t),
        # Ordered mode's index is not a step: it follows `ordering` (see ordering_statements).
        # The oldest waiting message (the autoscaling signal) and the attempts distribution.
        sql.SQL(
            "CREATE INDEX IF NOT EXISTS {i} ON {t} (id) WHERE status IN ('pending', 'processing')"
        ).format(i=table.index_name("waiting"), t=t),
        # Dead letters: counted and listed newest first without touching done rows.
        sql.SQL("CREATE INDEX IF NOT EXISTS {i} ON {t} (id) WHERE status = 'dead'").format(
            i=table.index_name("dead"), t=t
        ),
        *notify_trigger_statements(table),
    ]


# The notify function's body, as every version has made it: what tells the project's NOTIFY
# triggers from others whatever their names (a renamed table keeps the trigger and the
# function of its old name, which notify the old name's channel).
_NOTIFY_BODY = """
BEGIN
    PERFORM pg_notify(TG_ARGV[0], '');
    RETURN NULL;
END
"""
# pg_trigger.tgtype of AFTER INSERT FOR EACH STATEMENT: the INSERT bit alone (no ROW, no BEFORE).
_AFTER_INSERT_STATEMENT = 4


def notify_trigger_statements(table: Table) -> list[sql.Composed]:
    """One notification per inserting statement wakes idle workers; polling stays the
    fallback. On a partitioned table the trigger is the parent's (a statement trigger fires
    on the table the statement names)."""
    return [
        sql.SQL(
            "CREATE OR REPLACE FUNCTION {f}() RETURNS trigger LANGUAGE plpgsql AS $$"
            + _NOTIFY_BODY
            + "$$"
        ).format(f=table.sibling("notify")),
        _notify_trigger(table),
    ]


def _notify_trigger(table: Table) -> sql.Composed:
    """The trigger, notifying the table's channel as `Table.channel_sql` finds it when the
    statement runs (one for every spelling of the table): a trigger's argument is a
    constant, so the statement is made and run by a DO block."""
    create = sql.SQL(
        "CREATE OR REPLACE TRIGGER {trg} AFTER INSERT ON {t} "
        "FOR EACH STATEMENT EXECUTE FUNCTION {f}"
    ).format(
        trg=sql.Identifier(_notify_trigger_name(table)),
        t=table.ident,
        f=table.sibling("notify"),
    )
    # format()'s template: the channel its %L, every other % doubled.
    template = create.as_string(None).replace("%", "%%") + "(%L)"
    body = sql.SQL("BEGIN\n  EXECUTE format({template},\n    {channel});\nEND").format(
        template=sql.Literal(template), channel=table.channel_sql
    )
    text = body.as_string(None)
    # Dollar-quoted, so that `outbox migrate --print` shows the body as it runs, not with
    # every quote doubled; the tag is one the body (a table's name) does not hold.
    tag = next(t for n in itertools.count() if (t := f"$trigger{n or ''}$") not in text)
    return sql.SQL("DO {tag}\n{body}\n{tag}").format(tag=sql.SQL(tag), body=sql.SQL(text))


def _notify_trigger_name(table: Table) -> str:
    return f"{table.name}_notify"


def _notify_triggers(table: Table) -> Query[list[Row]]:
    """The project's NOTIFY triggers on the table, found by what they are, not by name: after
    each inserting statement, the notify function (its body). (Trigger name, function oid,
    whether it is the one this name makes: its trigger name, its function, its channel),
    that one first. The function run by another kind of trigger is someone's own use."""
    function = Table(table.schema, table.derived_name("notify")).regclass_literal
    statement = sql.SQL(
        """SELECT t.tgname::text, t.tgfoid::bigint,
       coalesce(t.tgname = {name}::name AND t.tgfoid = to_regprocedure({f} || '()')
                AND t.tgnargs = 1 AND t.tgargs = convert_to({channel}, getdatabaseencoding())
                                                 || decode('00', 'hex'),
                false)
  FROM pg_trigger t JOIN pg_proc p ON p.oid = t.tgfoid
  JOIN pg_language l ON l.oid = p.prolang AND l.lanname = 'plpgsql'
 WHERE t.tgrelid = {t}::regclass AND NOT t.tgisinternal AND t.tgtype = {type}
   AND p.prosrc = {body}
 ORDER BY 3 DESC, 1"""
    ).format(
        name=text_constant(_notify_trigger_name(table)),
        f=function,
        type=sql.Literal(_AFTER_INSERT_STATEMENT),
        channel=table.channel_sql,
        t=table.regclass_literal,
        body=sql.Literal(_NOTIFY_BODY),
    )
    return Query(statement, None, list)


def _unused_notify_functions(oids: list[int]) -> Query[list[Row]]:
    """Of these notify functions, those no object uses any more and the role may drop:
    (schema, name)."""
    statement = sql.SQL(
        """SELECT n.nspname::text, p.proname::text
  FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
 WHERE p.oid = ANY (%(oids)s::oid[]) AND pg_has_role(p.proowner, 'USAGE')
   AND NOT EXISTS (SELECT FROM pg_depend d
                    WHERE d.refclassid = 'pg_proc'::regclass AND d.refobjid = p.oid)"""
    ).format()
    return Query(statement, {"oids": oids}, list)


def _keep_one_notify_trigger(conn: psycopg.Connection[tuple[object, ...]], table: Table) -> None:
    """Leave on the table exactly one of the project's NOTIFY triggers: the one its name
    makes, on its channel. A table renamed since its migration keeps the trigger of its old
    name, which notifies the old channel (its workers are never woken), and an adopted one
    would notify twice. The triggers and functions are touched only when wrong: creating or
    dropping a trigger takes a lock that blocks inserts, and every replica may run the
    migration at start-up. A notify function left unused by that goes too."""
    found = fetch(conn, _notify_triggers(table))
    kept = 1 if found and found[0][2] else 0
    wrong = found[kept:]
    if wrong or not kept:
        instead = f" in place of {', '.join(shown(str(row[0])) for row in wrong)}" if wrong else ""
        _changed(f"made the NOTIFY trigger {shown(_notify_trigger_name(table))}{instead}")
    for name, _, _ in wrong:
        conn.execute(
            sql.SQL("DROP TRIGGER {trg} ON {t}").format(
                trg=sql.Identifier(str(name)), t=table.ident
            )
        )
    if not kept:
        for statement in notify_trigger_statements(table):
            conn.execute(statement)
    if wrong:
        unused = fetch(conn, _unused_notify_functions([int(str(row[1])) for row in wrong]))
        for schema, function in unused:
            conn.execute(
                sql.SQL("DROP FUNCTION {f}()").format(f=sql.Identifier(str(schema), str(function)))
            )


def _v2(table: Table) -> list[sql.Composed]:
    """The audit log of operator actions (requeue, skip), named after the outbox table.

    Kept in the database so the history survives the terminal that made it; see
    docs/tui.md. `message_ids` holds the rows an action actually changed.
    """
    actions = table.sibling("actions")
    return [
        sql.SQL(
            """CREATE TABLE IF NOT EXISTS {a} (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at          timestamptz NOT NULL DEFAULT now(),
    actor       text        NOT NULL DEFAULT current_user,
    db_user     text        NOT NULL DEFAULT current_user,
    action      text        NOT NULL,
    message_ids bigint[]    NOT NULL DEFAULT '{{}}',
    filter      jsonb,
    requested   integer     NOT NULL DEFAULT 0,
    count       integer     NOT NULL DEFAULT 0
)"""
        ).format(a=actions),
        # A message's history is `message_ids @> ARRAY[id]`: one GIN probe however long the log.
        sql.SQL("CREATE INDEX IF NOT EXISTS {i} ON {a} USING gin (message_ids)").format(
            i=table.index_name("actions_messages"), a=actions
        ),
    ]


def _v3(table: Table) -> list[sql.Composed]:
    """Every failed attempt's error, with its time and attempt number, newest last and
    bounded (outbox.queries.ERROR_HISTORY): written by the statement that records the
    failure, NULL for a message that never failed. Adding a column without a default is a
    catalog change only: no table rewrite."""
    return [sql.SQL("ALTER TABLE {t} ADD COLUMN IF NOT EXISTS errors jsonb").format(t=table.ident)]


def _v4(table: Table) -> list[sql.Composed]:
    """Destination health shared by every replica (outbox.destinations: the breaker, pauses,
    rate tokens), and `headers`, the metadata a producer adds to a message. The column has
    no default: a catalog change only, no rewrite, no long lock."""
    return [
        *destinations.create_statements(table),
        sql.SQL("ALTER TABLE {t} ADD COLUMN IF NOT EXISTS headers jsonb").format(t=table.ident),
    ]


def _v5(table: Table) -> list[sql.Composed]:
    """Which destinations the running workers serve (outbox.destinations: `served_at`,
    `served_by`, stamped by each worker), so that a destination no worker serves any more
    (its URL changed, its dispatcher is gone) is told apart from one that is down."""
    return destinations.serving_statements(table)


def _v6(table: Table) -> list[sql.Composed]:
    """Replays (outbox.operations.replay): `replay`, the number of the last replay that sent the row
    again (NULL for a row never replayed), which travels as the `Outbox-Replay` header; and
    the per-table counter that numbers replays 1, 2, ... A column without a default is a
    catalog change only: no rewrite, no long lock."""
    return [
        sql.SQL("ALTER TABLE {t} ADD COLUMN IF NOT EXISTS replay integer").format(t=table.ident),
        sql.SQL("CREATE SEQUENCE IF NOT EXISTS {s} AS integer").format(s=table.sibling("replays")),
    ]


def _v7(table: Table) -> list[sql.Composed]:
    """The record of a partitioned layout (outbox.partitions): one row holding the partition
    size and how many partitions are kept ahead, none for a plain table."""
    return partitions.layout_statements(table)


# How workers may order their claims: a table serves "aggregate" only with its ordering index.
ORDERINGS = ("none", "aggregate")
_ORDERING_INDEX = "aggregate"  # the index's name is the table's, with this suffix


def _ordering_index_name(table: Table) -> str:
    return table.derived_name(_ORDERING_INDEX)


def ordering_statements(table: Table, ordering: str | None) -> list[sql.Composed]:
    """What makes the table serve `ordering`, as `outbox migrate --print` shows it; None
    keeps the table as it is.

    Ordered mode asks "has this aggregate an unfinished earlier message?": one probe of this
    index, however many done rows the aggregate has. Every claim writes an entry in it (a
    claimed row is not done), time and WAL an unordered claim would spend for nothing (what
    it measured to: docs/protocol.md): so only a table whose workers order has it. Built
    in the migration's transaction: on a table that already holds many rows this blocks
    inserts while it reads the table (docs/protocol.md says how to build it concurrently).
    """
    if ordering is None:
        return []
    if ordering not in ORDERINGS:
        raise ValueError(f"{ordering!r} is not an ordering (use {' or '.join(ORDERINGS)})")
    if ordering == "none":
        return [_drop_ordering_index(table)]
    return [
        sql.SQL(
            "CREATE INDEX IF NOT EXISTS {i} ON {t} (aggregate_id, id) WHERE status <> 'done'"
        ).format(i=table.index_name(_ORDERING_INDEX), t=table.ident)
    ]


def _drop_ordering_index(table: Table) -> sql.Composed:
    return sql.SQL("DROP INDEX IF EXISTS {i}").format(i=table.sibling(_ORDERING_INDEX))


# What an index of that name on the table is: ours and usable; ours but invalid (what a failed
# CREATE INDEX CONCURRENTLY leaves, or one still running: present, never used); another
# index that took the name; or absent (None).
_USABLE, _INVALID, _OTHER = "usable", "invalid", "other"


def _ordering_index(table: Table) -> Query[str | None]:
    statement = sql.SQL(
        """SELECT i.indisvalid,
       am.amname = 'btree' AND NOT i.indisunique AND i.indexprs IS NULL
       AND ARRAY(SELECT a.attname::text
                   FROM unnest(i.indkey::int2[]) WITH ORDINALITY AS k(attnum, n)
                   JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum
                  ORDER BY k.n) = ARRAY['aggregate_id', 'id']
       AND pg_get_expr(i.indpred, i.indrelid) = {predicate}
  FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid JOIN pg_am am ON am.oid = c.relam
 WHERE i.indrelid = {t}::regclass AND c.relname = {name}"""
    ).format(
        t=table.regclass_literal,
        name=text_constant(_ordering_index_name(table)),
        predicate=sql.Literal("(status <> 'done'::text)"),
    )
    return Query(statement, None, first_row(_parse_ordering_index))


def _parse_ordering_index(row: Row | None) -> str | None:
    if row is None:
        return None
    valid, ours = row
    return _OTHER if not ours else _USABLE if valid else _INVALID


async def serves_ordering(conn: psycopg.AsyncConnection[tuple[object, ...]], table: Table) -> bool:
    """Whether the table has a usable ordering index (ordered mode's queries need it)."""
    return await fetch_async(conn, _ordering_index(table)) == _USABLE


def orderings(conn: psycopg.Connection[tuple[object, ...]], table: Table) -> tuple[str, ...]:
    """The orderings the table serves as it is now."""
    usable = fetch(conn, _ordering_index(table)) == _USABLE
    return ORDERINGS if usable else ORDERINGS[:1]


def _serve_ordering(
    conn: psycopg.Connection[tuple[object, ...]], table: Table, ordering: str
) -> None:
    """Build or drop ordered mode's index, touching the table only when that changes
    something: even `CREATE INDEX IF NOT EXISTS` takes a lock that blocks inserts, and every
    replica may run the migration at start-up."""
    name = _ordering_index_name(table)
    state = fetch(conn, _ordering_index(table))
    if state == _OTHER:
        if ordering == "none":
            return  # not ours to drop
        raise SchemaError(
            f"index {shown(name)} on {shown(table)} is not ordered mode's ((aggregate_id, id) "
            "WHERE status <> 'done'); drop or rename it, then run this again"
        )
    if ordering == "none":
        if state is not None:
            conn.execute(_drop_ordering_index(table))
            _changed(f"dropped ordered mode's index {shown(name)}")
        return
    if state == _USABLE:
        return
    if state == _INVALID:
        building = conn.execute(
            sql.SQL(
                "SELECT EXISTS (SELECT 1 FROM pg_stat_progress_create_index "
                "WHERE relid = {t}::regclass)"
            ).format(t=table.regclass_literal)
        ).fetchone()
        if building == (True,):
            raise SchemaError(
                f"index {shown(name)} on {shown(table)} is being built (a CREATE INDEX "
                "CONCURRENTLY?); run this again once that has ended"
            )
        conn.execute(_drop_ordering_index(table))  # left by a failed build: IF NOT EXISTS keeps it
    for statement in ordering_statements(table, ordering):
        conn.execute(statement)
    if fetch(conn, _ordering_index(table)) != _USABLE:  # the name is another relation's
        raise SchemaError(
            f"could not build index {shown(name)} on {shown(table)}: another relation in its "
            "schema has that name; rename it, then run this again"
        )
    again = " again (it was invalid)" if state == _INVALID else ""
    _changed(f"built ordered mode's index {shown(name)}{again}")


# Index i holds the statements that bring a table from version i to version i + 1.
# A released step is never edited in what it leaves behind, so a table at vN upgrades in place
# by running the later steps. v1 once built ordered mode's index too: that index is now an
# option a table at any version takes or leaves (ordering_statements), and a table built with
# it keeps it until told otherwise.
MIGRATIONS: list[Callable[[Table], list[sql.Composed]]] = [_v1, _v2, _v3, _v4, _v5, _v6, _v7]
assert len(MIGRATIONS) == SCHEMA_VERSION


def migration_statements(
    table: Table, from_version: int = 0, ordering: str | None = None
) -> list[sql.Composed]:
    """The steps from `from_version` on, then what makes the table serve `ordering`."""
    statements: list[sql.Composed] = []
    for version in range(from_version, SCHEMA_VERSION):
        statements.extend(MIGRATIONS[version](table))
        statements.append(
            sql.SQL("COMMENT ON TABLE {t} IS {c}").format(
                t=table.ident, c=sql.Literal(f"outbox-dispatcher schema v{version + 1}")
            )
        )
    return [*statements, *ordering_statements(table, ordering)]


def render_migration(
    table: Table, ordering: str | None = None, layout: partitions.Layout | None = None
) -> str:
    """The full migration of a new table as SQL text, for `outbox migrate --print` and for
    review; with `layout`, partitioned, with its first partitions."""
    statements = migration_statements(table, ordering=ordering)
    if layout is not None:
        parent = partitions.partitioned_parent(table, _COLUMNS_AFTER_ID)
        ahead = [
            statement
            for index, low, high in partitions.missing_ahead(table, [], 0, layout)
            for statement in partitions.make_partition(table, index, low, high)
        ]
        statements = [
            *table.create_schema(),
            *parent,
            *statements,
            partitions.record_layout(table, layout),
            *ahead,
        ]
    text = "".join(f"{stmt.as_string(None)};\n\n" for stmt in statements)
    if layout is None:
        return text
    # The conversion of an existing plain table depends on what the table holds (its highest
    # id, its indexes, its grants), so only the command itself, connected, can do it.
    return (
        f"-- A new partitioned table. This SQL does not convert an existing plain {shown(table)}:\n"
        "-- `outbox migrate --partition-size N` does that itself, online (docs/partitioning.md)"
        ".\n\n" + text
    )


def _state(table: Table) -> Query[tuple[bool, int | None]]:
    statement = sql.SQL(
        "SELECT to_regclass({t}) IS NOT NULL, obj_description(to_regclass({t}), 'pg_class')"
    ).format(t=table.regclass_literal)
    return Query(statement, None, first_row(_parse_state))


def _parse_state(row: Row | None) -> tuple[bool, int | None]:
    """(exists, version) where version is None for a table without our comment."""
    assert row is not None
    if not row[0]:
        return False, None
    match = _VERSION_COMMENT.match(str(row[1] or ""))
    return True, int(match.group(1)) if match else None


def _columns(table: Table) -> Query[list[Row]]:
    """(name, type, NOT NULL, has a default) of every column."""
    statement = sql.SQL(
        "SELECT attname, format_type(atttypid, atttypmod), attnotnull, "
        "attidentity <> '' OR atthasdef FROM pg_attribute WHERE attrelid = {t}::regclass "
        "AND attnum > 0 AND NOT attisdropped"
    ).format(t=table.regclass_literal)
    return Query(statement, None, list)


def _missing(rows: list[tuple[object, ...]], *, migrated: bool = False) -> list[str]:
    present = {str(row[0]) for row in rows}
    wanted = [*REQUIRED_COLUMNS, *ADDED_COLUMNS] if migrated else REQUIRED_COLUMNS
    return [column for column in wanted if column not in present]


def _misshapen(rows: list[tuple[object, ...]]) -> list[str]:
    """What is wrong with the required columns that exist, one phrase each."""
    shapes = {**COLUMN_SHAPES, **ADDED_COLUMNS}
    problems = []
    for name, type_, not_null, has_default in rows:
        if name not in shapes:
            continue  # extra columns are the application's business
        want_type, want_not_null, want_default = shapes[str(name)]
        if type_ != want_type:
            problems.append(f"{name} is {type_} (expected {want_type})")
        if want_not_null and not not_null:
            problems.append(f"{name} allows NULL")
        if want_default and not has_default:
            problems.append(
                f"{name} is not an identity column" if name == "id" else f"{name} has no default"
            )
    return problems


def shape_problems(rows: list[tuple[object, ...]]) -> str | None:
    """One line saying why a table cannot serve as an outbox table, or None if it can."""
    missing = _missing(rows)
    if missing:
        return f"missing columns: {', '.join(missing)}"
    misshapen = _misshapen(rows)
    return f"wrong columns: {'; '.join(misshapen)}" if misshapen else None


def migrate(
    conn: psycopg.Connection[tuple[object, ...]],
    table: Table,
    ordering: str | None = None,
    *,
    layout: partitions.Layout | None = None,
) -> tuple[int, int]:
    """Bring the table to SCHEMA_VERSION; returns (version before, version after).

    `ordering` "aggregate" builds ordered mode's index, "none" drops it, None leaves the
    table as it is (a new table then serves unordered workers only). Safe to run
    concurrently and repeatedly. Refuses a table newer than this code and a table of the
    right name but the wrong shape.

    `layout` creates a new table partitioned by range of id (outbox.partitions) with its
    partitions ahead, or, for a table partitioned already, records a new number ahead and
    makes what is missing. A plain table is refused: converting it online takes several
    transactions (outbox.operations.conversion).
    """
    with conn.transaction():
        conn.execute(
            "SELECT pg_advisory_xact_lock(hashtextextended('outbox-dispatcher migrate', 0))"
        )
        if layout is not None:
            # Partitions are made below: one session at a time with the workers' keepers and
            # `outbox maintain` (two making the same one fail on its name), taken before any
            # DDL on the table, which a keeper's ATTACH would wait behind.
            conn.execute(
                sql.SQL("SELECT pg_advisory_xact_lock({key})").format(
                    key=partitions.upkeep_lock(table)
                )
            )
        exists, version = fetch(conn, _state(table))
        if exists and version is None:
            problems = shape_problems(fetch(conn, _columns(table)))
            if problems:
                raise SchemaError(
                    f"table {shown(table)} exists but is not an outbox table ({problems})"
                )
            version = 0  # adopt a hand-made table of the right shape: every step is idempotent
        current = version or 0
        if layout is not None:
            if not exists:
                for statement in table.create_schema():
                    conn.execute(statement)
                for statement in partitions.partitioned_parent(table, _COLUMNS_AFTER_ID):
                    conn.execute(statement)
            elif fetch(conn, partitions.read_partitions(table)) is None:
                raise SchemaError(
                    f"table {shown(table)} exists and is not partitioned; `outbox migrate "
                    "--partition-size` converts it (outbox.operations.conversion)"
                )
        if current > SCHEMA_VERSION:
            raise SchemaError(
                f"table {shown(table)} is at schema v{current}, newer than this outbox-dispatcher "
                f"supports (v{SCHEMA_VERSION}); upgrade outbox-dispatcher"
            )
        if exists:
            _keep_siblings(conn, table, current)
            for moved in perform(conn, partitions.move_home(table)):
                _changed(f"moved partition {shown(moved)} into the table's schema")
        for statement in migration_statements(table, current):
            conn.execute(statement)
        _keep_one_notify_trigger(conn, table)
        if ordering is not None:
            _serve_ordering(conn, table, ordering)
        if layout is not None:
            # The layout's table in the table's schema, whatever the search_path reaches
            # first (see `partitions.in_schema`).
            home = partitions.in_schema(table, fetch(conn, partitions.home_schema(table)))
            recorded = fetch(conn, partitions.read_layout(home))
            if recorded is not None and recorded.partition_size != layout.partition_size:
                raise SchemaError(
                    f"table {shown(table)} has partitions of {recorded.partition_size} ids; "
                    f"--partition-size {layout.partition_size} cannot change that"
                )
            if recorded != layout:
                conn.execute(partitions.record_layout(home, layout))
                was = f" (was {recorded.partitions_ahead})" if recorded is not None else ""
                _changed(
                    f"recorded the layout: partitions of {layout.partition_size} ids, "
                    f"{layout.partitions_ahead} kept ahead{was}"
                )
            # A new table's first partition with the rest (it takes inserts from the
            # commit on); those ahead each in a transaction of its own, below.
            made = partitions.make_first(conn, table, layout)
    if layout is not None:
        made += partitions.make_ahead_apart(conn, table, layout, partial(_making, table))
        if made:
            _changed(f"made {counted(made, 'partition')} ahead")
    return current, SCHEMA_VERSION


def _making(table: Table, made: int, of: int) -> None:
    progress = _PROGRESS.get()
    if progress is not None:
        progress(f"{shown(table)}: made {made} of {of} partitions ahead")


def _keep_siblings(
    conn: psycopg.Connection[tuple[object, ...]], table: Table, version: int
) -> None:
    """Give the table back what it had under an old name (outbox.siblings): a table renamed
    since its migration finds its audit log, destinations, replay counter and layout under
    the old name, and later commands would fail without them. Where its indexes name no old
    name, it is refused; where the old name's are not its own (a table took that name again,
    or they are gone), they are made anew: there is no history of its to keep."""
    found = siblings.look(conn, table)
    for rename in found.renames:
        for statement in rename.statements():
            conn.execute(statement)
    if found.renames:
        _changed(siblings.renamed_text(found))
    lacking = siblings.missing(conn, table, version)
    if not lacking:
        return
    if found.old_name is None:
        raise SchemaError(siblings.refusal(table, lacking))
    for step in MIGRATIONS[1:version]:  # idempotent: they make what is missing, nothing else
        for statement in step(table):
            conn.execute(statement)
    old = found.old_name
    why = (
        f"those named {shown(old)} serve the table of that name now"
        if found.taken
        else f"none left under {shown(old)}"
    )
    _changed(f"made {', '.join(map(shown, lacking))} anew ({why})")


async def check_table(
    conn: psycopg.AsyncConnection[tuple[object, ...]], table: Table, *, ordered: bool = False
) -> partitions.Layout | None:
    """Raise SchemaError unless the table exists at a version this code can use, and, when
    `ordered`, has the index ordered mode's every claim probes (without it each claim would
    read every unfinished row). A partitioned table must be one its statements can address
    partition by partition; its layout is returned (None for a plain table)."""
    exists, version = await fetch_async(conn, _state(table))
    if not exists:
        raise SchemaError(
            f"table {shown(table)} does not exist; run `outbox migrate --table "
            f"{shown_argument(table)}`"
        )
    if version is None:
        raise SchemaError(f"table {shown(table)} was not created by `outbox migrate`; run it first")
    if version != SCHEMA_VERSION:
        raise SchemaError(
            f"table {shown(table)} is at schema v{version}, this outbox-dispatcher needs "
            f"v{SCHEMA_VERSION}; run `outbox migrate` with the newer of the two"
        )
    # The comment says "ours", but a column may have been dropped or altered since: every
    # claim would then fail, retried for ever. Refuse it here, naming what is wrong.
    rows = await fetch_async(conn, _columns(table))
    missing = _missing(rows, migrated=True)
    if missing:
        raise SchemaError(f"table {shown(table)} lacks required columns: {', '.join(missing)}")
    misshapen = _misshapen(rows)
    if misshapen:
        raise SchemaError(f"table {shown(table)} has wrong columns: {'; '.join(misshapen)}")
    try:
        layout = await partitions.check(conn, table)
    except ValueError as exc:
        raise SchemaError(f"table {shown(table)} cannot be served: {exc}") from None
    if ordered:
        state = await fetch_async(conn, _ordering_index(table))
        if state != _USABLE:
            what = {None: "no index", _INVALID: "no valid index", _OTHER: "another index as"}
            raise SchemaError(
                f"table {shown(table)} has {what[state]} {shown(_ordering_index_name(table))}, "
                "which --ordering aggregate needs; run `outbox migrate --table "
                f"{shown_argument(table)} --ordering aggregate`"
            )
    return layout
