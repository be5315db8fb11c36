"""End to end, as close to a cluster as these machines allow: the chart rendered by Helm's
engine → applied with the real kubectl to the API emulator → the operator, with the chart's
arguments, creates the worker Deployment → a local kubelet runs
its pods as podman containers of the image built here, honouring their security context →
the worker containers drain a backlog from PostgreSQL → the operator scales them down and they
stop on SIGTERM with exit code 0.

The operator itself runs as a process of this test, with the rendered Deployment's arguments
(in-cluster configuration would need the emulator's address and token in the container).
The chart's RBAC is applied but not enforced here: the local kubelet speaks plain HTTP, and
tests/chart/test_rbac_enforced.py runs the operator under that RBAC with the authorizer on.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
import yaml
from chart import chart as c
from chart.test_rbac_enforced import Installed
from helpers import seed, statuses
from k8s.cluster import ADMIN_TOKEN, LocalCluster
from k8s.expansion import expand
from k8s.kubelet import Kubelet, _rewrite_port
from k8s.test_operator import (
    CRD,
    NS,
    Operator,
    apply,
    dispatcher_manifest,
    get,
    secret_manifest,
    wait_for,
)

from image import images
from outbox.demo.sink import Sink

# One worker under pytest-xdist runs every test of the image, so the image is built once.
pytestmark = [
    pytest.mark.container,
    pytest.mark.slow,
    pytest.mark.timeout(2400),
    pytest.mark.xdist_group("image"),
]


class ContainerKubelet(Kubelet):
    """The local kubelet, but each pod's container runs from its image with podman (host
    network, so the kubelet's per-pod ports and probes still apply), as the pod's security
    context says: its user and group, a read-only root (not even a tmpfs), no capabilities,
    no privilege escalation."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.containers: list[str] = []
        self._pod_specs: dict[int, dict[str, Any]] = {}

    async def _start_pod(self, session: Any, deployment: Any, hash_: str, name: Any = None) -> Any:
        spec = deployment["spec"]["template"]["spec"]
        self._pod_specs[id(spec["containers"][0])] = spec
        return await super()._start_pod(session, deployment, hash_, name)

    def _command(
        self, container: Any, declared: dict[str, str], env: dict[str, str], ports: dict[int, int]
    ) -> list[str]:
        pod = self._pod_specs.get(id(container), {})
        security = {**pod.get("securityContext", {}), **container.get("securityContext", {})}
        flags = ["--network", "host", "--cap-drop", "ALL"]
        if "runAsUser" in security:
            flags += ["--user", f"{security['runAsUser']}:{security.get('runAsGroup', 0)}"]
        if security.get("readOnlyRootFilesystem"):
            flags += ["--read-only", "--read-only-tmpfs=false"]
        if security.get("allowPrivilegeEscalation") is False:
            flags += ["--security-opt", "no-new-privileges"]
        for key, value in env.items():
            if key != "PATH":
                flags += ["--env", f"{key}={value}"]
        # podman itself (not the container) needs this machine's settings.
        env.update({k: v for k, v in images.env().items() if k in ("CONTAINERS_CONF", "HOME")})
        name = f"outbox-e2e-{uuid.uuid4().hex[:10]}"
        self.containers.append(name)
        command = [*container.get("command", []), *container.get("args", [])]
        # As a kubelet does: $(VAR) from the container's own variables only.
        command = [_rewrite_port(expand(str(part), declared), ports) for part in command]
        return [*images.podman_run("--name", name, *flags, container["image"]), *command]


@pytest.fixture
def e2e(image: str, tmp_path: Path) -> Iterator[tuple[LocalCluster, ContainerKubelet, Installed]]:
    values = {"image": {"repository": image.rsplit(":", 1)[0], "tag": image.rsplit(":", 1)[1]}}
    installed = Installed(values)
    rendered = c.render(values, namespace=NS)
    (tmp_path / "k8s").mkdir()
    cluster = LocalCluster(tmp_path / "k8s").start()
    kubelet: ContainerKubelet | None = None
    try:
        cluster.install_crd(CRD)
        # Everything the chart renders that the emulator serves, with the real kubectl; not
        # the operator's Deployment (run below as a process) nor the NetworkPolicy (no
        # networking.k8s.io here) nor the test hook.
        served = [
            o
            for o in rendered.objects
            if o["kind"] not in ("Deployment", "NetworkPolicy", "CustomResourceDefinition")
            and o not in rendered.hooks()
        ]
        cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(served))
        kubelet = ContainerKubelet(cluster.url, ADMIN_TOKEN, tmp_path / "kubelet").start()
        yield cluster, kubelet, installed
    finally:
        if kubelet is not None:
            kubelet.stop()
            for name in kubelet.containers:
                images.run("podman", "rm", "--force", "--ignore", name, check=False)
        cluster.stop()


def test_chart_to_emulator_to_worker_containers_and_back_to_zero(
    dsn: str, e2e: tuple[LocalCluster, ContainerKubelet, Installed], tmp_path: Path
) -> None:
    cluster, kubelet, installed = e2e
    operator = Operator(cluster, tmp_path, *installed.args).start()
    try:
        with Sink() as sink, psycopg.connect(dsn, autocommit=True) as conn:
            scaling = {
                "minReplicas": 0,
                "maxReplicas": 2,
                "pollIntervalSeconds": 1,
                "targetOldestReadyAgeSeconds": 2,
                "scaleDownStabilizationSeconds": 3,
            }
            apply(
                cluster,
                secret_manifest("orders-db", dsn=dsn),
                dispatcher_manifest(
                    publisher={"type": "http", "http": {"url": sink.url}}, scaling=scaling
                ),
            )
            deployment = wait_for(
                "the worker Deployment", lambda: get(cluster, "deployments", "orders-worker")
            )
            [container] = deployment["spec"]["template"]["spec"]["containers"]
            assert container["image"] == images.IMAGE  # the chart's image, via --worker-image
            ids = seed(conn, 1500, aggregates=50)
            wait_for("a worker container", lambda: _running(kubelet), timeout=120)
            _assert_security_context_honoured(_running(kubelet)[0])
            wait_for("the drain", lambda: statuses(conn) == {"done": len(ids)}, timeout=300)
            assert sink.wait_idle()  # a reply is recorded after it is sent
            assert set(sink.delivered_ids()) == set(ids)
            wait_for(
                "the scale-down to zero",
                lambda: (
                    (d := get(cluster, "deployments", "orders-worker"))
                    and d["spec"]["replicas"] == 0
                    and not kubelet.pods(NS, "orders-worker")
                ),
                timeout=180,
            )
    finally:
        operator.stop()
    stopped = [r for r in kubelet.records if r.deployment == "orders-worker"]
    assert stopped, "no worker container ever ran"
    assert all(r.returncode == 0 for r in stopped), [
        (r.name, r.returncode, r.signals) for r in stopped
    ]
    assert all("SIGKILL" not in r.signals for r in stopped)
    log = operator.log()
    assert "Traceback" not in log, log[-3000:]


def _running(kubelet: ContainerKubelet) -> list[str]:
    result = images.run("podman", "ps", "--format", "{{.Names}}", check=False)
    names = set(result.stdout.split())
    return [name for name in kubelet.containers if name in names]


def _assert_security_context_honoured(name: str) -> None:
    [facts] = json.loads(images.run("podman", "inspect", name).stdout)
    assert facts["Config"]["User"] == "65532:65532", facts["Config"]["User"]
    assert facts["HostConfig"]["ReadonlyRootfs"] is True
    assert facts["HostConfig"]["CapDrop"], facts["HostConfig"]["CapDrop"]
