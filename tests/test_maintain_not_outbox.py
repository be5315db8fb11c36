"""`outbox maintain` and `outbox partitions` given a table that is no outbox table at all
(`CREATE TABLE orders (id int)`): they said it was a plain table and that `outbox migrate
--table orders --partition-size N` converts it (a partitioned one: a table at an older
schema, to be migrated), which `outbox migrate` then refuses. They say what `outbox migrate`
says, with its exit code: the table is not an outbox table, and why."""

from __future__ import annotations

import psycopg
import pytest
from helpers import outbox_on as outbox

from outbox.schema import migrate
from outbox.table import Table

NOT_OURS = "table orders exists but is not an outbox table ("
NOTHING_LIKE_IT = "missing columns: aggregate_type, aggregate_id, event_type, payload"


@pytest.mark.parametrize(
    ("made", "why"),
    [
        (["CREATE TABLE orders (id int)"], NOTHING_LIKE_IT),
        (["CREATE TABLE orders (id bigint) PARTITION BY RANGE (id)"], NOTHING_LIKE_IT),
        # Every column an outbox table has, one of them misshapen, and no schema version.
        (
            ["COMMENT ON TABLE orders IS NULL", "ALTER TABLE orders ALTER status DROP NOT NULL"],
            "wrong columns: status allows NULL)",
        ),
    ],
)
@pytest.mark.parametrize("command", ["maintain", "partitions"])
def test_a_table_that_is_no_outbox_table_is_named_so(
    empty_dsn: str, made: list[str], why: str, command: str
):
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        if made[0].startswith("COMMENT"):
            migrate(conn, Table.parse("orders"))
        for statement in made:
            conn.execute(statement)
        relations = conn.execute("SELECT count(*) FROM pg_class").fetchone()
    migrating = outbox(empty_dsn, "migrate", "--table", "orders", "--partition-size", "1000")
    assert migrating.returncode == 1, migrating.stderr
    assert f"{NOT_OURS}{why}" in migrating.stderr, migrating.stderr
    result = outbox(empty_dsn, command, "--table", "orders")
    assert (result.returncode, result.stdout) == (1, ""), result
    [line] = result.stderr.splitlines()
    assert line.startswith(f"outbox: error: {NOT_OURS}{why}"), line
    assert "migrate" not in line
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        # Left as it was: no partition made, no layout's table.
        assert conn.execute("SELECT count(*) FROM pg_class").fetchone() == relations


def test_a_plain_outbox_table_is_still_pointed_to_its_conversion(empty_dsn: str):
    """The check refuses only what `outbox migrate` refuses: a plain outbox table is still
    told that `outbox migrate --partition-size` converts it."""
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        migrate(conn, Table.parse("orders"))
    result = outbox(empty_dsn, "maintain", "--table", "orders")
    assert result.returncode == 1
    assert "it is a plain table" in result.stderr
    assert "`outbox migrate --table orders --partition-size N` converts it online" in result.stderr
