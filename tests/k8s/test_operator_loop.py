"""The closed loop: kubectl apply → Deployment → backlog → scale up → real workers drain it →
scale down to minReplicas; `kubectl get obd`, the status and the Events tell the story."""

from __future__ import annotations

from collections.abc import Callable

import psycopg
import pytest

from .cluster import LocalCluster
from .kubelet import Kubelet
from .test_operator import (
    Operator,
    apply,
    condition,
    dispatcher_manifest,
    enqueue,
    events,
    get,
    scaled_up,
    secret_manifest,
    wait_for,
)

pytestmark = pytest.mark.slow


def pending(dsn: str) -> int:
    with psycopg.connect(dsn) as conn:
        row = conn.execute("SELECT count(*) FROM outbox WHERE status <> 'done'").fetchone()
    return int(row[0]) if row else -1


# `dsn` first: the database outlives the workers at teardown.
def test_the_closed_loop(
    dsn: str, cluster: LocalCluster, kubelet: Kubelet, operators: Callable[..., Operator]
) -> None:
    operator = operators()
    scaling = {
        "minReplicas": 0,
        "maxReplicas": 3,
        "pollIntervalSeconds": 1,
        "targetOldestReadyAgeSeconds": 2,
        "scaleDownStabilizationSeconds": 3,
    }
    apply(
        cluster,
        secret_manifest("orders-db", dsn=dsn),
        dispatcher_manifest(publisher={"type": "null"}, scaling=scaling),
    )
    wait_for(
        "an idle Deployment at minReplicas",
        lambda: (d := get(cluster, "deployments", "orders-worker")) and d["spec"]["replicas"] == 0,
    )
    wait_for(
        "Ready=True: nothing to do",
        lambda: condition(cluster, "orders", "Ready").get("reason") == "ScaledToZero",
    )

    enqueue(dsn, 3000)
    wait_for("a scale-up for the backlog", lambda: scaled_up(cluster) > 0)
    wait_for(
        "ready workers",
        lambda: (
            (get(cluster, "outboxdispatchers", "orders") or {})["status"].get("readyReplicas", 0)
            > 0
        ),
    )
    wait_for("the real workers to drain the table", lambda: pending(dsn) == 0, timeout=120)
    wait_for("the scale-down to minReplicas", lambda: scaled_up(cluster) == 0, timeout=120)
    wait_for("every worker process gone", lambda: not kubelet.pods("default", "orders-worker"))

    status = wait_for(
        "the status after the drain",
        lambda: (
            (s := (get(cluster, "outboxdispatchers", "orders") or {})["status"])
            and s["backlog"]["backlog"] == 0
            and s["desiredReplicas"] == 0
            and not s.get("readyReplicas")
            and s
        ),
    )
    assert status["observedGeneration"] == 1
    assert "lastScaleTime" in status
    in_order = sorted(
        events(cluster, "orders"), key=lambda e: int(e["metadata"]["resourceVersion"])
    )
    story = [e["reason"] for e in in_order]
    assert "ScaledUp" in story and "ScaledDown" in story
    assert story.index("ScaledUp") < len(story) - 1 - story[::-1].index("ScaledDown")
    assert condition(cluster, "orders", "Ready")["status"] == "True"
    assert operator.metric("outbox_controller_scale_decisions_total", direction="up")

    table = cluster.kubectl("get", "obd").stdout.splitlines()
    assert table[0].split() == [
        "NAME",
        "READY",
        "DESIRED",
        "BACKLOG",
        "OLDEST-READY",
        "OLDEST-UNFINISHED",
        "DEAD",
        "DESTINATIONS",
        "STATUS",
        "SPEC-PAUSED",
        "AGE",
    ]
    assert table[1].split()[:9] == ["orders", "0", "0", "0", "0", "0", "0", "Reachable", "True"]
    described = cluster.kubectl("describe", "obd", "orders").stdout
    assert "ScaledUp" in described and "ScaledDown" in described and "ScaledToZero" in described
