"""examples/kubectl/outbox-dispatcher.yaml: the chart's render for `kubectl apply`, kept fresh,
valid, and applied to the API emulator by the real kubectl."""

from __future__ import annotations

import shutil

import pytest
import yaml

from chart import chart as c
from chart import manifest

MANIFEST = c.ROOT / "examples" / "kubectl" / "outbox-dispatcher.yaml"


def test_the_manifest_is_a_fresh_render_of_the_chart() -> None:
    assert MANIFEST.read_text() == manifest.render(), (
        "examples/kubectl/outbox-dispatcher.yaml is stale: "
        "python tests/chart/manifest.py > examples/kubectl/outbox-dispatcher.yaml"
    )


def test_every_object_of_the_manifest_is_valid_and_says_it_is_not_helms() -> None:
    objects = [o for o in yaml.safe_load_all(MANIFEST.read_text()) if o]
    assert {o["kind"] for o in objects} >= {"Deployment", "ServiceAccount", "ClusterRole"}
    assert [e for o in objects for e in c.object_errors(o)] == []
    for obj in objects:
        assert obj["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "kubectl"
        assert "helm.sh/hook" not in obj["metadata"].get("annotations", {})
    assert "CustomResourceDefinition" not in {o["kind"] for o in objects}


@pytest.fixture
def cluster(tmp_path):  # type: ignore[no-untyped-def]
    from k8s.cluster import KUBECTL, LocalCluster

    if shutil.which(KUBECTL) is None:
        pytest.skip(f"needs kubectl ({KUBECTL})")
    running = LocalCluster(tmp_path).start()
    try:
        yield running
    finally:
        running.stop()
    assert not running.emulator.failures, running.emulator.failures


def test_the_kubectl_install_and_the_examples_apply_to_a_validating_api(cluster) -> None:  # type: ignore[no-untyped-def]
    """The steps docs/deploy.md gives, with the real kubectl, against the API emulator (which
    validates built-in objects and checks custom resources against the CRD and its rules)."""
    _namespace(cluster, manifest.NAMESPACE)
    cluster.kubectl("apply", "-f", str(c.CRD_SOURCE))
    applied = cluster.kubectl("apply", "-f", str(MANIFEST)).stdout
    assert "deployment.apps/outbox-dispatcher created" in applied, applied
    assert "clusterrole.rbac.authorization.k8s.io/outbox-dispatcher created" in applied
    assert "networkpolicy.networking.k8s.io/outbox-dispatcher created" in applied, applied
    for namespace in ("shop", "payments", "inventory", "sandbox"):
        _namespace(cluster, namespace)
    for example in ("http", "nats", "kafka", "log"):
        cluster.kubectl("apply", "-f", str(c.ROOT / "examples" / f"{example}.yaml"))
    listed = cluster.kubectl("get", "obd", "--all-namespaces", "-o", "name").stdout.split()
    assert sorted(listed) == sorted(
        f"outboxdispatcher.outbox.dev/{name}"
        for name in ("orders", "payments", "inventory", "sandbox")
    )
    # The server applied the CRD's defaults to the smallest example.
    [sandbox] = cluster.objects("outbox.dev/v1alpha1", "outboxdispatchers", "sandbox", "sandbox")
    assert sandbox["spec"]["database"]["dsnSecretRef"]["key"] == "dsn"
    assert sandbox["spec"]["lease"] == "60s"


def _namespace(cluster, name: str) -> None:  # type: ignore[no-untyped-def]
    cluster.kubectl("create", "namespace", name)
