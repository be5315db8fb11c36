"""A plain table whose ids are near the top of bigint, converted to large partitions: the
first partition's bound stays a bigint, leaving a whole partition for the ids after it, or
the table is refused in one line, unchanged."""

from __future__ import annotations

import psycopg
from helpers import outbox_on

from outbox import enqueue
from outbox.partitions import read_partitions
from outbox.runner import fetch
from outbox.table import Table

TABLE = Table.parse("outbox")
SIZE = 10**12  # the largest --partition-size


def _one_row_at(conn: psycopg.Connection[tuple[object, ...]], first_id: int) -> None:
    conn.execute(f"ALTER TABLE outbox ALTER id RESTART WITH {first_id}")
    enqueue(conn, aggregate_type="a", aggregate_id="1", event_type="E", payload={})


def _constraints(conn: psycopg.Connection[tuple[object, ...]]) -> list[str]:
    rows = conn.execute("SELECT conname FROM pg_constraint WHERE conname LIKE '%range'")
    return [str(r[0]) for r in rows]


def test_the_first_bound_stops_a_partition_short_of_the_top(dsn: str) -> None:
    """16 partitions past id 9,223,360,000,000,000,000 end past 2^63 - 1: the bound was
    written as a numeric CHECK, which the next step could not read as its own (has a
    constraint outbox_p0_range that is not the conversion's), left on the table, and
    every run again said the same. Now the first partition ends where one last partition
    of the size still fits under the top."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        _one_row_at(conn, 9_223_360_000_000_000_000)
        done = outbox_on(dsn, "migrate", "--partition-size", str(SIZE))
        assert done.returncode == 0, done.stderr
        leaves = [(p.name, p.low, p.high) for p in fetch(conn, read_partitions(TABLE)) or []]
        assert leaves == [
            ("outbox_p0", 0, 9_223_371 * SIZE),
            ("outbox_p9223371", 9_223_371 * SIZE, 9_223_372 * SIZE),
        ]
        new = enqueue(conn, aggregate_type="a", aggregate_id="1", event_type="E", payload={})
        assert new == 9_223_371 * SIZE


def test_ids_past_the_last_whole_partition_are_refused_in_one_line(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        _one_row_at(conn, 9_223_372_036_000_000_000)
        refused = outbox_on(dsn, "migrate", "--partition-size", str(SIZE))
        assert refused.returncode == 1, refused.stderr
        assert refused.stderr.strip().splitlines() == [
            "outbox: error: table outbox cannot be converted to partitions of 1000000000000 "
            "ids: its highest id, 9223372036000000000, leaves no whole partition of bigint ids "
            "after the first (ids up to 2^63 - 1); give a smaller --partition-size; the table "
            "is as it was"
        ]
        assert _constraints(conn) == []
        kind = conn.execute("SELECT relkind FROM pg_class WHERE relname = 'outbox'").fetchone()
        assert kind == ("r",)
        enqueue(conn, aggregate_type="a", aggregate_id="1", event_type="E", payload={})
        smaller = outbox_on(dsn, "migrate", "--partition-size", "1000000")  # as it advises
        assert smaller.returncode == 0, smaller.stderr
        assert conn.execute("SELECT count(*) FROM outbox_p0").fetchone() == (2,)
