"""Which partitions a worker's role may not use, and what fixes it, in words.

The claims, finalizes and window readings name partitions themselves (outbox.partitions),
and a grant on a partitioned table covers only what goes through it: a partition made
without the parent's grants (by hand, or by a role that is not the table's owner, outside
`outbox maintain`) refuses the worker whatever the parent grants, and PostgreSQL's error
says only `permission denied for table <partition>`. `outbox maintain` carries the parent's
grants to every partition (outbox.partitions.carry_privileges); a GRANT on the partition
heals it at once, the worker running.
"""

from __future__ import annotations

from dataclasses import dataclass

from psycopg import sql

from outbox.runner import Query, Row
from outbox.table import Table, shown, shown_argument

# What a worker does to a partition it names: reads rows (claims, window readings) and
# updates them (claims, finalizes, lease extensions).
WORKER_PRIVILEGES = ("SELECT", "UPDATE")


@dataclass(frozen=True)
class Refused:
    """A partition the connected role lacks some of a worker's privileges on. Role names
    are quoted as identifiers."""

    partition: str  # as regclass prints it: quoted where needed, qualified off the search_path
    privileges: tuple[str, ...]  # of WORKER_PRIVILEGES, the ones lacking
    role: str  # the connected role
    on_the_parent: bool  # the parent grants them all: only the partition lacks them
    table_owner: str
    # The partition's owner when it is not the table's: the table's owner may then neither
    # grant on it nor carry grants to it (`outbox maintain` fails on it).
    other_owner: str | None

    def advice(self, table: Table) -> str:
        """One line: which partition, which privileges, and the fix."""
        privileges = ", ".join(self.privileges)
        partition = shown(self.partition)
        grant = f"GRANT {privileges} ON {partition} TO {self.role}"
        fix = (
            f"run `outbox maintain --table {shown_argument(table)}` as the table's owner (it "
            "carries the parent's grants to every partition)"
        )
        if not self.on_the_parent:
            fix = f"GRANT {privileges} ON {shown(table)} TO {self.role}, then {fix}"
        if self.other_owner is not None:
            fix = (
                f"it belongs to {self.other_owner}, not to the table's owner {self.table_owner}: "
                f"as {self.other_owner} (or a superuser) ALTER TABLE {partition} OWNER TO "
                f"{self.table_owner}, then {fix}; or, as {self.other_owner}, {grant}"
            )
        else:
            fix = f"{fix}; or {grant}"
        return (
            f"this worker's role {self.role} lacks {privileges} on partition {partition} "
            f"of {shown(table)} (made without the parent's grants: by hand, or by a role that is "
            f"not the table's owner), so claims that reach it are refused; {fix}. Claims are "
            "retried meanwhile"
        )


def refused_partitions(table: Table) -> Query[list[Refused]]:
    """The table's partitions on which the connected role lacks a worker's privileges, in
    name order; none for a plain table."""
    statement = sql.SQL(
        """SELECT c.oid::regclass::text, quote_ident(current_user::text),
       array_agg(p.privilege ORDER BY p.privilege),
       bool_and(has_table_privilege(parent.oid, p.privilege)),
       quote_ident(pg_get_userbyid(parent.relowner)),
       CASE WHEN c.relowner <> parent.relowner THEN quote_ident(pg_get_userbyid(c.relowner)) END
  FROM pg_class parent
  JOIN pg_inherits i ON i.inhparent = parent.oid
  JOIN pg_class c ON c.oid = i.inhrelid
 CROSS JOIN unnest(%(privileges)s::text[]) AS p(privilege)
 WHERE parent.oid = {t}::regclass AND NOT has_table_privilege(c.oid, p.privilege)
 GROUP BY c.oid, parent.oid
 ORDER BY 1"""
    ).format(t=table.regclass_literal)
    return Query(statement, {"privileges": list(WORKER_PRIVILEGES)}, _parse)


def _parse(rows: list[Row]) -> list[Refused]:
    return [
        Refused(
            str(name),
            tuple(str(p) for p in privileges),
            str(role),
            bool(parent),
            str(table_owner),
            None if other_owner is None else str(other_owner),
        )
        for name, role, privileges, parent, table_owner, other_owner in rows
    ]
