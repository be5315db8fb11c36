"""The worker Deployment as a pure function of the OutboxDispatcher resource.

Everything the pods need comes from the spec as OUTBOX_* variables (the worker's own
settings); every secret (the DSN, HTTP headers, broker credentials) is a `secretKeyRef` or a
mounted Secret, never a copied value. Rendering the same resource twice gives the same
object, so a status-only change of the resource leaves the pods alone, and a spec change
rolls them (the template changes, and with it the template hash the operator compares).
Every text reaches the worker as written: Kubernetes expands nothing in it (`literal`).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from outbox.controller.resource import (
    deployment_name,
    labels,
    owner_reference,
    selector_labels,
)
from outbox.controller.settings import DEFAULT_WORKER_RESOURCES
from outbox.controller.spec import DispatcherSpec, PublisherSpec
from outbox.publisher_options import Carried, Field, Option

TEMPLATE_HASH = "outbox.dev/template-hash"
# The DSN Secret's resourceVersion on the pods: env from a Secret is read at start only, so a
# changed Secret must roll the workers to take effect (the version holds nothing secret).
SECRET_VERSION = "outbox.dev/dsn-secret-version"
# Every Secret the pods use (the DSN's, HTTP headers and signing keys, broker credentials,
# registry credentials) as one hash of their resourceVersions: env and mounted files of a
# Secret reach a running worker only at start (a signing key rotated out would otherwise go
# on signing), so any of them changing rolls the workers.
SECRETS_HASH = "outbox.dev/secrets-hash"
WORKER_CONTAINER = "worker"
METRICS_PORT_NAME = "metrics"  # /metrics, /healthz, /readyz; the NetworkPolicy admits it alone
UID = 65532  # the image's non-root user
# After its shutdown grace the worker still writes its outcomes; leave it time for that.
FINALIZE_MARGIN_SECONDS = 15
# Where the Secrets a publisher's options take as files are mounted, a directory each.
SECRETS_DIR = "/etc/outbox"

Body = Mapping[str, Any]


def _value(name: str, value: object) -> dict[str, Any]:
    return {"name": name, "value": str(value)}


# The kubelet expands `$(NAME)` in a container's `command`, `args` and `env[].value` to the
# value of the container's variable NAME, and reads `$$` as one `$`. The operator never means
# a reference, and a resource's author must not get one: `$(OUTBOX_DSN)` in a URL would send
# the database's password wherever the author points it. So each `$` there is doubled, as the
# last step of rendering and for every container, whatever field the text came from (a field
# added later included). Nothing else in a pod is expanded: labels, annotations, the image,
# probes, volumes and their mounts are taken as written (only a mount's `subPathExpr`, which
# is never rendered, would be).
EXPANDED_FIELDS = ("command", "args")
CONTAINER_LISTS = ("initContainers", "containers", "ephemeralContainers")


def literal(text: str) -> str:
    """`text` as the kubelet passes it on unchanged: every `$` doubled."""
    return text.replace("$", "$$")


def _literal_container(container: Mapping[str, Any]) -> dict[str, Any]:
    result = dict(container)
    for field in EXPANDED_FIELDS:
        if field in result:
            result[field] = [literal(str(part)) for part in result[field]]
    if "env" in result:  # valueFrom is never expanded
        result["env"] = [
            {**item, "value": literal(str(item["value"]))} if "value" in item else dict(item)
            for item in result["env"]
        ]
    return result


def _literal_pod(pod_spec: dict[str, Any]) -> dict[str, Any]:
    for field in CONTAINER_LISTS:
        if field in pod_spec:
            pod_spec[field] = [_literal_container(c) for c in pod_spec[field]]
    return pod_spec


def _secret(name: str, ref: Mapping[str, Any]) -> dict[str, Any]:
    return {"name": name, "valueFrom": {"secretKeyRef": {"name": ref["name"], "key": ref["key"]}}}


def _mount(option: Option) -> str:
    return f"{SECRETS_DIR}/{option.key}"


def _carried(option: Option, field: Field, value: Any) -> dict[str, Any]:
    """The worker's variable for `option`, from the value of `field` (see Carried)."""
    name = option.variable
    match field.carried:
        case Carried.VALUE:
            return _value(name, value)
        case Carried.LINES:  # a repeatable option takes one value a line in its variable
            return _value(name, "\n".join(str(item) for item in value))
        case Carried.PAIRS:
            return _value(name, "\n".join(f"{k}={v}" for k, v in sorted(value.items())))
        case Carried.SECRET_KEY:
            return _secret(name, value)
        case Carried.SECRET_FILE:
            return _value(name, f"{_mount(option)}/{option.key}")
        case Carried.SECRET_DIR:  # the worker uses what the Secret holds of its keys
            return _value(name, _mount(option))


def _given(publisher: PublisherSpec) -> list[tuple[Option, Field, Any]]:
    """Each option the resource's publisher block sets, with the field and its value."""
    bindings = publisher.description().bindings(publisher.kind)
    found = ((option, f, publisher.given(f.path)) for option, f in bindings)
    return [(option, f, value) for option, f, value in found if value is not None]


def _optional(name: str, value: object) -> list[dict[str, Any]]:
    """The variable when the spec gives a value; absent, the worker's own default."""
    return [] if value is None else [_value(name, value)]


def _publisher_env(publisher: PublisherSpec) -> list[dict[str, Any]]:
    return [
        _value("OUTBOX_PUBLISHER", publisher.name),
        # What goes on the wire; absent, the worker's defaults (envelope, /outbox/<table>).
        *_optional("OUTBOX_FORMAT", publisher.format),
        *_optional("OUTBOX_CLOUDEVENTS_SOURCE", publisher.cloudevents_source),
        *(_carried(option, f, value) for option, f, value in _given(publisher)),
    ]


def _volumes(publisher: PublisherSpec) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(volumes, mounts): a writable /tmp on the read-only root, and the Secrets the
    publisher's options take as files (each mounted read-only under SECRETS_DIR)."""
    volumes: list[dict[str, Any]] = [{"name": "tmp", "emptyDir": {"sizeLimit": "64Mi"}}]
    mounts: list[dict[str, Any]] = [{"name": "tmp", "mountPath": "/tmp"}]
    for option, f, value in _given(publisher):
        if f.carried is Carried.SECRET_FILE:
            items = [{"key": value["key"], "path": option.key}]
            secret = {"secretName": value["name"], "items": items, "defaultMode": 0o440}
        elif f.carried is Carried.SECRET_DIR:
            secret = {"secretName": value, "defaultMode": 0o440}
        else:
            continue
        volumes.append({"name": option.key, "secret": secret})
        mounts.append({"name": option.key, "mountPath": _mount(option), "readOnly": True})
    return volumes, mounts


# spec.publisher.breaker's fields and the worker settings they set; an absent field leaves
# the worker's default (outbox-worker --help), the one source of each.
BREAKER_ENV = (
    ("failures", "OUTBOX_BREAKER_FAILURES"),
    ("window", "OUTBOX_BREAKER_WINDOW"),
    ("probeDelayMax", "OUTBOX_PROBE_DELAY_MAX"),
)


def _destination_env(publisher: PublisherSpec) -> list[dict[str, Any]]:
    """The destination gate: the rate limit and the breaker (the CRD checks their syntax and
    ranges against the worker's)."""
    breaker = publisher.breaker
    return [
        *_optional("OUTBOX_RATE_LIMIT", publisher.rate_limit),
        *(_value(variable, breaker[key]) for key, variable in BREAKER_ENV if key in breaker),
    ]


# OpenTelemetry's sampler for spec.worker.tracing.samplingRatio: the ratio decides for a
# span that is a root (every span with `link`); under `parent`, the producer's sampled flag.
SAMPLER = "parentbased_traceidratio"


def tracing_env(tracing: Body, name: str, namespace: str) -> list[dict[str, Any]]:
    """spec.worker.tracing as OpenTelemetry's standard variables (docs/tracing.md), which the
    worker reads; the dispatcher and its namespace as resource attributes, so that the spans
    of several dispatchers sharing a service name stay apart. Empty when tracing is off."""
    if not tracing:
        return []
    env = [
        _value("OTEL_TRACES_EXPORTER", "otlp"),
        _value("OTEL_EXPORTER_OTLP_ENDPOINT", tracing["endpoint"]),
        # Names are DNS labels and subdomains: nothing the attribute list would need to escape.
        _value(
            "OTEL_RESOURCE_ATTRIBUTES",
            f"k8s.namespace.name={namespace},outbox.dispatcher={name}",
        ),
    ]
    # Absent fields leave the worker's (and OpenTelemetry's) defaults: one source of each.
    if "serviceName" in tracing:
        env.append(_value("OTEL_SERVICE_NAME", tracing["serviceName"]))
    if "samplingRatio" in tracing:
        env.append(_value("OTEL_TRACES_SAMPLER", SAMPLER))
        env.append(_value("OTEL_TRACES_SAMPLER_ARG", tracing["samplingRatio"]))
    if "parent" in tracing:
        env.append(_value("OUTBOX_OTEL_PARENT", tracing["parent"]))
    return env


def worker_env(spec: DispatcherSpec, worker: Body) -> list[dict[str, Any]]:
    """The worker's settings as OUTBOX_* variables, the tracing block's OTEL_* variables,
    then the spec's extra variables (which come last, so that one of them wins). `worker` is
    spec.worker with the admin's defaults (worker_block). The values as the worker is to
    read them: pod_template makes them literal."""
    dsn = spec.dsn_secret
    env = [
        _secret("OUTBOX_DSN", {"name": dsn.name, "key": dsn.key}),
        _value("OUTBOX_TABLE", spec.table_name),
        *_publisher_env(spec.publisher),
        *_destination_env(spec.publisher),
        *_optional("OUTBOX_LEASE", spec.lease),
        *_optional("OUTBOX_BATCH", spec.batch_size),
        *_optional("OUTBOX_CONCURRENCY", spec.concurrency),
        *_optional("OUTBOX_MAX_ATTEMPTS", spec.max_attempts),
        *_optional("OUTBOX_ORDERING", spec.ordering),
        _value("OUTBOX_METRICS_PORT", worker["metricsPort"]),
        _value("OUTBOX_SHUTDOWN_GRACE", f"{worker['shutdownGraceSeconds']}s"),
        _value("OUTBOX_LOG_FORMAT", "json"),
        _value("OUTBOX_LOG_LEVEL", worker["logLevel"]),
        # lease_owner names the pod, for people reading the table.
        {"name": "OUTBOX_OWNER", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
    ]
    env.extend(_optional("OUTBOX_PUBLISH_TIMEOUT", spec.publisher.timeout))
    env.extend(tracing_env(worker.get("tracing") or {}, spec.name, spec.namespace))
    # Names and plain values only: the pod policy refuses valueFrom, and an entry that
    # escaped it would still reach no Secret.
    env.extend(_value(item["name"], item.get("value", "")) for item in worker.get("env") or ())
    return env


def _probe(path: str, *, period: int, failures: int) -> dict[str, Any]:
    return {
        "httpGet": {"path": path, "port": METRICS_PORT_NAME},
        "periodSeconds": period,
        "timeoutSeconds": 2,
        "failureThreshold": failures,
    }


# spec.worker's fields that become the pod spec's as they are (the CRD gives them the
# shapes of core/v1; the pod policy has checked each).
POD_FIELDS = (
    "nodeSelector",
    "tolerations",
    "affinity",
    "topologySpreadConstraints",
    "serviceAccountName",
    "priorityClassName",
    "imagePullSecrets",
)
DEFAULTS: Mapping[str, Any] = {"resources": DEFAULT_WORKER_RESOURCES}


def worker_block(spec: DispatcherSpec, defaults: Body = DEFAULTS) -> dict[str, Any]:
    """spec.worker with the admin's defaults (--worker-defaults) for the fields it omits."""
    worker = dict(spec.worker)
    for field, value in defaults.items():
        if field not in worker:
            worker[field] = json.loads(json.dumps(value))  # a copy the pod may own
    return worker


def _spread(constraints: list[Mapping[str, Any]], name: str) -> list[dict[str, Any]]:
    # A constraint without a labelSelector counts no pods at all, so spreads nothing: it
    # means the dispatcher's own workers.
    return [
        {**c}
        if "labelSelector" in c
        else {**c, "labelSelector": {"matchLabels": selector_labels(name)}}
        for c in constraints
    ]


def secrets_hash(versions: Mapping[str, str]) -> str:
    """The Secrets' resourceVersions by name as one stable value (sorted, so the order the
    spec names them in does not matter); nothing secret goes in."""
    text = json.dumps(sorted(versions.items()), separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def pod_template(
    spec: DispatcherSpec,
    worker: Body,
    default_image: str,
    rollout: Mapping[str, str],
) -> dict[str, Any]:
    """The worker pods of the resource `spec`: its `worker` block with every default
    applied, `rollout` the annotations whose change rolls the pods (Secret versions)."""
    name = spec.name
    port = int(worker["metricsPort"])
    volumes, mounts = _volumes(spec.publisher)
    container: dict[str, Any] = {
        "name": WORKER_CONTAINER,
        "image": worker.get("image") or default_image,
        "imagePullPolicy": worker["imagePullPolicy"],
        "command": ["outbox-worker"],
        # A worker that refuses its settings says why on stderr and exits: that last line
        # becomes the container's termination message, which the operator reports.
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "env": worker_env(spec, worker),
        "ports": [{"name": METRICS_PORT_NAME, "containerPort": port, "protocol": "TCP"}],
        # Ready = reaches the database and claims; alive = the process answers.
        "readinessProbe": _probe("/readyz", period=5, failures=2),
        "livenessProbe": _probe("/healthz", period=10, failures=3),
        "startupProbe": _probe("/healthz", period=2, failures=30),
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "runAsNonRoot": True,
            "capabilities": {"drop": ["ALL"]},
        },
        "volumeMounts": mounts,
    }
    if worker.get("resources"):
        container["resources"] = dict(worker["resources"])
    pod_spec: dict[str, Any] = {
        "containers": [container],
        "volumes": volumes,
        "terminationGracePeriodSeconds": int(worker["shutdownGraceSeconds"])
        + FINALIZE_MARGIN_SECONDS,
        "automountServiceAccountToken": False,  # the workers never talk to the API
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": UID,
            "runAsGroup": UID,
            "fsGroup": UID,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
    }
    for field in POD_FIELDS:
        if worker.get(field):
            pod_spec[field] = worker[field]
    if "topologySpreadConstraints" in pod_spec:
        pod_spec["topologySpreadConstraints"] = _spread(pod_spec["topologySpreadConstraints"], name)
    _literal_pod(pod_spec)
    annotations = {
        **(worker.get("podAnnotations") or {}),
        "prometheus.io/scrape": "true",
        "prometheus.io/port": str(port),
        "prometheus.io/path": "/metrics",
        **rollout,
    }
    return {
        "metadata": {
            "labels": {**(worker.get("podLabels") or {}), **labels(name)},
            "annotations": annotations,
        },
        "spec": pod_spec,
    }


def template_hash(template: Mapping[str, Any]) -> str:
    text = json.dumps(template, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def render_deployment(
    spec: DispatcherSpec,
    *,
    replicas: int,
    default_image: str,
    secret_version: str = "",
    defaults: Body = DEFAULTS,
    secret_versions: Mapping[str, str] | None = None,
    publisher_defaults: Body | None = None,
) -> dict[str, Any]:
    """The worker Deployment for the resource `spec` (parsed from the resource as the API
    server stores it, defaults applied); `secret_version` is the DSN Secret's
    resourceVersion, `secret_versions` every Secret's the spec names (the DSN's included) by
    name, `defaults` the admin's --worker-defaults, `publisher_defaults` the admin's
    --publisher-defaults."""
    name = spec.name
    if publisher_defaults:
        spec = replace(spec, publisher=spec.publisher.with_defaults(publisher_defaults))
    rollout = {SECRET_VERSION: secret_version} if secret_version else {}
    if secret_versions:
        rollout[SECRETS_HASH] = secrets_hash(secret_versions)
    template = pod_template(spec, worker_block(spec, defaults), default_image, rollout)
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {
            "name": deployment_name(name),
            "namespace": spec.namespace,
            "labels": labels(name),
            "annotations": {TEMPLATE_HASH: template_hash(template)},
            "ownerReferences": [owner_reference(spec.name, spec.uid)],
        },
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": selector_labels(name)},
            "revisionHistoryLimit": 5,
            # A new pod is ready before an old one goes: the ready count never dips.
            "strategy": {
                "type": "RollingUpdate",
                "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1},
            },
            "minReadySeconds": 0,
            "template": template,
        },
    }
