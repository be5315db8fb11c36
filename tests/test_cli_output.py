"""What the `outbox` commands print says what they did: `outbox migrate` names every change it
made to a table already at the current version ("already at ..." only when it made none), and
every count reads right in the singular ("made 1 partition ahead")."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
from helpers import seed
from test_cli import one_line, outbox

from outbox.plumbing.text import counted


def migrate(dsn: str, *args: str) -> str:
    result = outbox("migrate", "--dsn", dsn, *args)
    assert result.returncode == 0, result.stderr
    return one_line(result.stdout)


def partitions(conn: Any) -> int:
    row = conn.execute(
        "SELECT count(*) FROM pg_inherits WHERE inhparent = 'outbox'::regclass"
    ).fetchone()
    return int(row[0])


def test_migrate_says_it_built_the_ordering_index_on_a_table_at_the_current_version(empty_dsn):
    assert migrate(empty_dsn) == "outbox: migrated from v0 to v7, for --ordering none"
    built = migrate(empty_dsn, "--ordering", "aggregate")
    assert built == (
        "outbox: at schema v7; built ordered mode's index outbox_aggregate, "
        "for --ordering none or aggregate"
    )
    kept = migrate(empty_dsn, "--ordering", "aggregate")
    assert kept == "outbox: already at schema v7, for --ordering none or aggregate"
    dropped = migrate(empty_dsn, "--ordering", "none")
    assert dropped == (
        "outbox: at schema v7; dropped ordered mode's index outbox_aggregate, for --ordering none"
    )
    assert migrate(empty_dsn, "--ordering", "none") == (
        "outbox: already at schema v7, for --ordering none"
    )


def test_migrate_of_a_new_table_names_what_it_made_beyond_the_steps(empty_dsn):
    made = migrate(empty_dsn, "--partition-size", "100", "--partitions-ahead", "2")
    assert made == (
        "outbox: migrated from v0 to v7; recorded the layout: partitions of 100 ids, 2 kept "
        "ahead; made 3 partitions ahead, for --ordering none"
    )


def test_migrate_says_it_recorded_the_layout_and_made_partitions_ahead(empty_dsn):
    migrate(empty_dsn, "--partition-size", "100", "--partitions-ahead", "2")
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        before = partitions(conn)
        more = migrate(empty_dsn, "--partition-size", "100", "--partitions-ahead", "4")
        assert partitions(conn) == before + 2
        assert conn.execute("SELECT partitions_ahead FROM outbox_layout").fetchone() == (4,)
    assert more == (
        "outbox: at schema v7; recorded the layout: partitions of 100 ids, 4 kept ahead "
        "(was 2); made 2 partitions ahead, for --ordering none"
    )
    # Nothing left to do: the layout row is not even written again.
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        row = conn.execute("SELECT xmin::text FROM outbox_layout").fetchone()
        again = migrate(empty_dsn, "--partition-size", "100", "--partitions-ahead", "4")
        assert conn.execute("SELECT xmin::text FROM outbox_layout").fetchone() == row
    assert again == "outbox: already at schema v7, for --ordering none"


def test_maintain_counts_one_partition_in_the_singular(empty_dsn):
    migrate(empty_dsn, "--partition-size", "100", "--partitions-ahead", "2")  # p0 to p2
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        seed(conn, 100)  # id 100 opens p1: p3 is missing ahead
        before = partitions(conn)
        result = outbox("maintain", "--dsn", empty_dsn, "--retention", "7d")
        assert result.returncode == 0, result.stderr
        assert partitions(conn) == before + 1
    assert one_line(result.stdout) == (
        "outbox: made 1 partition ahead, retired 0 (0 rows), 0 finished but within the "
        "retention of 7d; analyzed"
    )


def test_purge_counts_one_row_in_the_singular(conn, dsn):
    [done] = seed(conn, 1)
    conn.execute(
        "UPDATE outbox SET status = 'done', done_at = now() - interval '8 days' WHERE id = %s",
        (done,),
    )
    result = outbox("purge", "--dsn", dsn, "--older-than", "7d", "--dry-run")
    assert one_line(result.stdout) == "outbox: would delete 1 done row"


@pytest.mark.parametrize(
    ("n", "noun", "plural", "text"),
    [
        (0, "partition", None, "0 partitions"),
        (1, "partition", None, "1 partition"),
        (2, "dead message", None, "2 dead messages"),
        (1, "batch", "batches", "1 batch"),
        (3, "batch", "batches", "3 batches"),
    ],
)
def test_counted_is_singular_for_one_only(n, noun, plural, text):
    assert counted(n, noun, plural) == text


def test_migrate_after_converting_a_plain_table_says_what_it_made_beyond_the_conversion(conn, dsn):
    """The conversion describes itself (and records the layout); the line after it names the
    partition the migration then made ahead, where it said 'already at schema v7'."""
    seed(conn, 250)
    result = outbox("migrate", "--dsn", dsn, "--partition-size", "100", "--partitions-ahead", "2")
    assert result.returncode == 0, result.stderr
    *conversion, last = result.stdout.splitlines()
    assert conversion[0] == "outbox: converted to the partitioned layout:"
    assert last == "outbox: at schema v7; made 1 partition ahead, for --ordering none"
