"""A retention run in flight belongs to the spec that started it: changed (a retention of
1h meant as 1d, a longer one, none at all, another table), the run is cancelled, its
statement with it, and done rows the new spec keeps are never deleted by the old one.
"""

from __future__ import annotations

from collections.abc import Callable

import psycopg
import pytest

from .cluster import LocalCluster
from .test_operator import (
    Operator,
    apply,
    dispatcher_manifest,
    enqueue,
    get,
    secret_manifest,
    wait_for,
)

pytestmark = pytest.mark.slow
PURGING = (
    "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'outbox-controller' "
    "AND query LIKE 'DELETE FROM %' AND state = 'active'"
)


def _purging(dsn: str) -> int:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(PURGING).fetchone()
    return int(row[0]) if row else 0


@pytest.mark.parametrize("retention", ["7d", None], ids=["longer", "removed"])
def test_a_retention_changed_while_its_run_waits_deletes_nothing_the_new_one_keeps(
    cluster: LocalCluster, operators: Callable[..., Operator], dsn: str, retention: str | None
) -> None:
    enqueue(dsn, 10)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("UPDATE outbox SET status = 'done', done_at = now() - interval '2 hours'")
    # A transaction holding one done row: the run's DELETE waits for it.
    with psycopg.connect(dsn) as locker:
        locker.execute("SELECT id FROM outbox ORDER BY id LIMIT 1 FOR UPDATE")
        operators()
        apply(cluster, secret_manifest("orders-db", dsn=dsn), dispatcher_manifest(retention="1h"))
        wait_for("the run's DELETE waiting for the row", lambda: _purging(dsn))
        # 1h was a mistake: the rows are to be kept.
        changed = dispatcher_manifest(**({"retention": retention} if retention else {}))
        if retention is None:
            cluster.kubectl(
                "patch", "obd", "orders", "--type", "json",
                "-p", '[{"op": "remove", "path": "/spec/retention"}]',
            )  # fmt: skip
        else:
            apply(cluster, changed)
        wait_for(
            "the new spec served",
            lambda: (
                ((get(cluster, "outboxdispatchers", "orders") or {}).get("status") or {}).get(
                    "observedGeneration"
                )
                == 2
            ),
        )
        wait_for("the old run's DELETE cancelled", lambda: not _purging(dsn))
        locker.rollback()
    if retention is not None:
        status = wait_for(
            "a run under the new retention",
            lambda: (
                (b := get(cluster, "outboxdispatchers", "orders"))
                and "lastPurgeTime" in b["status"]
                and b["status"]
            ),
        )
        assert status["purgedTotal"] == 0, status
    with psycopg.connect(dsn) as conn:
        assert conn.execute("SELECT count(*) FROM outbox").fetchone() == (10,)
