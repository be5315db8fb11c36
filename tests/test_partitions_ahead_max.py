"""`outbox migrate --partition-size N --partitions-ahead K` makes its partitions ahead each in a
transaction of its own: made all in one, every partition's locks were held to the end, and
--partitions-ahead 10000 (then the documented maximum, now 1000) ran out of the server's lock table
(`out of shared memory`, max_locks_per_transaction 64) after 1m40s and made nothing.

Shown on a server of its own whose lock table is a small fraction of the default one
(max_locks_per_transaction 10, 20 connections: about 200 locks for every session together):
before, 300 partitions ahead failed there as 10000 did on a default server."""

from __future__ import annotations

import os
from collections.abc import Iterator

import psycopg
import pytest

from outbox.demo.embedded import EmbeddedPostgres
from outbox.table import Table
from tests.helpers import outbox_on

AHEAD = 300
SIZE = 100


@pytest.fixture(scope="module")
def small_lock_table() -> Iterator[str]:
    if os.environ.get("OUTBOX_TEST_DSN"):
        pytest.skip("needs a server of its own, started with a small lock table")
    settings = {
        "fsync": "off",
        "synchronous_commit": "off",
        "full_page_writes": "off",
        "max_connections": "20",
        "max_locks_per_transaction": "10",
    }
    with EmbeddedPostgres(settings=settings) as server:
        yield server.dsn()


def _partitions(dsn: str, table: Table) -> list[str]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT c.relname::text FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid"
            " WHERE i.inhparent = to_regclass(%s) ORDER BY c.relname",
            (str(table),),
        ).fetchall()
    return [str(row[0]) for row in rows]


def test_a_fresh_table_gets_more_partitions_than_one_transaction_could_lock(
    small_lock_table: str,
) -> None:
    table = Table.parse("fresh_outbox")
    done = outbox_on(
        small_lock_table,
        "migrate",
        "--table",
        str(table),
        "--partition-size",
        str(SIZE),
        "--partitions-ahead",
        str(AHEAD),
    )
    assert done.returncode == 0, done.stderr
    assert "out of shared memory" not in done.stderr
    assert f"made {AHEAD + 1} partitions ahead" in done.stdout
    assert len(_partitions(small_lock_table, table)) == AHEAD + 1
    with psycopg.connect(small_lock_table, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO fresh_outbox (aggregate_type, aggregate_id, event_type, payload)"
            " VALUES ('a', '1', 'e', '{}')"
        )
    # Run again: nothing left to make, and said so.
    again = outbox_on(
        small_lock_table,
        "migrate",
        "--table",
        str(table),
        "--partition-size",
        str(SIZE),
        "--partitions-ahead",
        str(AHEAD),
    )
    assert again.returncode == 0, again.stderr
    assert "partitions ahead" not in again.stdout


def test_a_converted_table_gets_them_too_and_the_command_succeeds(small_lock_table: str) -> None:
    table = Table.parse("plain_outbox")
    made = outbox_on(small_lock_table, "migrate", "--table", str(table))
    assert made.returncode == 0, made.stderr
    converted = outbox_on(
        small_lock_table,
        "migrate",
        "--table",
        str(table),
        "--partition-size",
        str(SIZE),
        "--partitions-ahead",
        str(AHEAD),
    )
    assert converted.returncode == 0, converted.stderr
    assert "converted to the partitioned layout" in converted.stdout
    # The converted table itself (its bound past the next id), and AHEAD past it.
    leaves = _partitions(small_lock_table, table)
    assert len(leaves) == AHEAD + 1
    assert "plain_outbox_p0" in leaves


def test_a_run_stopped_half_way_leaves_a_served_table_the_next_run_completes(
    small_lock_table: str,
) -> None:
    """What a run stopped after some of its transactions left (simulated: partitions past
    the first dropped again) is a table that takes inserts, and a rerun makes the rest."""
    table = Table.parse("stopped_outbox")
    args = ["--table", str(table), "--partition-size", str(SIZE), "--partitions-ahead"]
    first = outbox_on(small_lock_table, "migrate", *args, str(AHEAD))
    assert first.returncode == 0, first.stderr
    with psycopg.connect(small_lock_table, autocommit=True) as conn:
        for name in _partitions(small_lock_table, table):
            if name not in ("stopped_outbox_p0", "stopped_outbox_p1"):
                conn.execute(f'DROP TABLE "{name}"')
        conn.execute(
            "INSERT INTO stopped_outbox (aggregate_type, aggregate_id, event_type, payload)"
            " VALUES ('a', '1', 'e', '{}')"
        )
    rerun = outbox_on(small_lock_table, "migrate", *args, str(AHEAD))
    assert rerun.returncode == 0, rerun.stderr
    assert f"made {AHEAD - 1} partitions ahead" in rerun.stdout
    assert len(_partitions(small_lock_table, table)) == AHEAD + 1
