"""The real operator on a partitioned table: its retention timer runs `outbox maintain`
(partitions made ahead, finished ones detached concurrently and dropped, the parent
analyzed) where a plain table's is purged with DELETE, and reports it as the purge does:
status.purgedTotal and lastPurgeTime, a Purged Event."""

from __future__ import annotations

from collections.abc import Callable

import psycopg

from outbox.partitions import Layout, read_partitions
from outbox.runner import fetch
from outbox.schema import migrate
from outbox.table import Table

from .cluster import LocalCluster
from .test_operator import (
    Operator,
    apply,
    dispatcher_manifest,
    enqueue,
    events,
    get,
    secret_manifest,
    wait_for,
)

TABLE = Table.parse("outbox")
ANALYZED = "SELECT last_analyze FROM pg_stat_user_tables WHERE relname = 'outbox'"


def _leaves(dsn: str) -> list[str]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return [p.name for p in fetch(conn, read_partitions(TABLE)) or []]


def test_the_retention_timer_retires_finished_partitions_and_makes_partitions_ahead(
    cluster: LocalCluster, operators: Callable[..., Operator], empty_dsn: str
) -> None:
    dsn = empty_dsn
    with psycopg.connect(dsn, autocommit=True) as conn:
        migrate(conn, TABLE, layout=Layout(100, 2))  # partitions 0-2: ids 0 to 299
    enqueue(dsn, 250)
    with psycopg.connect(dsn, autocommit=True) as conn:
        # Partitions 0 and 1 finished; partition 2 holds the newest ids and pending rows.
        conn.execute("UPDATE outbox SET status = 'done', done_at = now() WHERE id < 200")
        conn.execute("ANALYZE outbox")  # the partitions' row counts, as autovacuum keeps them
        analyzed_before = conn.execute(ANALYZED).fetchone()
    assert analyzed_before is not None and analyzed_before[0] is not None
    assert _leaves(dsn) == ["outbox_p0", "outbox_p1", "outbox_p2"]
    operators()
    # The first pass notes partitions 0 and 1 as finished; a pass a retention later drops them.
    apply(cluster, secret_manifest("orders-db", dsn=dsn), dispatcher_manifest(retention="1s"))
    status = wait_for(
        "the finished partitions retired",
        lambda: (
            (b := get(cluster, "outboxdispatchers", "orders"))
            and b["status"].get("purgedTotal")
            and b["status"]
        ),
    )
    assert status["purgedTotal"] == 199 and "lastPurgeTime" in status  # ids 1 to 199
    leaves = _leaves(dsn)
    assert "outbox_p0" not in leaves and "outbox_p1" not in leaves
    # Two whole partitions past the one holding id 250, made by the operator's run.
    assert leaves[:3] == ["outbox_p2", "outbox_p3", "outbox_p4"]
    with psycopg.connect(dsn, autocommit=True) as conn:
        assert conn.execute("SELECT min(id), count(*) FROM outbox").fetchone() == (200, 51)
        # The parent analyzed by the run (the test's own ANALYZE above set it already, and
        # autovacuum analyzes partitions, never their parent); the pool's connections left
        # outside any transaction.
        analyzed = conn.execute(ANALYZED).fetchone()
        assert analyzed is not None and analyzed[0] > analyzed_before[0], analyzed
        idle = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = "
            "'outbox-controller' AND state NOT IN ('idle', 'active')"
        ).fetchone()
        assert idle == (0,)
    purged = wait_for(
        "the Purged event",
        lambda: [e for e in events(cluster, "orders") if e["reason"] == "Purged"],
    )
    assert "199" in purged[0]["message"]
