"""The operator on day two, as a platform engineer meets it with kubectl: workers that cannot
run say why in the status and an Event; a Deployment changed by hand is put back; an API error
is reported in the server's own words; two resources on one table are one too many.

The real operator runs against the emulator; a local kubelet runs the worker pods as real
processes where the pods' states are the subject.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from chaos.proxy import Proxy
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from . import test_operator as harness
from .cluster import LocalCluster
from .kubelet import Kubelet
from .test_operator import (
    NS,
    Operator,
    apply,
    deployment_of,
    dispatcher_manifest,
    observed,
    secret_manifest,
    wait_for,
)

pytestmark = pytest.mark.slow
WORKER = Path(sys.executable).parent / "outbox-worker"


def obd(k8s: LocalCluster, name: str) -> dict[str, Any]:
    """The resource as `kubectl get obd NAME -o json` prints it."""
    result: dict[str, Any] = json.loads(k8s.kubectl("get", "obd", name, "-o", "json").stdout)
    return result


def kubectl_condition(k8s: LocalCluster, name: str, type_: str) -> dict[str, Any]:
    for item in (obd(k8s, name).get("status") or {}).get("conditions") or ():
        if item["type"] == type_:
            return item  # type: ignore[no-any-return]
    return {}


def kubectl_events(k8s: LocalCluster, name: str) -> list[dict[str, Any]]:
    """`kubectl get events` about the resource, oldest first."""
    listed = json.loads(k8s.kubectl("get", "events", "-o", "json").stdout)["items"]
    return [e for e in listed if e["involvedObject"]["name"] == name]


def workers_not_ready(k8s: LocalCluster, reason: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """Once resource `orders` says WorkersReady=False `reason` (and so does Ready, naming a
    pod) and a Warning Event says it too: the condition and the first such Event."""
    workers = wait_for(
        f"WorkersReady=False {reason}",
        lambda: (
            (c := kubectl_condition(k8s, "orders", "WorkersReady")).get("reason") == reason and c
        ),
    )
    assert workers["status"] == "False"
    assert workers["message"].startswith("pod orders-worker-"), workers
    ready = kubectl_condition(k8s, "orders", "Ready")
    assert (ready["status"], ready["reason"]) == ("False", reason)
    warning = wait_for(
        "a Warning Event",
        lambda: [e for e in kubectl_events(k8s, "orders") if e["reason"] == reason],
    )
    assert warning[0]["type"] == "Warning"
    return workers, warning[0]


def broken_image(directory: Path) -> Path:
    """An image whose `outbox-worker` pins a setting the worker refuses: its pods crash."""
    directory.mkdir()
    script = directory / "outbox-worker"
    script.write_text(f'#!/bin/sh\nexec {WORKER} --lease 0s "$@"\n')
    script.chmod(0o755)
    return directory


# dsn first: the database outlives the workers at teardown.
def test_crash_looping_workers_say_why_and_recover(
    dsn: str,
    cluster: LocalCluster,
    kubelet: Kubelet,
    operators: Callable[..., Operator],
    tmp_path: Path,
) -> None:
    kubelet.images["docker.io/library/outbox-dispatcher:broken"] = broken_image(tmp_path / "broken")
    operators()
    apply(
        cluster,
        secret_manifest("orders-db", dsn=dsn),
        dispatcher_manifest(worker={"image": "docker.io/library/outbox-dispatcher:broken"}),
    )
    workers, warning = workers_not_ready(cluster, "WorkersCrashing")
    # The container's own last line, read from the pod's last termination.
    assert "--lease: '0s' is out of range (1s to 1d)" in workers["message"], workers
    assert "out of range" in warning["message"]
    described = cluster.kubectl("describe", "obd", "orders").stdout
    assert "WorkersCrashing" in described

    # The fix: the default image again. The pods roll, become ready, and the status says so.
    cluster.kubectl(
        "patch", "obd", "orders", "--type=json",
        "-p", '[{"op": "remove", "path": "/spec/worker/image"}]',
    )  # fmt: skip
    wait_for(
        "WorkersReady=True",
        lambda: kubectl_condition(cluster, "orders", "WorkersReady").get("status") == "True",
        timeout=120,
    )
    wait_for(
        "Ready=True", lambda: kubectl_condition(cluster, "orders", "Ready")["status"] == "True"
    )
    recovered = [e for e in kubectl_events(cluster, "orders") if e["reason"] == "Recovered"]
    assert recovered and "WorkersCrashing" in recovered[-1]["message"]


def test_an_image_that_cannot_be_pulled_says_so(
    dsn: str, cluster: LocalCluster, kubelet: Kubelet, operators: Callable[..., Operator]
) -> None:
    missing = "docker.io/library/outbox-dispatcher:no-such-tag"
    kubelet.unpullable[missing] = (
        f'failed to pull and unpack image "{missing}": failed to resolve reference '
        f'"{missing}": {missing}: not found'
    )
    operators()
    apply(
        cluster,
        secret_manifest("orders-db", dsn=dsn),
        dispatcher_manifest(worker={"image": missing}),
    )
    workers, warning = workers_not_ready(cluster, "ImagePullFailed")
    assert f'"{missing}"' in workers["message"], workers
    assert missing in warning["message"]


def test_a_deployment_changed_by_hand_is_put_back_and_says_what_changed(
    cluster: LocalCluster, operators: Callable[..., Operator], dsn: str
) -> None:
    operator = operators()
    apply(cluster, secret_manifest("orders-db", dsn=dsn), dispatcher_manifest())
    wait_for("the first pass", lambda: observed(cluster))
    first = deployment_of(cluster)
    assert first is not None
    image = first["spec"]["template"]["spec"]["containers"][0]["image"]
    cluster.kubectl("set", "image", "deployment/orders-worker", "worker=evil:latest")
    cluster.kubectl("set", "env", "deployment/orders-worker", "SNEAKY=1")

    def restored() -> dict[str, Any] | None:
        deployment = deployment_of(cluster)
        if deployment is None:
            return None
        container = deployment["spec"]["template"]["spec"]["containers"][0]
        names = {e["name"] for e in container["env"]}
        return deployment if container["image"] == image and "SNEAKY" not in names else None

    put_back = wait_for("the rendered template back", restored)
    assert put_back["spec"]["template"] == first["spec"]["template"]

    def drift_events() -> list[dict[str, Any]]:
        return [e for e in kubectl_events(cluster, "orders") if e["reason"] == "DriftCorrected"]

    # Both changes are named, whether one pass or two put them back.
    said = wait_for(
        "DriftCorrected naming both changes",
        lambda: (
            (found := drift_events())
            and "evil:latest" in (text := " | ".join(e["message"] for e in found))
            and "env[SNEAKY] added" in text
            and found
        ),
    )
    assert all(e["type"] == "Warning" for e in said)
    assert f"(rendered: {image})" in " ".join(e["message"] for e in said)
    # The replica count stays the policy's.
    body = wait_for("a status after the repair", lambda: observed(cluster))
    assert put_back["spec"]["replicas"] == body["status"]["desiredReplicas"] == 1
    # What the operator does not render is no drift (`kubectl rollout restart` annotates the
    # template; the server defaults fields): nothing more is put back.
    cluster.kubectl("rollout", "restart", "deployment/orders-worker")
    before = len(drift_events())

    def passes() -> float:  # counted: the status is written only when it changed
        return operator.metric("outbox_controller_passes_total", dispatcher="orders") or 0.0

    start = passes()
    wait_for("three more passes", lambda: passes() >= start + 3)
    assert len(drift_events()) == before, drift_events()
    restarted = deployment_of(cluster)
    assert restarted is not None
    assert (
        "kubectl.kubernetes.io/restartedAt"
        in restarted["spec"]["template"]["metadata"]["annotations"]
    )


def test_fields_added_by_hand_where_the_operator_renders_nothing_are_put_back(
    cluster: LocalCluster, operators: Callable[..., Operator], dsn: str
) -> None:
    """`kubectl patch` giving the workers the node's network and a privileged container: the
    pod spec is compared whole (the server's defaults aside), so both are drift."""
    operators()
    apply(cluster, secret_manifest("orders-db", dsn=dsn), dispatcher_manifest())
    wait_for("the first pass", lambda: observed(cluster))
    first = deployment_of(cluster)
    assert first is not None
    patch = {
        "spec": {
            "template": {
                "spec": {
                    "hostNetwork": True,
                    "containers": [{"name": "worker", "securityContext": {"privileged": True}}],
                }
            }
        }
    }
    cluster.kubectl("patch", "deployment/orders-worker", "-p", json.dumps(patch))
    patched = deployment_of(cluster)
    assert patched is not None and patched["spec"]["template"]["spec"]["hostNetwork"] is True

    def restored() -> dict[str, Any] | None:
        deployment = deployment_of(cluster)
        if deployment is None:
            return None
        pod = deployment["spec"]["template"]["spec"]
        privileged = (pod["containers"][0].get("securityContext") or {}).get("privileged")
        return deployment if "hostNetwork" not in pod and not privileged else None

    put_back = wait_for("the rendered template back", restored)
    assert put_back["spec"]["template"] == first["spec"]["template"]
    said = wait_for(
        "DriftCorrected naming both",
        lambda: (
            (
                found := [
                    e for e in kubectl_events(cluster, "orders") if e["reason"] == "DriftCorrected"
                ]
            )
            and "spec.hostNetwork added" in (text := " | ".join(e["message"] for e in found))
            and "securityContext.privileged added" in text
            and found
        ),
    )
    assert all(e["type"] == "Warning" for e in said)


def without_name_rules(crd_path: Path) -> str:
    """The CRD as it was before it refused long names (a cluster upgraded from it keeps the
    resources it admitted: stored objects are not validated again)."""
    crd = yaml.safe_load(crd_path.read_text())
    for version in crd["spec"]["versions"]:
        schema = version["schema"]["openAPIV3Schema"]
        rules = [
            rule
            for rule in schema.get("x-kubernetes-validations") or ()
            if "metadata.name" not in rule["rule"]
        ]
        schema["x-kubernetes-validations"] = rules
        if not rules:
            del schema["x-kubernetes-validations"]
    return yaml.safe_dump(crd)


def test_an_api_error_is_reported_in_the_servers_words(
    cluster: LocalCluster, operators: Callable[..., Operator], dsn: str
) -> None:
    """A name too long for the label the workers carry: refused at admission now; one that
    an older CRD admitted meets the API server's 422, which reaches the status, an Event and
    the log in the server's own words."""
    operator = operators()
    name = "orders-" + "x" * 60  # 67 characters: a valid name, too long for a label value
    apply(cluster, secret_manifest("orders-db", dsn=dsn))
    manifest = yaml.safe_dump(dispatcher_manifest(name))
    refused = cluster.kubectl("apply", "-f", "-", input=manifest, check=False)
    assert refused.returncode != 0 and "63" in refused.stderr, refused.stderr

    cluster.kubectl("apply", "-f", "-", input=without_name_rules(harness.CRD))
    cluster.kubectl("apply", "-f", "-", input=manifest)
    ready = wait_for(
        "Ready=False ApiError",
        lambda: (c := kubectl_condition(cluster, name, "Ready")).get("reason") == "ApiError" and c,
    )
    assert ready["status"] == "False"
    assert f"creating Deployment {NS}/{name}-worker: 422" in ready["message"], ready
    assert "must be no more than 63 characters" in ready["message"], ready
    warning = wait_for(
        "a Warning Event",
        lambda: [e for e in kubectl_events(cluster, name) if e["reason"] == "ApiError"],
    )
    assert warning[0]["type"] == "Warning"
    assert "must be no more than 63 characters" in warning[0]["message"]
    logged = [line for line in operator.log().splitlines() if "API error" in line]
    assert logged and "must be no more than 63 characters" in logged[0], logged


def test_a_second_resource_on_the_same_table_runs_no_workers(
    cluster: LocalCluster, operators: Callable[..., Operator], dsn: str
) -> None:
    operators()
    # The same database, written another way: the server tells them apart, not the text.
    other_text = make_conninfo(dsn, application_name="shipping", connect_timeout=7)
    assert other_text != dsn
    apply(cluster, secret_manifest("orders-db", dsn=dsn), dispatcher_manifest("orders"))
    wait_for("the first resource served", lambda: observed(cluster, "orders"))
    copy = dispatcher_manifest("shipping")
    copy["spec"]["database"]["dsnSecretRef"]["name"] = "shipping-db"
    apply(cluster, secret_manifest("shipping-db", dsn=other_text), copy)
    ready = wait_for(
        "Ready=False TableConflict",
        lambda: (
            (c := kubectl_condition(cluster, "shipping", "Ready")).get("reason") == "TableConflict"
            and c
        ),
    )
    assert ready["status"] == "False"
    assert "default/orders" in ready["message"] and "public.outbox" in ready["message"], ready
    warning = wait_for(
        "a Warning Event",
        lambda: [e for e in kubectl_events(cluster, "shipping") if e["reason"] == "TableConflict"],
    )
    assert warning[0]["type"] == "Warning"
    # It runs no workers; the first is untouched.
    copy_deployment = deployment_of(cluster, "shipping")
    assert copy_deployment is None or copy_deployment["spec"]["replicas"] == 0
    assert obd(cluster, "shipping")["status"]["desiredReplicas"] == 0
    first = kubectl_condition(cluster, "orders", "Ready")
    assert first["reason"] == "WorkersStarting", first  # no kubelet here: pods on their way
    assert (deployment_of(cluster, "orders") or {})["spec"]["replicas"] == 1

    # The first one deleted, the table is the second's.
    cluster.kubectl("delete", "obd", "orders")
    wait_for(
        "the table freed: shipping served",
        lambda: kubectl_condition(cluster, "shipping", "Ready").get("reason") == "WorkersStarting",
    )
    wait_for(
        "shipping's workers",
        lambda: (d := deployment_of(cluster, "shipping")) and d["spec"]["replicas"] == 1,
    )


def test_two_resources_on_one_table_before_the_operator_starts_the_newer_never_runs_workers(
    cluster: LocalCluster, operators: Callable[..., Operator], dsn: str
) -> None:
    """After a start (or a failover) the registry of tables is empty: the newer resource's
    pass may read its table before the older one's. Here the older one reaches the database
    through a proxy held until the newer one's pass has read: the newer waits, then finds the
    table taken, and never gets a Deployment."""
    port = int(conninfo_to_dict(dsn).get("port") or 5432)
    with Proxy(port) as proxy:
        proxy.stall()
        held = make_conninfo(dsn, host="127.0.0.1", port=str(proxy.port))
        copy = dispatcher_manifest("shipping")
        copy["spec"]["database"]["dsnSecretRef"]["name"] = "shipping-db"
        apply(
            cluster,
            secret_manifest("orders-db", dsn=held),
            secret_manifest("shipping-db", dsn=dsn),
            dispatcher_manifest("orders"),
            copy,
        )
        operator = operators()
        waits = "default/shipping: runs no workers until these are read: default/orders"
        gave_up = "default/orders: DatabaseUnreachable"
        # The older reading must succeed: it is held until the newer one's pass has read, or
        # until the operator gives it up (its pass waits controller.database.WAIT_SECONDS
        # for a connection, then tries one more for CONNECT_TIMEOUT_SECONDS: about 15 s).
        # Whichever comes first ends the wait. The newer one's pass may take seconds on a
        # loaded machine; a bound of its own under the connect timeout (4 s) failed it there.
        wait_for("the older resource's reading held", lambda: proxy.connections >= 1)
        wait_for(
            "the newer one's pass done, or the older reading given up",
            lambda: (
                waits in operator.log()
                or observed(cluster, "shipping")
                or gave_up in operator.log()
            ),
        )
        proxy.resume()
        assert gave_up not in operator.log(), "the older reading was given up before the newer read"
        ready = wait_for(
            "Ready=False TableConflict",
            lambda: (
                (c := kubectl_condition(cluster, "shipping", "Ready")).get("reason")
                == "TableConflict"
                and c
            ),
        )
        assert "default/orders" in ready["message"], ready
        wait_for(
            "the older one's workers",
            lambda: (d := deployment_of(cluster, "orders")) and d["spec"]["replicas"] == 1,
        )
    # Never created (nothing deletes it), never scaled: the newer ran no worker at any time.
    assert deployment_of(cluster, "shipping") is None
    assert "creating Deployment default/shipping-worker" not in operator.log()
    assert not [e for e in kubectl_events(cluster, "shipping") if e["reason"].startswith("Scaled")]
