"""Day two's smaller findings, with the real operator against the emulator and kubectl:

- a paused resource says `Paused` (Ready's reason and the SPEC-PAUSED column), not `ScaledToZero`;
- a scale Event says why it scaled ("0 -> 1 workers: minReplicas is 1; nothing waiting"),
  not what the policy alone would have run ("wanted 0: idle for 0s");
- a bad DSN written to the Secret: reported (`InvalidDsn`), the running workers (started on
  the validated DSN) are neither rolled nor joined by pods that would read the bad one, and
  they go on delivering; the fixed Secret rolls them once;
- `outbox-controller` outside a cluster leads in the kubeconfig's current namespace.
"""

from __future__ import annotations

import base64
import os
import re
import subprocess
from collections.abc import Callable
from pathlib import Path

import psycopg
import pytest
import yaml

from . import test_operator as harness
from .cluster import LocalCluster
from .kubelet import Kubelet
from .test_operator import (
    CONTROLLER,
    Operator,
    apply,
    condition,
    deployment_of,
    dispatcher_manifest,
    enqueue,
    events,
    get,
    observed,
    secret_manifest,
    wait_for,
)

pytestmark = pytest.mark.slow
SECRET_VERSION = "outbox.dev/dsn-secret-version"


def _column(k8s: LocalCluster, name: str, column: str) -> str:
    header, row = k8s.kubectl("get", "obd", name).stdout.splitlines()[:2]
    return dict(zip(header.split(), row.split(), strict=True))[column]


def test_paused_reads_paused_and_scale_events_say_why(
    cluster: LocalCluster, operators: Callable[..., Operator], dsn: str
) -> None:
    operators()
    apply(cluster, secret_manifest("orders-db", dsn=dsn), dispatcher_manifest())
    up = wait_for(
        "the first scale Event",
        lambda: [e["message"] for e in events(cluster, "orders") if e["reason"] == "ScaledUp"],
    )
    # Created on an empty table: the floor is why one worker starts, and nothing waits.
    assert up == ["0 -> 1 workers: minReplicas is 1; nothing waiting"], up
    assert _column(cluster, "orders", "SPEC-PAUSED") == "false"

    cluster.kubectl("patch", "obd", "orders", "--type=merge", "-p", '{"spec":{"paused":true}}')
    ready = wait_for(
        "Ready=True, reason Paused",
        lambda: (c := condition(cluster, "orders", "Ready")).get("reason") == "Paused" and c,
    )
    assert ready["status"] == "True"
    assert "spec.paused" in ready["message"]
    assert _column(cluster, "orders", "SPEC-PAUSED") == "true"
    wide = cluster.kubectl("get", "obd", "orders", "-o", "wide").stdout.splitlines()
    assert dict(zip(wide[0].split(), wide[1].split(), strict=True))["REASON"] == "Paused"
    down = [e["message"] for e in events(cluster, "orders") if e["reason"] == "ScaledDown"]
    assert down == ["1 -> 0 workers: spec.paused is true: no workers run"], down

    cluster.kubectl("patch", "obd", "orders", "--type=merge", "-p", '{"spec":{"paused":false}}')
    wait_for(
        "Ready's reason no longer Paused",
        lambda: (
            condition(cluster, "orders", "Paused").get("status") == "False"
            and condition(cluster, "orders", "Ready").get("reason") != "Paused"
        ),
    )
    assert _column(cluster, "orders", "SPEC-PAUSED") == "false"
    ups = [e["message"] for e in events(cluster, "orders") if e["reason"] == "ScaledUp"]
    assert all("wanted 0" not in m and "needs 0" not in m for m in ups), ups


def _done(dsn: str) -> int:
    with psycopg.connect(dsn) as conn:
        row = conn.execute("SELECT count(*) FROM outbox WHERE status = 'done'").fetchone()
    return int(row[0]) if row else -1


# `dsn` first: the database outlives the workers at teardown.
def test_a_bad_dsn_in_the_secret_keeps_the_running_workers_and_starts_none(
    dsn: str, cluster: LocalCluster, kubelet: Kubelet, operators: Callable[..., Operator]
) -> None:
    operators("--secret-recheck", "1s")  # the bad DSN is read at the next pass
    apply(
        cluster,
        secret_manifest("orders-db", dsn=dsn),
        dispatcher_manifest(publisher={"type": "null"}),
    )
    wait_for(
        "a ready worker", lambda: condition(cluster, "orders", "Ready").get("status") == "True"
    )
    [pod] = kubelet.pods("default", "orders-worker")
    good = deployment_of(cluster)
    assert good is not None
    template = good["spec"]["template"]

    # A bad DSN written to the Secret (a typo in a rotation).
    apply(cluster, secret_manifest("orders-db", dsn="host=db dbname orders"))
    wait_for(
        "InvalidDsn",
        lambda: condition(cluster, "orders", "Ready").get("reason") == "InvalidDsn",
    )
    assert "InvalidDsn" in [
        e["reason"] for e in events(cluster, "orders") if e["type"] == "Warning"
    ]
    # More workers asked for: a new pod would read the bad DSN and crash, so none starts.
    cluster.kubectl("scale", "obd", "orders", "--replicas=2")
    scaling = wait_for(
        "the pass that saw spec.replicas: 2",
        lambda: (
            observed(cluster)
            and (c := condition(cluster, "orders", "Scaling"))["observedGeneration"]
            == (get(cluster, "outboxdispatchers", "orders") or {})["metadata"]["generation"]
            and c
        ),
    )
    assert scaling["reason"] == "HoldingSize", scaling
    assert "new workers would start on inputs that failed the check" in scaling["message"]
    held = deployment_of(cluster)
    assert held is not None and held["spec"]["replicas"] == 1
    assert held["spec"]["template"] == template  # not rolled onto the bad Secret
    # The running worker read the validated DSN when it started, and goes on delivering.
    enqueue(dsn, 5)
    wait_for("the five delivered by the running worker", lambda: _done(dsn) == 5)
    assert [p.record.pid for p in kubelet.pods("default", "orders-worker")] == [pod.record.pid]

    # Fixed: the workers roll once to the validated Secret, and the pinned count is met.
    apply(cluster, secret_manifest("orders-db", dsn=dsn, rotated="yes"))
    secret = wait_for("the fixed Secret", lambda: (s := get(cluster, "secrets", "orders-db")) and s)
    rolled = wait_for(
        "two workers on the fixed Secret",
        lambda: (
            (d := deployment_of(cluster))
            and d["spec"]["replicas"] == 2
            and d["spec"]["template"]["metadata"]["annotations"][SECRET_VERSION]
            == secret["metadata"]["resourceVersion"]
            and d
        ),
    )
    assert base64.b64decode(secret["data"]["dsn"]).decode() == dsn
    assert dsn not in yaml.safe_dump(rolled)
    wait_for("Recovered", lambda: "Recovered" in [e["reason"] for e in events(cluster, "orders")])


class _OutsideACluster(Operator):
    """The operator as a developer runs it (`kopf run` style): a kubeconfig and nothing else,
    no POD_NAMESPACE, no --leader-election-namespace."""

    def start(self) -> Operator:
        env = {**os.environ, "KUBECONFIG": str(self.kubeconfig)}
        for name in (
            "POD_NAMESPACE",
            "KUBERNETES_SERVICE_HOST",
            "OUTBOX_LEADER_ELECTION_NAMESPACE",
        ):
            env.pop(name, None)
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                [CONTROLLER, *self.args], stdout=log, stderr=log, env=env
            )
        match = wait_for(
            "the health port",
            lambda: re.search(r"health and metrics on port (\d+)", self.log()),
            timeout=30,
        )
        self.port = int(match.group(1))
        return self


def test_outside_a_cluster_it_leads_in_the_kubeconfigs_current_namespace(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    cluster.kubectl("create", "namespace", "dev")
    config = yaml.safe_load(cluster.kubeconfig.read_text())
    for context in config["contexts"]:
        context["context"]["namespace"] = "dev"
    kubeconfig = tmp_path / "dev-kubeconfig"
    kubeconfig.write_text(yaml.safe_dump(config))
    operator = _OutsideACluster(cluster, tmp_path, name="laptop", kubeconfig=kubeconfig).start()
    try:
        lease = wait_for(
            "the Lease in dev",
            lambda: (
                (found := cluster.objects("coordination.k8s.io/v1", "leases", "dev")) and found[0]
            ),
        )
        assert lease["metadata"]["name"] == "outbox-controller"
        assert lease["spec"]["holderIdentity"] == "laptop"
        assert wait_for("leading", operator.leading)
        assert not cluster.objects("coordination.k8s.io/v1", "leases", "default")
    finally:
        operator.stop()
    assert "Traceback" not in operator.log(), operator.log()


def test_a_retention_of_zero_from_an_older_crd_purges_nothing_and_says_why(
    cluster: LocalCluster, operators: Callable[..., Operator], dsn: str, tmp_path: Path
) -> None:
    # The CRD of a release that admitted zero (its pattern took any number): the operator
    # refuses it itself.
    crd = yaml.safe_load(harness.CRD.read_text())
    [version] = crd["spec"]["versions"]
    spec = version["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
    spec["retention"]["pattern"] = r"^[0-9]+(\.[0-9]+)?(ms|s|m|h|d)$"
    spec["retention"].pop("x-kubernetes-validations", None)  # the range rule came later
    older = tmp_path / "older-crd.yaml"
    older.write_text(yaml.safe_dump(crd))
    cluster.install_crd(older)
    enqueue(dsn, 10)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("UPDATE outbox SET status = 'done', done_at = now() - interval '1 hour'")
    operators()
    apply(cluster, secret_manifest("orders-db", dsn=dsn), dispatcher_manifest(retention="0s"))
    ready = wait_for(
        "InvalidRetention",
        lambda: (
            (c := condition(cluster, "orders", "Ready")).get("reason") == "InvalidRetention" and c
        ),
    )
    assert ready["status"] == "False"
    assert "spec.retention '0s' must be more than zero" in ready["message"]
    assert "InvalidRetention" in [e["reason"] for e in events(cluster, "orders")]
    assert _done(dsn) == 10  # nothing purged
    status = (get(cluster, "outboxdispatchers", "orders") or {}).get("status") or {}
    assert "lastPurgeTime" not in status

    cluster.kubectl("patch", "obd", "orders", "--type=merge", "-p", '{"spec":{"retention":"30m"}}')
    wait_for("Recovered", lambda: "Recovered" in [e["reason"] for e in events(cluster, "orders")])
    wait_for("the purge of the hour-old rows", lambda: _done(dsn) == 0)
