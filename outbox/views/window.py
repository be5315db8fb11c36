"""Bounding the TUI's reads of a partitioned table to where unfinished rows can be.

A statement over a partitioned table's parent plans and opens every partition: with
`outbox migrate --partition-size 1000 --partitions-ahead 200`, hundreds of them, finished
or made ahead, on every refresh of every screen. Dead, pending and processing rows are all
within the snapshot's window (`outbox.stats.unfinished_window`: from the first partition
`outbox maintain` has not noted finished to the one holding the newest id), so every read
of them names that window's ids as constants, which the planner prunes the other
partitions by. A plain table has no window and its statements are unchanged.
"""

from __future__ import annotations

from psycopg import sql

from outbox.stats import Window


def within(window: Window | None, alias: str | None = None) -> sql.Composable:
    """` AND id >= low AND id < high` (of `alias` if given) as constants; nothing without
    a window (a plain table)."""
    if window is None:
        return sql.SQL("")
    column = sql.Identifier(alias, "id") if alias else sql.Identifier("id")
    return sql.SQL(" AND {c} >= {low} AND {c} < {high}").format(
        c=column, low=sql.Literal(window.low), high=sql.Literal(window.high)
    )
