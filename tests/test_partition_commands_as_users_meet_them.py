"""`outbox partitions`, `outbox maintain` and the other commands as a user runs them on a
partitioned table: what they print agrees with the table, whatever state its statistics are
in, and a failure is one line with its exit code."""

from __future__ import annotations

import json
import signal
import subprocess
import sys

import psycopg
import pytest
from helpers import outbox_on as outbox
from helpers import seed

from outbox.partitions import Layout
from outbox.schema import migrate
from outbox.table import Table

TABLE = Table.parse("outbox")


def test_done_rows_agree_with_the_table_when_the_statistics_are_stale(empty_dsn: str) -> None:
    """The first `outbox maintain` analyzes the partitions while they are empty (0 rows, as
    far as the planner knows); rows written and delivered before autovacuum analyzes them
    again were listed `~0` and retired as `0 rows` (the operator's purged total with them)."""
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        migrate(conn, TABLE, layout=Layout(100, 3))
        first = outbox(empty_dsn, "maintain")
        assert first.returncode == 0, first.stderr
        seed(conn, 250)
        conn.execute("UPDATE outbox SET status = 'done', done_at = now()")
        # What those writes changed reaches the statistics the commands read once this
        # session is idle (in a second or so otherwise).
        conn.execute("SELECT pg_stat_force_next_flush()")
        listing = outbox(empty_dsn, "partitions", "--json")
        assert listing.returncode == 0, listing.stderr
        by_name = {p["name"]: p for p in json.loads(listing.stdout)["partitions"]}
        assert [by_name[f"outbox_p{k}"]["done_estimate"] for k in range(3)] == [99, 100, 51]
        assert by_name["outbox_p0"]["done_figure"] == "count"
        text = outbox(empty_dsn, "partitions").stdout.splitlines()
        assert text[1].split()[:6] == ["outbox_p0", "0-99", "0", "0", "0", "99"], text
        retired = outbox(empty_dsn, "maintain", "--retention", "0s")
        assert retired.returncode == 0, retired.stderr
        assert "retired 2 (199 rows)" in retired.stdout, retired.stdout
        assert conn.execute("SELECT count(*) FROM outbox").fetchone() == (51,)
        # Analyzed by that run, the partition left is the planner's estimate again.
        after = json.loads(outbox(empty_dsn, "partitions", "--json").stdout)["partitions"]
        assert (after[0]["name"], after[0]["done_estimate"]) == ("outbox_p2", 51)
        assert after[0]["done_figure"] == "estimate"


@pytest.mark.parametrize("command", [["stats"], ["partitions"], ["partitions", "--json"]])
def test_output_piped_into_a_reader_that_left_ends_without_a_traceback(
    empty_dsn: str, command: list[str]
) -> None:
    """`outbox stats | head -3`: the reader closes the pipe before the command writes. It
    printed a BrokenPipeError's traceback; it ends quietly, as a SIGPIPE would have."""
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        migrate(conn, TABLE, layout=Layout(100, 3))
    run = subprocess.Popen(
        [sys.executable, "-m", "outbox", *command, "--dsn", empty_dsn],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert run.stdout is not None
    run.stdout.close()  # the reader is gone before the first line is written
    _, stderr = run.communicate(timeout=60)
    assert stderr == ""
    assert run.returncode == 128 + signal.SIGPIPE
