"""The real operator (`outbox-controller`, kopf) against the emulator, driven by kubectl.

Each test starts the operator as its own process with short leader-election timings and a
one-second poll, writes resources with the real `kubectl`, and waits for the state it
asserts (status, Deployment, Events) with a deadline, never a fixed sleep.
"""

from __future__ import annotations

import base64
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import psycopg
import pytest
import yaml

from outbox.producer import enqueue_many
from outbox.table import Table

from .cluster import LocalCluster

ROOT = Path(__file__).resolve().parents[2]
CRD = ROOT / "crds" / "outboxdispatchers.yaml"
CONTROLLER = str(Path(sys.executable).parent / "outbox-controller")
NS = "default"
T = TypeVar("T")
FAST_LEADER = ["--lease-duration", "3s", "--renew-deadline", "2s", "--retry-period", "250ms"]


def wait_for(what: str, probe: Callable[[], T | None], timeout: float = 60) -> T:
    """Poll `probe` until it returns something truthy; fail naming `what` after `timeout`."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = probe()
        except (KeyError, IndexError, TypeError):
            last = None
        if last:
            return last
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what} (last: {last!r})")


class Operator:
    """One `outbox-controller` process; its log is kept for assertions and failures."""

    def __init__(self, k8s: LocalCluster, workdir: Path, *args: str, name: str = "op") -> None:
        self.k8s = k8s
        self.log_path = workdir / f"{name}.log"
        self.args = ["--health-port", "0", "--log-format", "text", *FAST_LEADER,
                     "--leader-identity", name, *args]  # fmt: skip
        self.name = name
        self.process: subprocess.Popen[bytes] | None = None
        self.port: int | None = None

    def start(self) -> Operator:
        env = {**os.environ, "KUBECONFIG": str(self.k8s.kubeconfig), "POD_NAMESPACE": NS}
        env.pop("KUBERNETES_SERVICE_HOST", None)
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen([CONTROLLER, *self.args], stdout=log, stderr=log, env=env)
        match = wait_for(
            f"{self.name}'s health port",
            lambda: re.search(r"health and metrics on port (\d+)", self.log()),
            timeout=30,
        )
        self.port = int(match.group(1))
        return self

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def metric(self, name: str, **labels: str) -> float | None:
        """A sample from the operator's /metrics, or None if absent."""
        assert self.port is not None
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=5) as r:
            text = r.read().decode()
        for line in text.splitlines():
            if line.startswith(name) and all(f'{k}="{v}"' in line for k, v in labels.items()):
                head = line.split(" ")[0]
                if head == name or head.startswith(name + "{"):
                    return float(line.rsplit(" ", 1)[1])
        return None

    def leading(self) -> bool:
        try:
            return self.metric("outbox_controller_leader") == 1
        except OSError:
            return False

    def signal(self, sig: signal.Signals) -> None:
        assert self.process is not None
        self.process.send_signal(sig)

    def wait(self, timeout: float = 60) -> int:
        assert self.process is not None
        return self.process.wait(timeout)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGCONT)
            self.process.terminate()
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)


@pytest.fixture
def cluster(k8s: LocalCluster) -> LocalCluster:
    k8s.install_crd(CRD)
    return k8s


@pytest.fixture
def operators(cluster: LocalCluster, tmp_path: Path) -> Iterator[Callable[..., Operator]]:
    started: list[Operator] = []

    def start(*args: str, name: str = "op") -> Operator:
        operator = Operator(cluster, tmp_path, *args, name=name).start()
        started.append(operator)
        return operator

    yield start
    for operator in started:
        operator.stop()
    for operator in started:
        assert "Traceback" not in operator.log(), operator.log()


def secret_manifest(name: str, **data: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": name, "namespace": NS},
        "data": {k: base64.b64encode(v.encode()).decode() for k, v in data.items()},
    }


def dispatcher_manifest(name: str = "orders", **spec: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "database": {"dsnSecretRef": {"name": "orders-db", "key": "dsn"}, "table": "outbox"},
        "publisher": {"type": "log"},
        "scaling": {"minReplicas": 1, "maxReplicas": 3, "pollIntervalSeconds": 1},
    }
    base.update(spec)
    return {
        "apiVersion": "outbox.dev/v1alpha1",
        "kind": "OutboxDispatcher",
        "metadata": {"name": name, "namespace": NS},
        "spec": base,
    }


def apply(k8s: LocalCluster, *manifests: dict[str, Any]) -> str:
    text = yaml.safe_dump_all(manifests)
    return k8s.kubectl("apply", "-f", "-", input=text).stdout


def get(k8s: LocalCluster, plural: str, name: str) -> dict[str, Any] | None:
    found = k8s.objects(_api_version(plural), plural, NS, name)
    return found[0] if found else None


def _api_version(plural: str) -> str:
    return {
        "outboxdispatchers": "outbox.dev/v1alpha1",
        "deployments": "apps/v1",
        "secrets": "v1",
        "events": "v1",
        "leases": "coordination.k8s.io/v1",
    }[plural]


def condition(k8s: LocalCluster, name: str, type_: str) -> dict[str, Any]:
    body = get(k8s, "outboxdispatchers", name) or {}
    for item in (body.get("status") or {}).get("conditions") or ():
        if item["type"] == type_:
            return item  # type: ignore[no-any-return]
    return {}


def events(k8s: LocalCluster, name: str) -> list[dict[str, Any]]:
    return [
        e for e in k8s.objects("v1", "events", NS)
        if e.get("involvedObject", {}).get("name") == name
    ]  # fmt: skip


def reasons(k8s: LocalCluster, name: str) -> list[str]:
    return [e["reason"] for e in events(k8s, name)]


def enqueue(dsn: str, n: int) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        enqueue_many(
            conn,
            [("order", str(i), "created", {"i": i}) for i in range(n)],
            table=Table.parse("outbox"),
        )


# ---- the tests ----------------------------------------------------------------------------


def test_create_renders_the_deployment_with_owner_reference_and_status(
    cluster: LocalCluster, operators: Callable[..., Operator], dsn: str
) -> None:
    operators()
    apply(cluster, secret_manifest("orders-db", dsn=dsn), dispatcher_manifest())
    deployment = wait_for("the worker Deployment", lambda: get(cluster, "deployments", "orders-worker"))
    body = get(cluster, "outboxdispatchers", "orders")
    assert body is not None
    (owner,) = deployment["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["uid"]) == ("OutboxDispatcher", body["metadata"]["uid"])
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    dsn_env = next(e for e in container["env"] if e["name"] == "OUTBOX_DSN")
    assert dsn_env["valueFrom"]["secretKeyRef"] == {"name": "orders-db", "key": "dsn"}
    assert dsn not in json.dumps(deployment)
    assert deployment["spec"]["replicas"] == 1  # minReplicas on an empty table
    reachable = wait_for(
        "DatabaseReachable=True", lambda: condition(cluster, "orders", "DatabaseReachable")
    )
    assert reachable["status"] == "True"
    status = wait_for(
        "observedGeneration",
        lambda: (get(cluster, "outboxdispatchers", "orders") or {}).get("status"),
    )
    assert status["observedGeneration"] == body["metadata"]["generation"]
    assert status["desiredReplicas"] == 1
    assert status["backlog"]["backlog"] == 0
