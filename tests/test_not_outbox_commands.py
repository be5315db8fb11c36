"""Commands that read an outbox table, given a table that is no outbox table at all
(`CREATE TABLE orders (id int)`): they said the table was at an older schema and to run
`outbox migrate`, which then refuses it. They say what `outbox migrate` says: the table is
not an outbox table, and why, exit code 1. A real outbox table at an older schema is still
told to migrate."""

from __future__ import annotations

import psycopg
import pytest
from helpers import outbox_on as outbox

from outbox.schema import migrate
from outbox.table import Table

NOT_OURS = (
    "outbox: error: table orders exists but is not an outbox table (missing columns: "
    "aggregate_type, aggregate_id, event_type, payload"
)


@pytest.mark.parametrize(
    "command",
    [
        ["stats"],
        ["destinations"],
        ["purge", "--older-than", "7d"],
        ["requeue", "--all"],
        ["replay", "--since", "1h", "--until", "0s", "--dry-run"],
    ],
)
def test_a_table_that_is_no_outbox_table_is_named_so(empty_dsn: str, command: list[str]):
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE orders (id int)")
    migrating = outbox(empty_dsn, "migrate", "--table", "orders")
    assert migrating.returncode == 1, migrating.stderr
    assert NOT_OURS.removeprefix("outbox: error: ") in migrating.stderr, migrating.stderr
    result = outbox(empty_dsn, *command, "--table", "orders")
    assert (result.returncode, result.stdout) == (1, ""), result
    [line] = result.stderr.splitlines()
    assert line.startswith(NOT_OURS), line
    assert "migrate" not in line, line


def test_an_outbox_table_at_an_older_schema_is_still_told_to_migrate(empty_dsn: str):
    """v4, before the destinations' stamps: `outbox migrate` takes it, as the line says; and
    one without its destinations table."""
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        migrate(conn, Table.parse("orders"))
        conn.execute("ALTER TABLE orders_destinations DROP COLUMN served_at, DROP COLUMN served_by")
        conn.execute("COMMENT ON TABLE orders IS 'outbox-dispatcher schema v4'")
    for command in ("stats", "destinations"):
        result = outbox(empty_dsn, command, "--table", "orders")
        assert (result.returncode, result.stderr) == (
            1,
            'outbox: error: table orders is at an older schema (column "served_at" does not '
            "exist); run `outbox migrate --table orders`\n",
        ), result
    assert outbox(empty_dsn, "migrate", "--table", "orders").returncode == 0
    assert outbox(empty_dsn, "stats", "--table", "orders").returncode == 0
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        conn.execute("DROP TABLE orders_destinations")
    result = outbox(empty_dsn, "destinations", "--table", "orders")
    assert (result.returncode, result.stderr) == (
        1,
        'outbox: error: table orders is at an older schema (relation "orders_destinations" '
        "does not exist); run `outbox migrate --table orders`\n",
    ), result
