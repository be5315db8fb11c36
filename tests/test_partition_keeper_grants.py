"""A partition the worker's role may not use (made by hand, or by a role that is not the
table's owner, without the parent's grants): the worker says once which partition lacks
which privilege and what fixes it, keeps retrying its claims, and drains once a GRANT heals
it. Real roles, real worker code."""

from __future__ import annotations

import logging
from typing import Any

import psycopg
import pytest
from helpers import seed, statuses, wait_until
from psycopg import sql
from test_partition_grants import SIZE, Roles, roles  # noqa: F401  (roles: the fixture)
from test_worker import Scripted
from workers import dispatching, settings

from outbox.partition_privileges import refused_partitions
from outbox.runner import fetch
from outbox.table import Table


def _advice(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "lacks" in r.getMessage()]


def _admin_name(roles: Roles) -> str:  # noqa: F811
    with psycopg.connect(roles.admin, autocommit=True) as admin:
        return str(admin.execute("SELECT current_user").fetchone()[0])  # type: ignore[index]


def _claims_refused(replica: Any) -> float:
    return float(replica.metrics.db_errors.labels("claim")._value.get())


def _set_up(made_by: str, roles: Roles, conn: Any) -> None:  # noqa: F811
    """Partitions p0 to p2 with the parent's grants (`outbox maintain`), then p3 made
    without them, holding ten pending rows."""
    made = roles.outbox("migrate", "--partition-size", str(SIZE), "--partitions-ahead", "2")
    assert made.returncode == 0, made.stderr
    roles.grant_on_the_tables(conn)
    assert roles.outbox("maintain").returncode == 0
    hand_made = "CREATE TABLE outbox_p3 PARTITION OF outbox FOR VALUES FROM (300) TO (400)"
    if made_by == "the owner by hand":
        conn.execute(hand_made)
    else:  # a superuser: the partition is the superuser's, with none of the parent's grants
        with psycopg.connect(roles.admin, autocommit=True) as admin:
            admin.execute(hand_made)
    conn.execute("SELECT setval(pg_get_serial_sequence('outbox', 'id'), 300)")
    seed(conn, 10)  # ids 301 to 310: every pending row is in outbox_p3


@pytest.mark.parametrize("healed_by", ["grant", "maintain"])
@pytest.mark.parametrize("made_by", ["the owner by hand", "another role"])
async def test_a_partition_without_the_parents_grants_is_named_once_and_a_grant_heals_it(
    roles,  # noqa: F811
    caplog,
    made_by,
    healed_by,
):
    caplog.set_level(logging.WARNING, logger="outbox.worker")
    with psycopg.connect(roles.owner, autocommit=True) as conn:
        _set_up(made_by, roles, conn)
        worker = settings(roles.worker, batch=40)
        async with dispatching(worker, Scripted(lambda m: None)) as replica:
            await wait_until(lambda: _claims_refused(replica) >= 4, what="refused claims")
            advice = _advice(caplog)
            assert len(advice) == 1, advice  # once, however many claims were refused
            said = advice[0]
            role = roles.worker_name
            assert f"role {role} lacks SELECT, UPDATE on partition outbox_p3 of outbox" in said
            assert "`outbox maintain --table outbox` as the table's owner" in said
            assert f"GRANT SELECT, UPDATE ON outbox_p3 TO {role}" in said
            admin = _admin_name(roles)
            owned_by_another = f"ALTER TABLE outbox_p3 OWNER TO {roles.owner_name}, then run"
            assert (owned_by_another in said) == (made_by == "another role"), said
            assert statuses(conn) == {"pending": 10}

            if healed_by == "maintain":
                if made_by == "another role":  # as the advice says: the owner first
                    with psycopg.connect(roles.admin, autocommit=True) as as_admin:
                        as_admin.execute(
                            sql.SQL("ALTER TABLE outbox_p3 OWNER TO {}").format(
                                sql.Identifier(roles.owner_name)
                            )
                        )
                    assert f"it belongs to {admin}" in said
                healed = roles.outbox("maintain")  # as the table's owner
                assert healed.returncode == 0, healed.stderr
            else:
                with psycopg.connect(roles.admin, autocommit=True) as admin:
                    admin.execute(
                        sql.SQL("GRANT SELECT, UPDATE ON outbox_p3 TO {}").format(
                            sql.Identifier(role)
                        )
                    )
            await wait_until(lambda: statuses(conn) == {"done": 10}, what="the drain")
        assert len(_advice(caplog)) == 1


def test_a_role_without_the_parents_grants_is_told_to_grant_on_the_parent_first(roles):  # noqa: F811
    """A role granted nothing on the parent either: `outbox maintain` alone would carry
    nothing to it."""
    made = roles.outbox("migrate", "--partition-size", str(SIZE), "--partitions-ahead", "1")
    assert made.returncode == 0, made.stderr
    with psycopg.connect(roles.owner, autocommit=True) as conn:
        conn.execute(
            sql.SQL("GRANT SELECT ON outbox, outbox_p0, outbox_p1 TO {}").format(
                sql.Identifier(roles.worker_name)
            )
        )
    with psycopg.connect(roles.worker, autocommit=True) as conn:
        refused = fetch(conn, refused_partitions(Table.parse("outbox")))
    assert [(r.partition, r.privileges, r.on_the_parent) for r in refused] == [
        ("outbox_p0", ("UPDATE",), False),
        ("outbox_p1", ("UPDATE",), False),
    ]
    said = refused[0].advice(Table.parse("outbox"))
    assert f"GRANT UPDATE ON outbox TO {roles.worker_name}, then run `outbox maintain" in said


async def test_a_partition_made_ahead_without_the_grants_is_named_before_its_rows_come(
    roles,  # noqa: F811
    caplog,
):
    """The partition keeper looks at its pass: no claim has been refused yet."""
    caplog.set_level(logging.WARNING, logger="outbox.worker")
    made = roles.outbox("migrate", "--partition-size", str(SIZE), "--partitions-ahead", "2")
    assert made.returncode == 0, made.stderr
    with psycopg.connect(roles.owner, autocommit=True) as conn:
        roles.grant_on_the_tables(conn)
        assert roles.outbox("maintain").returncode == 0
        conn.execute("CREATE TABLE outbox_p3 PARTITION OF outbox FOR VALUES FROM (300) TO (400)")
        seed(conn, 10)  # ids 1 to 10, in outbox_p0
        async with dispatching(settings(roles.worker), Scripted(lambda m: None)) as replica:
            await wait_until(lambda: len(_advice(caplog)) == 1, what="the partition named")
            await wait_until(lambda: statuses(conn) == {"done": 10}, what="the drain")
            assert _claims_refused(replica) == 0
    assert "lacks SELECT, UPDATE on partition outbox_p3 of outbox" in _advice(caplog)[0]
