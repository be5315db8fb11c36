"""Privileges on a partitioned table reach its partitions: the claims, finalizes and window
readings name partitions themselves, which a grant on the parent does not cover. The usual
production setup, run for real: an owner role runs `outbox migrate` and `outbox maintain`,
the workers run as a role with grants on the parent only."""

from __future__ import annotations

import subprocess
import sys
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from helpers import seed, statuses, wait_until
from psycopg import sql
from psycopg.conninfo import make_conninfo
from test_worker import Scripted
from workers import dispatching, settings

from outbox.operations.conversion import migrate_converting
from outbox.partitions import Layout, keep_ahead, read_partitions
from outbox.runner import fetch
from outbox.table import Table

TABLE = Table.parse("outbox")
SIZE = 100


class Roles:
    """An owner that may create tables in the schema, and a worker with no privilege of its
    own: grants on the tables come from the test."""

    def __init__(self, dsn: str) -> None:
        tag = uuid.uuid4().hex[:8]
        self.admin = dsn
        self.owner_name, self.worker_name = f"owner_{tag}", f"worker_{tag}"
        self.owner = make_conninfo(dsn, user=self.owner_name)
        self.worker = make_conninfo(dsn, user=self.worker_name)

    def outbox(self, *args: str, dsn: str | None = None) -> subprocess.CompletedProcess[str]:
        """The `outbox` command as the owner (or as `dsn` says)."""
        return subprocess.run(
            [sys.executable, "-m", "outbox", *args, "--dsn", dsn or self.owner],
            capture_output=True,
            text=True,
            timeout=120,
        )

    def grant_on_the_tables(self, conn: Any) -> None:
        """What a worker needs, granted on each table but the partitions (as `GRANT ... ON
        outbox` does), and the sequences."""
        names = conn.execute(
            "SELECT relname FROM pg_class WHERE relnamespace = 'public'::regnamespace "
            "AND relkind IN ('r', 'p') AND NOT relispartition"
        ).fetchall()
        for (name,) in names:
            conn.execute(
                sql.SQL("GRANT SELECT, INSERT, UPDATE, DELETE ON {t} TO {r}").format(
                    t=sql.Identifier(name), r=sql.Identifier(self.worker_name)
                )
            )
        conn.execute(
            sql.SQL("GRANT USAGE ON ALL SEQUENCES IN SCHEMA public TO {r}").format(
                r=sql.Identifier(self.worker_name)
            )
        )


@pytest.fixture
def roles(empty_dsn: str) -> Iterator[Roles]:
    made = Roles(empty_dsn)
    owner, worker = sql.Identifier(made.owner_name), sql.Identifier(made.worker_name)
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE ROLE {} LOGIN").format(owner))
        conn.execute(sql.SQL("CREATE ROLE {} LOGIN").format(worker))
        conn.execute(sql.SQL("GRANT CREATE ON SCHEMA public TO {}").format(owner))
    try:
        yield made
    finally:
        with psycopg.connect(empty_dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP OWNED BY {}, {} CASCADE").format(owner, worker))
            conn.execute(sql.SQL("DROP ROLE {}, {}").format(owner, worker))


def _partitions(conn: Any) -> list[str]:
    return [p.name for p in fetch(conn, read_partitions(TABLE)) or []]


def _readable(dsn: str, name: str) -> bool:
    with psycopg.connect(dsn, autocommit=True) as conn:
        try:
            conn.execute(sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(name)))
        except psycopg.errors.InsufficientPrivilege:
            return False
        return True


@pytest.mark.parametrize("carried_by", ["maintain", "migrate"])
def test_partitions_made_before_a_grant_get_it_from_maintain_or_migrate_again(roles, carried_by):
    made = roles.outbox("migrate", "--partition-size", str(SIZE), "--partitions-ahead", "2")
    assert made.returncode == 0, made.stderr
    with psycopg.connect(roles.owner, autocommit=True) as conn:
        roles.grant_on_the_tables(conn)
        # The grant went to the parent alone: the partitions made before it lack it.
        assert not _readable(roles.worker, "outbox_p1")
        layout = ["--partition-size", str(SIZE), "--partitions-ahead", "2"]
        again = roles.outbox(carried_by, *(layout if carried_by == "migrate" else []))
        assert again.returncode == 0, again.stderr
        partitions = _partitions(conn)
    assert partitions == ["outbox_p0", "outbox_p1", "outbox_p2"]
    assert all(_readable(roles.worker, name) for name in partitions)
    with (
        psycopg.connect(roles.worker, autocommit=True) as worker,
        pytest.raises(psycopg.errors.InsufficientPrivilege),
    ):
        worker.execute("TRUNCATE outbox_p1")  # what it had not on the parent, it has not


async def test_a_worker_with_grants_on_the_parent_drains_partitions_made_after_it_started(roles):
    """Real worker code as a role that does not own the table: its claims, finalizes and
    window readings name the partitions themselves, those made before the grant (carried by
    `outbox maintain`) and those the owner's `outbox maintain` makes while it drains. Its
    own partition keeper may not make partitions (ATTACH needs the owner) and leaves them to
    `outbox maintain`."""
    made = roles.outbox("migrate", "--partition-size", str(SIZE), "--partitions-ahead", "2")
    assert made.returncode == 0, made.stderr
    with psycopg.connect(roles.owner, autocommit=True) as conn:
        roles.grant_on_the_tables(conn)
        assert roles.outbox("maintain").returncode == 0
        seed(conn, 250)
        async with dispatching(settings(roles.worker, batch=40), Scripted(lambda m: None)):
            await wait_until(lambda: statuses(conn) == {"done": 250}, what="the first drain")
            ahead = roles.outbox("maintain")  # the owner's, the worker running
            assert ahead.returncode == 0, ahead.stderr
            assert _partitions(conn)[-1] == "outbox_p4"
            seed(conn, 200)  # ids 251 to 450: into outbox_p3 and outbox_p4, made just now
            await wait_until(lambda: statuses(conn) == {"done": 450}, what="the second drain")
        top = conn.execute("SELECT max(id) FROM outbox_p4").fetchone()
        assert top == (450,)


def test_a_converted_tables_grantee_may_read_every_partition(empty_dsn, roles):
    """A role that could read and update the plain table may name each partition of the
    converted one: those the swap makes and those made ahead after it."""
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("SET ROLE {}").format(sql.Identifier(roles.owner_name)))
        migrate_converting(conn, TABLE, None, None)  # a plain table
        conn.execute(
            sql.SQL("GRANT SELECT, INSERT, UPDATE ON outbox TO {}").format(
                sql.Identifier(roles.worker_name)
            )
        )
        seed(conn, 150)
        _, _, converted = migrate_converting(conn, TABLE, None, Layout(SIZE, 3))
        assert converted is not None
        seed(conn, 50)  # ids 500 to 549, in the partition the swap made
    assert roles.outbox("maintain").returncode == 0  # the partitions ahead of them
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        partitions = _partitions(conn)
    assert partitions == [f"outbox_p{k}" for k in (0, 5, 6, 7, 8)], partitions
    with psycopg.connect(roles.worker, autocommit=True) as worker:
        for name in partitions:
            worker.execute(
                sql.SQL("UPDATE {} SET attempts = attempts WHERE id = 1").format(
                    sql.Identifier(name)
                )
            )
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            worker.execute("DELETE FROM outbox_p8")


async def test_partitions_a_workers_keeper_or_a_superuser_makes_get_the_owner_and_grants(roles):
    """The workers' partition keeper (running as the owner) and `outbox maintain` run by a
    superuser make partitions like the others: the parent's owner, the parent's grants."""
    made = roles.outbox("migrate", "--partition-size", str(SIZE), "--partitions-ahead", "2")
    assert made.returncode == 0, made.stderr
    with psycopg.connect(roles.owner, autocommit=True) as conn:
        roles.grant_on_the_tables(conn)
        assert roles.outbox("maintain").returncode == 0
        seed(conn, 150)  # partitions ahead now lacking: up to outbox_p3
    async with await psycopg.AsyncConnection.connect(roles.owner, autocommit=True) as aconn:
        kept = await keep_ahead(aconn, TABLE, Layout(SIZE, 2))
    assert kept.made == 1  # outbox_p3
    with psycopg.connect(roles.owner, autocommit=True) as conn:
        seed(conn, 100)  # up to id 250: outbox_p4 wanted
    superuser = roles.outbox("maintain", dsn=roles.admin)
    assert superuser.returncode == 0, superuser.stderr
    with psycopg.connect(roles.admin, autocommit=True) as conn:
        owners = conn.execute(
            "SELECT relname, pg_get_userbyid(relowner) FROM pg_class "
            "WHERE relname IN ('outbox_p3', 'outbox_p4') ORDER BY 1"
        ).fetchall()
    assert owners == [("outbox_p3", roles.owner_name), ("outbox_p4", roles.owner_name)]
    assert _readable(roles.worker, "outbox_p3") and _readable(roles.worker, "outbox_p4")


@pytest.mark.parametrize(
    "command",
    [["migrate"], ["migrate", "--partition-size", "100"], ["inbox", "migrate"]],
    ids=["plain", "partitioned", "inbox"],
)
def test_an_owner_of_its_schema_migrates_without_creating_schemas(
    roles: Roles, command: list[str]
) -> None:
    """A role that owns the table's schema and may not create schemas in the database (the
    least a table's owner needs): `CREATE SCHEMA IF NOT EXISTS` asks for that right before it
    looks, and refused it; the schema is made only when it is missing."""
    schema = f"app_{roles.owner_name}"
    with psycopg.connect(roles.admin, autocommit=True) as conn:
        conn.execute(
            sql.SQL("CREATE SCHEMA {} AUTHORIZATION {}").format(
                sql.Identifier(schema), sql.Identifier(roles.owner_name)
            )
        )
    try:
        done = roles.outbox(*command, "--table", f"{schema}.ob")
        assert done.returncode == 0, done.stderr
        with psycopg.connect(roles.admin, autocommit=True) as conn:
            owner = conn.execute(
                "SELECT pg_get_userbyid(relowner) FROM pg_class WHERE oid = to_regclass(%s)",
                (f"{schema}.ob",),
            ).fetchone()
        assert owner == (roles.owner_name,)
    finally:
        with psycopg.connect(roles.admin, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(schema)))
