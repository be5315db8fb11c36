"""Day two, as a user meets it with kubectl: values the worker would refuse and names no label
can hold are refused at admission, `kubectl explain` describes every field, and the worker pod
settings (pull secrets, resources, spread, priority, budget) reach the pods through the real
operator, within the cluster admin's policy."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
import yaml

from outbox.controller.resource import MAX_NAME_LENGTH

from .cluster import LocalCluster
from .test_operator import (
    NS,
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
HTTP = {"type": "http", "http": {"url": "http://sink.example/in"}}


def kubectl_apply(k8s: LocalCluster, manifest: dict[str, Any]) -> Any:
    return k8s.kubectl("apply", "-f", "-", input=yaml.safe_dump(manifest), check=False)


@pytest.mark.parametrize(
    ("spec", "says"),
    [
        ({"lease": "0s"}, "lease must be between 1s and 24h"),
        ({"lease": "500ms"}, "lease must be between 1s and 24h"),
        ({"lease": "720h"}, "lease must be between 1s and 24h"),
        ({"publisher": {**HTTP, "http": {**HTTP["http"], "timeout": "0s"}}},
         "the publisher's timeout must be between 1ms and 24h"),
        ({"retention": "0s"}, "spec.retention"),
        ({"concurrency": 10001}, "spec.concurrency"),
        ({"worker": {"podLabels": {"app.kubernetes.io/instance": "billing"}}},
         "they select the dispatcher's pods"),
        ({"worker": {"disruptionBudget": {"maxUnavailable": 0}}},
         "spec.worker.disruptionBudget.maxUnavailable"),
        ({"worker": {"disruptionBudget": {"minAvailable": 1, "maxUnavailable": 1}}},
         "takes one of minAvailable and maxUnavailable"),
    ],
)  # fmt: skip
def test_what_the_workers_could_never_run_is_refused_by_kubectl_apply(
    cluster: LocalCluster, spec: dict[str, Any], says: str
) -> None:
    result = kubectl_apply(cluster, dispatcher_manifest("wrong", **spec))
    assert result.returncode != 0
    assert says in result.stderr, result.stderr
    assert cluster.objects("outbox.dev/v1alpha1", "outboxdispatchers", NS) == []


def test_a_name_no_label_can_hold_is_refused_and_the_longest_is_served(
    cluster: LocalCluster, operators: Callable[..., Operator], dsn: str
) -> None:
    too_long = "o" * (MAX_NAME_LENGTH + 1)
    result = kubectl_apply(cluster, dispatcher_manifest(too_long))
    assert result.returncode != 0
    assert f"metadata.name must be at most {MAX_NAME_LENGTH} characters" in result.stderr
    # The longest admitted name gets its workers: every label the operator writes fits.
    operators()
    longest = "o" * MAX_NAME_LENGTH
    apply(cluster, secret_manifest("orders-db", dsn=dsn), dispatcher_manifest(longest))
    deployment = wait_for(
        "the worker Deployment", lambda: get(cluster, "deployments", f"{longest}-worker")
    )
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert labels["app.kubernetes.io/instance"] == longest
    ready = wait_for("DatabaseReachable", lambda: condition(cluster, longest, "DatabaseReachable"))
    assert ready["status"] == "True"


def test_kubectl_explain_describes_the_spec_its_fields_and_the_conditions(
    cluster: LocalCluster,
) -> None:
    top = cluster.kubectl("explain", "obd").stdout
    assert "<no description>" not in top
    assert "What to dispatch" in top  # spec's own description
    for path, says in [
        ("obd.spec", "How long a claim owns a message"),
        ("obd.spec.worker", "imagePullSecrets"),
        ("obd.spec.worker.disruptionBudget", "can never block a node drain"),
        ("obd.status.conditions", "CamelCase word"),
        ("obd.status.conditions.reason", "Why, in one CamelCase word"),
    ]:
        text = cluster.kubectl("explain", path).stdout
        assert says in text, (path, text)
        assert "<no description>" not in text, (path, text)
    recursive = cluster.kubectl("explain", "obd", "--recursive").stdout
    assert "<no description>" not in recursive


def test_the_worker_pod_settings_reach_the_pods_and_the_budget_follows_the_replicas(
    cluster: LocalCluster, operators: Callable[..., Operator], dsn: str
) -> None:
    operators(
        "--allowed-priority-classes=batch-high",
        "--allowed-pod-labels=team",
        "--worker-defaults=" + json.dumps({"nodeSelector": {"pool": "outbox"}}),
    )
    regcred = {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "kubernetes.io/dockerconfigjson",
        "metadata": {"name": "regcred", "namespace": NS,
                     "annotations": {"outbox.dev/dispatchers": "orders"}},
        "stringData": {".dockerconfigjson": '{"auths": {}}'},
    }  # fmt: skip
    worker = {
        "imagePullSecrets": [{"name": "regcred"}],
        "resources": {"requests": {"cpu": "0.25", "memory": "256Mi"}},
        "topologySpreadConstraints": [
            {"maxSkew": 1, "topologyKey": "topology.kubernetes.io/zone",
             "whenUnsatisfiable": "ScheduleAnyway"}],
        "priorityClassName": "batch-high",
        "podLabels": {"team": "orders"},
        "disruptionBudget": {"minAvailable": 2},
    }  # fmt: skip
    manifest = dispatcher_manifest(worker=worker)
    manifest["spec"]["scaling"] = {"minReplicas": 3, "maxReplicas": 4, "pollIntervalSeconds": 1}
    applied = apply(cluster, secret_manifest("orders-db", dsn=dsn), regcred, manifest)
    assert "outboxdispatcher.outbox.dev/orders created" in applied

    def template() -> dict[str, Any] | None:
        deployment = get(cluster, "deployments", "orders-worker")
        return deployment["spec"]["template"] if deployment else None

    pod = wait_for("the worker Deployment", template)
    spec = pod["spec"]
    assert spec["imagePullSecrets"] == [{"name": "regcred"}]
    assert spec["containers"][0]["resources"] == {"requests": {"cpu": "250m", "memory": "256Mi"}}
    assert spec["priorityClassName"] == "batch-high"
    assert spec["nodeSelector"] == {"pool": "outbox"}  # the admin's default
    [spread] = spec["topologySpreadConstraints"]
    assert spread["labelSelector"]["matchLabels"]["app.kubernetes.io/instance"] == "orders"
    assert pod["metadata"]["labels"]["team"] == "orders"

    def budget() -> dict[str, Any] | None:
        found = cluster.objects("policy/v1", "poddisruptionbudgets", NS, "orders-worker")
        return found[0] if found else None

    def allowed() -> Any:
        return ((budget() or {}).get("spec") or {}).get("maxUnavailable")

    pdb = wait_for("the workers' PodDisruptionBudget", budget)
    # minAvailable 2 of 3 replicas: one eviction at a time; never none.
    assert pdb["spec"]["maxUnavailable"] == 1
    assert pdb["spec"]["unhealthyPodEvictionPolicy"] == "AlwaysAllow"
    # Pinned to 2 replicas, minAvailable 2 would allow no eviction: still one.
    cluster.kubectl("scale", "obd", "orders", "--replicas", "2")
    wait_for(
        "2 replicas", lambda: get(cluster, "deployments", "orders-worker")["spec"]["replicas"] == 2
    )
    assert allowed() == 1
    cluster.kubectl("scale", "obd", "orders", "--replicas", "4")
    wait_for("maxUnavailable 2 at 4 replicas", lambda: allowed() == 2)
    # Removed from the spec, the budget lets every eviction through (the operator deletes
    # nothing; the budget goes with the resource).
    remove = '[{"op": "remove", "path": "/spec/worker/disruptionBudget"}]'
    cluster.kubectl("patch", "obd", "orders", "--type=json", "-p", remove)
    wait_for("the budget released", lambda: allowed() == "100%")
    # The settings as the server stores them (0.25 CPU is 250m) are what the operator rendered:
    # nothing was ever put back as drift.
    assert [e for e in events(cluster, "orders") if e["reason"] == "DriftCorrected"] == []


def test_a_pod_setting_outside_the_policy_stops_the_workers_with_the_reason(
    cluster: LocalCluster, operators: Callable[..., Operator], dsn: str
) -> None:
    operators()  # the narrowest policy: no priority classes, no extra labels
    worker = {"priorityClassName": "system-cluster-critical", "podLabels": {"team": "x"}}
    apply(cluster, secret_manifest("orders-db", dsn=dsn), dispatcher_manifest(worker=worker))
    ready = wait_for(
        "Ready=False PolicyViolation",
        lambda: (c := condition(cluster, "orders", "Ready"))["reason"] == "PolicyViolation" and c,
    )
    assert "spec.worker.priorityClassName" in ready["message"]
    assert "spec.worker.podLabels.team" in ready["message"]
    assert get(cluster, "deployments", "orders-worker") is None
