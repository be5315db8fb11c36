"""The real operator under exactly the chart's rendered RBAC, enforced by the API emulator's
authorizer (403 for anything no rule allows), with the chart's own arguments: it serves a
resource end to end, cluster-wide and namespaced; without a verb the chart grants, it cannot."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from k8s.cluster import LocalCluster
from k8s.rbac import Identity
from k8s.test_operator import (
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

from chart import chart as c
from outbox.controller.reconcile.apply import KEPT_RECHECK

pytestmark = pytest.mark.slow
TOKEN = "chart-service-account-token"
RBAC_KINDS = ("ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding")
# The harness sets these itself (a free port, leader timings for the test's pace, text logs).
HARNESS_FLAGS = ("--health-port", "--lease-duration", "--renew-deadline", "--retry-period",
                 "--log-format")  # fmt: skip


class Installed:
    """The chart rendered into the harness's namespace: its RBAC, account and operator args."""

    def __init__(self, values: dict[str, Any]) -> None:
        rendered = c.render(values, namespace=NS)
        self.rbac = [o for o in rendered.objects if o["kind"] in RBAC_KINDS]
        self.account = rendered.one("ServiceAccount")["metadata"]["name"]
        [container] = rendered.one("Deployment")["spec"]["template"]["spec"]["containers"]
        self.args = [a for a in container["args"] if not a.startswith(HARNESS_FLAGS)]
        self.lease = next(
            a.split("=", 1)[1] for a in self.args if a.startswith("--leader-election-id=")
        )

    def without(self, kind: str, resource: str, verb: str) -> Installed:
        """The same install with one verb taken out of one rule."""
        trimmed = copy.copy(self)
        trimmed.rbac = copy.deepcopy(self.rbac)
        found = False
        for role in trimmed.rbac:
            if role["kind"] != kind:
                continue
            for rule in role.get("rules", []):
                if resource in rule["resources"] and verb in rule["verbs"]:
                    rule["verbs"].remove(verb)
                    found = True
        assert found, f"the chart grants no {verb} on {resource} in a {kind}"
        return trimmed


@pytest.fixture
def secured(
    tmp_path: Path, request: pytest.FixtureRequest
) -> Iterator[tuple[LocalCluster, Operator]]:
    installed: Installed = request.param
    workdir = tmp_path / "k8s"
    workdir.mkdir()
    identity = Identity.service_account(NS, installed.account)
    cluster = LocalCluster(workdir, tokens={TOKEN: identity}, rbac=installed.rbac).start()
    try:
        cluster.install_crd(CRD)
        kubeconfig = cluster.write_kubeconfig(tmp_path / "operator-kubeconfig", TOKEN)
        operator = Operator(cluster, tmp_path, *installed.args, kubeconfig=kubeconfig)
        operator.start()
        try:
            yield cluster, operator
        finally:
            operator.stop()
    finally:
        cluster.stop()
    assert not cluster.emulator.failures, cluster.emulator.failures


CLUSTER_WIDE = Installed({})
NAMESPACED = Installed({"watch": {"namespaces": [NS]}})


@pytest.mark.parametrize(
    "secured", [CLUSTER_WIDE, NAMESPACED], ids=["cluster-wide", "namespaced"], indirect=True
)
def test_the_charts_rbac_is_enough_to_serve_a_resource(
    secured: tuple[LocalCluster, Operator], dsn: str
) -> None:
    cluster, operator = secured
    apply(cluster, secret_manifest("orders-db", dsn=dsn), dispatcher_manifest(retention="1h"))
    wait_for("the Deployment", lambda: deployment_of(cluster))
    wait_for("the status", lambda: observed(cluster))
    wait_for("an Event", lambda: "ScaledUp" in reasons(cluster, "orders"))
    assert condition(cluster, "orders", "DatabaseReachable")["status"] == "True"
    assert get(cluster, "leases", CLUSTER_WIDE.lease) is not None
    # A spec change: the Deployment is replaced (update), then resized (patch).
    cluster.kubectl(
        "patch", "obd", "orders", "--type=merge", "-p",
        '{"spec":{"batchSize":7,"scaling":{"minReplicas":2}}}',
    )  # fmt: skip
    wait_for(
        "the replaced and resized Deployment",
        lambda: (d := deployment_of(cluster)) and d["spec"]["replicas"] == 2,
    )
    log = operator.log()
    assert "Forbidden" not in log, log  # (a bare "403" may be a timestamp's milliseconds)


def test_the_operator_account_cannot_do_more_than_the_chart_grants(
    tmp_path: Path,
) -> None:
    """Least privilege, asked of the authorizer: the account may not list Secrets, delete
    Deployments, or touch another Lease."""
    workdir = tmp_path / "k8s"
    workdir.mkdir()
    identity = Identity.service_account(NS, CLUSTER_WIDE.account)
    cluster = LocalCluster(workdir, tokens={TOKEN: identity}, rbac=CLUSTER_WIDE.rbac).start()
    try:
        kubeconfig = cluster.write_kubeconfig(tmp_path / "kubeconfig", TOKEN)
        # One to patch (kubectl reads it first, which the account may).
        labels = {"app": "anything"}
        apply(cluster, {
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "anything", "namespace": NS},
            "spec": {"selector": {"matchLabels": labels}, "template": {
                "metadata": {"labels": labels},
                "spec": {"containers": [{"name": "c", "image": "example"}]},
            }},
        })  # fmt: skip
        for args in (
            ("get", "secrets"),
            ("delete", "deployment", "anything"),
            ("get", "lease", "someone-elses-lease"),
            ("get", "namespaces"),
            # Resizing goes through deployments/scale: no patch of a whole Deployment.
            ("patch", "deployment", "anything", "-n", NS, "--type=merge", "-p", "{}"),
        ):
            refused = cluster.kubectl(*args, kubeconfig=kubeconfig, check=False)
            assert refused.returncode != 0 and "forbidden" in refused.stderr.lower(), args
    finally:
        cluster.stop()


@pytest.mark.parametrize(
    ("secured", "what"),
    [
        (CLUSTER_WIDE.without("ClusterRole", "outboxdispatchers/status", "patch"), "the status"),
        (CLUSTER_WIDE.without("ClusterRole", "deployments", "create"), "the Deployment"),
    ],
    ids=["no-status-patch", "no-deployment-create"],
    indirect=["secured"],
)
def test_a_verb_removed_from_the_chart_makes_the_operator_fail(
    secured: tuple[LocalCluster, Operator], what: str, dsn: str
) -> None:
    cluster, operator = secured
    apply(cluster, secret_manifest("orders-db", dsn=dsn), dispatcher_manifest())
    probe = {
        "the status": lambda: observed(cluster),
        "the Deployment": lambda: deployment_of(cluster),
    }
    with pytest.raises(AssertionError, match="timed out"):
        wait_for(what, probe[what], timeout=15)
    wait_for(
        "the refusal in the operator's log",
        lambda: "Forbidden" in operator.log(),
    )


MONITORING = [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}]


def _worker_policy(cluster: LocalCluster) -> dict[str, Any] | None:
    found = cluster.objects("networking.k8s.io/v1", "networkpolicies", NS, "orders-worker")
    return found[0] if found else None


def _resize(cluster: LocalCluster, replicas: int) -> None:
    """A change of size alone (the pod template stays): the operator only resizes."""
    cluster.kubectl(
        "patch", "obd", "orders", "--type=merge", "-p",
        f'{{"spec":{{"scaling":{{"minReplicas":{replicas}}}}}}}',
    )  # fmt: skip


@pytest.mark.parametrize("secured", [CLUSTER_WIDE], ids=["cluster-wide"], indirect=True)
def test_the_operator_resizes_through_the_scale_subresource_and_fences_its_workers(
    secured: tuple[LocalCluster, Operator], dsn: str
) -> None:
    cluster, operator = secured
    apply(cluster, secret_manifest("orders-db", dsn=dsn), dispatcher_manifest())
    wait_for("the Deployment", lambda: deployment_of(cluster))
    # The worker pods' NetworkPolicy: the metrics port only, from the monitoring namespace;
    # the resource owns it, so it goes with it.
    policy = wait_for("the workers' NetworkPolicy", lambda: _worker_policy(cluster))
    assert policy["spec"]["policyTypes"] == ["Ingress"]  # egress open: database, destinations
    assert policy["spec"]["ingress"] == [
        {"ports": [{"port": "metrics", "protocol": "TCP"}], "from": MONITORING}
    ]
    assert policy["spec"]["podSelector"]["matchLabels"]["app.kubernetes.io/instance"] == "orders"
    [owner] = policy["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["name"]) == ("OutboxDispatcher", "orders")
    _resize(cluster, 2)
    resized = wait_for(
        "the resized Deployment",
        lambda: (d := deployment_of(cluster)) and d["spec"]["replicas"] == 2 and d,
    )
    writers = {
        (f["manager"], f.get("subresource", "")) for f in resized["metadata"]["managedFields"]
    }
    assert ("outbox-controller", "scale") in writers, writers
    # Opened by hand: a pass puts the policy back as rendered within the recheck (an idle
    # resource's passes read it once a minute, not every pass).
    cluster.kubectl(
        "patch", "networkpolicy", "orders-worker", "-n", NS, "--type=merge", "-p",
        '{"spec":{"ingress":[{}]}}',
    )  # fmt: skip
    wait_for(
        "the policy restored",
        lambda: (
            (p := _worker_policy(cluster)) and p["spec"]["ingress"][0].get("from") == MONITORING
        ),
        timeout=KEPT_RECHECK.total_seconds() + 30,
    )
    log = operator.log()
    assert "Forbidden" not in log
    # Kept as rendered, not rewritten at every pass: once created, once restored.
    assert (log.count("creating NetworkPolicy"), log.count("restoring NetworkPolicy")) == (1, 1)


@pytest.mark.parametrize(
    "secured",
    [CLUSTER_WIDE.without("ClusterRole", "deployments/scale", "patch")],
    ids=["no-scale-patch"],
    indirect=True,
)
def test_without_the_scale_subresource_the_operator_cannot_resize(
    secured: tuple[LocalCluster, Operator], dsn: str
) -> None:
    """The operator needs `deployments/scale` patch, and no patch of the Deployment itself
    stands in for it."""
    cluster, operator = secured
    apply(cluster, secret_manifest("orders-db", dsn=dsn), dispatcher_manifest())
    wait_for("the Deployment", lambda: deployment_of(cluster))
    _resize(cluster, 2)
    wait_for("the refusal in the operator's log", lambda: "Forbidden" in operator.log())
    deployment = deployment_of(cluster)
    assert deployment is not None and deployment["spec"]["replicas"] == 1
