"""The operator's settings: one frozen model, read from flags and OUTBOX_* variables."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import yaml
from kubernetes.config import ConfigException, list_kube_config_contexts

from outbox.controller import flag_values
from outbox.controller.defaults import (
    PUBLISHER_DEFAULT_FIELDS,
    WORKER_DEFAULT_FIELDS,
    publisher_defaults,
    worker_defaults,
)
from outbox.controller.flag_values import installed_publishers
from outbox.controller.images import check_image_pattern
from outbox.plumbing.cliutil import (
    ArgumentParser,
    env_name,
    int_between,
    listen_address,
    on_off,
    port,
    resolve,
)
from outbox.plumbing.durations import format_duration, parse_duration
from outbox.plumbing.errors import SettingError
from outbox.plumbing.ranges import within

DEFAULT_WORKER_IMAGE = "outbox-dispatcher:0.1.0"
# What a worker pod asks the scheduler for when neither the resource nor the admin's
# --worker-defaults says: one worker idles near 60 MiB and a few millicores, and a busy one
# (a full claim in flight) stays under 128 MiB at the default claim size. Without requests
# the pods are BestEffort: first evicted under pressure, and packed onto full nodes.
DEFAULT_WORKER_RESOURCES: Mapping[str, Any] = {"requests": {"cpu": "100m", "memory": "128Mi"}}


@dataclass(frozen=True)
class Bounded:
    """A number setting's default and the range it may be set to (the one source of both)."""

    default: int
    low: int
    high: int

    def parse(self, text: str) -> int:
        return int_between(self.low, self.high)(text)


# A fleet's sizing (docs/operator.md, "Running a fleet"). Connections to one database, shared
# by every dispatcher on it: a few suffice for hundreds of passes a second of one bounded
# query each, and the fleet's sessions stay at most this many times its databases.
DATABASE_CONNECTIONS = Bounded(default=4, low=1, high=64)
# Requests the reconcile work keeps in flight at the API server at once (the client's default
# is 100, its upper bound here). Passes queue in the operator rather than at the server,
# where the Lease renewals (on connections of their own, leader.py) would wait behind them.
API_REQUESTS_IN_FLIGHT = Bounded(default=16, low=1, high=100)
# How long a Secret's last read is reused (controller/secret_cache.py): about the kubelet's
# own Secret cache's life; at most an hour.
SECRET_RECHECK = timedelta(seconds=60)
SECRET_RECHECK_RANGE = (timedelta(seconds=1), timedelta(hours=1))


@dataclass(frozen=True)
class ControllerSettings:
    namespaces: tuple[str, ...] = ()
    """Namespaces to serve; empty means all namespaces."""
    health_port: int = 8080
    """Serve /healthz (liveness) and /metrics on this port (0 = any free port)."""
    health_address: str = "0.0.0.0"
    """The address they listen on: every IPv4 interface, which a pod needs (kubelet's probes
    and Prometheus come to the pod's IP; the chart's NetworkPolicy says who may); `::` for
    IPv6, `127.0.0.1` outside a cluster."""
    leader_election_namespace: str = ""
    """Namespace of the leader-election Lease; the pod's own (POD_NAMESPACE) by default, and
    outside a cluster the kubeconfig's current context's (as kubectl and `kopf run` use)."""
    leader_election_id: str = "outbox-controller"
    """Name of the leader-election Lease; replicas sharing it elect one leader."""
    leader_identity: str = ""
    """This replica's name in the Lease (holderIdentity); the pod name (POD_NAME) or
    hostname-pid by default."""
    lease_duration: timedelta = timedelta(seconds=15)
    """How long followers wait after the last renewal they saw before taking the Lease."""
    renew_deadline: timedelta = timedelta(seconds=10)
    """A leader that could not renew for this long stops acting and exits; shorter than
    the lease duration, so it stops before anyone else may start."""
    retry_period: timedelta = timedelta(seconds=2)
    """How often the leader renews and followers try to acquire."""
    worker_image: str = DEFAULT_WORKER_IMAGE
    """Image of the worker pods when a resource does not name one."""
    worker_defaults: Mapping[str, Any] = field(
        default_factory=lambda: {"resources": DEFAULT_WORKER_RESOURCES}
    )
    """spec.worker fields applied to a resource that omits them, as a JSON object: resources,
    imagePullSecrets, nodeSelector, tolerations, affinity, topologySpreadConstraints,
    priorityClassName, tracing (default: resources with requests of 100m CPU and 128Mi
    memory)."""
    publisher_defaults: Mapping[str, Any] = field(default_factory=dict)
    """spec.publisher's wire format fields applied to a resource that omits them, as a JSON
    object: format, cloudEventsSource (default: none, so the worker's own: envelope,
    /outbox/<table>)."""
    worker_publishers: tuple[str, ...] = field(default_factory=installed_publishers)
    """Publishers the worker image has (built-in or plugins, each installed beside the
    operator too); a resource asking for another is refused in status."""
    secret_consent: bool = True
    """Secrets by consent: a resource may use a Secret only when the Secret's annotation
    outbox.dev/dispatchers names it (or is `*`); off for clusters whose every writer of
    OutboxDispatchers may read every Secret of their namespace."""
    allowed_images: tuple[str, ...] = ()
    """Images a resource's worker.image may name: repositories (any tag or digest),
    repository@sha256:<digest>, prefix/* or `*`; empty = the repository of --worker-image."""
    allowed_service_accounts: tuple[str, ...] = ()
    """Service accounts a resource's worker pods may run as besides the namespace's
    `default` (`*` = any); their token is never mounted."""
    allowed_tolerations: tuple[str, ...] = ()
    """Tolerations the worker pods may have: a taint key (any value), key=value, or `*`."""
    allowed_node_selectors: tuple[str, ...] = ()
    """Node selector entries the worker pods may have: a label key (any value), key=value,
    or `*`."""
    allowed_priority_classes: tuple[str, ...] = ()
    """Priority classes the worker pods may have (`*` = any)."""
    allowed_pod_labels: tuple[str, ...] = ()
    """Extra label keys the worker pods may have: a key, a prefix ending in `*`, or `*`."""
    allowed_pod_annotations: tuple[str, ...] = ()
    """Extra annotation keys the worker pods may have: a key, a prefix ending in `*`
    (example.com/*), or `*`."""
    allow_affinity: bool = False
    """Node and pod affinity on the worker pods, and anti-affinity terms that select other
    pods than the dispatcher's own workers (those it always allows)."""
    worker_network_policy: bool = False
    """Give each dispatcher's worker pods a NetworkPolicy (owned by the resource): ingress
    only to their metrics port, from --worker-metrics-from; egress stays open (the database,
    the destinations). The chart turns it on."""
    worker_metrics_from: tuple[Mapping[str, Any], ...] = ()
    """Who may reach the worker pods' metrics port: NetworkPolicy peers, as a JSON list
    (namespaceSelector, podSelector, ipBlock); empty = any source."""
    database_connections: int = DATABASE_CONNECTIONS.default
    """Connections the operator keeps at most to each database (one pool per database,
    shared by every dispatcher on it)."""
    api_requests_in_flight: int = API_REQUESTS_IN_FLIGHT.default
    """Requests the reconcile passes keep in flight at the API server at once; the others
    wait in the operator."""
    secret_recheck: timedelta = SECRET_RECHECK
    """How long a Secret's last read serves the passes of healthy dispatchers before it is
    read again (a dispatcher with a problem reads its Secrets on every pass)."""
    log_format: str = "auto"
    """`json`, `text`, or `auto` (text on a terminal, JSON otherwise)."""
    log_level: str = "INFO"
    """DEBUG, INFO, WARNING or ERROR."""


def build_parser() -> ArgumentParser:
    parser = ArgumentParser(
        prog="outbox-controller",
        description="Run the OutboxDispatcher operator: render, size and watch worker "
        "Deployments. Every flag can also be set with an OUTBOX_* variable "
        "(--health-port = OUTBOX_HEALTH_PORT; OUTBOX_NAMESPACE takes several names separated "
        "by commas). Outside a cluster it uses KUBECONFIG. Durations: 500ms, 10s, 1m.",
    )
    parser.add_argument(
        "--namespace",
        action="append",
        help="serve this namespace (repeatable; default all namespaces)",
    )
    parser.add_argument("--health-port", help="port of /healthz and /metrics (default 8080)")
    parser.add_argument(
        "--health-address", help="address they listen on (default 0.0.0.0: a pod's IP too)"
    )
    parser.add_argument(
        "--leader-election-namespace",
        help="namespace of the leader-election Lease (default $POD_NAMESPACE; outside a "
        "cluster, the kubeconfig's current namespace)",
    )
    parser.add_argument(
        "--leader-election-id", help="name of the leader-election Lease (default outbox-controller)"
    )
    parser.add_argument(
        "--leader-identity", help="this replica's holder identity (default $POD_NAME or host-pid)"
    )
    parser.add_argument("--lease-duration", help="leader Lease duration (default 15s)")
    parser.add_argument("--renew-deadline", help="leader gives up after failing this long (10s)")
    parser.add_argument("--retry-period", help="renew / acquire interval (default 2s)")
    parser.add_argument("--worker-image", help=f"default worker image ({DEFAULT_WORKER_IMAGE})")
    parser.add_argument(
        "--worker-defaults",
        help="spec.worker fields for resources that omit them, as a JSON object ("
        + ", ".join(WORKER_DEFAULT_FIELDS)
        + "; default: "
        + json.dumps({"resources": DEFAULT_WORKER_RESOURCES})
        + ")",
    )
    parser.add_argument(
        "--publisher-defaults",
        help="spec.publisher fields for resources that omit them, as a JSON object ("
        + ", ".join(PUBLISHER_DEFAULT_FIELDS)
        + '; e.g. {"format": "cloudevents-binary"}; default: none, the worker\'s own)',
    )
    parser.add_argument(
        "--worker-publishers",
        help="comma-separated publishers the worker image has (default: those installed here)",
    )
    policy = parser.add_argument_group(
        "the cluster admin's policy (docs/security.md); lists are separated by commas"
    )
    policy.add_argument("--secret-consent", help="on (default) or off: Secrets by consent")
    policy.add_argument(
        "--allowed-images",
        help="repositories, repo@sha256:..., prefix/* or * (default: --worker-image's repository)",
    )
    policy.add_argument(
        "--allowed-service-accounts", help="besides the namespace's default (default: none)"
    )
    policy.add_argument("--allowed-tolerations", help="key, key=value or * (default: none)")
    policy.add_argument("--allowed-node-selectors", help="key, key=value or * (default: none)")
    policy.add_argument("--allowed-priority-classes", help="names or * (default: none)")
    policy.add_argument("--allowed-pod-labels", help="keys, prefix* or * (default: none)")
    policy.add_argument("--allowed-pod-annotations", help="keys, prefix* or * (default: none)")
    policy.add_argument(
        "--allow-affinity",
        help="on or off (default): node and pod affinity, anti-affinity to other pods",
    )
    policy.add_argument(
        "--worker-network-policy",
        help="on or off (default): a NetworkPolicy for each dispatcher's worker pods",
    )
    policy.add_argument(
        "--worker-metrics-from",
        help="NetworkPolicy peers allowed to the workers' metrics port, as JSON, e.g. "
        '[{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": '
        '"monitoring"}}}] (default: any source)',
    )
    fleet = parser.add_argument_group("a fleet's sizing (docs/operator.md, Running a fleet)")
    fleet.add_argument(
        "--database-connections",
        help="connections kept at most to each database, shared by its dispatchers "
        f"(default {DATABASE_CONNECTIONS.default}; {DATABASE_CONNECTIONS.low} to "
        f"{DATABASE_CONNECTIONS.high})",
    )
    fleet.add_argument(
        "--api-requests-in-flight",
        help="API requests the passes keep in flight at once "
        f"(default {API_REQUESTS_IN_FLIGHT.default}; {API_REQUESTS_IN_FLIGHT.low} to "
        f"{API_REQUESTS_IN_FLIGHT.high})",
    )
    fleet.add_argument(
        "--secret-recheck",
        help="how long a Secret's last read is reused before it is read again (default "
        f"{format_duration(SECRET_RECHECK)}; "
        + " to ".join(format_duration(d) for d in SECRET_RECHECK_RANGE)
        + ")",
    )
    parser.add_argument("--log-format", help="auto (default), json or text")
    parser.add_argument("--log-level", help="DEBUG, INFO (default), WARNING, ERROR")
    return parser


def kubeconfig_namespace(env: Mapping[str, str]) -> tuple[str, str]:
    """Outside a cluster, the namespace of the kubeconfig's current context ("default" when
    the context names none, as kubectl reads it), or "" and why there is none: in a pod (its
    namespace is POD_NAMESPACE, nothing to say) or without a usable kubeconfig. The same files
    the client logs in with: KUBECONFIG (a list separated by the path separator), else
    ~/.kube/config."""
    if env.get("KUBERNETES_SERVICE_HOST"):
        return "", ""
    home = env.get("HOME")
    path = env.get("KUBECONFIG") or (os.path.join(home, ".kube", "config") if home else "")
    files = [name for name in path.split(os.pathsep) if name]
    if not files:
        return "", "neither KUBECONFIG nor HOME is set"
    if not any(os.path.exists(name) for name in files):
        return "", f"no kubeconfig at {', '.join(files)}"
    try:
        _, current = list_kube_config_contexts(config_file=path)  # type: ignore[no-untyped-call]
    except Exception as exc:  # the loader raises its own errors, PyYAML's, OSError, TypeError
        return "", f"the kubeconfig {path} is unusable ({_kubeconfig_fault(exc)})"
    context = (current or {}).get("context") or {}
    return str(context.get("namespace") or "default"), ""


def _kubeconfig_fault(exc: Exception) -> str:
    """What is wrong with a kubeconfig, without quoting it: PyYAML's messages show the text
    around the fault, which may be a token."""
    if isinstance(exc, OSError):
        return f"{exc.strerror or type(exc).__name__}: {exc.filename}"
    if isinstance(exc, yaml.YAMLError):
        mark = getattr(exc, "problem_mark", None)
        return "not YAML" + (f" at line {mark.line + 1}" if mark is not None else "")
    if isinstance(exc, ConfigException):
        return str(exc)  # the loader's own words name keys, never values
    return "not a kubeconfig: a mapping with contexts and current-context"


def default_identity(env: Mapping[str, str]) -> str:
    return env.get("POD_NAME") or f"{os.uname().nodename}-{os.getpid()}"


def load_settings(
    argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None
) -> ControllerSettings:
    """Parse flags and environment; raises SettingError naming the bad setting."""
    env = os.environ if env is None else env
    args = build_parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    defaults = ControllerSettings(worker_publishers=())
    kube_namespace, no_kube_namespace = kubeconfig_namespace(env)

    def get(flag: str, convert, default):  # type: ignore[no-untyped-def]
        return resolve(args, flag, convert, default, env)

    if args.namespace:
        try:
            namespaces = tuple(flag_values.dns_label(name) for name in args.namespace)
        except ValueError as exc:
            raise SettingError(f"--namespace: {exc}") from None
    else:
        namespaces = get(
            "--namespace", lambda t: tuple(map(flag_values.dns_label, flag_values.names(t))), ()
        )
    settings = ControllerSettings(
        namespaces=namespaces,
        health_port=get("--health-port", port, defaults.health_port),
        health_address=get("--health-address", listen_address, defaults.health_address),
        leader_election_namespace=get(
            "--leader-election-namespace",
            flag_values.dns_label,
            env.get("POD_NAMESPACE") or kube_namespace,
        ),
        leader_election_id=get(
            "--leader-election-id", flag_values.dns_label, defaults.leader_election_id
        ),
        leader_identity=get("--leader-identity", str, default_identity(env)),
        lease_duration=get(
            "--lease-duration", flag_values.positive_duration, defaults.lease_duration
        ),
        renew_deadline=get(
            "--renew-deadline", flag_values.positive_duration, defaults.renew_deadline
        ),
        retry_period=get("--retry-period", flag_values.positive_duration, defaults.retry_period),
        worker_image=get("--worker-image", str, defaults.worker_image),
        worker_publishers=get(
            "--worker-publishers", flag_values.publisher_names, installed_publishers()
        ),
        worker_defaults=get("--worker-defaults", worker_defaults, defaults.worker_defaults),
        publisher_defaults=get(
            "--publisher-defaults", publisher_defaults, defaults.publisher_defaults
        ),
        secret_consent=get("--secret-consent", on_off, defaults.secret_consent),
        allowed_images=get("--allowed-images", flag_values.entries(check_image_pattern), ()),
        allowed_service_accounts=get(
            "--allowed-service-accounts", flag_values.entries(flag_values.name_or_any), ()
        ),
        allowed_tolerations=get("--allowed-tolerations", flag_values.entries(flag_values.pair), ()),
        allowed_node_selectors=get(
            "--allowed-node-selectors", flag_values.entries(flag_values.pair), ()
        ),
        allowed_priority_classes=get(
            "--allowed-priority-classes", flag_values.entries(flag_values.name_or_any), ()
        ),
        allowed_pod_labels=get(
            "--allowed-pod-labels", flag_values.entries(flag_values.key_pattern), ()
        ),
        allowed_pod_annotations=get(
            "--allowed-pod-annotations", flag_values.entries(flag_values.key_pattern), ()
        ),
        allow_affinity=get("--allow-affinity", on_off, defaults.allow_affinity),
        worker_network_policy=get(
            "--worker-network-policy", on_off, defaults.worker_network_policy
        ),
        worker_metrics_from=get(
            "--worker-metrics-from", flag_values.peers, defaults.worker_metrics_from
        ),
        database_connections=get(
            "--database-connections", DATABASE_CONNECTIONS.parse, defaults.database_connections
        ),
        api_requests_in_flight=get(
            "--api-requests-in-flight",
            API_REQUESTS_IN_FLIGHT.parse,
            defaults.api_requests_in_flight,
        ),
        secret_recheck=get(
            "--secret-recheck",
            within(parse_duration, *SECRET_RECHECK_RANGE, format_duration),
            defaults.secret_recheck,
        ),
        log_format=get("--log-format", flag_values.log_format, defaults.log_format),
        log_level=get("--log-level", flag_values.log_level, defaults.log_level),
    )
    _check(settings, no_kube_namespace)
    return settings


def _check(settings: ControllerSettings, no_kube_namespace: str) -> None:
    if not settings.leader_election_namespace:
        raise SettingError(
            f"--leader-election-namespace (or {env_name('--leader-election-namespace')}, "
            "POD_NAMESPACE, or a kubeconfig with a current context) is required: the "
            "namespace of the leader-election Lease"
            + (f"; {no_kube_namespace}" if no_kube_namespace else "")
        )
    if not settings.renew_deadline < settings.lease_duration:
        raise SettingError(
            f"--renew-deadline {format_duration(settings.renew_deadline)} must be shorter than "
            f"--lease-duration {format_duration(settings.lease_duration)}: a leader must stop "
            "before another replica may take over"
        )
    if not settings.retry_period < settings.renew_deadline:
        raise SettingError(
            f"--retry-period {format_duration(settings.retry_period)} must be shorter than "
            f"--renew-deadline {format_duration(settings.renew_deadline)}"
        )
    if not settings.worker_image.strip():
        raise SettingError("--worker-image: must not be empty")
