"""Partitioned tables met in ways the layout's own commands never make them: a DEFAULT
partition added by hand, roles granted less than the layout needs, rows written past the
sequence, partitions retired under a worker's window, partitions made by two sessions at once."""

from __future__ import annotations

import subprocess
import sys

import psycopg
import pytest

from outbox.partitions import Layout
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
