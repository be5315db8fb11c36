"""The local kubelet: Deployments in the emulator become real `outbox-worker` processes."""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Callable
from typing import Any

import psycopg
import pytest
from helpers import seed, statuses

from .cluster import LocalCluster
from .kubelet import Kubelet

# Each test asks for `dsn` first: the database must outlive the workers at teardown.
pytestmark = pytest.mark.slow


def eventually(check: Callable[[], Any], what: str, timeout: float = 60) -> Any:
    deadline = time.monotonic() + timeout
    while not (result := check()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)
    return result


def worker_deployment(
    name: str, replicas: int, *, extra_env: dict[str, str] | None = None, grace: int = 30
) -> str:
    env = [
        {"name": "OUTBOX_DSN", "valueFrom": {"secretKeyRef": {"name": "db", "key": "dsn"}}},
        {"name": "OUTBOX_PUBLISHER", "value": "null"},
        {"name": "OUTBOX_METRICS_PORT", "value": "9090"},
        {"name": "OUTBOX_POLL_INTERVAL", "value": "100ms"},
        {"name": "OUTBOX_LOG_FORMAT", "value": "json"},
        {"name": "OUTBOX_OWNER", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
    ]
    env += [{"name": k, "value": v} for k, v in (extra_env or {}).items()]
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {
                    "terminationGracePeriodSeconds": grace,
                    "containers": [
                        {
                            "name": "worker",
                            "image": "outbox-dispatcher:test",
                            "command": ["outbox-worker"],
                            "env": env,
                            "ports": [{"name": "metrics", "containerPort": 9090}],
                            "readinessProbe": {"httpGet": {"path": "/readyz", "port": "metrics"}},
                        }
                    ],
                },
            },
        },
    }
    return json.dumps(deployment)


def secret(dsn: str) -> str:
    return json.dumps(
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "db"},
            "stringData": {"dsn": dsn},
        }
    )


def deployment_status(k8s: LocalCluster, name: str) -> dict[str, Any]:
    found = k8s.objects("apps/v1", "deployments", "default", name)
    return found[0].get("status", {}) if found else {}


def test_a_deployment_runs_real_workers_that_drain_the_table(
    dsn: str, conn: psycopg.Connection[Any], k8s: LocalCluster, kubelet: Kubelet
) -> None:
    k8s.kubectl("apply", "-f", "-", input=secret(dsn))
    k8s.kubectl("apply", "-f", "-", input=worker_deployment("workers", 2))
    status = eventually(
        lambda: (s := deployment_status(k8s, "workers")).get("readyReplicas") == 2 and s,
        "two ready workers",
    )
    assert status["replicas"] == status["updatedReplicas"] == status["availableReplicas"] == 2
    assert status["observedGeneration"] == 1
    seed(conn, 200)
    eventually(lambda: statuses(conn) == {"done": 200}, "the backlog drained")
    # OUTBOX_OWNER came from the pod's name (fieldRef), the DSN from the Secret.
    for pod in kubelet.pods("default", "workers"):
        assert f"worker {pod.name} dispatching" in kubelet.logs("default", pod.name)
    # Each pod has its own port: both answer their own /readyz.
    ports = {p.ports[9090] for p in kubelet.pods("default", "workers")}
    assert len(ports) == 2


def test_scaling_down_stops_workers_with_sigterm_and_they_exit_cleanly(
    dsn: str, k8s: LocalCluster, kubelet: Kubelet
) -> None:
    k8s.kubectl("apply", "-f", "-", input=secret(dsn))
    k8s.kubectl("apply", "-f", "-", input=worker_deployment("workers", 3))
    eventually(lambda: deployment_status(k8s, "workers").get("readyReplicas") == 3, "3 ready")
    k8s.kubectl("scale", "deployment", "workers", "--replicas=1")
    eventually(lambda: deployment_status(k8s, "workers").get("replicas") == 1, "scaled to 1")
    stopped = eventually(
        lambda: (
            [r for r in kubelet.records if r.returncode is not None]
            if len([r for r in kubelet.records if r.returncode is not None]) == 2
            else None
        ),
        "two processes ended",
    )
    for record in stopped:
        assert record.reason == "scale-down"
        assert record.signals == ["SIGTERM"]  # no SIGKILL was needed
        assert record.returncode == 0, kubelet.logs("default", record.name)
        assert "SIGTERM received" in kubelet.logs("default", record.name)
    assert len(kubelet.pods("default", "workers")) == 1


def test_a_template_change_rolls_the_pods_and_deletion_stops_them(
    dsn: str, k8s: LocalCluster, kubelet: Kubelet
) -> None:
    k8s.kubectl("apply", "-f", "-", input=secret(dsn))
    k8s.kubectl("apply", "-f", "-", input=worker_deployment("workers", 2))
    eventually(lambda: deployment_status(k8s, "workers").get("readyReplicas") == 2, "2 ready")
    first = {p.name for p in kubelet.pods("default", "workers")}
    k8s.kubectl(
        "apply", "-f", "-", input=worker_deployment("workers", 2, extra_env={"OUTBOX_BATCH": "10"})
    )
    eventually(
        lambda: (
            (s := deployment_status(k8s, "workers")).get("updatedReplicas") == 2
            and s.get("readyReplicas") == 2
            and s.get("replicas") == 2
            and s.get("observedGeneration") == 2
        ),
        "rolled out",
    )
    second = {p.name for p in kubelet.pods("default", "workers")}
    assert not first & second
    assert all(r.reason == "rollout" for r in kubelet.records if r.name in first)
    k8s.kubectl("delete", "deployment", "workers")
    eventually(lambda: all(r.returncode is not None for r in kubelet.records), "all stopped")
    assert all(r.signals == ["SIGTERM"] for r in kubelet.records)


def test_a_missing_secret_holds_the_pod_back_until_it_exists(
    dsn: str, k8s: LocalCluster, kubelet: Kubelet
) -> None:
    k8s.kubectl("apply", "-f", "-", input=worker_deployment("workers", 1))
    reason = eventually(lambda: kubelet.errors.get(("default", "workers")), "a held-back pod")
    assert reason == 'secret "db" not found'
    assert not kubelet.records
    k8s.kubectl("apply", "-f", "-", input=secret(dsn))
    eventually(lambda: deployment_status(k8s, "workers").get("readyReplicas") == 1, "1 ready")


def test_pods_are_published_and_deleting_one_replaces_its_process(
    dsn: str, k8s: LocalCluster, kubelet: Kubelet
) -> None:
    k8s.kubectl("apply", "-f", "-", input=secret(dsn))
    k8s.kubectl("apply", "-f", "-", input=worker_deployment("workers", 2))
    eventually(lambda: deployment_status(k8s, "workers").get("readyReplicas") == 2, "2 ready")
    eventually(
        lambda: (
            all(
                c["status"] == "True"
                for p in k8s.objects("v1", "pods", "default")
                for c in p.get("status", {}).get("conditions", [])
                if c["type"] == "Ready"
            )
            and len(k8s.objects("v1", "pods", "default")) == 2
        ),
        "two Ready pods",
    )
    table = k8s.kubectl("get", "pods").stdout.splitlines()
    assert table[0].split() == ["NAME", "READY", "STATUS", "RESTARTS", "AGE"]
    assert [row.split()[1:4] for row in table[1:]] == [["1/1", "Running", "0"]] * 2
    listed = k8s.kubectl("get", "pods", "-o", "name").stdout.split()
    assert sorted(listed) == sorted(f"pod/{p.name}" for p in kubelet.pods("default", "workers"))
    victim = listed[0].removeprefix("pod/")
    assert f"worker {victim} dispatching" in k8s.kubectl("logs", listed[0]).stdout
    assert "dispatching" in k8s.kubectl("logs", "deployment/workers").stdout
    k8s.kubectl("delete", "pod", victim)
    record = next(r for r in kubelet.records if r.name == victim)
    eventually(lambda: record.returncode is not None, "the deleted pod's process ended")
    assert record.reason == "pod-deleted" and record.signals == ["SIGTERM"]
    eventually(
        lambda: (
            len(kubelet.pods("default", "workers")) == 2
            and victim not in {p.name for p in kubelet.pods("default", "workers")}
            and deployment_status(k8s, "workers").get("readyReplicas") == 2
        ),
        "a replacement",
    )
    # Deleting the Deployment takes its pods along (owner references).
    k8s.kubectl("delete", "deployment", "workers")
    eventually(lambda: not k8s.objects("v1", "pods", "default"), "pods collected")
    eventually(lambda: all(r.returncode is not None for r in kubelet.records), "all stopped")


def test_a_process_ignoring_sigterm_is_killed_after_its_grace_period(
    k8s: LocalCluster, kubelet: Kubelet
) -> None:
    stubborn = json.loads(worker_deployment("stubborn", 1, grace=1))
    container = stubborn["spec"]["template"]["spec"]["containers"][0]
    container.update(command=["sh", "-c", "trap '' TERM; sleep 600"], env=[])
    del container["readinessProbe"]
    k8s.kubectl("apply", "-f", "-", input=json.dumps(stubborn))
    eventually(lambda: deployment_status(k8s, "stubborn").get("readyReplicas") == 1, "running")
    k8s.kubectl("scale", "deployment", "stubborn", "--replicas=0")
    record = kubelet.records[0]
    eventually(lambda: record.returncode is not None, "the process ended")
    assert record.signals == ["SIGTERM", "SIGKILL"]
    assert record.returncode == -9


def test_a_stopped_worker_fails_its_liveness_probe_and_is_restarted(
    dsn: str, k8s: LocalCluster, kubelet: Kubelet
) -> None:
    deployment = json.loads(worker_deployment("workers", 1, grace=2))
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    container["livenessProbe"] = {
        "httpGet": {"path": "/healthz", "port": "metrics"},
        "failureThreshold": 2,
    }
    k8s.kubectl("apply", "-f", "-", input=secret(dsn))
    k8s.kubectl("apply", "-f", "-", input=json.dumps(deployment))
    eventually(lambda: deployment_status(k8s, "workers").get("readyReplicas") == 1, "ready")
    (pod,) = kubelet.pods("default", "workers")
    first = pod.record
    os.kill(pod.process.pid, signal.SIGSTOP)  # a hung worker: alive, answering nothing
    eventually(lambda: first.returncode is not None, "the hung worker killed", timeout=90)
    assert first.reason == "liveness"
    assert first.signals == ["SIGTERM", "SIGKILL"]  # a stopped process cannot take SIGTERM
    eventually(
        lambda: (
            deployment_status(k8s, "workers").get("readyReplicas") == 1
            and kubelet.pods("default", "workers")[0].record is not first
        ),
        "restarted",
    )
    (restarted,) = kubelet.pods("default", "workers")
    assert restarted.name == pod.name and restarted.restarts == 1
    statuses = eventually(
        lambda: [
            c
            for p in k8s.objects("v1", "pods", "default", pod.name)
            for c in p.get("status", {}).get("containerStatuses", [])
            if c["restartCount"] == 1
        ],
        "the restart count published",
    )
    assert statuses[0]["ready"] is True
