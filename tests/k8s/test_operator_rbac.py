"""The operator under exactly the RBAC that docs/operator.md gives, and nothing else."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from .cluster import LocalCluster
from .rbac import Identity
from .test_operator import (
    CRD,
    NS,
    Operator,
    apply,
    condition,
    deployment_of,
    dispatcher_manifest,
    get,
    observed,
    reasons,
    secret_manifest,
    wait_for,
)

pytestmark = pytest.mark.slow
DOC = Path(__file__).resolve().parents[2] / "docs" / "operator.md"
TOKEN = "outbox-controller-token"
ACCOUNT = Identity.service_account(NS, "outbox-controller")


def documented_rbac() -> list[dict[str, Any]]:
    text = DOC.read_text()
    block = re.search(r"<!-- rbac:.*?-->\s*```yaml\n(.*?)```", text, re.S)
    assert block, "docs/operator.md has no RBAC block"
    return [doc for doc in yaml.safe_load_all(block.group(1)) if doc]


def bindings() -> list[dict[str, Any]]:
    subject = [{"kind": "ServiceAccount", "name": "outbox-controller", "namespace": NS}]
    return [
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": "outbox-controller"},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": "outbox-controller",
            },
            "subjects": subject,
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": "outbox-controller-leader-election", "namespace": NS},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "Role",
                "name": "outbox-controller-leader-election",
            },
            "subjects": subject,
        },
    ]


@pytest.fixture
def secured(tmp_path: Path) -> Iterator[LocalCluster]:
    rules = documented_rbac()
    for doc in rules:
        if doc["kind"] == "Role":
            doc["metadata"]["namespace"] = NS
    workdir = tmp_path / "k8s"
    workdir.mkdir()
    cluster = LocalCluster(workdir, tokens={TOKEN: ACCOUNT}, rbac=[*rules, *bindings()]).start()
    try:
        cluster.install_crd(CRD)
        yield cluster
    finally:
        cluster.stop()
    assert not cluster.emulator.failures, cluster.emulator.failures


def test_the_documented_rbac_is_enough(secured: LocalCluster, tmp_path: Path, dsn: str) -> None:
    kubeconfig = secured.write_kubeconfig(tmp_path / "operator-kubeconfig", TOKEN)
    # The rules are least privilege: the account cannot even list Secrets.
    refused = secured.kubectl("get", "secrets", kubeconfig=kubeconfig, check=False)
    assert refused.returncode != 0 and "forbidden" in refused.stderr.lower()
    operator = Operator(secured, tmp_path, kubeconfig=kubeconfig).start()
    try:
        apply(secured, secret_manifest("orders-db", dsn=dsn), dispatcher_manifest(retention="1h"))
        wait_for("the Deployment", lambda: deployment_of(secured))
        wait_for("the status", lambda: observed(secured))
        wait_for("an Event", lambda: "ScaledUp" in reasons(secured, "orders"))
        assert condition(secured, "orders", "DatabaseReachable")["status"] == "True"
        assert get(secured, "leases", "outbox-controller") is not None
        # A spec change: the Deployment is replaced (update), then resized (patch).
        secured.kubectl(
            "patch",
            "obd",
            "orders",
            "--type=merge",
            "-p",
            '{"spec":{"batchSize":7,"scaling":{"minReplicas":2}}}',
        )
        wait_for(
            "the replaced and resized Deployment",
            lambda: (d := deployment_of(secured)) and d["spec"]["replicas"] == 2,
        )
    finally:
        operator.stop()
    log = operator.log()
    assert "API error 403" not in log and "orbidden" not in log, log
    assert operator.wait() == 0
