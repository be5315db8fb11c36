"""Retention runs never take every connection of a database's pool: runs waiting for a
lock (a session holding done rows, a VACUUM FULL) may wait long, and the passes of every
dispatcher on that database must still read their backlog.
"""

from __future__ import annotations

from collections.abc import Callable

import psycopg
import pytest
from psycopg import sql

from outbox.models import Event
from outbox.producer import enqueue_many
from outbox.table import Table

from .cluster import LocalCluster
from .test_operator import (
    Operator,
    apply,
    condition,
    dispatcher_manifest,
    get,
    own_table,
    secret_manifest,
    wait_for,
)

pytestmark = pytest.mark.slow
PURGING = (
    "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'outbox-controller' "
    "AND query LIKE 'DELETE FROM %' AND wait_event_type = 'Lock'"
)


def _purging(dsn: str) -> int:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(PURGING).fetchone()
    return int(row[0]) if row else 0


def _pending(cluster: LocalCluster, name: str) -> int:
    status = (get(cluster, "outboxdispatchers", name) or {}).get("status") or {}
    return int((status.get("backlog") or {}).get("pending") or 0)


def test_retention_runs_waiting_for_locks_leave_the_passes_a_connection(
    cluster: LocalCluster, operators: Callable[..., Operator], dsn: str
) -> None:
    names = ("orders", "shipping")
    manifests = [secret_manifest("orders-db", dsn=dsn)]
    for name in names:
        manifests.append(dispatcher_manifest(name, database=own_table(dsn, name), retention="1h"))
        with psycopg.connect(dsn, autocommit=True) as conn:
            enqueue_many(conn, [Event("a", "1", "created", {})], table=Table.parse(name))
            conn.execute(
                sql.SQL(
                    "UPDATE {} SET status = 'done', done_at = now() - interval '2 hours'"
                ).format(sql.Identifier(name))
            )
    manifests.append(dispatcher_manifest("billing", database=own_table(dsn, "billing")))
    # One transaction holding both tables' done rows: each run's DELETE waits for it.
    with psycopg.connect(dsn) as locker:
        for name in names:
            locker.execute(sql.SQL("SELECT id FROM {} FOR UPDATE").format(sql.Identifier(name)))
        operators("--database-connections", "2")
        apply(cluster, *manifests)
        wait_for("a retention run waiting for the lock", lambda: _purging(dsn))
        wait_for(
            "billing's database checked",
            lambda: condition(cluster, "billing", "DatabaseReachable").get("status") == "True",
        )
        with psycopg.connect(dsn, autocommit=True) as conn:
            enqueue_many(conn, [Event("a", "1", "created", {})], table=Table.parse("billing"))
        # Read by a pass while the runs wait: the pool kept a connection for the passes.
        wait_for("billing's new row in its status", lambda: _pending(cluster, "billing") == 1)
        assert condition(cluster, "billing", "DatabaseReachable")["status"] == "True"
        assert _purging(dsn) == 1  # the other run waits for its turn, holding no connection
        locker.rollback()
    for name in names:
        wait_for(
            f"{name}'s done row purged",
            lambda name=name: (
                ((get(cluster, "outboxdispatchers", name) or {}).get("status") or {}).get(
                    "purgedTotal"
                )
                == 1
            ),
        )
