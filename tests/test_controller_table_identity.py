"""Which table a resource serves, as the server identifies it (one table, one resource)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from outbox.controller.database import TableIdentity, read_table
from outbox.schema import migrate
from outbox.table import Table


async def identity(dsn: str, table: str = "outbox") -> TableIdentity:
    return (await read_table(dsn, Table.parse(table)))[1]


async def test_the_same_table_through_other_dsn_text_is_the_same_identity(dsn: str) -> None:
    params = conninfo_to_dict(dsn)
    other = make_conninfo("", **{**params, "application_name": "other", "connect_timeout": "9"})
    assert other != dsn
    first, second = await identity(dsn), await identity(other)
    assert first == second
    assert first.text == f"table public.outbox of database {params['dbname']}"
    # Named with its schema, or found through the search_path: one table.
    assert await identity(dsn, "public.outbox") == first


async def test_another_table_or_database_is_another_identity(dsn: str, admin_dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        migrate(conn, Table.parse("billing"))
    assert await identity(dsn, "billing") != await identity(dsn)
    name = f"outbox_identity_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    try:
        other = make_conninfo(dsn, dbname=name)
        with psycopg.connect(other, autocommit=True) as conn:
            migrate(conn, Table.parse("outbox"))
        there = await identity(other)
        assert there != await identity(dsn)
        assert there.key.split("/")[0] == (await identity(dsn)).key.split("/")[0]  # one server
    finally:
        with psycopg.connect(admin_dsn, autocommit=True) as conn:
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )


@pytest.fixture
def plain_role(dsn: str) -> Iterator[str]:
    """A DSN of a role with no special privilege that may use the outbox table."""
    role = f"dispatcher_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(role)))
        conn.execute(sql.SQL("GRANT ALL ON ALL TABLES IN SCHEMA public TO {}").format(
            sql.Identifier(role)))  # fmt: skip
    try:
        yield make_conninfo(dsn, user=role)
    finally:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(role)))
            conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))


async def test_a_role_without_privileges_gets_the_same_identity(dsn: str, plain_role: str) -> None:
    assert await identity(plain_role) == await identity(dsn)


async def test_without_pg_control_system_both_roles_agree(dsn: str, plain_role: str) -> None:
    """A role denied pg_control_system() (managed services deny it) keys the table as one
    that may call it does: the server is named by what every role may read."""
    with psycopg.connect(dsn, autocommit=True) as conn:  # in this database only
        conn.execute("REVOKE EXECUTE ON FUNCTION pg_control_system() FROM PUBLIC")
    with psycopg.connect(plain_role, autocommit=True) as conn:
        denied = conn.execute("SELECT has_function_privilege('pg_control_system()', 'execute')")
        assert denied.fetchone() == (False,)
    found = await identity(plain_role)
    params = conninfo_to_dict(dsn)
    server = found.key.split("/")[0]  # start time @ port
    assert server.endswith(f"@{params.get('port', '5432')}"), found
    assert server.split("@")[0].isdigit(), found
    assert found == await identity(dsn)  # a superuser keys it the same
    assert await identity(make_conninfo(plain_role, application_name="again")) == found


async def test_a_role_denied_the_start_time_still_reads_an_identity(
    dsn: str, plain_role: str
) -> None:
    """Checked with has_function_privilege first: no failing call (PostgreSQL would log an
    ERROR on every pass); the server is then named by its port only."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("REVOKE EXECUTE ON FUNCTION pg_postmaster_start_time() FROM PUBLIC")
    found = await identity(plain_role)
    assert found.key.split("/")[0] == f"unknown@{conninfo_to_dict(dsn).get('port', '5432')}"
    assert found.key.split("/")[1:] == (await identity(dsn)).key.split("/")[1:]
