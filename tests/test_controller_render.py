"""The worker Deployment rendered from a resource: a pure function, no cluster needed."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from outbox.controller.render import (
    SECRET_VERSION,
    SECRETS_HASH,
    TEMPLATE_HASH,
    render_deployment,
)
from outbox.controller.resource import selector_string
from outbox.controller.spec import DispatcherSpec
from outbox.plumbing.durations import parse_duration

CRD = Path(__file__).parent.parent / "crds" / "outboxdispatchers.yaml"


def _schema() -> dict[str, Any]:
    crd = yaml.safe_load(CRD.read_text())
    return crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]  # type: ignore[no-any-return]


def with_defaults(schema: dict[str, Any], value: Any) -> Any:
    """The CRD's defaults applied as an API server applies them (the one source of each)."""
    if schema.get("type") == "object" and isinstance(value, dict):
        for key, sub in (schema.get("properties") or {}).items():
            if key not in value and "default" in sub:
                value[key] = copy.deepcopy(sub["default"])
            if key in value:
                value[key] = with_defaults(sub, value[key])
    if schema.get("type") == "array" and isinstance(value, list) and "items" in schema:
        return [with_defaults(schema["items"], item) for item in value]
    return value


def resource(**spec: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "database": {"dsnSecretRef": {"name": "orders-db"}, "table": "app.outbox"},
        "publisher": {"type": "http", "http": {"url": "http://events.example/ingest"}},
    }
    base.update(spec)
    body = {
        "apiVersion": "outbox.dev/v1alpha1",
        "kind": "OutboxDispatcher",
        "metadata": {"name": "orders", "namespace": "shop", "uid": "0000-1111", "generation": 1},
        "spec": base,
    }
    return with_defaults(_schema(), body)  # type: ignore[no-any-return]


def env_of(deployment: dict[str, Any]) -> dict[str, Any]:
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    return {item["name"]: item.get("value", item.get("valueFrom")) for item in container["env"]}


def render(body: dict[str, Any], replicas: int = 2) -> dict[str, Any]:
    return render_deployment(
        DispatcherSpec.parse(body), replicas=replicas, default_image="outbox-dispatcher:test"
    )


def test_the_deployment_is_a_valid_apps_v1_object() -> None:
    kubernetes_validate.validate(render(resource()), "1.30", strict=True)


def test_the_dsn_comes_from_the_secret_and_is_never_copied() -> None:
    env = env_of(render(resource()))
    assert env["OUTBOX_DSN"] == {"secretKeyRef": {"name": "orders-db", "key": "dsn"}}
    assert env["OUTBOX_TABLE"] == "app.outbox"


def test_spec_fields_become_the_workers_outbox_variables() -> None:
    body = resource(lease="90s", batchSize=20, concurrency=4, maxAttempts=3, ordering="aggregate")
    body["spec"]["publisher"]["http"]["timeout"] = "5s"
    env = env_of(render(body))
    assert env["OUTBOX_PUBLISHER"] == "http"
    assert env["OUTBOX_HTTP_URL"] == "http://events.example/ingest"
    assert (env["OUTBOX_LEASE"], env["OUTBOX_PUBLISH_TIMEOUT"]) == ("90s", "5s")
    assert (env["OUTBOX_BATCH"], env["OUTBOX_CONCURRENCY"]) == ("20", "4")
    assert (env["OUTBOX_MAX_ATTEMPTS"], env["OUTBOX_ORDERING"]) == ("3", "aggregate")
    assert env["OUTBOX_OWNER"] == {"fieldRef": {"fieldPath": "metadata.name"}}


def test_publisher_secrets_are_secret_refs_or_mounted_secrets() -> None:
    ref = {"name": "nats-auth", "key": "password"}
    body = resource(
        publisher={
            "type": "nats",
            "nats": {
                "urls": ["nats://a:4222", "nats://b:4222"],
                "passwordSecretRef": ref,
                "credsSecretRef": {"name": "nats-auth", "key": "creds"},
            },
        }
    )
    deployment = render(body)
    env = env_of(deployment)
    assert env["OUTBOX_NATS_URL"] == "nats://a:4222\nnats://b:4222"
    assert env["OUTBOX_NATS_PASSWORD"] == {"secretKeyRef": ref}
    pod = deployment["spec"]["template"]["spec"]
    mounted = {v["name"]: v for v in pod["volumes"]}["nats-creds"]["secret"]
    assert mounted["secretName"] == "nats-auth"
    assert env["OUTBOX_NATS_CREDS"].startswith(
        {m["name"]: m for m in pod["containers"][0]["volumeMounts"]}["nats-creds"]["mountPath"]
    )
    kubernetes_validate.validate(deployment, "1.30", strict=True)


def test_a_nats_tls_secret_is_mounted_whole_and_the_worker_takes_the_keys_it_holds() -> None:
    # ca.crt is optional in the Secret: naming each file would stop a worker whose Secret
    # lacks one; the worker reads the directory instead.
    body = resource(
        publisher={"type": "nats", "nats": {"urls": ["tls://a:4222"], "tlsSecretName": "nats-tls"}}
    )
    deployment = render(body)
    env = env_of(deployment)
    pod = deployment["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["nats-tls-dir"]["secret"]["secretName"] == "nats-tls"
    mounts = {m["name"]: m for m in pod["containers"][0]["volumeMounts"]}
    assert env["OUTBOX_NATS_TLS_DIR"] == mounts["nats-tls-dir"]["mountPath"]
    assert not {"OUTBOX_NATS_TLS_CA", "OUTBOX_NATS_TLS_CERT", "OUTBOX_NATS_TLS_KEY"} & set(env)


def test_kafka_options_and_secret_config() -> None:
    body = resource(
        publisher={
            "type": "kafka",
            "kafka": {
                "bootstrapServers": "k1:9092,k2:9092",
                "configSecretRef": {"name": "kafka", "key": "sasl"},
            },
        }
    )
    env = env_of(render(body))
    assert env["OUTBOX_KAFKA_BOOTSTRAP_SERVERS"] == "k1:9092,k2:9092"
    assert env["OUTBOX_KAFKA_CONFIG"] == {"secretKeyRef": {"name": "kafka", "key": "sasl"}}
    assert env["OUTBOX_KAFKA_COMPRESSION"] == "none"


def test_pods_run_non_root_read_only_with_probes_and_scrape_annotations() -> None:
    template = render(resource())["spec"]["template"]
    pod = template["spec"]
    container = pod["containers"][0]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] != 0
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    port = container["ports"][0]["containerPort"]
    assert env_of({"spec": {"template": template}})["OUTBOX_METRICS_PORT"] == str(port)
    assert template["metadata"]["annotations"]["prometheus.io/scrape"] == "true"
    assert template["metadata"]["annotations"]["prometheus.io/port"] == str(port)


def test_the_grace_period_outlasts_the_workers_shutdown_grace() -> None:
    deployment = render(resource(worker={"shutdownGraceSeconds": 40}))
    grace = parse_duration(env_of(deployment)["OUTBOX_SHUTDOWN_GRACE"]).total_seconds()
    assert grace == 40
    assert deployment["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] > grace


def test_the_rolling_update_never_lowers_the_ready_count() -> None:
    strategy = render(resource())["spec"]["strategy"]
    assert strategy["type"] == "RollingUpdate"
    assert strategy["rollingUpdate"]["maxUnavailable"] == 0


def test_owner_reference_and_labels() -> None:
    deployment = render(resource())
    (owner,) = deployment["metadata"]["ownerReferences"]
    assert owner["kind"] == "OutboxDispatcher" and owner["uid"] == "0000-1111"
    assert owner["controller"] is True
    labels = deployment["metadata"]["labels"]
    assert labels["app.kubernetes.io/instance"] == "orders"
    assert labels["app.kubernetes.io/managed-by"] == "outbox-controller"
    selector = deployment["spec"]["selector"]["matchLabels"]
    assert selector.items() <= deployment["spec"]["template"]["metadata"]["labels"].items()
    assert selector_string("orders") == ",".join(f"{k}={v}" for k, v in sorted(selector.items()))


def test_rendering_is_deterministic_and_replicas_do_not_change_the_template() -> None:
    a, b = render(resource(), replicas=1), render(resource(), replicas=7)
    assert a["spec"]["template"] == b["spec"]["template"]
    assert (
        a["metadata"]["annotations"][TEMPLATE_HASH] == b["metadata"]["annotations"][TEMPLATE_HASH]
    )
    assert b["spec"]["replicas"] == 7


def test_a_status_change_keeps_the_template_and_a_spec_change_rolls_it() -> None:
    body = resource()
    before = render(body)["metadata"]["annotations"][TEMPLATE_HASH]
    body["status"] = {"desiredReplicas": 3, "backlog": {"pending": 10}}
    body["metadata"]["generation"] = 1
    assert render(body)["metadata"]["annotations"][TEMPLATE_HASH] == before
    body["spec"]["batchSize"] = 7
    assert render(body)["metadata"]["annotations"][TEMPLATE_HASH] != before


def test_the_worker_block_reaches_the_pods() -> None:
    worker = {
        "image": "registry.example/outbox:1.2",
        "resources": {"requests": {"cpu": "100m"}},
        "env": [{"name": "TZ", "value": "UTC"}],
        "nodeSelector": {"pool": "workers"},
        "tolerations": [{"key": "dedicated", "operator": "Exists"}],
        "podAnnotations": {"team": "orders"},
        "podLabels": {"team": "orders", "app.kubernetes.io/instance": "spoofed"},
        "serviceAccountName": "orders-worker",
        "priorityClassName": "high",
    }
    deployment = render(resource(worker=worker))
    template = deployment["spec"]["template"]
    pod = template["spec"]
    container = pod["containers"][0]
    assert container["image"] == "registry.example/outbox:1.2"
    assert container["resources"] == {"requests": {"cpu": "100m"}}
    assert env_of(deployment)["TZ"] == "UTC"
    assert pod["nodeSelector"] == {"pool": "workers"}
    assert pod["serviceAccountName"] == "orders-worker"
    assert pod["priorityClassName"] == "high"
    assert template["metadata"]["annotations"]["team"] == "orders"
    assert template["metadata"]["labels"]["team"] == "orders"
    assert template["metadata"]["labels"]["app.kubernetes.io/instance"] == "orders"
    kubernetes_validate.validate(deployment, "1.30", strict=True)


def test_the_default_image_when_the_resource_names_none() -> None:
    container = render(resource())["spec"]["template"]["spec"]["containers"][0]
    assert container["image"] == "outbox-dispatcher:test"
    assert container["command"] == ["outbox-worker"]


@pytest.mark.parametrize("kind", ["null", "log"])
def test_publishers_without_options(kind: str) -> None:
    env = env_of(render(resource(publisher={"type": kind})))
    assert env["OUTBOX_PUBLISHER"] == kind
    assert "OUTBOX_PUBLISH_TIMEOUT" not in env


def _worker_variables() -> set[str]:
    from outbox.plumbing.cliutil import env_name
    from outbox.worker.publishers.registry import builtin_names, load_publisher
    from outbox.worker.settings import build_parser

    parser = build_parser([load_publisher(name) for name in builtin_names()])
    return {env_name(flag) for action in parser._actions for flag in action.option_strings
            if flag.startswith("--") and flag != "--help"}  # fmt: skip


PUBLISHERS = [
    {"type": "http", "http": {"url": "http://sink.example/in", "timeout": "3s",
                              "headersSecretRef": {"name": "h", "key": "headers"}}},
    {"type": "nats", "nats": {"urls": ["nats://n1:4222"], "subject": "events.{event_type}",
                              "tokenSecretRef": {"name": "n", "key": "token"}}},
    {"type": "kafka", "kafka": {"bootstrapServers": "k1:9092", "topic": "{aggregate_type}",
                                "compression": "zstd",
                                "config": {"security.protocol": "plaintext"}}},
    {"type": "log"},
]  # fmt: skip


@pytest.mark.parametrize("publisher", PUBLISHERS, ids=lambda p: p["type"])
def test_the_worker_understands_every_variable_the_operator_sets(
    publisher: dict[str, Any],
) -> None:
    """The rendered env, with the Secrets' values filled in, is a valid worker configuration."""
    from outbox.worker.settings import load_settings

    body = resource(publisher=publisher, lease="30s", batchSize=7, ordering="aggregate")
    secrets = {"OUTBOX_DSN": "postgresql://app@db/orders", "OUTBOX_HTTP_HEADER": "X-Token: t",
               "OUTBOX_NATS_TOKEN": "secret-token"}  # fmt: skip
    env: dict[str, str] = {}
    for item in render(body)["spec"]["template"]["spec"]["containers"][0]["env"]:
        name = item["name"]
        if name.startswith("OUTBOX_"):
            assert name in _worker_variables(), f"the worker has no {name}"
            if "value" in item:
                env[name] = item["value"]
            elif "secretKeyRef" in item["valueFrom"]:
                env[name] = secrets[name]
            else:
                env[name] = "orders-worker-abc12"  # fieldRef metadata.name
    settings = load_settings([], env)
    assert settings.publisher == publisher["type"]
    assert (settings.batch, settings.ordering) == (7, "aggregate")
    assert settings.lease.total_seconds() == 30
    assert settings.owner == "orders-worker-abc12"
    assert settings.metrics_port == 9000
    if publisher["type"] == "http":
        assert settings.publisher_options["http_url"] == "http://sink.example/in"
        assert settings.publish_timeout.total_seconds() == 3
    if publisher["type"] == "kafka":
        assert settings.publisher_options["kafka_compression"] == "zstd"


def test_a_changed_dsn_secret_rolls_the_workers() -> None:
    body = resource()
    first = render_deployment(
        DispatcherSpec.parse(body), replicas=1, default_image="i", secret_version="41"
    )
    again = render_deployment(
        DispatcherSpec.parse(body), replicas=3, default_image="i", secret_version="41"
    )
    rotated = render_deployment(
        DispatcherSpec.parse(body), replicas=1, default_image="i", secret_version="97"
    )
    hashes = [d["metadata"]["annotations"][TEMPLATE_HASH] for d in (first, again, rotated)]
    assert hashes[0] == hashes[1] != hashes[2]
    assert rotated["spec"]["template"]["metadata"]["annotations"][SECRET_VERSION] == "97"


def test_any_changed_secret_rolls_the_workers_whatever_the_order() -> None:
    """A rotated signing key (or headers, broker or registry credentials) reaches running
    workers only through a new pod: each Secret's version is in the template's hash."""
    body = resource()

    def rendered(versions: dict[str, str]) -> dict[str, Any]:
        return render_deployment(
            DispatcherSpec.parse(body),
            replicas=1,
            default_image="i",
            secret_version="41",
            secret_versions=versions,
        )

    first = rendered({"orders-db": "41", "signing": "7", "headers": "9"})
    reordered = rendered({"headers": "9", "signing": "7", "orders-db": "41"})
    signing = rendered({"orders-db": "41", "signing": "8", "headers": "9"})
    headers = rendered({"orders-db": "41", "signing": "7", "headers": "10"})
    dropped = rendered({"orders-db": "41", "signing": "7"})

    def template(d: dict[str, Any]) -> tuple[str, str]:
        annotations = d["spec"]["template"]["metadata"]["annotations"]
        return d["metadata"]["annotations"][TEMPLATE_HASH], annotations[SECRETS_HASH]

    assert template(first) == template(reordered)
    seen = {template(d) for d in (first, signing, headers, dropped)}
    assert len(seen) == 4
    assert "41" not in template(first)[1] and len(template(first)[1]) == 16
    # No Secret named (rendered without versions): no annotation, the template as before.
    plain = render_deployment(
        DispatcherSpec.parse(body), replicas=1, default_image="i", secret_version="41"
    )
    assert SECRETS_HASH not in plain["spec"]["template"]["metadata"]["annotations"]


def test_the_rate_limit_and_the_breaker_become_the_workers_variables() -> None:
    from outbox.worker.settings import load_settings

    body = resource()
    body["spec"]["publisher"]["rateLimit"] = "600/m"
    body["spec"]["publisher"]["breaker"] = {"failures": 3, "window": "30s", "probeDelayMax": "5s"}
    env = env_of(render(body))
    assert env["OUTBOX_RATE_LIMIT"] == "600/m"
    assert (env["OUTBOX_BREAKER_FAILURES"], env["OUTBOX_BREAKER_WINDOW"]) == ("3", "30s")
    assert env["OUTBOX_PROBE_DELAY_MAX"] == "5s"
    # What the worker makes of them (a test may import both; the operator does not).
    plain = {k: v for k, v in env.items() if isinstance(v, str)}
    settings = load_settings([], {**plain, "OUTBOX_DSN": "host=db"})
    assert settings.rate_limit == 10.0
    assert (settings.breaker_failures, settings.breaker_window) == (3, parse_duration("30s"))
    assert settings.probe_delay_max == parse_duration("5s")


def test_without_them_the_worker_keeps_its_defaults() -> None:
    env = env_of(render(resource()))
    assert not {"OUTBOX_RATE_LIMIT", "OUTBOX_PROBE_DELAY_MAX"} & set(env)
    assert not [name for name in env if name.startswith("OUTBOX_BREAKER_")]


# -- day two: the pods placed and pulled like any other, with defaults from the admin --------

DAY_TWO = {
    "imagePullSecrets": [{"name": "regcred"}],
    "resources": {"requests": {"cpu": "250m", "memory": "256Mi"}, "limits": {"memory": "1Gi"}},
    "nodeSelector": {"pool": "workers"},
    "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "workers",
                     "effect": "NoSchedule"}],
    "affinity": {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
        {"weight": 100, "podAffinityTerm": {"topologyKey": "kubernetes.io/hostname",
                                            "labelSelector": {"matchLabels": {"team": "x"}}}}]}},
    "topologySpreadConstraints": [
        {"maxSkew": 1, "topologyKey": "topology.kubernetes.io/zone",
         "whenUnsatisfiable": "ScheduleAnyway"},
        {"maxSkew": 2, "topologyKey": "kubernetes.io/hostname",
         "whenUnsatisfiable": "DoNotSchedule", "labelSelector": {"matchLabels": {"team": "x"}}},
    ],
    "priorityClassName": "batch-high",
    "serviceAccountName": "orders-worker",
    "podLabels": {"team": "orders"},
    "podAnnotations": {"team.example.com/owner": "orders"},
    "disruptionBudget": {"maxUnavailable": 1},
}  # fmt: skip


def test_every_day_two_pod_setting_reaches_the_pod_as_the_crd_admits_it() -> None:
    from chart.chart import custom_resource_errors

    body = resource(worker=copy.deepcopy(DAY_TWO))
    assert custom_resource_errors(body) == []
    template = render(body)["spec"]["template"]
    pod = template["spec"]
    assert pod["imagePullSecrets"] == [{"name": "regcred"}]
    assert pod["containers"][0]["resources"] == DAY_TWO["resources"]
    assert pod["nodeSelector"] == {"pool": "workers"}
    assert pod["tolerations"] == DAY_TWO["tolerations"]
    assert pod["affinity"] == DAY_TWO["affinity"]
    assert pod["priorityClassName"] == "batch-high"
    assert pod["serviceAccountName"] == "orders-worker"
    # Without a labelSelector a constraint would count no pods: it counts the workers.
    own, other = pod["topologySpreadConstraints"]
    assert own["labelSelector"] == {"matchLabels": selector_labels_of("orders")}
    assert other["labelSelector"] == {"matchLabels": {"team": "x"}}
    assert template["metadata"]["labels"]["team"] == "orders"
    kubernetes_validate.validate(render(body), "1.30", strict=True)


def selector_labels_of(name: str) -> dict[str, str]:
    from outbox.controller.resource import selector_labels

    return selector_labels(name)


def test_workers_ask_for_resources_by_default_and_the_admins_defaults_fill_what_is_omitted() -> (
    None
):
    from outbox.controller.settings import DEFAULT_WORKER_RESOURCES

    container = render(resource())["spec"]["template"]["spec"]["containers"][0]
    assert container["resources"] == DEFAULT_WORKER_RESOURCES
    assert container["resources"]["requests"]["memory"] == "128Mi"
    admin = {
        "resources": {"requests": {"cpu": "50m", "memory": "96Mi"}},
        "imagePullSecrets": [{"name": "cluster-regcred"}],
        "nodeSelector": {"pool": "outbox"},
        "priorityClassName": "low",
    }
    body = resource(worker={"nodeSelector": {"pool": "mine"}})
    pod = render_deployment(
        DispatcherSpec.parse(body), replicas=1, default_image="i:1", defaults=admin
    )["spec"]["template"]["spec"]
    assert pod["containers"][0]["resources"] == admin["resources"]
    assert pod["imagePullSecrets"] == [{"name": "cluster-regcred"}]
    assert pod["priorityClassName"] == "low"
    assert pod["nodeSelector"] == {"pool": "mine"}  # the resource's own wins
    # A resource's own resources win whole (requests and limits are one decision).
    own = resource(worker={"resources": {"limits": {"memory": "1Gi"}}})
    container = render(own)["spec"]["template"]["spec"]["containers"][0]
    assert container["resources"] == {"limits": {"memory": "1Gi"}}


# -- the PodDisruptionBudget: only while it cannot block a drain -------------------------------


def budget(value: dict[str, Any] | None, replicas: int) -> dict[str, Any] | None:
    from outbox.controller.budget import render_disruption_budget

    worker = {} if value is None else {"disruptionBudget": value}
    return render_disruption_budget(DispatcherSpec.parse(resource(worker=worker)), replicas)


@pytest.mark.parametrize(
    ("value", "replicas", "allowed"),
    [
        ({"maxUnavailable": 1}, 1, 1),
        ({"maxUnavailable": 2}, 5, 2),
        ({"maxUnavailable": "10%"}, 1, "10%"),  # rounds up to one pod
        ({"minAvailable": 1}, 1, 1),  # 1 of 1 would allow no eviction: one
        ({"minAvailable": 1}, 2, 1),
        ({"minAvailable": 3}, 3, 1),
        ({"minAvailable": 3}, 5, 2),
        ({"minAvailable": 3}, 0, 1),
        ({"minAvailable": "50%"}, 1, 1),  # ceil(0.5) = 1 of 1: one
        ({"minAvailable": "50%"}, 4, 2),
        ({"minAvailable": "99%"}, 50, 1),  # ceil(49.5) = 50 of 50: one
        ({"minAvailable": "60%"}, 10, 4),
    ],
)
def test_the_budget_always_allows_an_eviction(
    value: dict[str, Any], replicas: int, allowed: int | str
) -> None:
    pdb = budget(value, replicas)
    assert pdb is not None
    spec = pdb["spec"]
    assert spec["maxUnavailable"] == allowed and "minAvailable" not in spec
    assert spec["unhealthyPodEvictionPolicy"] == "AlwaysAllow"
    assert spec["selector"] == render(resource())["spec"]["selector"]
    assert pdb["metadata"]["ownerReferences"][0]["uid"] == "0000-1111"
    kubernetes_validate.validate(pdb, "1.30", strict=True)


def test_no_budget_unless_asked_and_a_released_one_allows_every_eviction() -> None:
    from outbox.controller.budget import render_disruption_budget

    assert budget(None, 3) is None
    released = render_disruption_budget(DispatcherSpec.parse(resource()), 3, released=True)
    assert released is not None and released["spec"]["maxUnavailable"] == "100%"


def _pod(ready: bool, phase: str = "Running", going: bool = False) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": "orders-worker-x"}
    if going:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    status = {"type": "Ready", "status": "True" if ready else "False"}
    return {"metadata": meta, "status": {"phase": phase, "conditions": [status]}}


@pytest.mark.parametrize(
    ("value", "replicas", "pods", "allowed"),
    [
        # A drain evicted one of two; its replacement is Pending (no node): maxUnavailable 1
        # would allow no eviction at all, so the budget lets the drain go on.
        ({"maxUnavailable": 1}, 2, [_pod(True), _pod(False, "Pending")], "100%"),
        (
            {"maxUnavailable": 1},
            2,
            [_pod(True), _pod(True, going=True), _pod(False, "Pending")],
            "100%",
        ),
        ({"maxUnavailable": 1}, 2, [_pod(True), _pod(True, going=True)], 1),
        ({"maxUnavailable": 1}, 1, [], 1),  # no pod: none to hold
        ({"maxUnavailable": 1}, 2, [_pod(True), _pod(True)], 1),
        ({"maxUnavailable": 2}, 3, [_pod(True), _pod(True), _pod(False, "Pending")], 2),
        ({"maxUnavailable": "10%"}, 3, [_pod(True), _pod(True), _pod(False)], "100%"),
        ({"minAvailable": 2}, 4, [_pod(True)] * 3 + [_pod(False, "Pending")], 2),
        ({"minAvailable": 2}, 4, [_pod(True)] * 2 + [_pod(False, "Pending")] * 2, "100%"),
        # Pods that could not be read (RBAC): the budget as asked.
        ({"maxUnavailable": 1}, 2, None, 1),
    ],
)
def test_the_budget_lets_a_drain_through_while_pods_not_ready_use_it_up(
    value: dict[str, Any], replicas: int, pods: list[dict[str, Any]] | None, allowed: int | str
) -> None:
    from outbox.controller.budget import render_disruption_budget, unavailable

    body = resource(worker={"disruptionBudget": value})
    missing = unavailable(pods)
    pdb = render_disruption_budget(DispatcherSpec.parse(body), replicas, unavailable=missing)
    assert pdb is not None and pdb["spec"]["maxUnavailable"] == allowed, (missing, pdb)
    kubernetes_validate.validate(pdb, "1.30", strict=True)


@pytest.mark.parametrize(
    ("value", "admitted"),
    [({"maxUnavailable": 0}, False), ({"maxUnavailable": "0%"}, False),
     ({"maxUnavailable": "100%"}, False), ({"maxUnavailable": 1}, True),
     ({"maxUnavailable": "25%"}, True), ({"minAvailable": 0}, False),
     ({"minAvailable": "100%"}, False), ({"minAvailable": 2}, True),
     ({"minAvailable": "60%"}, True), ({}, False),
     ({"minAvailable": 1, "maxUnavailable": 1}, False), ({"maxUnavailable": "1"}, False)],
)  # fmt: skip
def test_the_crd_refuses_a_budget_that_blocks_every_drain(
    value: dict[str, Any], admitted: bool
) -> None:
    from chart.chart import custom_resource_errors

    body = resource(worker={"disruptionBudget": value})
    assert (custom_resource_errors(body) == []) is admitted, value


# -- nothing a resource's author writes is expanded by Kubernetes ------------------------------

DSN = "postgresql://app:hunter2@orders-db/orders"
REF = "$(OUTBOX_DSN)"  # what the kubelet would replace with the DSN, password and all


def _kafka(**block: Any) -> dict[str, Any]:
    return {"publisher": {"type": "kafka", "kafka": {"bootstrapServers": "k:9092", **block}}}


def _nats(**block: Any) -> dict[str, Any]:
    return {"publisher": {"type": "nats", "nats": {"urls": ["nats://n:4222"], **block}}}


def _http(url: str = "http://events.example/in", **publisher: Any) -> dict[str, Any]:
    return {"publisher": {"type": "http", "http": {"url": url}, **publisher}}


# Every text field of the CRD that reaches the worker's environment and admits a `$`: the
# spec that puts a reference to the DSN's variable there, and the variable that must carry
# the author's text as written.
EXPANSION_ROUTES: dict[str, tuple[dict[str, Any], str, str]] = {
    "database.table": (
        {"database": {"dsnSecretRef": {"name": "orders-db"}, "table": f"app.{REF}"}},
        "OUTBOX_TABLE", f"app.{REF}",
    ),
    "publisher.cloudEventsSource": (
        _http(cloudEventsSource=f"/shop/{REF}"), "OUTBOX_CLOUDEVENTS_SOURCE", f"/shop/{REF}",
    ),
    "publisher.http.url": (
        _http(f"http://listener/hook?d={REF}"), "OUTBOX_HTTP_URL", f"http://listener/hook?d={REF}",
    ),
    "publisher.nats.urls[]": (
        {"publisher": {"type": "nats", "nats": {"urls": [f"nats://{REF}:4222"]}}},
        "OUTBOX_NATS_URL", f"nats://{REF}:4222",
    ),
    "publisher.nats.subject": (_nats(subject=f"events.{REF}"), "OUTBOX_NATS_SUBJECT",
                               f"events.{REF}"),
    "publisher.kafka.bootstrapServers": (
        {"publisher": {"type": "kafka", "kafka": {"bootstrapServers": f"{REF}:9092"}}},
        "OUTBOX_KAFKA_BOOTSTRAP_SERVERS", f"{REF}:9092",
    ),
    "publisher.kafka.topic": (_kafka(topic=f"t.{REF}"), "OUTBOX_KAFKA_TOPIC", f"t.{REF}"),
    "publisher.kafka.config{}": (
        _kafka(config={"client.id": REF}), "OUTBOX_KAFKA_CONFIG", f"client.id={REF}",
    ),
    "worker.env[].value": ({"worker": {"env": [{"name": "NOTE", "value": REF}]}}, "NOTE", REF),
    "worker.tracing.endpoint": (
        {"worker": {"tracing": {"endpoint": f"http://collector:4318/{REF}"}}},
        "OTEL_EXPORTER_OTLP_ENDPOINT", f"http://collector:4318/{REF}",
    ),
    "worker.tracing.serviceName": (
        {"worker": {"tracing": {"endpoint": "http://c:4318", "serviceName": REF}}},
        "OTEL_SERVICE_NAME", REF,
    ),
}  # fmt: skip
# Routes only an installed plugin opens: tests/test_publisher_plugin_operator.py takes them
# with its plugin.
ROUTES_OF_A_PLUGIN = {"publisher.plugin.options{}"}
# Text fields placed where Kubernetes expands nothing (the image, names of variables, the
# pods' placement, labels and annotations), or refused: valueFrom.
NOT_IN_THE_CONTAINERS_TEXT = {
    "worker.image",
    "worker.env[].name",
    "worker.env[].valueFrom",
    "worker.tolerations[].key",
    "worker.tolerations[].value",
    "worker.topologySpreadConstraints[].topologyKey",
    "worker.topologySpreadConstraints[].labelSelector",
    "worker.topologySpreadConstraints[].matchLabelKeys[]",
    "worker.affinity",
    "worker.podAnnotations{}",
}
# Text fields whose pattern admits no `$` (checked below with a value it admits).
FIXED_SYNTAX = {
    "database.dsnSecretRef.name": "orders-db",
    "database.dsnSecretRef.key": "dsn",
    "publisher.http.timeout": "10s",
    "publisher.http.headersSecretRef.name": "h",
    "publisher.http.headersSecretRef.key": "k",
    "publisher.http.signingSecretRef.name": "s",
    "publisher.http.signingSecretRef.key": "k",
    "publisher.nats.timeout": "10s",
    "publisher.nats.userSecretRef.name": "n",
    "publisher.nats.userSecretRef.key": "k",
    "publisher.nats.passwordSecretRef.name": "n",
    "publisher.nats.passwordSecretRef.key": "k",
    "publisher.nats.tokenSecretRef.name": "n",
    "publisher.nats.tokenSecretRef.key": "k",
    "publisher.nats.credsSecretRef.name": "n",
    "publisher.nats.credsSecretRef.key": "k",
    "publisher.nats.tlsSecretName": "nats-tls",
    "publisher.kafka.timeout": "10s",
    "publisher.kafka.configSecretRef.name": "k",
    "publisher.kafka.configSecretRef.key": "k",
    "publisher.plugin.name": "sqs",
    "publisher.plugin.timeout": "10s",
    "publisher.plugin.secretRefs{}.name": "s",
    "publisher.plugin.secretRefs{}.key": "k",
    "publisher.rateLimit": "50/s",
    "publisher.breaker.window": "30s",
    "publisher.breaker.probeDelayMax": "5s",
    "lease": "60s",
    "retention": "7d",
    "worker.resources.requests{}": "100m",
    "worker.resources.limits{}": "1Gi",
    "worker.nodeSelector{}": "workers",
    "worker.podLabels{}": "orders",
    "worker.serviceAccountName": "orders-worker",
    "worker.priorityClassName": "batch",
    "worker.imagePullSecrets[].name": "regcred",
    "worker.disruptionBudget.maxUnavailable": "10%",
    "worker.disruptionBudget.minAvailable": "50%",
}


def _text_fields(schema: dict[str, Any], path: str = "") -> dict[str, dict[str, Any]]:
    """spec's fields that hold text, by path (`[]` an item, `{}` a map's value)."""
    found = {}
    if (
        schema.get("type") == "string"
        or schema.get("x-kubernetes-int-or-string")
        or (schema.get("x-kubernetes-preserve-unknown-fields"))
    ):
        found[path] = schema
    for key, sub in (schema.get("properties") or {}).items():
        found.update(_text_fields(sub, f"{path}.{key}" if path else key))
    for key, mark in (("items", "[]"), ("additionalProperties", "{}")):
        if isinstance(schema.get(key), dict):
            found.update(_text_fields(schema[key], path + mark))
    return found


def process_of(deployment: dict[str, Any]) -> tuple[dict[str, str], list[str]]:
    """What the worker process gets from a real kubelet: the DSN as OUTBOX_DSN, the pod's
    name, each other Secret's value as its variable's name."""
    from k8s.expansion import container_environment

    [container] = deployment["spec"]["template"]["spec"]["containers"]
    values_from = {"OUTBOX_DSN": DSN, "OUTBOX_OWNER": "orders-worker-abc12"}
    for item in container["env"]:
        values_from.setdefault(item["name"], f"<{item['name']}>")
    return container_environment(container, values_from)


def test_every_text_field_is_a_route_tested_below_or_can_hold_no_reference() -> None:
    import re

    fields = _text_fields(_schema()["properties"]["spec"])
    enums = {path for path, schema in fields.items() if "enum" in schema}
    assert not [p for p in enums if any("$" in str(v) for v in fields[p]["enum"])]
    known = (
        set(EXPANSION_ROUTES)
        | ROUTES_OF_A_PLUGIN
        | NOT_IN_THE_CONTAINERS_TEXT
        | set(FIXED_SYNTAX)
        | enums
    )
    assert set(fields) == known, (
        "a text field the tests do not know: add it to EXPANSION_ROUTES if it reaches the "
        "worker's command, args or environment and admits a `$`"
    )
    for path, sample in FIXED_SYNTAX.items():
        pattern = fields[path]["pattern"]
        assert re.search(pattern, sample), path
        hostile = [sample[:i] + REF + sample[i:] for i in range(len(sample) + 1)]
        assert not [text for text in hostile if re.search(pattern, text)], path


@pytest.mark.parametrize("route", sorted(EXPANSION_ROUTES))
def test_a_reference_the_author_writes_reaches_the_worker_as_written(route: str) -> None:
    """The kubelet would put the DSN's password wherever the author points a URL, a topic or
    a variable that names $(OUTBOX_DSN); the worker gets the text instead."""
    from chart.chart import custom_resource_errors

    spec, variable, written = EXPANSION_ROUTES[route]
    body = resource(**copy.deepcopy(spec))
    assert custom_resource_errors(body) == [], route  # a route a tenant can take
    deployment = render(body)
    env, argv = process_of(deployment)
    assert written in env[variable]
    assert [name for name, value in env.items() if "hunter2" in value] == ["OUTBOX_DSN"]
    assert "hunter2" not in json.dumps(argv)


def test_the_admins_defaults_reach_the_worker_as_written_too() -> None:
    defaults = {"resources": {}, "tracing": {"endpoint": f"http://c:4318/{REF}"}}
    deployment = render_deployment(
        DispatcherSpec.parse(resource(**_http())),
        replicas=1,
        default_image="i",
        defaults=defaults,
        publisher_defaults={"cloudEventsSource": f"/shop/{REF}"},
    )
    env, _ = process_of(deployment)
    assert env["OTEL_EXPORTER_OTLP_ENDPOINT"] == f"http://c:4318/{REF}"
    assert env["OUTBOX_CLOUDEVENTS_SOURCE"] == f"/shop/{REF}"


@pytest.mark.parametrize(
    "text", ["$", "$$", "a$", "$(", "$()", "$(A", "$$(A)", "$$$(A)", "x$(A)y$(B)", "5$ (A)"]
)
def test_every_value_and_argument_reaches_the_process_unchanged(text: str) -> None:
    """Whatever the text, a variable declared before it included: the kubelet gives the
    process exactly what the operator rendered from the resource."""
    env = [{"name": "A", "value": "a"}, {"name": "NOTE", "value": text}]
    body = resource(worker={"env": env})
    process_env, argv = process_of(render(body))
    assert (process_env["A"], process_env["NOTE"]) == ("a", text)
    assert argv == ["outbox-worker"]
