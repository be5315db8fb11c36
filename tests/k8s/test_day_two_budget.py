"""The workers' PodDisruptionBudget never holds a drain, with the real operator, the local
kubelet and kubectl: while worker pods not ready (here a new pod whose image cannot be pulled,
as a replacement a drain left Pending would be) use up what the budget allows, the operator
writes it to allow every eviction, and restores it once every pod is ready again."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

from .cluster import LocalCluster
from .kubelet import Kubelet
from .test_operator import (
    NS,
    Operator,
    apply,
    condition,
    dispatcher_manifest,
    secret_manifest,
    wait_for,
)

pytestmark = pytest.mark.slow


# `dsn` first: the database outlives the workers at teardown.
def test_pods_not_ready_release_the_budget_until_they_are_ready(
    dsn: str, cluster: LocalCluster, kubelet: Kubelet, operators: Callable[..., Operator]
) -> None:
    missing = "docker.io/library/outbox-dispatcher:no-such-tag"
    kubelet.unpullable[missing] = f'failed to pull image "{missing}": not found'
    operators()
    manifest = dispatcher_manifest(
        publisher={"type": "null"}, worker={"disruptionBudget": {"maxUnavailable": 1}}
    )
    manifest["spec"]["scaling"] = {"minReplicas": 2, "maxReplicas": 2, "pollIntervalSeconds": 1}
    apply(cluster, secret_manifest("orders-db", dsn=dsn), manifest)

    def allowed() -> Any:
        found = cluster.objects("policy/v1", "poddisruptionbudgets", NS, "orders-worker")
        return found[0]["spec"]["maxUnavailable"] if found else None

    wait_for(
        "two ready workers",
        lambda: (
            condition(cluster, "orders", "Ready").get("status") == "True"
            and len([p for p in kubelet.pods("default", "orders-worker") if p.ready]) == 2
        ),
    )
    wait_for("the budget as asked, two pods ready", lambda: allowed() == 1)

    # A pod that cannot become ready: maxUnavailable 1 would allow no eviction while it lasts.
    patch = json.dumps({"spec": {"worker": {"image": missing}}})
    cluster.kubectl("patch", "obd", "orders", "--type=merge", "-p", patch)
    wait_for(
        "a worker pod that is not ready",
        lambda: any(not p.ready for p in kubelet.pods("default", "orders-worker")),
    )
    wait_for("the budget released", lambda: allowed() == "100%")

    # Every pod ready again: the budget as asked.
    undo = '[{"op": "remove", "path": "/spec/worker/image"}]'
    cluster.kubectl("patch", "obd", "orders", "--type=json", "-p", undo)
    wait_for("the budget restored", lambda: allowed() == 1)
    assert all(p.ready for p in kubelet.pods("default", "orders-worker"))
