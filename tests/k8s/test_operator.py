"""The real operator (`outbox-controller`, kopf) against the emulator, driven by kubectl.

Each test starts the operator as its own process with leader-election timings of its own and
a one-second poll, writes resources with the real `kubectl`, and waits for the state it
asserts (status, Deployment, Events) with a deadline, never a fixed sleep.
"""

from __future__ import annotations

import base64
import http.client
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar

import psycopg
import pytest
import yaml
from psycopg.conninfo import make_conninfo

from outbox.controller.cli import LOST_LEADERSHIP
from outbox.demo.embedded import EmbeddedPostgres
from outbox.models import Event
from outbox.producer import enqueue_many
from outbox.schema import migrate
from outbox.table import Table

from .cluster import LocalCluster

ROOT = Path(__file__).resolve().parents[2]
CRD = ROOT / "crds" / "outboxdispatchers.yaml"
CONTROLLER = str(Path(sys.executable).parent / "outbox-controller")
NS = "default"
T = TypeVar("T")
pytestmark = pytest.mark.slow
# Leader election at the pace of the tests whose subject is a takeover: a successor waits
# out a killed or frozen leader's whole lease. The renew deadline is one a loaded machine's
# stall does not reach before the test kills, freezes or cuts off the leader, and the lease
# outlasts a scrape of the leader gauge in flight as it froze (a 5 s timeout).
FAST_LEADER = ("--lease-duration", "6s", "--renew-deadline", "5s", "--retry-period", "250ms")
# Every other test has one leader, which must not lose its Lease because a loaded machine
# delayed its renewals past a short deadline (its process then exits, and the test waits in
# vain); SIGTERM still hands the Lease over at once.
STEADY_LEADER = ("--lease-duration", "20s", "--renew-deadline", "15s", "--retry-period", "250ms")


def _logged_at(operator: Operator, text: str) -> float:
    """When the operator's text log first says `text` (seconds since the epoch)."""
    for line in operator.log().splitlines():
        if text in line:  # 2026-01-01 10:00:00,123 INFO    outbox.controller: ...
            return datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp()
    raise AssertionError(f"the operator never logged {text!r}: {operator.log()[-2000:]}")


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

    def __init__(
        self,
        k8s: LocalCluster,
        workdir: Path,
        *args: str,
        name: str = "op",
        kubeconfig: Path | None = None,
        leader: tuple[str, ...] = STEADY_LEADER,
    ) -> None:
        self.k8s = k8s
        self.kubeconfig = kubeconfig or k8s.kubeconfig
        self.log_path = workdir / f"{name}.log"
        self.args = [
            "--health-port",
            "0",
            "--log-format",
            "text",
            *leader,
            "--leader-identity",
            name,
            *args,
        ]
        self.name = name
        self.process: subprocess.Popen[bytes] | None = None
        self.port: int | None = None

    def start(self) -> Operator:
        env = {**os.environ, "KUBECONFIG": str(self.kubeconfig), "POD_NAMESPACE": NS}
        env.pop("KUBERNETES_SERVICE_HOST", None)
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                [CONTROLLER, *self.args], stdout=log, stderr=log, env=env
            )
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


def secret_manifest(name: str, **data: str) -> dict[str, Any]:
    # Shared with every dispatcher of the namespace (the operator's Secrets by consent);
    # tests/k8s/test_operator_tenant.py covers a Secret that is not.
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {
            "name": name,
            "namespace": NS,
            "annotations": {"outbox.dev/dispatchers": "*"},
        },
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


def own_table(dsn: str, table: str, secret: str = "orders-db") -> dict[str, Any]:
    """spec.database for a table of its own in the test's database: one table, one resource
    (a second resource on a table gets TableConflict and no workers)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        migrate(conn, Table.parse(table))
    return {"dsnSecretRef": {"name": secret, "key": "dsn"}, "table": table}


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
        e
        for e in k8s.objects("v1", "events", NS)
        if e.get("involvedObject", {}).get("name") == name
    ]


def reasons(k8s: LocalCluster, name: str) -> list[str]:
    return [e["reason"] for e in events(k8s, name)]


def enqueue(dsn: str, n: int) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        enqueue_many(
            conn,
            [Event("order", str(i), "created", {"i": i}) for i in range(n)],
            table=Table.parse("outbox"),
        )


# ---- the tests ----------------------------------------------------------------------------


def test_create_renders_the_deployment_with_owner_reference_and_status(
    cluster: LocalCluster, operators: Callable[..., Operator], dsn: str
) -> None:
    operators()
    apply(cluster, secret_manifest("orders-db", dsn=dsn), dispatcher_manifest())
    deployment = wait_for(
        "the worker Deployment", lambda: get(cluster, "deployments", "orders-worker")
    )
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


def deployment_of(k8s: LocalCluster, name: str = "orders") -> dict[str, Any] | None:
    return get(k8s, "deployments", f"{name}-worker")


def observed(k8s: LocalCluster, name: str = "orders") -> dict[str, Any] | None:
    """The resource once its status describes its current generation."""
    body = get(k8s, "outboxdispatchers", name)
    if body and (body.get("status") or {}).get("observedGeneration") == body["metadata"].get(
        "generation"
    ):
        return body
    return None


def env_value(deployment: dict[str, Any], name: str) -> str | None:
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    return next((e.get("value") for e in container["env"] if e["name"] == name), None)


def test_a_spec_change_rolls_the_workers_and_a_status_change_does_not(
    cluster: LocalCluster, operators: Callable[..., Operator], dsn: str
) -> None:
    operator = operators()
    apply(cluster, secret_manifest("orders-db", dsn=dsn), dispatcher_manifest(batchSize=10))
    wait_for("the first pass", lambda: observed(cluster))
    first = deployment_of(cluster)
    assert first is not None
    # Status-only changes, ours and someone else's: the operator keeps reconciling (it
    # writes the status only when it changed), and the Deployment's template (and so its
    # generation) stays as it was.
    cluster.kubectl(
        "patch",
        "obd",
        "orders",
        "--subresource=status",
        "--type=merge",
        "-p",
        json.dumps({"status": {"purgedTotal": 0}}),
    )

    def passes() -> float:
        return operator.metric("outbox_controller_passes_total", dispatcher="orders") or 0.0

    before = passes()
    wait_for("two more passes", lambda: passes() >= before + 2, timeout=30)
    unchanged = deployment_of(cluster)
    assert unchanged is not None
    assert unchanged["metadata"]["generation"] == first["metadata"]["generation"]
    assert unchanged["spec"]["template"] == first["spec"]["template"]

    cluster.kubectl("patch", "obd", "orders", "--type=merge", "-p", '{"spec":{"batchSize":25}}')
    rolled = wait_for(
        "the new template",
        lambda: (d := deployment_of(cluster)) and env_value(d, "OUTBOX_BATCH") == "25" and d,
    )
    assert rolled["metadata"]["generation"] > first["metadata"]["generation"]
    body = wait_for("observedGeneration of the change", lambda: observed(cluster))
    assert body["metadata"]["generation"] == 2


def test_paused_scales_to_zero_and_says_so(
    cluster: LocalCluster, operators: Callable[..., Operator], dsn: str
) -> None:
    operators()
    apply(cluster, secret_manifest("orders-db", dsn=dsn), dispatcher_manifest())
    wait_for("one worker", lambda: (d := deployment_of(cluster)) and d["spec"]["replicas"] == 1)
    cluster.kubectl("patch", "obd", "orders", "--type=merge", "-p", '{"spec":{"paused":true}}')
    wait_for("zero workers", lambda: (d := deployment_of(cluster)) and d["spec"]["replicas"] == 0)
    paused = wait_for(
        "Paused=True",
        lambda: (c := condition(cluster, "orders", "Paused"))["status"] == "True" and c,
    )
    assert paused["reason"] == "PausedBySpec"
    assert "ScaledDown" in wait_for("the ScaledDown event", lambda: reasons(cluster, "orders"))
    cluster.kubectl("patch", "obd", "orders", "--type=merge", "-p", '{"spec":{"paused":false}}')
    wait_for(
        "one worker again", lambda: (d := deployment_of(cluster)) and d["spec"]["replicas"] == 1
    )
    # The same pass resizes, then writes the status: wait for the latter too.
    wait_for("Paused=False", lambda: condition(cluster, "orders", "Paused")["status"] == "False")


def _bad_table(dsn: str) -> str:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE outbox (id bigint PRIMARY KEY, payload jsonb)")
    return dsn


UNREACHABLE = (
    "host=127.0.0.1 port=1 dbname=orders user=app password=hunter2-secret connect_timeout=2"
)


@pytest.mark.parametrize(
    ("case", "reason"),
    [
        ("no secret", "SecretNotFound"),
        ("no key", "SecretKeyMissing"),
        ("bad dsn", "InvalidDsn"),
        ("unreachable", "DatabaseUnreachable"),
        ("refused", "DatabaseRefused"),
        ("no table", "TableMissing"),
        ("wrong table", "TableInvalid"),
        ("table not ordered", "TableInvalid"),
        ("no publisher", "PublisherUnavailable"),
    ],
)
def test_a_resource_that_cannot_be_served_says_why_and_recovers_when_fixed(
    cluster: LocalCluster,
    operators: Callable[..., Operator],
    dsn: str,
    empty_dsn: str,
    case: str,
    reason: str,
) -> None:
    operators("--worker-publishers", "log,http,null")
    secret: dict[str, Any] | None = secret_manifest("orders-db", dsn=dsn)
    spec: dict[str, Any] = {}
    if case == "no secret":
        secret = None
    elif case == "no key":
        secret = secret_manifest("orders-db", url=dsn)
    elif case == "bad dsn":
        secret = secret_manifest("orders-db", dsn="host=db password=hunter2-secret port=notaport =")
    elif case == "unreachable":
        secret = secret_manifest("orders-db", dsn=UNREACHABLE)
    elif case == "refused":  # a role the server does not have: waiting will not fix it
        secret = secret_manifest("orders-db", dsn=make_conninfo(dsn, user="no_such_role"))
    elif case == "no table":
        secret = secret_manifest("orders-db", dsn=empty_dsn)
    elif case == "wrong table":
        secret = secret_manifest("orders-db", dsn=_bad_table(empty_dsn))
    elif case == "table not ordered":  # migrated without --ordering aggregate
        spec = {"ordering": "aggregate"}
    elif case == "no publisher":
        spec = {"publisher": {"type": "kafka", "kafka": {"bootstrapServers": "kafka:9092"}}}
    apply(cluster, *([secret] if secret else []), dispatcher_manifest(**spec))
    ready = wait_for(
        f"Ready=False with {reason}",
        lambda: (c := condition(cluster, "orders", "Ready")).get("reason") == reason and c,
    )
    assert ready["status"] == "False"
    assert ready["message"]
    if case == "table not ordered":
        assert "run `outbox migrate --table outbox --ordering aggregate`" in ready["message"]
    warning = wait_for(
        "a Warning event", lambda: [e for e in events(cluster, "orders") if e["reason"] == reason]
    )
    assert warning[0]["type"] == "Warning"
    assert deployment_of(cluster) is None  # nothing is started on inputs that cannot work
    # The database's own problems (the table's included) are DatabaseReachable's; before it
    # is reached, it was not checked.
    database = condition(cluster, "orders", "DatabaseReachable")
    if reason.startswith(("Database", "Table")):
        assert (database["status"], database["reason"]) == ("False", reason)
    else:
        assert (database["status"], database["reason"]) == ("Unknown", "NotChecked")

    # Fixed: the Secret is right, the publisher is one the image has.
    apply(cluster, secret_manifest("orders-db", dsn=dsn), dispatcher_manifest())
    wait_for("the Deployment after the fix", lambda: deployment_of(cluster))
    wait_for(
        "Ready to leave the problem",
        lambda: condition(cluster, "orders", "Ready").get("reason") != reason,
    )
    wait_for(
        "DatabaseReachable=True",
        lambda: condition(cluster, "orders", "DatabaseReachable").get("status") == "True",
    )
    assert "Recovered" in wait_for("the Recovered event", lambda: reasons(cluster, "orders"))
    everything = json.dumps(
        [get(cluster, "outboxdispatchers", "orders"), events(cluster, "orders")]
    )
    assert "hunter2-secret" not in everything
    assert "hunter2-secret" not in (cluster.workdir.parent / "op.log").read_text()


def test_kubectl_apply_of_a_bad_resource_prints_the_reason(cluster: LocalCluster) -> None:
    cases = {
        "scaling.minReplicas must not exceed scaling.maxReplicas": dispatcher_manifest(
            scaling={"minReplicas": 5, "maxReplicas": 2}
        ),
        "lease must be longer than publisher.http.timeout": dispatcher_manifest(
            lease="5s", publisher={"type": "http", "http": {"url": "http://x", "timeout": "10s"}}
        ),
        "publisher.http is required": dispatcher_manifest(publisher={"type": "http"}),
        "spec.lease": dispatcher_manifest(lease="soon"),
        "spec.publisher.type": dispatcher_manifest(publisher={"type": "carrier-pigeon"}),
        "spec.batchSize": dispatcher_manifest(batchSize=0),
        "publisher.rateLimit must be between 0.01/s (36/h) and 1000000/s": dispatcher_manifest(
            publisher={"type": "log", "rateLimit": "10/h"}
        ),
        "spec.publisher.rateLimit": dispatcher_manifest(
            publisher={"type": "log", "rateLimit": "50 per second"}
        ),
        "publisher.breaker.probeDelayMax must be between 2s and 1h": dispatcher_manifest(
            publisher={"type": "log", "breaker": {"probeDelayMax": "1s"}}
        ),
        "spec.database.dsnSecretRef": dispatcher_manifest(database={"table": "outbox"}),
    }
    for expected, manifest in cases.items():
        result = cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(manifest), check=False)
        assert result.returncode != 0, expected
        assert expected in result.stderr, (expected, result.stderr)
    assert cluster.objects("outbox.dev/v1alpha1", "outboxdispatchers", NS) == []


def scaled_up(k8s: LocalCluster) -> int:
    deployment = deployment_of(k8s)
    return int(deployment["spec"]["replicas"]) if deployment else 0


def test_database_errors_hold_the_size(
    cluster: LocalCluster, operators: Callable[..., Operator], dsn: str
) -> None:
    operators("--secret-recheck", "1s")  # the changed Secret is read at the next pass
    enqueue(dsn, 300)
    scaling = {
        "minReplicas": 0,
        "maxReplicas": 3,
        "pollIntervalSeconds": 1,
        "targetOldestReadyAgeSeconds": 1,
    }
    apply(cluster, secret_manifest("orders-db", dsn=dsn), dispatcher_manifest(scaling=scaling))
    size = wait_for("a scale-up for the backlog", lambda: scaled_up(cluster))
    apply(cluster, secret_manifest("orders-db", dsn=UNREACHABLE))
    reachable = wait_for(
        "DatabaseReachable=False",
        lambda: (c := condition(cluster, "orders", "DatabaseReachable"))["status"] == "False" and c,
    )
    assert reachable["reason"] == "DatabaseUnreachable"
    holding = wait_for(
        "a pass that held the size",
        lambda: (c := condition(cluster, "orders", "Scaling"))["reason"] == "HoldingSize" and c,
    )
    assert "cannot connect" in holding["message"]
    assert scaled_up(cluster) == size
    assert condition(cluster, "orders", "Ready")["status"] == "False"


def test_retention_purges_old_done_rows_on_a_timer(
    cluster: LocalCluster, operators: Callable[..., Operator], dsn: str
) -> None:
    enqueue(dsn, 30)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "UPDATE outbox SET status = 'done', done_at = now() - interval '2 hours' WHERE id <= 20"
        )
        conn.execute("UPDATE outbox SET status = 'done', done_at = now() WHERE id > 20")
    operators()
    apply(cluster, secret_manifest("orders-db", dsn=dsn), dispatcher_manifest(retention="1h"))
    status = wait_for(
        "a purge",
        lambda: (
            (b := get(cluster, "outboxdispatchers", "orders"))
            and b["status"].get("purgedTotal")
            and b["status"]
        ),
    )
    assert status["purgedTotal"] == 20
    assert "lastPurgeTime" in status
    with psycopg.connect(dsn) as conn:
        row = conn.execute("SELECT count(*), min(id) FROM outbox").fetchone()
    assert row == (10, 21)
    purged = wait_for(
        "the Purged event",
        lambda: [e for e in events(cluster, "orders") if e["reason"] == "Purged"],
    )
    assert "20" in purged[0]["message"]


def test_deleting_the_resource_deletes_its_deployment_and_leaves_the_table(
    cluster: LocalCluster, operators: Callable[..., Operator], dsn: str
) -> None:
    operators()
    enqueue(dsn, 5)
    apply(cluster, secret_manifest("orders-db", dsn=dsn), dispatcher_manifest())
    wait_for("the Deployment", lambda: deployment_of(cluster))
    cluster.kubectl("delete", "obd", "orders", "--wait=true")
    wait_for("the Deployment to go", lambda: deployment_of(cluster) is None)
    with psycopg.connect(dsn) as conn:
        assert conn.execute("SELECT count(*) FROM outbox").fetchone() == (5,)
    # Foreground: the resource waits for its Deployment, which the operator does not recreate.
    apply(cluster, dispatcher_manifest())
    wait_for("the Deployment again", lambda: deployment_of(cluster))
    cluster.kubectl("delete", "obd", "orders", "--cascade=foreground", "--wait=true")
    wait_for(
        "both gone",
        lambda: (
            deployment_of(cluster) is None and get(cluster, "outboxdispatchers", "orders") is None
        ),
    )


def test_changes_made_while_the_operator_was_down_are_handled_when_it_starts(
    cluster: LocalCluster, operators: Callable[..., Operator], dsn: str
) -> None:
    apply(cluster, secret_manifest("orders-db", dsn=dsn), dispatcher_manifest("early"))
    first = operators(name="first")
    wait_for("the resource made before the operator", lambda: observed(cluster, "early"))
    apply(cluster, dispatcher_manifest("doomed", database=own_table(dsn, "doomed")))
    wait_for("a second resource", lambda: deployment_of(cluster, "doomed"))
    # A scraper's keep-alive connection, open and idle at the stop, as Prometheus keeps one.
    assert first.port is not None
    scraper = http.client.HTTPConnection("127.0.0.1", first.port, timeout=10)
    scraper.request("GET", "/metrics")
    assert scraper.getresponse().read().startswith(b"# HELP")
    first.signal(signal.SIGTERM)
    assert first.wait(timeout=60) == 0
    # Within kopf's own 5 s wait for tasks started after it (see handlers.cleanup), timed
    # by the operator's own clock from its cleanup to its hand-over: a stop that lasts it
    # out left one pending, and a pod stop would take 5 s longer.
    stopping, released = (
        _logged_at(first, "stopping: every dispatcher loop"),
        _logged_at(first, "released lease"),
    )
    assert 0 <= released - stopping < 4, (stopping, released)
    scraper.close()
    lease = get(cluster, "leases", "outbox-controller")
    assert lease is not None and not lease["spec"].get("holderIdentity")  # handed over at once
    # While nobody runs: one resource changed, one deleted, one made.
    cluster.kubectl("patch", "obd", "early", "--type=merge", "-p", '{"spec":{"concurrency":3}}')
    cluster.kubectl("delete", "obd", "doomed")
    apply(cluster, dispatcher_manifest("late", database=own_table(dsn, "late")))
    operators(name="second")
    changed = wait_for("the change", lambda: observed(cluster, "early"))
    assert changed["metadata"]["generation"] == 2
    deployment = deployment_of(cluster, "early")
    assert deployment is not None and env_value(deployment, "OUTBOX_CONCURRENCY") == "3"
    wait_for(
        "the new resource", lambda: observed(cluster, "late") and deployment_of(cluster, "late")
    )
    assert deployment_of(cluster, "doomed") is None


def test_an_operator_killed_mid_reconcile_converges_after_restart(
    cluster: LocalCluster, operators: Callable[..., Operator], dsn: str
) -> None:
    victim = operators(name="victim", leader=FAST_LEADER)
    apply(cluster, secret_manifest("orders-db", dsn=dsn), dispatcher_manifest())
    # The Deployment exists, the status may not yet: somewhere inside the first pass.
    wait_for("the Deployment", lambda: deployment_of(cluster))
    victim.signal(signal.SIGKILL)
    assert victim.wait() == -signal.SIGKILL
    cluster.kubectl("patch", "obd", "orders", "--type=merge", "-p", '{"spec":{"maxAttempts":4}}')
    # Waits out the dead one's Lease (its recorded 6 s); once leading, a loaded machine's
    # stall must not cost it the Lease.
    operators(name="successor", leader=STEADY_LEADER)
    body = wait_for("observedGeneration == generation", lambda: observed(cluster), timeout=90)
    assert body["metadata"]["generation"] == 2
    deployment = deployment_of(cluster)
    assert deployment is not None and env_value(deployment, "OUTBOX_MAX_ATTEMPTS") == "4"
    lease = get(cluster, "leases", "outbox-controller")
    assert lease is not None and lease["spec"]["holderIdentity"] == "successor"


def test_never_past_max_replicas_and_kubectl_scale_pins_the_count(
    cluster: LocalCluster, operators: Callable[..., Operator], dsn: str
) -> None:
    operator = operators()
    enqueue(dsn, 2000)
    scaling = {
        "minReplicas": 0,
        "maxReplicas": 2,
        "pollIntervalSeconds": 1,
        "targetOldestReadyAgeSeconds": 0.5,
    }
    apply(cluster, secret_manifest("orders-db", dsn=dsn), dispatcher_manifest(scaling=scaling))
    wait_for("the maximum", lambda: scaled_up(cluster) == 2)
    # The Event is posted after the Deployment is scaled: wait for the one that reached 2.
    ups = wait_for(
        "the ScaledUp event to 2",
        lambda: (
            (m := [e["message"] for e in events(cluster, "orders") if e["reason"] == "ScaledUp"])
            and any("-> 2 workers" in u for u in m)
            and m
        ),
    )
    assert all(int(re.search(r"-> (\d+) workers", m).group(1)) <= 2 for m in ups)  # type: ignore[union-attr]
    assert operator.metric("outbox_controller_desired_replicas", dispatcher="orders") == 2

    refused = cluster.kubectl("scale", "obd", "orders", "--replicas=5", check=False)
    assert refused.returncode != 0
    assert "replicas must not exceed scaling.maxReplicas" in refused.stderr
    cluster.kubectl("scale", "obd", "orders", "--replicas=1")
    wait_for("the pinned count", lambda: scaled_up(cluster) == 1)
    pinned = wait_for(
        "ReplicasPinned",
        lambda: (c := condition(cluster, "orders", "Scaling"))["reason"] == "ReplicasPinned" and c,
    )
    assert "spec.replicas" in pinned["message"]
    table = cluster.kubectl("get", "obd", "orders").stdout
    header, row = table.splitlines()[:2]
    assert header.split() == [
        "NAME",
        "READY",
        "DESIRED",
        "BACKLOG",
        "OLDEST-READY",
        "OLDEST-UNFINISHED",
        "DEAD",
        "DESTINATIONS",
        "STATUS",
        "SPEC-PAUSED",
        "AGE",
    ]
    assert row.split()[:4] == ["orders", "0", "1", "2000"]


@pytest.fixture
def own_server(tmp_path: Path) -> Iterator[EmbeddedPostgres]:
    """A PostgreSQL of the test's own, to restart under the operator."""
    server = EmbeddedPostgres(tmp_path / "pg")
    server.start()
    with psycopg.connect(server.dsn(), autocommit=True) as conn:
        migrate(conn, Table.parse("outbox"))
    try:
        yield server
    finally:
        server.stop()


def test_postgres_restarted_under_the_operator(
    own_server: EmbeddedPostgres, cluster: LocalCluster, operators: Callable[..., Operator]
) -> None:
    operators()
    dsn = own_server.dsn()
    scaling = {"minReplicas": 2, "maxReplicas": 3, "pollIntervalSeconds": 1}
    apply(cluster, secret_manifest("orders-db", dsn=dsn), dispatcher_manifest(scaling=scaling))
    wait_for(
        "DatabaseReachable=True",
        lambda: condition(cluster, "orders", "DatabaseReachable").get("status") == "True",
    )
    assert scaled_up(cluster) == 2
    own_server.stop(mode="immediate", remove=False)  # a crash
    down = wait_for(
        "DatabaseReachable=False",
        lambda: (c := condition(cluster, "orders", "DatabaseReachable"))["status"] == "False" and c,
    )
    assert down["reason"] == "DatabaseUnreachable"
    wait_for(
        "the size held",
        lambda: condition(cluster, "orders", "Scaling").get("reason") == "HoldingSize",
    )
    assert scaled_up(cluster) == 2
    own_server.start()
    wait_for(
        "DatabaseReachable=True again",
        lambda: condition(cluster, "orders", "DatabaseReachable").get("status") == "True",
    )
    assert "Recovered" in wait_for("the Recovered event", lambda: reasons(cluster, "orders"))
    assert scaled_up(cluster) == 2


def test_a_changed_dsn_secret_rolls_the_workers(
    cluster: LocalCluster, operators: Callable[..., Operator], dsn: str
) -> None:
    operators("--secret-recheck", "1s")  # the rotated Secret is read at the next pass
    apply(cluster, secret_manifest("orders-db", dsn=dsn), dispatcher_manifest())
    first = wait_for("the Deployment", lambda: deployment_of(cluster))
    # Any change of the Secret (here a key added) is a new resourceVersion: the pods restart.
    apply(cluster, secret_manifest("orders-db", dsn=dsn, note="rotated"))
    rolled = wait_for(
        "a new template",
        lambda: (
            (d := deployment_of(cluster))
            and d["metadata"]["generation"] > first["metadata"]["generation"]
            and d
        ),
    )
    secret = get(cluster, "secrets", "orders-db")
    assert secret is not None
    annotations = rolled["spec"]["template"]["metadata"]["annotations"]
    assert annotations["outbox.dev/dsn-secret-version"] == secret["metadata"]["resourceVersion"]
    assert dsn not in json.dumps(rolled)


def test_a_deployment_of_the_same_name_that_is_not_ours_is_left_alone(
    cluster: LocalCluster, operators: Callable[..., Operator], dsn: str
) -> None:
    theirs_manifest = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "orders-worker", "namespace": NS},
        "spec": {
            "replicas": 2,
            "selector": {"matchLabels": {"app": "theirs"}},
            "template": {
                "metadata": {"labels": {"app": "theirs"}},
                "spec": {"containers": [{"name": "web", "image": "nginx"}]},
            },
        },
    }
    apply(cluster, theirs_manifest)
    operators()
    apply(cluster, secret_manifest("orders-db", dsn=dsn), dispatcher_manifest())
    ready = wait_for(
        "DeploymentNotOwned",
        lambda: (
            (c := condition(cluster, "orders", "Ready")).get("reason") == "DeploymentNotOwned" and c
        ),
    )
    assert "orders-worker" in ready["message"]
    assert condition(cluster, "orders", "DatabaseReachable")["status"] == "True"
    theirs = deployment_of(cluster)
    assert theirs is not None
    assert theirs["spec"]["replicas"] == 2 and "ownerReferences" not in theirs["metadata"]
    assert theirs["spec"]["template"]["spec"]["containers"][0]["image"] == "nginx"
    cluster.kubectl("delete", "deployment", "orders-worker")
    ours = wait_for(
        "our own Deployment",
        lambda: (d := deployment_of(cluster)) and d["metadata"].get("ownerReferences") and d,
    )
    assert ours["spec"]["template"]["spec"]["containers"][0]["command"] == ["outbox-worker"]


def test_the_api_server_going_away_mid_watch_is_ridden_out(
    cluster: LocalCluster, operators: Callable[..., Operator], dsn: str
) -> None:
    # A renew deadline (15 s) longer than the outage: the leader keeps leading through it.
    operator = operators()
    apply(cluster, secret_manifest("orders-db", dsn=dsn), dispatcher_manifest())
    wait_for("the first pass", lambda: observed(cluster))
    before = len(operator.log())
    with cluster.outage():  # open watches cut, connections refused
        wait_for(
            "the operator to meet the outage",
            lambda: "cannot reach the API" in operator.log()[before:],
        )
    # The watch is back: a change made now is seen and rolled out.
    cluster.kubectl("patch", "obd", "orders", "--type=merge", "-p", '{"spec":{"batchSize":7}}')
    rolled = wait_for(
        "the change after the outage",
        lambda: (d := deployment_of(cluster)) and env_value(d, "OUTBOX_BATCH") == "7" and d,
    )
    assert rolled is not None
    assert (
        wait_for("observedGeneration 2", lambda: observed(cluster))["metadata"]["generation"] == 2
    )
    assert operator.process is not None and operator.process.poll() is None  # never restarted


def test_an_outage_past_the_renew_deadline_restarts_the_leader_and_its_successor_converges(
    cluster: LocalCluster, operators: Callable[..., Operator], dsn: str
) -> None:
    leader = operators(name="leader", leader=FAST_LEADER)  # renews within 5 s, or stops
    apply(cluster, secret_manifest("orders-db", dsn=dsn), dispatcher_manifest())
    wait_for("the first pass", lambda: observed(cluster))
    with cluster.outage():
        # It cannot know whether another replica took over: it exits, so its pod restarts.
        assert leader.wait(timeout=60) == LOST_LEADERSHIP
    assert "lost lease" in leader.log()
    cluster.kubectl("patch", "obd", "orders", "--type=merge", "-p", '{"spec":{"batchSize":9}}')
    operators(name="restarted", leader=STEADY_LEADER)  # waits out the old Lease, then leads
    rolled = wait_for(
        "the change handled by the restarted operator",
        lambda: (d := deployment_of(cluster)) and env_value(d, "OUTBOX_BATCH") == "9" and d,
        timeout=90,
    )
    assert rolled is not None
    lease = get(cluster, "leases", "outbox-controller")
    assert lease is not None and lease["spec"]["holderIdentity"] == "restarted"
