"""A retention run that fails says so where a user looks: `RetentionHealthy=False` with
reason `RetentionFailed` in status and one Warning Event of that reason naming what failed
and the fix, not one per pass; a run that succeeds again clears it (`RetentionRecovered`).
A purge's DELETE waits for a row lock as long as `outbox maintain`'s statements run, and the
batches a run deleted before it was stopped reach `status.purgedTotal`.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import make_conninfo

from outbox.controller import status as st
from outbox.controller.reconcile.report import DRIFT_CORRECTED
from outbox.models import Event
from outbox.producer import enqueue_many
from outbox.table import Table

from .cluster import LocalCluster
from .test_operator import (
    Operator,
    apply,
    condition,
    dispatcher_manifest,
    events,
    get,
    secret_manifest,
    wait_for,
)

pytestmark = pytest.mark.slow
WAITING = (
    "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'outbox-controller' "
    "AND query LIKE 'DELETE FROM %' AND wait_event_type = 'Lock'"
)


@pytest.fixture
def role_dsn(dsn: str) -> Iterator[str]:
    """A DSN of a role of its own that may read and write the outbox table (no superuser:
    a REVOKE holds for it)."""
    role = f"dispatcher_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(role)))
        for kind in ("TABLES", "SEQUENCES"):
            conn.execute(
                sql.SQL("GRANT ALL ON ALL {} IN SCHEMA public TO {}").format(
                    sql.SQL(kind), sql.Identifier(role)
                )
            )
    try:
        yield make_conninfo(dsn, user=role)
    finally:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(role)))
            conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))


def _done(dsn: str, n: int) -> None:
    """`n` rows done two hours ago."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        enqueue_many(
            conn,
            [Event("order", str(i), "created", {"i": i}) for i in range(n)],
            table=Table.parse("outbox"),
        )
        conn.execute("UPDATE outbox SET status = 'done', done_at = now() - interval '2 hours'")


def _count(dsn: str, query: str = "SELECT count(*) FROM outbox") -> int:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(query).fetchone()
    return int(row[0]) if row else 0


def _status(cluster: LocalCluster) -> dict[str, object]:
    return (get(cluster, "outboxdispatchers", "orders") or {}).get("status") or {}


def _of(cluster: LocalCluster, reason: str) -> list[dict[str, object]]:
    return [e for e in events(cluster, "orders") if e["reason"] == reason]


def test_a_purge_refused_a_privilege_says_so_once_with_the_grant_and_recovers(
    cluster: LocalCluster, operators: Callable[..., Operator], dsn: str, role_dsn: str
) -> None:
    _done(dsn, 5)
    role = psycopg.conninfo.conninfo_to_dict(role_dsn)["user"]
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("REVOKE DELETE ON outbox FROM {}").format(sql.Identifier(role)))
    operator = operators()
    apply(cluster, secret_manifest("orders-db", dsn=role_dsn), dispatcher_manifest(retention="1h"))
    failed = wait_for(
        "RetentionHealthy=False",
        lambda: (
            (c := condition(cluster, "orders", "RetentionHealthy")).get("status") == "False" and c
        ),
    )
    assert failed["reason"] == "RetentionFailed", failed
    message = str(failed["message"])
    assert "permission denied for table outbox" in message, message
    assert f'GRANT DELETE ON "outbox" TO "{role}"' in message, message
    assert "\n" not in message and role_dsn not in message
    # Tried again at every pass (one a second), said once.
    wait_for("three failed runs", lambda: operator.log().count("purge failed") >= 3)
    warned = _of(cluster, "RetentionFailed")
    assert len(warned) == 1 and warned[0]["type"] == "Warning", warned
    assert warned[0]["message"] == message
    assert operator.log().count("RetentionFailed") == 1  # the Event's line, not one a pass
    assert "purgedTotal" not in _status(cluster)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("GRANT DELETE ON outbox TO {}").format(sql.Identifier(role)))
    healthy = wait_for(
        "RetentionHealthy=True",
        lambda: (
            (c := condition(cluster, "orders", "RetentionHealthy")).get("status") == "True" and c
        ),
    )
    assert healthy["reason"] == "RetentionSucceeded", healthy
    assert _status(cluster)["purgedTotal"] == 5
    recovered = wait_for("the RetentionRecovered Event", lambda: _of(cluster, "RetentionRecovered"))
    assert recovered[0]["type"] == "Normal" and "permission denied" in recovered[0]["message"]
    assert len(_of(cluster, "RetentionFailed")) == 1
    # Without a retention there is nothing to say of it.
    cluster.kubectl(
        "patch", "obd", "orders", "--type", "json",
        "-p", '[{"op": "remove", "path": "/spec/retention"}]',
    )  # fmt: skip
    wait_for("the condition gone", lambda: not condition(cluster, "orders", "RetentionHealthy"))


def test_a_purge_waiting_for_a_lock_stops_at_the_lock_timeout_and_says_so(
    cluster: LocalCluster, operators: Callable[..., Operator], dsn: str
) -> None:
    _done(dsn, 3)
    with psycopg.connect(dsn) as locker:
        locker.execute("SELECT id FROM outbox ORDER BY id LIMIT 1 FOR UPDATE")
        operators()
        apply(cluster, secret_manifest("orders-db", dsn=dsn), dispatcher_manifest(retention="1h"))
        wait_for("the run's DELETE waiting for the row", lambda: _count(dsn, WAITING))
        failed = wait_for(
            "RetentionHealthy=False",
            lambda: (
                (c := condition(cluster, "orders", "RetentionHealthy")).get("status") == "False"
                and c
            ),
            timeout=120,  # the lock timeout is one minute
        )
        assert failed["reason"] == "RetentionFailed"
        assert "waited 1m for a lock another session holds" in failed["message"], failed
        assert _of(cluster, "RetentionFailed")
        locker.rollback()
    wait_for(
        "RetentionHealthy=True",
        lambda: condition(cluster, "orders", "RetentionHealthy").get("status") == "True",
    )
    assert _status(cluster)["purgedTotal"] == 3 and _count(dsn) == 0


def test_the_batches_a_stopped_purge_deleted_reach_purged_total(
    cluster: LocalCluster, operators: Callable[..., Operator], dsn: str
) -> None:
    total = 5100  # more than a batch (5000)
    _done(dsn, total)
    # The last row is in the second batch (a sequential scan finds the rows in id order):
    # the first batch goes, the second waits for this lock.
    with psycopg.connect(dsn) as locker:
        locker.execute("SELECT id FROM outbox ORDER BY id DESC LIMIT 1 FOR UPDATE")
        operators()
        apply(cluster, secret_manifest("orders-db", dsn=dsn), dispatcher_manifest(retention="1h"))
        wait_for("the second batch waiting for the row", lambda: _count(dsn, WAITING))
        deleted = total - _count(dsn)
        assert deleted == 5000
        apply(cluster, dispatcher_manifest(retention="7d"))  # the rest is to be kept
        wait_for("the run stopped", lambda: not _count(dsn, WAITING))
        locker.rollback()
    wait_for("the first batch counted", lambda: _status(cluster).get("purgedTotal") == deleted)
    purged = wait_for("a Purged Event", lambda: _of(cluster, "Purged"))
    assert "deleted 5000 done messages" in purged[0]["message"]
    assert _count(dsn) == total - deleted


def test_the_docs_list_every_event_reason_and_the_retention_condition() -> None:
    doc = (Path(__file__).parents[2] / "docs" / "operator.md").read_text()
    table = doc.split("<!-- event reasons -->")[1].split("<!-- end of event reasons -->")[0]
    posted = {
        st.RETENTION_FAILED, st.RETENTION_RECOVERED, DRIFT_CORRECTED, "Purged", "Recovered",
        "DestinationDown", "DestinationRecovered", "ScaledUp", "ScaledDown",
    }  # fmt: skip
    assert {reason for reason in posted if f"`{reason}`" not in table} == set()
    for name in (st.RETENTION_HEALTHY, st.RETENTION_SUCCEEDED, st.RETENTION_FAILED):
        assert f"`{name}`" in doc.split("## Status and conditions")[1], name
