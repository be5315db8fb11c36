"""`outbox partitions` and `outbox maintain` on a partitioned table: partitions made ahead,
finished ones retired whole once the retention has passed, never one holding a pending,
processing or dead row."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import psycopg
import pytest
from helpers import seed

from outbox.partitions import Layout, read_partitions
from outbox.runner import fetch
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


@pytest.fixture
def history(empty_dsn: str) -> Any:
    """450 rows in partitions of 100 ids: all done but a dead row in partition 1 and a
    pending one in partition 3; partition 4 holds the newest ids."""
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        migrate(conn, TABLE, layout=Layout(100, 2))
        migrate(conn, TABLE, layout=Layout(100, 5))  # room for 450 rows
        seed(conn, 449)
        conn.execute("UPDATE outbox SET status = 'done', done_at = now()")
        conn.execute("UPDATE outbox SET status = 'dead', done_at = NULL WHERE id = 150")
        conn.execute("UPDATE outbox SET status = 'pending', done_at = NULL WHERE id = 320")
        yield conn


def _leaves(conn: Any) -> list[str]:
    return [p.name for p in fetch(conn, read_partitions(TABLE)) or []]


def test_maintain_retires_finished_partitions_and_nothing_else(history, empty_dsn):
    result = outbox(empty_dsn, "maintain", "--retention", "0s")
    assert result.returncode == 0, result.stderr
    assert "retired 2 (199 rows)" in result.stdout  # ids 1-99 and 200-299
    leaves = _leaves(history)
    assert "outbox_p0" not in leaves and "outbox_p2" not in leaves
    # Pinned: a dead row, a pending row; the newest ids' partition; those made ahead.
    assert leaves[:3] == ["outbox_p1", "outbox_p3", "outbox_p4"]
    assert leaves[-1] == "outbox_p9"  # 5 whole partitions past the one holding id 449
    counts = dict(history.execute("SELECT status, count(*) FROM outbox GROUP BY 1").fetchall())
    assert counts == {"done": 248, "dead": 1, "pending": 1}  # the retired rows are gone
    assert history.execute(
        "SELECT count(*) FROM outbox WHERE id < 100 OR id BETWEEN 200 AND 299"
    ).fetchone() == (0,)
    # The parent was analyzed (autovacuum never does it for a partitioned table).
    analyzed = history.execute(
        "SELECT last_analyze IS NOT NULL FROM pg_stat_user_tables WHERE relname = 'outbox'"
    ).fetchone()
    assert analyzed == (True,)


def test_a_partition_stays_for_the_retention_and_the_listing_says_why(history, empty_dsn):
    kept = outbox(empty_dsn, "maintain", "--retention", "1h")
    assert kept.returncode == 0, kept.stderr
    assert "retired 0 (0 rows), 2 finished but within the retention of 1h" in kept.stdout
    listing = outbox(empty_dsn, "partitions", "--json")
    assert listing.returncode == 0, listing.stderr
    by_name = {p["name"]: p for p in json.loads(listing.stdout)["partitions"]}
    assert by_name["outbox_p0"]["retirable"] and by_name["outbox_p0"]["done_since"]
    assert by_name["outbox_p0"]["done_estimate"] >= 0
    assert by_name["outbox_p1"]["why_not"] == (
        "1 dead rows pin it until they are requeued or skipped"
    )
    assert by_name["outbox_p3"]["why_not"] == "1 rows are not done yet"
    assert by_name["outbox_p4"]["why_not"] == "it holds the newest ids"
    assert by_name["outbox_p9"]["why_not"] == "made ahead"
    assert (by_name["outbox_p3"]["low"], by_name["outbox_p3"]["high"]) == (300, 400)
    # The dead row skipped, its partition goes at the next run with a retention of 0s.
    history.execute("UPDATE outbox SET status = 'done', done_at = now() WHERE id = 150")
    text = outbox(empty_dsn, "partitions")
    assert "outbox_p1" in text.stdout and "yes" in text.stdout.splitlines()[2]
    again = outbox(empty_dsn, "maintain", "--retention", "0s")
    assert "retired 3 (299 rows)" in again.stdout, again.stdout


def test_partitions_on_a_plain_table_and_a_bad_retention(dsn):
    plain = outbox(dsn, "partitions")
    assert plain.returncode == 1
    assert "table outbox is not partitioned by `outbox migrate --partition-size`" in plain.stderr
    bad = outbox(dsn, "maintain", "--retention", "soon")
    assert bad.returncode == 2 and "--retention" in bad.stderr
