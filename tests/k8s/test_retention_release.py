"""A retention run in flight ends when its dispatcher is released, at the database too.

The purge runs as a task beside the passes (controller/database.py). When nobody serves its
table any more (the resource deleted, or the operator lost its Lease) the task is cancelled
and its statement with it (the connection's cancel): a DELETE waiting for a lock does not
wait on for nobody. PostgreSQL does not notice a client gone while a statement waits for a
lock, so only the cancel ends it here: the test's lock is held throughout.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import psycopg
import pytest
from psycopg import sql

from outbox.controller.cli import LOST_LEADERSHIP
from outbox.controller.database import APPLICATION_NAME

from .cluster import LocalCluster
from .test_operator import (
    Operator,
    apply,
    dispatcher_manifest,
    own_table,
    secret_manifest,
    wait_for,
)

TABLE = "retained"


def _purges_waiting(dsn: str) -> int:
    """The operator's DELETEs waiting for a lock on the table."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s "
            "AND wait_event_type = 'Lock' AND query ILIKE 'DELETE%%'",
            (APPLICATION_NAME,),
        ).fetchone()
    assert row is not None
    return int(row[0])


@pytest.fixture
def locked(dsn: str) -> Iterator[psycopg.Connection]:
    """The table under a SHARE lock: its stats are read, its purge waits (held till the end)."""
    database = own_table(dsn, TABLE)
    assert database["table"] == TABLE
    with psycopg.connect(dsn) as conn:
        conn.execute(sql.SQL("LOCK TABLE {} IN SHARE MODE").format(sql.Identifier(TABLE)))
        yield conn
        conn.rollback()


def _a_purge_waiting(
    cluster: LocalCluster, operators: Callable[..., Operator], dsn: str
) -> Operator:
    manifest = dispatcher_manifest(
        "retained",
        database={"dsnSecretRef": {"name": "orders-db", "key": "dsn"}, "table": TABLE},
        retention="1h",
        scaling={"minReplicas": 0, "maxReplicas": 1, "pollIntervalSeconds": 1},
    )
    apply(cluster, secret_manifest("orders-db", dsn=dsn), manifest)
    operator = operators()
    wait_for("the purge waiting for the lock", lambda: _purges_waiting(dsn) == 1)
    return operator


def test_deleting_the_resource_cancels_its_purge_in_flight(
    cluster: LocalCluster,
    operators: Callable[..., Operator],
    dsn: str,
    locked: psycopg.Connection,
) -> None:
    _a_purge_waiting(cluster, operators, dsn)
    cluster.kubectl("delete", "obd", "retained", "--wait=true")
    wait_for("the purge's statement cancelled", lambda: _purges_waiting(dsn) == 0)
    assert not locked.closed  # the lock still held: the cancel ended it, not the lock


def test_losing_the_lease_cancels_the_purge_in_flight(
    cluster: LocalCluster,
    operators: Callable[..., Operator],
    dsn: str,
    locked: psycopg.Connection,
) -> None:
    operator = _a_purge_waiting(cluster, operators, dsn)
    # Another replica took the Lease: this one may not act any more.
    cluster.kubectl(
        "patch", "lease", "outbox-controller", "--type=merge",
        "-p", '{"spec":{"holderIdentity":"another-replica"}}',
    )  # fmt: skip
    assert operator.wait(timeout=60) == LOST_LEADERSHIP
    assert _purges_waiting(dsn) == 0
    assert not locked.closed
