"""What is named after an outbox table, and what a rename of the table leaves behind.

`ALTER TABLE a RENAME TO b` renames the table alone: its audit log `a_actions`, its
`a_destinations`, its replay counter `a_replays` and its layout record `a_layout` keep the old
name, and so do its indexes (`a_ready`) and partitions (`a_p0`). Every command on `b` then
fails on `b_actions` and the rest, which `outbox migrate` must not make empty: the audit log
would lose its history.

The table's indexes and partitions are tied to it by oid, whatever its name: their names give
the name the table had when they were made (`a_ready` names `a`), the one reliable record of
it. Under that name, and only when no relation holds it now, the old siblings are the table's
to rename; once a new table took the old name, they are that table's.
"""

from __future__ import annotations

from dataclasses import dataclass

import psycopg
from psycopg import sql

from outbox.partitions import range_check_name
from outbox.plumbing.text import counted
from outbox.runner import Query, Row, fetch
from outbox.table import Table, shown

# The objects of their own named after the table: (suffix, the schema version that makes it).
SIBLINGS = (("actions", 2), ("destinations", 4), ("replays", 6), ("layout", 7))
# Made with them, named after the table too: the audit log's index, a partitioned table's id
# sequence. Renamed along, never missed: neither is looked up by name.
_ALONG = ("actions_messages", "id_seq")
# The table's own indexes, made by the first step, whose names tell the old name.
_TELLING_INDEXES = ("ready", "leased", "waiting", "dead")
_INDEXES = (*_TELLING_INDEXES, "aggregate")
_KINDS = {"r": "TABLE", "p": "TABLE", "S": "SEQUENCE", "i": "INDEX", "I": "INDEX"}


@dataclass(frozen=True)
class Rename:
    """One object to rename from the old name's to the table's (a partition's range CHECK
    with it: outbox maintain reads a partition's ids from `<partition>_range`)."""

    kind: str  # TABLE, SEQUENCE, INDEX
    old: str
    new: str
    schema: str | None
    check: bool = False  # a partition: its `<old>_range` CHECK goes to `<new>_range`

    def statements(self) -> list[sql.Composed]:
        old = Table(self.schema, self.old)
        rename = sql.SQL("ALTER {kind} {old} RENAME TO {new}").format(
            kind=sql.SQL(self.kind), old=old.ident, new=sql.Identifier(self.new)
        )
        if not self.check:
            return [rename]
        new = Table(self.schema, self.new)
        return [
            rename,
            sql.SQL("ALTER TABLE {t} RENAME CONSTRAINT {old} TO {new}").format(
                t=new.ident,
                old=sql.Identifier(range_check_name(self.old)),
                new=sql.Identifier(range_check_name(self.new)),
            ),
        ]


@dataclass(frozen=True)
class Found:
    """What the table's catalog says of an old name: the name (None when its indexes name
    none, or several), whether a relation holds that name now, and the renames to make."""

    old_name: str | None
    taken: bool
    renames: list[Rename]


def _owned(table: Table) -> Query[list[Row]]:
    """(name, what: index or partition) of the table's own indexes and partitions."""
    statement = sql.SQL(
        """SELECT c.relname::text, 'index' FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
 WHERE i.indrelid = {t}::regclass
UNION ALL
SELECT c.relname::text, 'partition' FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
 WHERE i.inhparent = {t}::regclass"""
    ).format(t=table.regclass_literal)
    return Query(statement, None, list)


def _kinds(table: Table, names: list[str]) -> Query[list[Row]]:
    """(name, relkind) of those of `names` that exist in the table's schema."""
    statement = sql.SQL(
        """SELECT c.relname::text, c.relkind::text FROM pg_class c
 WHERE c.relnamespace = (SELECT relnamespace FROM pg_class WHERE oid = {t}::regclass)
   AND c.relname = ANY (%(names)s::text[])"""
    ).format(t=table.regclass_literal)
    return Query(statement, {"names": names}, list)


def _old_name(table: Table, indexes: list[str]) -> str | None:
    """The one other name the table's first indexes were made under, or None."""
    names = set()
    for index in indexes:
        for suffix in _TELLING_INDEXES:
            name = index.removesuffix(f"_{suffix}")
            if name != index and Table(table.schema, name).derived_name(suffix) == index:
                names.add(name)
    names.discard(table.name)
    return names.pop() if len(names) == 1 else None


def look(conn: psycopg.Connection[tuple[object, ...]], table: Table) -> Found:
    """The old name's objects the table should hold under its own name: those tied to it
    (its indexes, its partitions) always, the siblings of their own only while no relation
    holds the old name. A rename is planned only where the new name is free."""
    owned = fetch(conn, _owned(table))
    old_name = _old_name(table, [str(name) for name, what in owned if what == "index"])
    if old_name is None:
        return Found(None, False, [])
    old = Table(table.schema, old_name)
    pairs: list[tuple[str, str, bool]] = []  # (old, new, a partition)
    for name, what in owned:
        for suffix in _INDEXES if what == "index" else ():
            if name == old.derived_name(suffix):
                pairs.append((str(name), table.derived_name(suffix), False))
        if what == "partition" and str(name).startswith(f"{old_name}_p"):
            index = str(name).removeprefix(f"{old_name}_p")
            if index.isdigit() and old.derived_name(f"p{int(index)}") == name:
                pairs.append((str(name), table.derived_name(f"p{int(index)}"), True))
    standalone = [(old.derived_name(s), table.derived_name(s)) for s, _ in SIBLINGS]
    standalone += [(old.derived_name(s), table.derived_name(s)) for s in _ALONG]
    names = [old_name, *(n for pair in standalone + [p[:2] for p in pairs] for n in pair)]
    kinds = {str(name): str(kind) for name, kind in fetch(conn, _kinds(table, names))}
    taken = old_name in kinds
    if not taken:
        pairs += [(o, n, False) for o, n in standalone if o in kinds]
    renames = [
        Rename(_KINDS.get(kinds[o], "TABLE"), o, n, table.schema, check)
        for o, n, check in pairs
        if o in kinds and n not in kinds
    ]
    return Found(old_name, taken, renames)


def missing(conn: psycopg.Connection[tuple[object, ...]], table: Table, version: int) -> list[str]:
    """The siblings a table at `version` has and this one lacks."""
    wanted = [table.derived_name(s) for s, made_at in SIBLINGS if made_at <= version]
    there = {str(name) for name, _ in fetch(conn, _kinds(table, wanted))}
    return [name for name in wanted if name not in there]


def renamed_text(found: Found) -> str:
    """What the renames did, in one phrase for `outbox migrate`'s line: the siblings by name,
    the indexes, sequences and partitions that came along counted."""
    assert found.old_name is not None
    old = Table(found.renames[0].schema if found.renames else None, found.old_name)
    named = {old.derived_name(suffix) for suffix, _ in SIBLINGS}
    own = [f"{shown(r.old)} to {shown(r.new)}" for r in found.renames if r.old in named]
    along = [r for r in found.renames if r.old not in named]
    counts = [
        counted(n, noun, plural)
        for n, noun, plural in (
            (sum(r.kind == "INDEX" for r in along), "index", "indexes"),
            (sum(r.kind == "SEQUENCE" for r in along), "sequence", None),
            (sum(r.check for r in along), "partition", None),
        )
        if n
    ]
    return f"renamed what it had as {shown(found.old_name)}: " + ", ".join(
        [*own, *([f"with {_listed(counts)}"] if counts else [])]
    )


def _listed(items: list[str]) -> str:
    return " and ".join([", ".join(items[:-1]), items[-1]] if len(items) > 1 else items)


def refusal(table: Table, lacking: list[str]) -> str:
    """Why `outbox migrate` stops on a table that lacks siblings and whose indexes name no
    old name: one line with the statements that bring them back (the old name left to fill
    in), since making them empty would lose what they hold."""
    suffix = {table.derived_name(s): s for s, _ in SIBLINGS}
    statements = "; ".join(
        f"ALTER {'SEQUENCE' if suffix[name] == 'replays' else 'TABLE'} "
        f"{_shown(table, '<old name>_' + suffix[name])} RENAME TO {_shown(table, name)}"
        for name in lacking
    )
    return (
        f"table {shown(table)} lacks {', '.join(map(shown, lacking))}, which its schema version "
        "has, and its indexes name no other name it had; if it was renamed, rename its old "
        f"name's to these, then run this again: {statements}"
    )


def _shown(table: Table, name: str) -> str:
    return sql.Identifier(*((table.schema, name) if table.schema else (name,))).as_string(None)
