"""Partitioned tables met in ways the layout's own commands never make them: a DEFAULT
partition added by hand, roles granted less than the layout needs, rows written past the
sequence, partitions retired under a worker's window, partitions made by two sessions at once."""

from __future__ import annotations

import subprocess
import sys
import threading

import psycopg
import pytest
from helpers import seed, wait_until_db
from psycopg import sql

from outbox.partitions import Layout, make_partition, upkeep_lock
from outbox.schema import migrate
from outbox.table import Table

TABLE = Table.parse("outbox")


def outbox(dsn: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "outbox", *args, "--dsn", dsn],
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize(
    "command",
    [
        ["stats"],
        ["partitions"],
        ["maintain", "--retention", "0s"],
        ["migrate", "--partition-size", "100"],
    ],
)
def test_a_default_partition_is_named_in_one_line(empty_dsn: str, command: list[str]) -> None:
    """A DEFAULT partition someone added: every command that reads the partitions' bounds says
    what the check says of it, in one line, and changes nothing."""
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        migrate(conn, TABLE, layout=Layout(100, 2))
        conn.execute("CREATE TABLE outbox_default PARTITION OF outbox DEFAULT")
    done = outbox(empty_dsn, *command)
    assert done.returncode == 1, (done.stdout, done.stderr)
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert "error: table outbox cannot be served: it has a DEFAULT partition" in lines[0]
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        partitions = conn.execute(
            "SELECT count(*) FROM pg_inherits WHERE inhparent = 'outbox'::regclass"
        ).fetchone()
    assert partitions == (4,)  # p0..p2 and the DEFAULT one: nothing made, nothing retired


def test_migrate_waits_for_a_keeper_making_the_same_partition(empty_dsn: str) -> None:
    """`outbox migrate` at a pod's start while a worker's keeper makes the partition it would
    make too: it waits for the keeper's upkeep lock, then finds the partition made, where
    both making it failed on the partition's name."""
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        migrate(conn, TABLE, layout=Layout(100, 3))  # p0..p3
        seed(conn, 150)  # the highest id is in p1: p4 is missing ahead
    lock = sql.SQL("{key}").format(key=upkeep_lock(TABLE))
    with psycopg.connect(empty_dsn, autocommit=True) as keeper:
        # What keep_ahead does: the upkeep lock, then each partition in a transaction of its
        # own, here held open between its statements.
        keeper.execute(sql.SQL("SELECT pg_advisory_lock({l})").format(l=lock))
        failure: list[BaseException] = []
        with keeper.transaction():
            for statement in make_partition(TABLE, 4, 400, 500):
                keeper.execute(statement)

            def run_migrate() -> None:
                migrating = psycopg.conninfo.make_conninfo(empty_dsn, application_name="migrating")
                with psycopg.connect(migrating, autocommit=True) as other:
                    try:
                        migrate(other, TABLE, layout=Layout(100, 3))
                    except BaseException as exc:  # reported below
                        failure.append(exc)

            thread = threading.Thread(target=run_migrate)
            thread.start()
            with psycopg.connect(empty_dsn, autocommit=True) as watcher:
                wait_until_db(
                    watcher,
                    "EXISTS (SELECT FROM pg_stat_activity"
                    " WHERE application_name = 'migrating' AND wait_event_type = 'Lock')",
                )
        keeper.execute(sql.SQL("SELECT pg_advisory_unlock({l})").format(l=lock))
        thread.join(60)
    assert not thread.is_alive()
    assert not failure, f"outbox migrate failed: {failure[0]!r}"
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        names = conn.execute(
            "SELECT array_agg(c.relname::text ORDER BY c.relname) FROM pg_inherits i"
            " JOIN pg_class c ON c.oid = i.inhrelid WHERE i.inhparent = 'outbox'::regclass"
        ).fetchone()
    assert names == ([f"outbox_p{k}" for k in range(5)],)
