"""Retention: delete done rows in bounded batches so no statement holds locks for long; on a
partitioned table, retire finished partitions whole (outbox.operations.partition_maintenance).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import psycopg
from psycopg import sql

from outbox.operations.partition_maintenance import maintain_async
from outbox.partitions import home_schema, in_schema, read_layout, read_partitions
from outbox.runner import fetch_async
from outbox.table import Table, shown

log = logging.getLogger("outbox.maintenance")

PURGE_BATCH = 5000  # rows per DELETE: each one short, so no statement holds locks for long
MAX_PURGE_BATCH = 1_000_000
# Not OUTBOX_BATCH: that is the workers' claim batch wherever their settings are set.
PURGE_BATCH_ENV = "OUTBOX_PURGE_BATCH"


def purge_done(
    conn: psycopg.Connection[Any],
    table: Table,
    *,
    older_than: timedelta,
    batch: int = PURGE_BATCH,
    dry_run: bool = False,
) -> int:
    """Delete done rows finished more than `older_than` ago; returns how many (would) go."""
    t = table.ident
    if dry_run:
        row = conn.execute(
            sql.SQL(
                "SELECT count(*) FROM {t} WHERE status = 'done' AND done_at < now() - %(age)s"
            ).format(t=t),
            {"age": older_than},
        ).fetchone()
        return int(row[0]) if row else 0
    delete = _delete_done(table)
    total = 0
    while True:
        with conn.transaction():
            deleted = conn.execute(delete, {"age": older_than, "batch": batch}).rowcount
        total += deleted
        if deleted < batch:
            return total


def _delete_done(table: Table) -> sql.Composed:
    """One batch of done rows past the age (`purge_done`, `purge_done_async`)."""
    return sql.SQL(
        "DELETE FROM {t} WHERE id IN (SELECT id FROM {t} WHERE status = 'done' "
        "AND done_at < now() - %(age)s LIMIT %(batch)s)"
    ).format(t=table.ident)


async def purge_done_async(
    conn: psycopg.AsyncConnection[Any],
    table: Table,
    *,
    older_than: timedelta,
    batch: int = PURGE_BATCH,
    gone: Callable[[int], None] | None = None,
) -> int:
    """`purge_done` on an async connection (the operator's pooled ones); how many went.
    `gone` is told each batch's rows once its transaction committed."""
    delete = _delete_done(table)
    total = 0
    while True:
        async with conn.transaction():
            cursor = await conn.execute(delete, {"age": older_than, "batch": batch})
        total += cursor.rowcount
        if gone is not None:
            gone(cursor.rowcount)
        if cursor.rowcount < batch:
            return total


async def retire_done_async(
    conn: psycopg.AsyncConnection[Any],
    table: Table,
    *,
    older_than: timedelta,
    gone: Callable[[int], None] | None = None,
) -> int:
    """The operator's retention: done rows older than `older_than` gone, how many. A plain
    table is purged in batches (`purge_done_async`); a partitioned one is maintained as
    `outbox maintain --retention` does (partitions made ahead, finished ones detached
    concurrently and dropped, the parent analyzed), and the rows counted are those of the
    partitions dropped. `conn` is in autocommit and is left so, outside any transaction.

    `gone` is told the rows as they go, each batch's as it commits, the partitions' as they
    are dropped: a run that fails or is cancelled part-way has removed those all the same,
    and its caller counts them without the total it never returns.

    A plain table whose `<table>_layout` still holds a row (a conversion undone by hand that
    left it) is purged as the plain table it is, with a warning."""
    # The layout's table in the table's schema, whatever the search_path reaches first
    # (see `in_schema`).
    schema = await fetch_async(conn, home_schema(table))
    home = in_schema(table, schema)
    if await fetch_async(conn, read_layout(home)) is None:
        return await purge_done_async(conn, table, older_than=older_than, gone=gone)
    if await fetch_async(conn, read_partitions(table)) is None:
        log.warning(
            "table %s is not partitioned but %s holds a partition layout (a conversion undone "
            "by hand?): purged as a plain table; delete that row (docs/partitioning.md)",
            shown(table), shown(table.derived_name("layout")),
        )  # fmt: skip
        return await purge_done_async(conn, table, older_than=older_than, gone=gone)
    done = await maintain_async(conn, table, retention=older_than, dropped=gone)
    if done.attached_back:
        log.warning(
            "table %s: attached back %s, found detached or pending detach by no run of "
            "outbox maintain (by hand) or holding an unfinished row",
            shown(table), ", ".join(map(shown, done.attached_back)),
        )  # fmt: skip
    if done.held_off:  # a replay running: retired at a later pass
        log.info("table %s: %s", shown(table), done.held_off)
    return done.rows_retired
