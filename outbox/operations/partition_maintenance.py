"""Upkeep of a partitioned outbox table (outbox.partitions): what each partition holds, and
`outbox maintain`, which makes partitions ahead, retires finished ones whole and analyzes
the parent.

A partition is retired when every row in it has been done for the retention: DETACH
PARTITION ... CONCURRENTLY (producers and workers go on), then DROP, where a DELETE of the
same rows would leave hours of vacuum behind. A pending, processing or dead row pins its
partition (a dead one until it is requeued or skipped). When a partition is first seen with
nothing unfinished, maintenance notes the time in the partition's comment: every `done_at`
in it is older than that, so it can go once the note is older than the retention, without
reading a row.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from datetime import datetime, timedelta
from typing import Any

import psycopg
from psycopg import sql

from outbox.partitions import Layout, Partition, make_ahead, read_layout, read_partitions
from outbox.runner import fetch
from outbox.table import Table

_DONE_NOTE = "outbox-dispatcher: nothing unfinished since "
_NOTE = re.compile("^" + re.escape(_DONE_NOTE) + r"(.+)$")

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
    done_estimate: int  # the planner's row estimate less the unfinished rows
    oldest_created_at: datetime | None  # of its first row
    done_since: datetime | None  # first seen with nothing unfinished
    retirable: bool
    why_not: str | None

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        for key in ("oldest_created_at", "done_since"):
            d[key] = d[key].isoformat() if d[key] is not None else None
        return d


def _layout(conn: Conn, table: Table) -> tuple[Layout, list[Partition]]:
    leaves = fetch(conn, read_partitions(table))
    layout = fetch(conn, read_layout(table)) if leaves is not None else None
    if leaves is None or layout is None:
        raise NotPartitioned(
            f"table {table} is not partitioned by `outbox migrate --partition-size`"
        )
    return layout, leaves


def _last_id(conn: Conn, table: Table) -> int:
    row = conn.execute(
        sql.SQL(
            "SELECT coalesce(pg_sequence_last_value(pg_get_serial_sequence({t}, 'id')), 0)"
        ).format(t=table.regclass_literal)
    ).fetchone()
    return int(row[0]) if row else 0


def _leaf(table: Table, name: str) -> sql.Composable:
    return Table(table.schema, name).ident


def _state(conn: Conn, table: Table, leaf: Partition, current: int) -> PartitionState:
    """One partition, read directly (its partial indexes count what is unfinished)."""
    row = conn.execute(
        sql.SQL(
            """SELECT count(*) FILTER (WHERE status = 'pending'),
       count(*) FILTER (WHERE status = 'processing'),
       (SELECT count(*) FROM {leaf} WHERE status = 'dead'),
       (SELECT greatest(reltuples, 0)::bigint FROM pg_class WHERE oid = {name}::regclass),
       (SELECT created_at FROM {leaf} ORDER BY id LIMIT 1),
       obj_description({name}::regclass, 'pg_class')
  FROM {leaf} WHERE status IN ('pending', 'processing')"""
        ).format(
            leaf=_leaf(table, leaf.name),
            name=Table(table.schema, leaf.name).regclass_literal,
        )
    ).fetchone()
    assert row is not None
    pending, processing, dead, tuples, oldest, comment = row
    note = _NOTE.match(str(comment or ""))
    done_since = datetime.fromisoformat(note.group(1)) if note else None
    unfinished = int(pending) + int(processing) + int(dead)
    why_not = None
    if leaf.high > current:
        why_not = "it holds the newest ids" if leaf.low <= current else "made ahead"
    elif dead:
        why_not = f"{dead} dead rows pin it until they are requeued or skipped"
    elif unfinished:
        why_not = f"{unfinished} rows are not done yet"
    return PartitionState(
        leaf.name, leaf.low, leaf.high, int(pending), int(processing), int(dead),
        max(int(tuples or 0) - unfinished, 0), oldest,
        done_since if not unfinished else None, why_not is None, why_not,
    )  # fmt: skip


def partition_states(conn: Conn, table: Table) -> list[PartitionState]:
    """Every partition, oldest first: `outbox partitions`."""
    _, leaves = _layout(conn, table)
    current = _last_id(conn, table)
    return [_state(conn, table, leaf, current) for leaf in leaves]


@dataclass(frozen=True)
class Maintained:
    made: int
    retired: list[str]
    rows_retired: int
    kept: list[PartitionState]  # finished, but not for the retention yet


def maintain(conn: Conn, table: Table, *, retention: timedelta) -> Maintained:
    """Make partitions ahead, retire those finished for `retention`, ANALYZE the parent.

    `conn` must be in autocommit: DETACH ... CONCURRENTLY runs outside a transaction."""
    layout, leaves = _layout(conn, table)
    half_detached = _finish_detaches(conn, table)
    with conn.transaction():
        made = make_ahead(conn, table, layout)
    current = _last_id(conn, table)
    retired: list[str] = []
    rows = 0
    kept = []
    for leaf in leaves:
        if leaf.name in half_detached:
            count = _drop_unless_unfinished(conn, table, leaf)
            if count is not None:
                retired.append(leaf.name)
                rows += count
            continue
        state = _state(conn, table, leaf, current)
        if not state.retirable:
            if state.why_not and "made ahead" not in state.why_not:
                _note(conn, table, leaf.name, None)  # unfinished again (a replay): forget
            continue
        if state.done_since is None:
            _note(conn, table, leaf.name, _now(conn))
            state = _state(conn, table, leaf, current)
        if state.done_since is None or state.done_since > _now(conn) - retention:
            kept.append(state)
            continue
        count = _retire(conn, table, leaf)
        if count is not None:
            retired.append(leaf.name)
            rows += count
    # Autovacuum never analyzes a partitioned parent: the planner's view of it comes from here.
    conn.execute(sql.SQL("ANALYZE {t}").format(t=table.ident))
    return Maintained(made, retired, rows, kept)


def _now(conn: Conn) -> datetime:
    row = conn.execute("SELECT clock_timestamp()").fetchone()
    assert row is not None and isinstance(row[0], datetime)
    return row[0]


def _note(conn: Conn, table: Table, name: str, since: datetime | None) -> None:
    comment = None if since is None else _DONE_NOTE + since.isoformat()
    current = conn.execute(
        sql.SQL("SELECT obj_description({n}::regclass, 'pg_class')").format(
            n=Table(table.schema, name).regclass_literal
        )
    ).fetchone()
    if current is not None and current[0] == comment:
        return
    conn.execute(
        sql.SQL("COMMENT ON TABLE {leaf} IS {c}").format(
            leaf=_leaf(table, name), c=sql.Literal(comment)
        )
    )


def _retire(conn: Conn, table: Table, leaf: Partition) -> int | None:
    """Detach without blocking the parent's users, check again, drop; the rows it held, or
    None if a row became unfinished meanwhile (attached back)."""
    conn.execute(
        sql.SQL("ALTER TABLE {t} DETACH PARTITION {leaf} CONCURRENTLY").format(
            t=table.ident, leaf=_leaf(table, leaf.name)
        )
    )
    return _drop_unless_unfinished(conn, table, leaf)


def _drop_unless_unfinished(conn: Conn, table: Table, leaf: Partition) -> int | None:
    ident = _leaf(table, leaf.name)
    # Through the partial indexes, and the row count from the statistics when the partition
    # has them: counting a partition of a million rows would cost more than dropping it.
    row = conn.execute(
        sql.SQL(
            """SELECT EXISTS (SELECT FROM {leaf} WHERE status IN ('pending', 'processing'))
       OR EXISTS (SELECT FROM {leaf} WHERE status = 'dead'),
       (SELECT reltuples::bigint FROM pg_class WHERE oid = {name}::regclass)"""
        ).format(leaf=ident, name=Table(table.schema, leaf.name).regclass_literal)
    ).fetchone()
    assert row is not None
    unfinished, total = bool(row[0]), int(row[1])
    if total < 0:  # never analyzed: count it
        counted = conn.execute(sql.SQL("SELECT count(*) FROM {leaf}").format(leaf=ident)).fetchone()
        total = int(counted[0]) if counted else 0
    if unfinished:
        conn.execute(
            sql.SQL(
                "ALTER TABLE {t} ATTACH PARTITION {leaf} FOR VALUES FROM ({l}) TO ({h})"
            ).format(t=table.ident, leaf=ident, l=sql.Literal(leaf.low), h=sql.Literal(leaf.high))
        )
        return None
    conn.execute(sql.SQL("DROP TABLE {leaf}").format(leaf=ident))
    return total


def _finish_detaches(conn: Conn, table: Table) -> set[str]:
    """A DETACH ... CONCURRENTLY interrupted (a cancel, a crash) leaves its partition
    half-detached: finish it, so that the run retires it like any other."""
    pending = conn.execute(
        sql.SQL(
            "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
            "WHERE i.inhparent = {t}::regclass AND i.inhdetachpending"
        ).format(t=table.regclass_literal)
    ).fetchall()
    for (name,) in pending:
        conn.execute(
            sql.SQL("ALTER TABLE {t} DETACH PARTITION {leaf} FINALIZE").format(
                t=table.ident, leaf=_leaf(table, str(name))
            )
        )
    return {str(name) for (name,) in pending}
