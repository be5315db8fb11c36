"""Fixtures: one real PostgreSQL per test session, a fresh database per test.

The server is the embedded PostgreSQL 18 unless OUTBOX_TEST_DSN names another one (its
user needs CREATEDB), or OUTBOX_TEST_PG_BIN names another installation's binaries to start
(e.g. /usr/lib/postgresql/15/bin). A template database is migrated once; each test gets a
copy of it, which takes milliseconds (procrastinate's fixtures do the same).
"""

from __future__ import annotations

import importlib
import os
import sys
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from outbox.demo.embedded import EmbeddedPostgres
from outbox.demo.sink import Sink
from outbox.schema import migrate
from outbox.table import Table

if TYPE_CHECKING:
    from test_nats import NatsServer

sys.path.insert(0, str(Path(__file__).parent))

TEMPLATE = f"outbox_template_{os.getpid()}"
TEST_SETTINGS = {
    # Durability is not under test; speed is welcome.
    "fsync": "off",
    "synchronous_commit": "off",
    "full_page_writes": "off",
    "max_connections": "300",
}


# The tiers whose conftest prints a report at the end of the run (`pytest_terminal_summary`).
REPORTING_CONFTESTS = ("chaos.conftest", "image.conftest")


def pytest_configure(config: pytest.Config) -> None:
    """The pytest-xdist controller collects nothing, so it would never load those conftests:
    it loads them here, to merge what the workers hand over and print it."""
    if getattr(config, "workerinput", None) is None and config.getoption("numprocesses", None):
        for name in REPORTING_CONFTESTS:
            module = importlib.import_module(name)
            if not config.pluginmanager.is_registered(module):
                config.pluginmanager.register(module)


@pytest.fixture(scope="session")
def admin_dsn() -> Iterator[str]:
    external = os.environ.get("OUTBOX_TEST_DSN")
    if external:
        yield external
        return
    bin_dir = os.environ.get("OUTBOX_TEST_PG_BIN")
    with EmbeddedPostgres(
        settings=TEST_SETTINGS, bin_dir=Path(bin_dir) if bin_dir else None
    ) as server:
        yield server.dsn()


def _with_dbname(dsn: str, dbname: str) -> str:
    params = conninfo_to_dict(dsn)
    params["dbname"] = dbname
    return make_conninfo("", **params)


@pytest.fixture(scope="session")
def template(admin_dsn: str) -> Iterator[str]:
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {}").format(sql.Identifier(TEMPLATE)))
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(TEMPLATE)))
    with psycopg.connect(_with_dbname(admin_dsn, TEMPLATE), autocommit=True) as conn:
        migrate(conn, Table.parse("outbox"))
    yield TEMPLATE
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {}").format(sql.Identifier(TEMPLATE)))


@pytest.fixture
def dsn(admin_dsn: str, template: str) -> Iterator[str]:
    """A fresh database with a migrated `outbox` table."""
    name = f"outbox_test_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        conn.execute(
            sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(
                sql.Identifier(name), sql.Identifier(template)
            )
        )
    yield _with_dbname(admin_dsn, name)
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        conn.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
        )


@pytest.fixture
def empty_dsn(admin_dsn: str) -> Iterator[str]:
    """A fresh database without any outbox table."""
    name = f"outbox_empty_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    yield _with_dbname(admin_dsn, name)
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        conn.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
        )


@pytest.fixture
def table() -> Table:
    return Table.parse("outbox")


@pytest.fixture
def conn(dsn: str) -> Iterator[psycopg.Connection[tuple[object, ...]]]:
    with psycopg.connect(dsn, autocommit=True) as connection:
        yield connection


@pytest.fixture
async def aconn(dsn: str) -> AsyncIterator[psycopg.AsyncConnection[tuple[object, ...]]]:
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as connection:
        yield connection


@pytest.fixture
def sink() -> Iterator[Sink]:
    with Sink() as server:
        yield server


@pytest.fixture
def nats_server(tmp_path: Path) -> Iterator[NatsServer]:
    """A real nats-server (JetStream) of the test's own, for the NATS publisher's tests."""
    from test_nats import NatsServer  # here: only the tests that ask for it load the NATS client

    server = NatsServer(tmp_path / "nats").start()
    yield server
    server.stop()
