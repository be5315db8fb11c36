"""The trust boundary end to end: a tenant who may write OutboxDispatchers in a namespace and
nothing else (no Secrets, no Deployments) tries, through the operator, what the chart's RBAC
does not let them do themselves; every attack fails, and the same resources made legitimate
work.

The API emulator enforces RBAC: the operator runs under exactly the chart's rendered rules
and arguments, the tenant under a Role on `outboxdispatchers` only. A local kubelet runs the
Deployments the operator makes as real `outbox-worker` processes, so "nothing was sent" is
the author's listener (a real HTTP server) seeing no request while the same dispatcher, once
the Secret consents, delivers there.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest
import yaml
from chart.test_rbac_enforced import Installed

from outbox.controller.consent import CONSENT_ANNOTATION
from outbox.demo.sink import Sink
from outbox.models import Event
from outbox.producer import enqueue_many
from outbox.schema import migrate
from outbox.table import Table

from .cluster import ADMIN_TOKEN, LocalCluster
from .kubelet import Kubelet
from .rbac import Identity
from .test_operator import (
    CRD,
    NS,
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

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]
OPERATOR_TOKEN = "operator-token"
TENANT_TOKEN = "tenant-token"
TENANT = Identity("mallory", ("team-orders",))
# Another team's bearer token: the prize.
BILLING_TOKEN = "billing-TOKEN-8f3e1c9a77d24b"
BILLING_TABLE = "billing_outbox"
# The paused resources' own table: one table is served by one resource (TableConflict).
SPARE_TABLE = "spare_outbox"
# The cluster admin's policy for this cluster: the operator's own repository and the orders
# team's registry path.
POLICY = {
    "policy": {"images": ["outbox-dispatcher", "registry.example/orders/*"]},
    # Consent given or taken back is seen at the next pass, not after the default minute.
    "fleet": {"secretRecheck": "1s"},
}
ALLOWED_IMAGE = "registry.example/orders/outbox-dispatcher:1.4"
EVERY_POD_OFF = {
    "podAntiAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": [
            {"labelSelector": {}, "namespaceSelector": {}, "topologyKey": "kubernetes.io/os"}
        ]
    }
}


def tenant_rbac() -> list[dict[str, Any]]:
    return [
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": {"name": "dispatcher-author", "namespace": NS},
            "rules": [
                {
                    "apiGroups": ["outbox.dev"],
                    "resources": ["outboxdispatchers", "outboxdispatchers/status"],
                    "verbs": ["get", "list", "watch", "create", "update", "patch", "delete"],
                }
            ],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": "dispatcher-author", "namespace": NS},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "Role",
                "name": "dispatcher-author",
            },
            "subjects": [
                {"kind": "User", "name": TENANT.user, "apiGroup": "rbac.authorization.k8s.io"}
            ],
        },
    ]


@dataclass
class Shared:
    """A cluster with RBAC enforced, the operator as the chart installs it, a kubelet."""

    cluster: LocalCluster
    operator: Operator
    kubelet: Kubelet
    tenant: Path  # the tenant's kubeconfig

    def as_tenant(self, *args: str, input: str | None = None, check: bool = True) -> Any:
        return self.cluster.kubectl(*args, input=input, check=check, kubeconfig=self.tenant)


@pytest.fixture
def shared(dsn: str, tmp_path: Path) -> Iterator[Shared]:
    installed = Installed(POLICY)
    account = Identity.service_account(NS, installed.account)
    workdir = tmp_path / "k8s"
    workdir.mkdir()
    cluster = LocalCluster(
        workdir,
        tokens={OPERATOR_TOKEN: account, TENANT_TOKEN: TENANT},
        rbac=[*installed.rbac, *tenant_rbac()],
    ).start()
    kubelet = None
    operator = None
    try:
        cluster.install_crd(CRD)
        kubelet = Kubelet(
            cluster.url, ADMIN_TOKEN, tmp_path / "kubelet", ca_path=cluster.ca_path
        ).start()
        kubeconfig = cluster.write_kubeconfig(tmp_path / "operator-kubeconfig", OPERATOR_TOKEN)
        operator = Operator(cluster, tmp_path, *installed.args, kubeconfig=kubeconfig).start()
        tenant = cluster.write_kubeconfig(tmp_path / "tenant-kubeconfig", TENANT_TOKEN)
        yield Shared(cluster, operator, kubelet, tenant)
    finally:
        if operator is not None:
            operator.stop()
        if kubelet is not None:
            kubelet.stop()
        cluster.stop()
    assert "Traceback" not in operator.log(), operator.log()
    assert not cluster.emulator.failures, cluster.emulator.failures
    assert not kubelet.failures, kubelet.failures


def secret(name: str, consent: str | None, **data: str) -> dict[str, Any]:
    manifest = secret_manifest(name, **data)
    if consent is None:
        del manifest["metadata"]["annotations"]
    else:
        manifest["metadata"]["annotations"] = {CONSENT_ANNOTATION: consent}
    return manifest


def http(url: str, **block: Any) -> dict[str, Any]:
    return {"type": "http", "http": {"url": url, "timeout": "5s", **block}}


def ready(shared: Shared, name: str, reason: str) -> dict[str, Any]:
    return wait_for(
        f"{name}: Ready {reason}",
        lambda: (c := condition(shared.cluster, name, "Ready")).get("reason") == reason and c,
    )


def warned(shared: Shared, name: str, reason: str) -> None:
    wait_for(
        f"{name}: a Warning {reason} Event",
        lambda: [
            e
            for e in events(shared.cluster, name)
            if (e["type"], e["reason"]) == ("Warning", reason)
        ],
    )


def pending(dsn: str, table: str) -> list[tuple[str, int]]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute(f"SELECT status, attempts FROM {table} ORDER BY id").fetchall()
    return [(str(status), int(attempts)) for status, attempts in rows]


def test_a_tenant_who_may_only_write_dispatchers_gets_nothing_more_through_the_operator(
    shared: Shared, dsn: str
) -> None:
    cluster = shared.cluster
    with psycopg.connect(dsn, autocommit=True) as conn:
        migrate(conn, Table.parse(BILLING_TABLE))
        migrate(conn, Table.parse(SPARE_TABLE))
        enqueue_many(
            conn,
            [Event("invoice", str(i), "issued", {"i": i}) for i in range(5)],
            table=Table.parse(BILLING_TABLE),
        )
    enqueue(dsn, 5)
    # The Secrets, as their owners made them: the orders team's database shared with every
    # dispatcher of the namespace, billing's database with billing's dispatcher only, and
    # billing's API token with nobody.
    apply(
        cluster,
        secret("orders-db", "*", dsn=dsn),
        secret("billing-db", "billing", dsn=dsn),
        secret("billing-api", None, headers=f"Authorization: Bearer {BILLING_TOKEN}\n"),
    )
    refused = shared.as_tenant("get", "secret", "billing-api", "-o", "yaml", check=False)
    assert refused.returncode != 0 and "forbidden" in refused.stderr.lower()

    with Sink() as listener:  # the author's own listener
        orders = {"dsnSecretRef": {"name": "orders-db", "key": "dsn"}, "table": "outbox"}
        spare = {**orders, "table": SPARE_TABLE}
        attacks = [
            # Finding 3: another team's outbox drained to the author's URL ...
            dispatcher_manifest(
                "drain",
                database={"dsnSecretRef": {"name": "billing-db"}, "table": BILLING_TABLE},
                publisher=http(listener.url),
            ),
            # ... and another team's bearer token sent to it.
            dispatcher_manifest(
                "hook",
                database=orders,
                publisher=http(
                    listener.url, headersSecretRef={"name": "billing-api", "key": "headers"}
                ),
            ),
            # Finding 2: a pod of the author's choosing (paused: the image is the point).
            dispatcher_manifest(
                "miner", database=spare, paused=True, worker={"image": "evil.example/miner:1"}
            ),
            dispatcher_manifest(
                "deputy", database=spare, paused=True, worker={"serviceAccountName": "deployer"}
            ),
            # One worker's required anti-affinity that holds every pod of every namespace off
            # every node: the scheduler enforces it against each pod it places.
            dispatcher_manifest(
                "blocker", database=spare, paused=True, worker={"affinity": EVERY_POD_OFF}
            ),
        ]
        shared.as_tenant("apply", "-f", "-", input=yaml.safe_dump_all(attacks))

        # Finding 2's environment, finding 3's PGHOSTADDR, and what sends libpq elsewhere by
        # name (the resolver's search domains) or reads its files elsewhere (HOME): refused
        # before any operator.
        stolen = {"secretKeyRef": {"name": "billing-api", "key": "headers"}}
        for env, says in (
            ({"name": "TOKEN", "valueFrom": stolen}, "takes plain values only (no valueFrom)"),
            ({"name": "PGHOSTADDR", "value": "203.0.113.9"}, "may not set PGHOSTADDR: "),
            ({"name": "LD_PRELOAD", "value": "/tmp/x.so"}, "may not set LD_PRELOAD: "),
            ({"name": "LOCALDOMAIN", "value": "evil.example"}, "may not set LOCALDOMAIN: "),
            ({"name": "HOME", "value": "/tmp"}, "may not set HOME: "),
            ({"name": "https_proxy", "value": "http://evil.example"}, "may not set https_proxy"),
        ):  # fmt: skip
            manifest = dispatcher_manifest("env", database=orders, worker={"env": [env]})
            result = shared.as_tenant("apply", "-f", "-", input=json.dumps(manifest), check=False)
            assert result.returncode != 0 and says in result.stderr, result.stderr
        assert get(cluster, "outboxdispatchers", "env") is None

        drain = ready(shared, "drain", "SecretNotShared")
        assert drain["message"].startswith(
            f"Secret `{NS}/billing-db` (spec.database.dsnSecretRef) is not shared with "
            "dispatcher `drain`"
        )
        hook = ready(shared, "hook", "SecretNotShared")
        assert hook["message"].startswith(
            f"Secret `{NS}/billing-api` (spec.publisher.http.headersSecretRef) is not shared "
            "with dispatcher `hook`"
        )
        assert f"kubectl annotate secret billing-api {CONSENT_ANNOTATION}=hook" in hook["message"]
        miner = ready(shared, "miner", "PolicyViolation")
        assert "spec.worker.image: image `evil.example/miner:1` is not allowed" in miner["message"]
        deputy = ready(shared, "deputy", "PolicyViolation")
        assert "spec.worker.serviceAccountName" in deputy["message"]
        blocker = ready(shared, "blocker", "PolicyViolation")
        assert (
            "spec.worker.affinity.podAntiAffinity.requiredDuringSchedulingIgnoredDuringExecution"
            "[0]: selects pods of other namespaces" in blocker["message"]
        )
        for name, reason in (
            ("drain", "SecretNotShared"),
            ("hook", "SecretNotShared"),
            ("miner", "PolicyViolation"),
            ("deputy", "PolicyViolation"),
            ("blocker", "PolicyViolation"),
        ):
            warned(shared, name, reason)
            wait_for(f"{name}'s status for its generation", lambda n=name: observed(cluster, n))
            assert deployment_of(cluster, name) is None, name  # no workers, ever
        assert listener.requests == []

        # What the tenant can read says which Secret and which annotation, never its content.
        seen = shared.as_tenant("get", "obd", "-o", "json").stdout
        assert "SecretNotShared" in seen
        everything = seen + json.dumps(cluster.objects("v1", "events", NS)) + shared.operator.log()
        assert BILLING_TOKEN not in everything and "Bearer" not in everything

        # Made legitimate: billing shares its token with `hook`; the author moves `miner` to an
        # allowed image. The same resources now run, and the token reaches the listener.
        cluster.kubectl("annotate", "secret", "billing-api", f"{CONSENT_ANNOTATION}=hook")
        shared.as_tenant(
            "patch", "obd", "miner", "--type=merge", "-p",
            json.dumps({"spec": {"worker": {"image": ALLOWED_IMAGE}}}),
        )  # fmt: skip
        if not listener.wait_for(lambda s: len(s.delivered()) >= 5, timeout=90):
            pods = shared.kubelet.pods(NS, "hook-worker")
            pytest.fail(
                "\n".join(
                    [
                        f"ready: {condition(cluster, 'hook', 'Ready')}",
                        f"deployment: {deployment_of(cluster, 'hook')}",
                        f"kubelet errors: {shared.kubelet.errors}",
                        f"kubelet failures: {shared.kubelet.failures}",
                        f"records: {shared.kubelet.records}",
                        *(f"pod {p.name}: {shared.kubelet.logs(NS, p.name)}" for p in pods),
                    ]
                )
            )
        assert {r.headers.get("Authorization") for r in listener.delivered()} == {
            f"Bearer {BILLING_TOKEN}"
        }
        worker = deployment_of(cluster, "hook")
        assert worker is not None
        assert worker["spec"]["template"]["spec"]["automountServiceAccountToken"] is False
        moved = wait_for("miner's Deployment", lambda: deployment_of(cluster, "miner"))
        assert moved["spec"]["replicas"] == 0  # paused
        assert moved["spec"]["template"]["spec"]["containers"][0]["image"] == ALLOWED_IMAGE
        ready(shared, "miner", "Paused")  # paused by its spec, not an idle table

        # Consent taken back: the workers stop at once; the Deployment stays, at zero.
        cluster.kubectl("annotate", "secret", "billing-api", f"{CONSENT_ANNOTATION}-")
        ready(shared, "hook", "SecretNotShared")
        wait_for("hook scaled to zero", lambda: (deployment_of(cluster, "hook") or {})
                 .get("spec", {}).get("replicas") == 0)  # fmt: skip
        wait_for("hook's workers stopped", lambda: not shared.kubelet.pods(NS, "hook-worker"))

    # Billing's outbox was never touched: no claim, no attempt.
    assert pending(dsn, BILLING_TABLE) == [("pending", 0)] * 5
    assert deployment_of(cluster, "drain") is None


@pytest.fixture
def single_tenant(k8s: LocalCluster, tmp_path: Path) -> Iterator[Operator]:
    k8s.install_crd(CRD)
    installed = Installed({"policy": {"secretConsent": False}})
    operator = Operator(k8s, tmp_path, *installed.args).start()
    try:
        yield operator
    finally:
        operator.stop()


def test_with_secret_consent_off_an_unannotated_secret_is_used(
    k8s: LocalCluster, single_tenant: Operator, dsn: str
) -> None:
    apply(k8s, secret("orders-db", None, dsn=dsn), dispatcher_manifest())
    wait_for("the Deployment", lambda: deployment_of(k8s))
    wait_for(
        "DatabaseReachable=True",
        lambda: condition(k8s, "orders", "DatabaseReachable").get("status") == "True",
    )
