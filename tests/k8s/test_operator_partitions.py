"""The real operator on a partitioned table: its retention timer runs `outbox maintain`
(partitions made ahead, finished ones detached concurrently and dropped, the parent
analyzed) where a plain table's is purged with DELETE, and reports it as the purge does:
status.purgedTotal and lastPurgeTime, a Purged Event; the partitions a run dropped before it
failed or was stopped count as a purge's batches do."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg

from outbox.partitions import FINISHED_NOTE, Layout, read_partitions
from outbox.runner import fetch
from outbox.schema import migrate
from outbox.table import Table

from .cluster import LocalCluster
from .test_operator import (
    Operator,
    apply,
    condition,
    dispatcher_manifest,
    enqueue,
    events,
    get,
    secret_manifest,
    wait_for,
)

TABLE = Table.parse("outbox")
ANALYZED = "SELECT last_analyze FROM pg_stat_user_tables WHERE relname = 'outbox'"
ANALYZE_WAITING = (
    "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'outbox-controller' "
    "AND query LIKE 'ANALYZE %' AND wait_event_type = 'Lock'"
)


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


def _two_finished(dsn: str) -> None:
    """Partitions 0 to 2 (ids 0 to 299), rows 1 to 250; 0 and 1 done (199 rows, the
    partitions' statistics read), 2 holding the newest ids and pending rows."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        migrate(conn, TABLE, layout=Layout(100, 2))
    enqueue(dsn, 250)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("UPDATE outbox SET status = 'done', done_at = now() WHERE id < 200")
        conn.execute("ANALYZE outbox")


def _status_when(
    cluster: LocalCluster, what: str, ready: Callable[[dict[str, Any]], bool]
) -> dict[str, Any]:
    """The dispatcher's status once `ready` says so."""

    def status() -> dict[str, Any] | None:
        found = get(cluster, "outboxdispatchers", "orders")
        return found["status"] if found and ready(found["status"]) else None

    return wait_for(what, status)


def _purged(cluster: LocalCluster) -> list[dict[str, object]]:
    return [e for e in events(cluster, "orders") if e["reason"] == "Purged"]


def test_the_partitions_a_failed_run_dropped_reach_purged_total(
    cluster: LocalCluster, operators: Callable[..., Operator], empty_dsn: str
) -> None:
    """The sequence moved far past the partitions: each run drops what it may, then fails
    (`TooFarAhead`, said once it retired). The partitions it dropped are gone all the same."""
    dsn = empty_dsn
    _two_finished(dsn)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SELECT setval('outbox_id_seq', 1000000000)")
    operators()
    apply(cluster, secret_manifest("orders-db", dsn=dsn), dispatcher_manifest(retention="1s"))
    failed = wait_for(
        "RetentionHealthy=False",
        lambda: (
            (c := condition(cluster, "orders", "RetentionHealthy")).get("status") == "False" and c
        ),
    )
    assert "making them all is refused" in str(failed["message"]), failed
    # Noted finished by the first run, dropped by one a second later, which fails as well.
    wait_for("the finished partitions dropped", lambda: _leaves(dsn) == ["outbox_p2"])
    status = _status_when(cluster, "the dropped partitions counted", lambda s: "purgedTotal" in s)
    assert status["purgedTotal"] == 199, status
    assert "lastPurgeTime" not in status  # no run ended well
    purged = wait_for("a Purged Event", lambda: _purged(cluster))
    assert "deleted 199 done messages before the retention run" in purged[0]["message"]
    with psycopg.connect(dsn, autocommit=True) as conn:
        assert conn.execute("SELECT min(id), count(*) FROM outbox").fetchone() == (200, 51)


def test_the_partitions_a_stopped_run_dropped_reach_purged_total(
    cluster: LocalCluster, operators: Callable[..., Operator], empty_dsn: str
) -> None:
    """A run that dropped its partitions and waits for a lock on its ANALYZE of the parent is
    cancelled (the spec's retention changed): the rows it dropped count."""
    dsn = empty_dsn
    _two_finished(dsn)
    noted = (datetime.now(UTC) - timedelta(hours=2)).isoformat()
    with psycopg.connect(dsn, autocommit=True) as conn:
        for leaf in ("outbox_p0", "outbox_p1"):  # finished two hours ago: the first run retires
            conn.execute(f"COMMENT ON TABLE {leaf} IS '{FINISHED_NOTE}{noted}'")
    # A lock on the partition kept (not on the parent: the run's DETACH goes on) holds up
    # the run's ANALYZE of the parent, which takes each partition's too, after the DROP.
    with psycopg.connect(dsn) as locker:
        locker.execute("LOCK TABLE outbox_p2 IN SHARE UPDATE EXCLUSIVE MODE")
        operators()
        apply(cluster, secret_manifest("orders-db", dsn=dsn), dispatcher_manifest(retention="1h"))
        wait_for("the run's ANALYZE waiting for the lock", lambda: _count(dsn, ANALYZE_WAITING))
        assert _leaves(dsn)[:1] == ["outbox_p2"]  # p0 and p1 dropped already
        apply(cluster, dispatcher_manifest(retention="7d"))
        status = _status_when(
            cluster, "the new spec served", lambda s: s.get("observedGeneration") == 2
        )
        # Reported by the pass that stopped the run.
        assert status.get("purgedTotal") == 199, status
        locker.rollback()
    purged = wait_for("a Purged Event", lambda: _purged(cluster))
    assert "deleted 199 done messages before the retention run stopped" in purged[0]["message"]
    status = _status_when(cluster, "a run under the new retention", lambda s: "lastPurgeTime" in s)
    assert status["purgedTotal"] == 199, status  # counted once


def _count(dsn: str, query: str) -> int:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(query).fetchone()
    return int(row[0]) if row else 0
