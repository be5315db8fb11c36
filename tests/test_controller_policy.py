"""The trust boundary, as pure functions: the cluster admin's pod policy, the Secrets a spec
names and their consent, the settings that set both, and the CRD agreeing with them.

The operator end to end, under RBAC and with a tenant who may only write dispatchers, is
tests/k8s/test_operator_tenant.py.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
import yaml

from outbox.controller.consent import (
    CONSENT_ANNOTATION,
    consents,
    not_shared,
    secret_fields,
    secret_uses,
)
from outbox.controller.decision import Limits, Observed, decide
from outbox.controller.images import check_image_pattern, image_allowed, parse_image
from outbox.controller.policy import (
    BY_CONSENT,
    DENIED_ENV_NAMES,
    DENIED_ENV_PREFIXES,
    DENIED_ENV_SUFFIX,
    OPERATOR_ANNOTATION_PREFIXES,
    OPERATOR_LABELS,
    UNRESTRICTED,
    WORKER_CHECKS,
    check_pod_policy,
    violations,
)
from outbox.controller.problem import Problem
from outbox.controller.settings import ControllerSettings, load_settings
from outbox.plumbing.errors import SettingError
from outbox.publisher_options import Carried, installed

ROOT = Path(__file__).resolve().parent.parent
CRD = yaml.safe_load((ROOT / "crds" / "outboxdispatchers.yaml").read_text())
SCHEMA = CRD["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
ENV = {"POD_NAMESPACE": "outbox-system"}
A64 = "sha256:" + "a" * 64
DIGEST = "sha256:" + "c" * 64
OWN = "registry.example/platform/outbox-dispatcher"
# The operator as the chart installs it: the workers run its own image.
DEFAULTS = ControllerSettings(worker_image=f"{OWN}:0.1.0")
# The Kafka properties no resource may set: the kafka publisher's description says so.
[DENIED_KAFKA_CONFIG] = [
    f.keys.refused
    for _, f in installed("kafka").bindings("kafka")
    if f.carried is Carried.PAIRS and f.keys is not None
]
SECRET_FIELDS = secret_fields()


def spec(**worker: Any) -> dict[str, Any]:
    return {
        "database": {"dsnSecretRef": {"name": "orders-db", "key": "dsn"}},
        "publisher": {"type": "log"},
        "worker": worker,
    }


def resource_of(spec: dict[str, Any]) -> dict[str, Any]:
    """An OutboxDispatcher `orders` of namespace `shop` with `spec`, as kubectl would send it."""
    return {
        "apiVersion": "outbox.dev/v1alpha1",
        "kind": "OutboxDispatcher",
        "metadata": {"name": "orders", "namespace": "shop"},
        "spec": spec,
    }


def fields(worker: dict[str, Any], settings: ControllerSettings = DEFAULTS) -> list[str]:
    return [field for field, _ in violations(spec(**worker), settings)]


# -- images -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "repository", "tag", "digest"),
    [
        ("outbox", "docker.io/library/outbox", None, None),
        ("outbox:1.2", "docker.io/library/outbox", "1.2", None),
        ("team/outbox", "docker.io/team/outbox", None, None),
        ("docker.io/library/outbox:1", "docker.io/library/outbox", "1", None),
        ("index.docker.io/library/outbox", "docker.io/library/outbox", None, None),
        ("localhost:5000/outbox:dev", "localhost:5000/outbox", "dev", None),
        ("registry:5000/a/b", "registry:5000/a/b", None, None),
        (f"ghcr.io/acme/outbox@{A64}", "ghcr.io/acme/outbox", None, A64),
        (f"ghcr.io/acme/outbox:1@{A64}", "ghcr.io/acme/outbox", "1", A64),
    ],
)  # fmt: skip
def test_image_references_name_their_repository_in_full(
    text: str, repository: str, tag: str | None, digest: str | None
) -> None:
    image = parse_image(text)
    assert image is not None
    assert (image.repository, image.tag, image.digest) == (repository, tag, digest)


@pytest.mark.parametrize(
    "text", ["", "Outbox", "outbox:", "a b", "outbox@sha256:abc", "-x/y", "x//y", "x/y:t:u"]
)
def test_what_is_not_an_image_reference(text: str) -> None:
    assert parse_image(text) is None


@pytest.mark.parametrize(
    ("image", "patterns", "allowed"),
    [
        # The default: the operator's own repository, any tag or digest.
        (f"{OWN}:0.2.0", (OWN,), True),
        (f"{OWN}@{DIGEST}", (OWN,), True),
        (f"{OWN}-evil:1", (OWN,), False),
        (f"{OWN}/x:1", (OWN,), False),
        ("evil.example/outbox-dispatcher:1", (OWN,), False),
        # Docker Hub's short names are the same repository however spelled.
        ("docker.io/library/outbox:1", ("outbox",), True),
        ("outbox:1", ("docker.io/library/outbox",), True),
        ("evil/outbox:1", ("outbox",), False),
        ("outbox.evil.example/x:1", ("outbox",), False),
        # A prefix: every repository under it, on a path boundary.
        ("registry.example/platform/a:1", ("registry.example/platform/*",), True),
        ("registry.example/platform-evil/a:1", ("registry.example/platform/*",), False),
        ("registry.example/x:1", ("registry.example/*",), True),
        ("acme/x:1", ("acme/*",), True),
        ("acme-evil/x:1", ("acme/*",), False),
        # A digest pin: that digest only.
        (f"ghcr.io/acme/outbox@{DIGEST}", (f"ghcr.io/acme/outbox@{DIGEST}",), True),
        (f"ghcr.io/acme/outbox:1@{DIGEST}", (f"ghcr.io/acme/outbox@{DIGEST}",), True),
        ("ghcr.io/acme/outbox:1", (f"ghcr.io/acme/outbox@{DIGEST}",), False),
        ("ghcr.io/acme/outbox@sha256:" + "d" * 64, (f"ghcr.io/acme/outbox@{DIGEST}",), False),
        ("anything.example/at:all", ("*",), True),
        ("not a reference", ("*",), False),
    ],
)  # fmt: skip
def test_allowed_images(image: str, patterns: tuple[str, ...], allowed: bool) -> None:
    assert image_allowed(image, patterns) is allowed


def test_the_default_allows_the_operators_own_repository_only() -> None:
    assert fields({}) == []
    assert fields({"image": DEFAULTS.worker_image}) == []
    assert fields({"image": f"registry.example/platform/outbox-dispatcher@{DIGEST}"}) == []
    assert fields({"image": "docker.io/attacker/miner:latest"}) == ["spec.worker.image"]
    [(_, why)] = violations(spec(image="attacker/miner"), DEFAULTS)
    assert why == (
        "image `attacker/miner` is not allowed "
        "(allowed: registry.example/platform/outbox-dispatcher)"
    )
    listed = dataclasses.replace(DEFAULTS, allowed_images=("ghcr.io/acme/*",))
    assert fields({"image": "ghcr.io/acme/outbox:2"}, listed) == []
    assert fields({"image": "registry.example/platform/outbox-dispatcher:1"}, listed) == [
        "spec.worker.image"
    ]


# -- the other pod fields -------------------------------------------------------------------


def test_service_accounts_beyond_the_namespaces_default_need_the_admin() -> None:
    assert fields({"serviceAccountName": "default"}) == []
    assert fields({"serviceAccountName": "deployer"}) == ["spec.worker.serviceAccountName"]
    listed = dataclasses.replace(DEFAULTS, allowed_service_accounts=("outbox-worker",))
    assert fields({"serviceAccountName": "outbox-worker"}, listed) == []
    assert fields({"serviceAccountName": "deployer"}, listed) == ["spec.worker.serviceAccountName"]
    anyone = dataclasses.replace(DEFAULTS, allowed_service_accounts=("*",))
    assert fields({"serviceAccountName": "deployer"}, anyone) == []


def test_env_takes_plain_values_outside_the_reserved_prefixes_and_never_quotes_one() -> None:
    env = [
        {"name": "TZ", "value": "UTC"},
        {"name": "PGHOSTADDR", "value": "203.0.113.9"},
        {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "billing-api", "key": "t"}}},
        {"name": "LD_PRELOAD", "value": "/tmp/x.so"},
        {"name": "NOT_PG", "value": "hunter2-in-a-value"},
    ]
    found = violations(spec(env=env), DEFAULTS)
    assert [field for field, _ in found] == [
        "spec.worker.env[1]",
        "spec.worker.env[2]",
        "spec.worker.env[3]",
    ]
    assert "valueFrom" in found[1][1]
    text = repr(found)
    assert "203.0.113.9" not in text and "billing-api" not in text


def _env_refused(name: str) -> tuple[bool, bool]:
    """(the CRD refuses `name` in spec.worker.env, the operator does)."""
    from chart.chart import custom_resource_errors

    env = [{"name": name, "value": "1"}]
    return bool(custom_resource_errors(resource_of(spec(env=env)))), bool(fields({"env": env}))


def _crd_env_rule() -> str:
    items = SCHEMA["properties"]["spec"]["properties"]["worker"]["properties"]["env"]["items"]
    [rule] = [r["rule"] for r in items["x-kubernetes-validations"] if "self.name" in r["rule"]]
    return str(rule)


def test_the_crds_env_rule_holds_the_operators_list() -> None:
    import re

    rule = _crd_env_rule()
    [prefixes] = re.findall(r"\[([^]]*)\]\.exists\(p, self\.name\.startsWith\(p\)\)", rule)
    [names] = re.findall(r"self\.name in \[([^]]*)\]", rule)
    [suffix] = re.findall(r"self\.name\.upperAscii\(\)\.endsWith\('([^']*)'\)", rule)

    def listed(text: str) -> list[str]:
        return re.findall(r"'([^']*)'", text)

    assert sorted(listed(prefixes)) == sorted(DENIED_ENV_PREFIXES)
    assert sorted(listed(names)) == sorted(DENIED_ENV_NAMES)
    assert suffix == DENIED_ENV_SUFFIX


DENIED_EXAMPLES = [
    *(f"{prefix}X" for prefix in DENIED_ENV_PREFIXES),
    *DENIED_ENV_NAMES,
    # The routes of the review: the resolver's search domains and options, code and
    # configuration that OpenSSL, Kerberos and SASL load, libpq's files under HOME, proxies.
    "LOCALDOMAIN", "RES_OPTIONS", "HOSTALIASES", "GCONV_PATH", "OPENSSL_CONF",
    "OPENSSL_MODULES", "KRB5_CONFIG", "KRB5CCNAME", "SASL_PATH", "HOME", "PATH",
    "PGSERVICEFILE", "BASH_ENV", "http_proxy", "HTTPS_PROXY", "no_proxy", "All_Proxy",
    "SSLKEYLOGFILE",
]  # fmt: skip
ALLOWED_EXAMPLES = [
    *(f"X{prefix}" for prefix in DENIED_ENV_PREFIXES),
    *(prefix.lower() + "x" for prefix in DENIED_ENV_PREFIXES),
    *(f"{name}X" for name in DENIED_ENV_NAMES),
    # OpenTelemetry's own settings stay the author's (spec.worker.tracing documents them).
    "OTEL_EXPORTER_OTLP_HEADERS", "OTEL_BSP_MAX_EXPORT_BATCH_SIZE", "OTEL_PYTHON_LOG_LEVEL",
    "TZ", "LANG", "PROXY", "MY_PROXY_URL", "HOMEPAGE",
]  # fmt: skip


@pytest.mark.parametrize("name", DENIED_EXAMPLES)
def test_the_crd_and_the_operator_refuse_every_variable_that_redirects_the_worker(
    name: str,
) -> None:
    assert _env_refused(name) == (True, True)


@pytest.mark.parametrize("name", ALLOWED_EXAMPLES)
def test_the_crd_and_the_operator_admit_the_other_variables(name: str) -> None:
    assert _env_refused(name) == (False, False)


def test_a_refused_variable_is_named_with_what_reads_it() -> None:
    from chart.chart import custom_resource_errors

    env = [{"name": "TZ", "value": "UTC"}, {"name": "LOCALDOMAIN", "value": "evil.example"}]
    [(field, why)] = violations(spec(env=env), DEFAULTS)
    assert field == "spec.worker.env[1]"
    assert why == "`LOCALDOMAIN` may not be set: " + DENIED_ENV_NAMES["LOCALDOMAIN"]
    [error] = custom_resource_errors(resource_of(spec(env=env)))
    assert error.startswith("spec.worker.env[1]: ") and "may not set LOCALDOMAIN: " in error
    assert "evil.example" not in why + error


def test_the_crd_refuses_value_from_with_the_reason() -> None:
    from chart.chart import custom_resource_errors

    resource = resource_of(
        spec(env=[{"name": "T", "valueFrom": {"secretKeyRef": {"name": "x", "key": "k"}}}])
    )
    [error] = custom_resource_errors(resource)
    assert error.startswith("spec.worker.env[0]: ") and "no valueFrom" in error


def test_placement_labels_and_annotations_are_refused_until_the_admin_lists_them() -> None:
    worker = {
        "tolerations": [
            {"key": "dedicated", "operator": "Equal", "value": "workers", "effect": "NoSchedule"},
            {"operator": "Exists"},
        ],
        "nodeSelector": {"pool": "workers"},
        "priorityClassName": "system-cluster-critical",
        "podLabels": {"app": "payments", "team": "orders"},
        "podAnnotations": {"sidecar.istio.io/inject": "false", "team.example.com/owner": "o"},
        "affinity": {"nodeAffinity": {}, "podAntiAffinity": {}},
    }
    assert fields(worker) == [
        "spec.worker.tolerations[0]",
        "spec.worker.tolerations[1]",
        "spec.worker.nodeSelector.pool",
        "spec.worker.affinity.nodeAffinity",
        "spec.worker.priorityClassName",
        "spec.worker.podLabels.app",
        "spec.worker.podLabels.team",
        "spec.worker.podAnnotations.sidecar.istio.io/inject",
        "spec.worker.podAnnotations.team.example.com/owner",
    ]
    listed = dataclasses.replace(
        DEFAULTS,
        allowed_tolerations=("dedicated=workers",),
        allowed_node_selectors=("pool",),
        allowed_priority_classes=("batch-low",),
        allowed_pod_labels=("team",),
        allowed_pod_annotations=("team.example.com/*",),
        allow_affinity=True,
    )
    # What is left: the toleration of every taint, a class, a label and an annotation not listed.
    assert fields(worker, listed) == [
        "spec.worker.tolerations[1]",
        "spec.worker.priorityClassName",
        "spec.worker.podLabels.app",
        "spec.worker.podAnnotations.sidecar.istio.io/inject",
    ]
    assert fields({"tolerations": [{"key": "dedicated", "value": "gpu"}]}, listed) == [
        "spec.worker.tolerations[0]"
    ]
    # A key alone allows any value, and Exists.
    by_key = dataclasses.replace(DEFAULTS, allowed_tolerations=("dedicated",))
    assert fields({"tolerations": [{"key": "dedicated", "operator": "Exists"}]}, by_key) == []
    assert fields({"affinity": {"podAntiAffinity": {"x": 1}}}) == []


# -- Kafka properties: no code loaded, no command run, one property a line -------------------


def kafka_refused(config: dict[str, str]) -> tuple[list[str], list[str]]:
    """(what the CRD refuses, what the operator refuses) of spec.publisher.kafka.config."""
    from chart.chart import custom_resource_errors

    kafka = {"type": "kafka", "kafka": {"bootstrapServers": "k:9092", "config": config}}
    resource = resource_of({**spec(), "publisher": kafka})
    operator = [field for field, _ in violations(resource["spec"], DEFAULTS, "orders")]
    return custom_resource_errors(resource), operator


def test_the_crds_kafka_rule_holds_the_operators_list() -> None:
    import re

    kafka = SCHEMA["properties"]["spec"]["properties"]["publisher"]["properties"]["kafka"]
    [rule] = [r["rule"] for r in kafka["properties"]["config"]["x-kubernetes-validations"]]
    [listed] = re.findall(r"^!\[([^]]*)\]\.exists\(k, k in self\)$", rule)
    assert sorted(re.findall(r"'([^']*)'", listed)) == sorted(DENIED_KAFKA_CONFIG)


@pytest.mark.parametrize("key", sorted(DENIED_KAFKA_CONFIG))
def test_a_property_that_loads_code_or_runs_a_command_is_refused(key: str) -> None:
    crd, operator = kafka_refused({"security.protocol": "plaintext", key: "/tmp/x.so"})
    assert len(crd) == 1 and "may not set plugin.library.paths" in crd[0]
    assert operator == [f"spec.publisher.kafka.config.{key}"]


@pytest.mark.parametrize(
    ("config", "crd_refuses"),
    [
        # A line break in a value adds a property of its own, a denied one included.
        ({"client.id": "a\nplugin.library.paths=/tmp/x.so"}, True),
        ({"client.id": "a\rplugin.library.paths=/tmp/x.so"}, True),
        ({"client.id": "a\u2028plugin.library.paths=/tmp/x.so"}, True),
        ({"client.id": "a\x85b"}, True),
        # So does one in a key, which the CRD cannot check cheaply: the operator does.
        ({"client.id=a\nplugin.library.paths": "/tmp/x.so"}, False),
        ({"Client.Id": "a"}, False),
    ],
)
def test_every_property_is_one_line_of_its_own(config: dict[str, str], crd_refuses: bool) -> None:
    crd, operator = kafka_refused(config)
    assert bool(crd) is crd_refuses
    assert operator == [f"spec.publisher.kafka.config.{' '.join(next(iter(config)).split())}"]


def test_plain_properties_pass_and_a_refusal_never_quotes_a_value() -> None:
    plain = {"security.protocol": "sasl_ssl", "sasl.mechanisms": "SCRAM-SHA-512",
             "client.id": "orders outbox", "linger.ms": "5"}  # fmt: skip
    assert kafka_refused(plain) == ([], [])
    kafka = {"type": "kafka", "kafka": {"bootstrapServers": "k:9092",
                                        "config": {"sasl.password": "hunter2\nx=y"}}}  # fmt: skip
    [(field, why)] = violations({**spec(), "publisher": kafka}, DEFAULTS, "orders")
    assert field == "spec.publisher.kafka.config.sasl.password"
    assert why == "its value must be one line of printable ASCII"


# -- anti-affinity: the workers apart from each other, and from nothing else ------------------

WORKERS = {
    "app.kubernetes.io/name": "outbox-dispatcher",
    "app.kubernetes.io/instance": "orders",
    "app.kubernetes.io/component": "worker",
}
REQUIRED = "requiredDuringSchedulingIgnoredDuringExecution"
PREFERRED = "preferredDuringSchedulingIgnoredDuringExecution"


def term(selector: dict[str, Any] | None = None, **more: Any) -> dict[str, Any]:
    found = {"topologyKey": "kubernetes.io/hostname", **more}
    return found if selector is None else {**found, "labelSelector": selector}


def anti_fields(
    required: tuple[Any, ...] = (),
    preferred: tuple[Any, ...] = (),
    settings: ControllerSettings = DEFAULTS,
) -> list[str]:
    anti = {REQUIRED: list(required),
            PREFERRED: [{"weight": 100, "podAffinityTerm": t} for t in preferred]}  # fmt: skip
    found = violations(spec(affinity={"podAntiAffinity": anti}), settings, "orders")
    return [field.removeprefix("spec.worker.affinity.podAntiAffinity.") for field, _ in found]


# A term that selects other pods: the scheduler holds them off every node of the term's
# topology domain while a worker runs there (required), or weighs against it (preferred).
HOLDS_OFF_OTHERS = {
    # The review's: every pod of every namespace, off every node of the operating system.
    "every pod of the cluster": term({}, namespaceSelector={}, topologyKey="kubernetes.io/os"),
    "every pod of the namespace": term({}),
    "another application's pods": term({"matchLabels": {"app": "postgres"}}),
    "another dispatcher's workers": term(
        {"matchLabels": {**WORKERS, "app.kubernetes.io/instance": "billing"}}),
    "part of the selector": term({"matchLabels": {"app.kubernetes.io/instance": "orders"}}),
    "the workers of another namespace": term({"matchLabels": WORKERS}, namespaces=["billing"]),
    "the workers of every namespace": term({"matchLabels": WORKERS}, namespaceSelector={}),
    "expressions only": term({"matchExpressions": [
        {"key": "app.kubernetes.io/instance", "operator": "In", "values": ["orders"]}]}),
}  # fmt: skip
SELECTS_THE_WORKERS_ONLY = {
    "the workers": term({"matchLabels": WORKERS}),
    "some of the workers": term({"matchLabels": {**WORKERS, "team": "a"}, "matchExpressions": [
        {"key": "pod-template-hash", "operator": "Exists"}]}, matchLabelKeys=["pod-template-hash"]),
    "no pods (no labelSelector)": term(),
    "their own namespace, named": term({"matchLabels": WORKERS}, namespaces=[]),
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(HOLDS_OFF_OTHERS))
def test_an_anti_affinity_that_would_hold_other_pods_off_the_workers_nodes_is_refused(
    name: str,
) -> None:
    chosen = HOLDS_OFF_OTHERS[name]
    assert anti_fields((chosen,)) == [f"{REQUIRED}[0]"]
    assert anti_fields(preferred=(chosen,)) == [f"{PREFERRED}[0].podAffinityTerm"]
    # The cluster admin may allow it (policy.affinity), as every other pod affinity.
    allowed = dataclasses.replace(DEFAULTS, allow_affinity=True)
    assert anti_fields((chosen,), (chosen,), settings=allowed) == []


@pytest.mark.parametrize("name", sorted(SELECTS_THE_WORKERS_ONLY))
def test_an_anti_affinity_among_the_workers_needs_no_permission(name: str) -> None:
    chosen = SELECTS_THE_WORKERS_ONLY[name]
    assert anti_fields((chosen,), (chosen,)) == []


def test_the_refusal_says_what_the_term_must_select() -> None:
    everyone = HOLDS_OFF_OTHERS["every pod of the cluster"]
    with pytest.raises(Problem) as raised:
        check_pod_policy(spec(affinity={"podAntiAffinity": {REQUIRED: [everyone]}}), DEFAULTS,
                         "orders")  # fmt: skip
    assert raised.value.reason == "PolicyViolation" and raised.value.stops_workers
    assert (
        f"spec.worker.affinity.podAntiAffinity.{REQUIRED}[0]: selects pods of other namespaces"
        in raised.value.message
    )
    [(_, why)] = violations(
        spec(affinity={"podAntiAffinity": {REQUIRED: [term({})]}}), DEFAULTS, "orders"
    )
    assert why.endswith(
        "labelSelector.matchLabels must hold app.kubernetes.io/name: outbox-dispatcher, "
        "app.kubernetes.io/instance: orders, app.kubernetes.io/component: worker"
    )


def test_the_operators_own_labels_and_annotations_are_refused_whatever_the_admin_allows() -> None:
    anything = dataclasses.replace(
        DEFAULTS, allowed_pod_labels=("*",), allowed_pod_annotations=("*",)
    )
    worker = {
        "podLabels": {"app.kubernetes.io/instance": "billing", "team": "orders",
                      "app.kubernetes.io/version": "1"},
        "podAnnotations": {"prometheus.io/port": "1", "outbox.dev/template-hash": "x", "a": "b"},
    }  # fmt: skip
    found = violations(spec(**worker), anything)
    assert [field for field, _ in found] == [
        "spec.worker.podLabels.app.kubernetes.io/instance",
        "spec.worker.podAnnotations.outbox.dev/template-hash",
        "spec.worker.podAnnotations.prometheus.io/port",
    ]
    assert "the operator's own" in found[0][1]


@pytest.mark.parametrize("key", [*OPERATOR_LABELS, "app.kubernetes.io/version", "team"])
def test_the_crd_and_the_operator_refuse_the_same_pod_labels(key: str) -> None:
    from chart.chart import custom_resource_errors

    anything = dataclasses.replace(DEFAULTS, allowed_pod_labels=("*",))
    resource = resource_of(spec(podLabels={key: "x"}))
    refused = key in OPERATOR_LABELS
    assert bool(custom_resource_errors(resource)) is refused, key
    assert bool(fields({"podLabels": {key: "x"}}, anything)) is refused, key


@pytest.mark.parametrize("prefix", [*OPERATOR_ANNOTATION_PREFIXES, "example.com/"])
def test_the_crd_and_the_operator_refuse_the_same_pod_annotations(prefix: str) -> None:
    from chart.chart import custom_resource_errors

    anything = dataclasses.replace(DEFAULTS, allowed_pod_annotations=("*",))
    key = f"{prefix}scrape"
    resource = resource_of(spec(podAnnotations={key: "x"}))
    refused = prefix in OPERATOR_ANNOTATION_PREFIXES
    assert bool(custom_resource_errors(resource)) is refused, key
    assert bool(fields({"podAnnotations": {key: "x"}}, anything)) is refused, key


def test_a_violation_is_a_problem_that_stops_the_workers_and_names_each_field() -> None:
    with pytest.raises(Problem) as raised:
        check_pod_policy(spec(image="evil.example/x:1", serviceAccountName="admin"), DEFAULTS)
    problem = raised.value
    assert problem.reason == "PolicyViolation" and problem.stops_workers
    assert "spec.worker.image: image `evil.example/x:1` is not allowed" in problem.message
    assert "spec.worker.serviceAccountName: service account `admin`" in problem.message
    check_pod_policy(spec(), DEFAULTS)  # nothing to say


def test_a_problem_that_stops_the_workers_wins_over_pinned_and_paused() -> None:
    problem = Problem("SecretNotShared", "not shared", stops_workers=True)
    observed = Observed(None, problem, replicas=3, ready_replicas=3)
    for limits in (Limits(1, 5), Limits(1, 5, paused=True), Limits(1, 5, pinned=4)):
        decision = decide(observed, limits, lambda: pytest.fail("no reading, no policy"))
        assert (decision.replicas, decision.reason) == (0, "SecretNotShared")
    held = Observed(None, Problem("SecretNotFound", "missing"), replicas=3, ready_replicas=3)
    assert decide(held, Limits(1, 5), lambda: pytest.fail("no policy")).replicas == 3


# -- the tables agree with the CRD ----------------------------------------------------------


def _walk(schema: dict[str, Any], path: str = "") -> dict[str, dict[str, Any]]:
    found = {path: schema} if path else {}
    for name, sub in (schema.get("properties") or {}).items():
        found.update(_walk(sub, f"{path}.{name}" if path else name))
    if "items" in schema:
        found.update(_walk(schema["items"], f"{path}[]"))
    if isinstance(schema.get("additionalProperties"), dict):  # a map's values, as consent walks
        found.update(_walk(schema["additionalProperties"], f"{path}{{}}"))
    return found


FIELDS = _walk(SCHEMA)


def test_every_worker_field_of_the_crd_is_checked_or_known_to_widen_nothing() -> None:
    worker = set(SCHEMA["properties"]["spec"]["properties"]["worker"]["properties"])
    assert not set(WORKER_CHECKS) & UNRESTRICTED
    assert not (set(WORKER_CHECKS) | UNRESTRICTED) & BY_CONSENT
    assert worker == set(WORKER_CHECKS) | UNRESTRICTED | BY_CONSENT, (
        "a spec.worker field the policy does not know: add a check to WORKER_CHECKS, to "
        "UNRESTRICTED if it gives the pods nothing more, or to BY_CONSENT if it names Secrets"
    )
    # A field classified by consent is one whose Secrets are checked for consent.
    for field in BY_CONSENT:
        assert any(path.startswith(f"worker.{field}") for path in SECRET_FIELDS), field


def test_every_secret_the_crd_can_name_is_checked_for_consent() -> None:
    named = {
        path.removeprefix("spec.").removesuffix("[]")
        for path in FIELDS
        if path.startswith("spec.")
        and path.rsplit(".", 1)[-1].rstrip("[]").endswith(("SecretRef", "SecretName", "Secrets"))
    }
    covered = {f.removesuffix(".name").removesuffix("[]").removesuffix("{}") for f in SECRET_FIELDS}
    assert named <= covered, named - covered
    for path in SECRET_FIELDS:
        if not path.startswith("worker.imagePullSecrets"):  # the day-two pod settings' field
            assert "spec." + path in FIELDS, path
        leaf = FIELDS.get("spec." + path)
        if leaf is not None:  # a Secret name: one of this namespace's, never a path
            assert leaf["pattern"] == "^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$", path


# -- Secrets by consent ---------------------------------------------------------------------


def test_secret_uses_names_every_reference_and_where() -> None:
    nats = {
        "database": {"dsnSecretRef": {"name": "db"}},
        "publisher": {
            "type": "nats",
            "nats": {
                "userSecretRef": {"name": "nats", "key": "user"},
                "passwordSecretRef": {"name": "nats", "key": "password"},
                "tokenSecretRef": {"name": "token", "key": "t"},
                "credsSecretRef": {"name": "creds", "key": "c"},
                "tlsSecretName": "tls",
            },
        },
        "worker": {"imagePullSecrets": [{"name": "regcred"}, {"name": "other"}]},
    }
    assert [(u.field, u.name) for u in secret_uses(nats)] == [
        ("spec.database.dsnSecretRef", "db"),
        ("spec.publisher.nats.credsSecretRef", "creds"),
        ("spec.publisher.nats.userSecretRef", "nats"),
        ("spec.publisher.nats.passwordSecretRef", "nats"),
        ("spec.publisher.nats.tokenSecretRef", "token"),
        ("spec.publisher.nats.tlsSecretName", "tls"),
        ("spec.worker.imagePullSecrets[0]", "regcred"),
        ("spec.worker.imagePullSecrets[1]", "other"),
    ]
    db = nats["database"]
    http = {"type": "http", "http": {"headersSecretRef": {"name": "headers", "key": "h"},
                                     "signingSecretRef": {"name": "keys", "key": "k"}}}  # fmt: skip
    assert [(u.field, u.name) for u in secret_uses({"database": db, "publisher": http})][1:] == [
        ("spec.publisher.http.headersSecretRef", "headers"),
        ("spec.publisher.http.signingSecretRef", "keys"),
    ]
    kafka = {"type": "kafka", "kafka": {"configSecretRef": {"name": "kafka", "key": "k"}}}
    assert [(u.field, u.name) for u in secret_uses({"database": db, "publisher": kafka})][1:] == [
        ("spec.publisher.kafka.configSecretRef", "kafka"),
    ]
    # A plugin's: every entry of its secretRefs, by the option's name.
    refs = {"b-token": {"name": "b", "key": "t"}, "a-key": {"name": "a", "key": "k"}}
    plugin = {"type": "plugin", "plugin": {"name": "any", "secretRefs": refs}}
    assert [(u.field, u.name) for u in secret_uses({"database": db, "publisher": plugin})][1:] == [
        ("spec.publisher.plugin.secretRefs.a-key", "a"),
        ("spec.publisher.plugin.secretRefs.b-token", "b"),
    ]


@pytest.mark.parametrize(
    ("annotation", "shared"),
    [
        (None, False),
        ("", False),
        ("orders", True),
        ("billing, orders", True),
        ("billing,orders-2", False),
        ("ORDERS", False),
        ("*", True),
        ("billing,*", True),
    ],
)
def test_consent_names_the_dispatcher_or_all_of_them(annotation: str | None, shared: bool) -> None:
    annotations = {} if annotation is None else {CONSENT_ANNOTATION: annotation}
    assert consents(annotations, "orders") is shared
    assert consents({"other.example/dispatchers": "orders"}, "orders") is False


def test_the_refusal_names_the_secret_the_fields_and_the_annotation_to_add() -> None:
    problem = not_shared("shop", "billing-api", "orders", ["spec.publisher.http.headersSecretRef"])
    assert (problem.reason, problem.stops_workers) == ("SecretNotShared", True)
    assert problem.message.startswith(
        "Secret `shop/billing-api` (spec.publisher.http.headersSecretRef) is not shared with "
        "dispatcher `orders`"
    )
    assert "kubectl annotate secret billing-api outbox.dev/dispatchers=orders" in problem.message


def test_every_example_passes_the_default_policy_with_its_secrets_consenting() -> None:
    examples = sorted((ROOT / "examples").glob("*.yaml"))
    assert examples
    for path in examples:
        objects = [o for o in yaml.safe_load_all(path.read_text()) if o]
        secrets = {o["metadata"]["name"]: o for o in objects if o["kind"] == "Secret"}
        for dispatcher in (o for o in objects if o["kind"] == "OutboxDispatcher"):
            name = dispatcher["metadata"]["name"]
            assert violations(dispatcher["spec"], DEFAULTS) == [], path
            for use in secret_uses(dispatcher["spec"]):
                annotations = secrets[use.name]["metadata"].get("annotations")
                assert consents(annotations, name), (path.name, use)


# -- settings -------------------------------------------------------------------------------


def test_the_policy_settings_default_to_the_narrowest() -> None:
    settings = load_settings([], ENV)
    assert settings.secret_consent is True and settings.allow_affinity is False
    for field in (
        "allowed_images",
        "allowed_service_accounts",
        "allowed_tolerations",
        "allowed_node_selectors",
        "allowed_priority_classes",
        "allowed_pod_labels",
        "allowed_pod_annotations",
    ):
        assert getattr(settings, field) == (), field


def test_the_policy_settings_from_flags_and_variables() -> None:
    settings = load_settings(
        [
            "--secret-consent=off",
            f"--allowed-images=ghcr.io/acme/*, outbox ,ghcr.io/acme/x@{DIGEST}",
            "--allowed-node-selectors=pool=workers,zone",
            "--allow-affinity=on",
        ],
        {
            **ENV,
            "OUTBOX_ALLOWED_SERVICE_ACCOUNTS": "outbox-worker",
            "OUTBOX_ALLOWED_TOLERATIONS": "dedicated=workers",
            "OUTBOX_ALLOWED_PRIORITY_CLASSES": "batch-low",
            "OUTBOX_ALLOWED_POD_LABELS": "team,example.com/*",
            "OUTBOX_ALLOWED_POD_ANNOTATIONS": "team.example.com/*",
        },
    )
    assert settings.secret_consent is False and settings.allow_affinity is True
    assert settings.allowed_images == ("ghcr.io/acme/*", "outbox", f"ghcr.io/acme/x@{DIGEST}")
    assert settings.allowed_node_selectors == ("pool=workers", "zone")
    assert settings.allowed_service_accounts == ("outbox-worker",)
    assert settings.allowed_tolerations == ("dedicated=workers",)
    assert settings.allowed_priority_classes == ("batch-low",)
    assert settings.allowed_pod_labels == ("team", "example.com/*")
    assert settings.allowed_pod_annotations == ("team.example.com/*",)


@pytest.mark.parametrize(
    ("argv", "env", "names"),
    [
        (["--secret-consent", "yes"], ENV, "--secret-consent"),
        (["--allowed-images", "outbox:1.0"], ENV, "--allowed-images"),
        (["--allowed-images", "Not An Image"], ENV, "--allowed-images"),
        ([], {**ENV, "OUTBOX_ALLOWED_PRIORITY_CLASSES": "High"}, "OUTBOX_ALLOWED_PRIORITY_CLASSES"),
        (["--allowed-node-selectors", "pool=a b"], ENV, "--allowed-node-selectors"),
        (["--allowed-pod-labels", "a b"], ENV, "--allowed-pod-labels"),
        (["--allow-affinity", "true"], ENV, "--allow-affinity"),
    ],
)  # fmt: skip
def test_bad_policy_settings_name_themselves(
    argv: list[str], env: dict[str, str], names: str
) -> None:
    with pytest.raises(SettingError, match=names):
        load_settings(argv, env)


def test_image_patterns() -> None:
    for good in ("*", "outbox", "ghcr.io/acme/*", "acme/*", f"ghcr.io/a/b@{DIGEST}"):
        assert check_image_pattern(good) == good
    for bad in ("outbox:1", "*/x", "ghcr.io/acme/**", ""):
        with pytest.raises(ValueError):
            check_image_pattern(bad)


def test_keys_that_are_no_label_or_annotation_keys_are_refused_whatever_the_admin_allows() -> None:
    anything = dataclasses.replace(
        DEFAULTS,
        allowed_pod_labels=("*",),
        allowed_pod_annotations=("*",),
        allowed_node_selectors=("*",),
    )
    worker = {
        "podLabels": {"team": "a", "-bad": "b", "a/b/c": "c", "x" * 64: "d"},
        "podAnnotations": {"example.com/ok": "1", "example.com/": "2"},
        "nodeSelector": {"pool": "w", "bad key": "v"},
    }
    found = violations(spec(**worker), anything)
    assert [field for field, _ in found] == [
        "spec.worker.nodeSelector.bad key",
        "spec.worker.podLabels.-bad",
        "spec.worker.podLabels.a/b/c",
        "spec.worker.podLabels." + "x" * 64,
        "spec.worker.podAnnotations.example.com/",
    ]
    assert "is not a label key" in found[1][1]
