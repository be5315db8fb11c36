"""The CRD: the contract's field names, a structural schema, CEL rules that compile, and the
docs' field table generated from it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import celpy
import pytest
import yaml

from outbox.controller.spec import DispatcherSpec

ROOT = Path(__file__).resolve().parent.parent
CRD = yaml.safe_load((ROOT / "crds" / "outboxdispatchers.yaml").read_text())
VERSION = CRD["spec"]["versions"][0]
SCHEMA = VERSION["schema"]["openAPIV3Schema"]

# The field names other components and users build on (the issue's contract).
CONTRACT = [
    "spec.database.dsnSecretRef.name",
    "spec.database.dsnSecretRef.key",
    "spec.database.table",
    "spec.publisher.type",
    "spec.publisher.http.url",
    "spec.publisher.http.timeout",
    "spec.publisher.nats",
    "spec.publisher.kafka",
    "spec.publisher.rateLimit",
    "spec.publisher.breaker.failures",
    "spec.publisher.breaker.window",
    "spec.publisher.breaker.probeDelayMax",
    "spec.lease",
    "spec.batchSize",
    "spec.concurrency",
    "spec.maxAttempts",
    "spec.ordering",
    "spec.paused",
    "spec.retention",
    "spec.scaling.minReplicas",
    "spec.scaling.maxReplicas",
    "spec.scaling.targetOldestReadyAgeSeconds",
    "spec.scaling.pollIntervalSeconds",
    "spec.scaling.scaleDownStabilizationSeconds",
    "spec.worker.image",
    "spec.worker.imagePullPolicy",
    "spec.worker.resources",
    "spec.worker.env",
    "spec.worker.nodeSelector",
    "spec.worker.tolerations",
    "spec.worker.affinity",
    "spec.worker.podAnnotations",
    "spec.worker.podLabels",
    "spec.worker.serviceAccountName",
    "spec.worker.priorityClassName",
    "status.observedGeneration",
    "status.replicas",
    "status.readyReplicas",
    "status.desiredReplicas",
    "status.lastScaleTime",
    "status.conditions",
    "status.backlog.pending",
    "status.backlog.ready",
    "status.backlog.dead",
    "status.backlog.oldestReadyAgeSeconds",
    "status.backlog.oldestUnfinishedAgeSeconds",
    "status.backlog.retrying",
    "status.backlog.arrivalRate",
    "status.backlog.completionRate",
]


def walk(schema: dict[str, Any], path: str = "") -> dict[str, dict[str, Any]]:
    found = {path: schema} if path else {}
    for name, sub in (schema.get("properties") or {}).items():
        found.update(walk(sub, f"{path}.{name}" if path else name))
    if "items" in schema:
        found.update(walk(schema["items"], f"{path}[]"))
    return found


FIELDS = walk(SCHEMA)


def test_names() -> None:
    names = CRD["spec"]["names"]
    assert CRD["spec"]["group"] == "outbox.dev" and VERSION["name"] == "v1alpha1"
    assert (names["kind"], names["plural"], names["shortNames"]) == (
        "OutboxDispatcher",
        "outboxdispatchers",
        ["obd"],
    )
    assert CRD["spec"]["scope"] == "Namespaced"


@pytest.mark.parametrize("path", CONTRACT)
def test_the_contract_fields_exist(path: str) -> None:
    assert path in FIELDS


@pytest.mark.parametrize("path", sorted(FIELDS))
def test_the_schema_is_structural(path: str) -> None:
    schema = FIELDS[path]
    assert "type" in schema or schema.get("x-kubernetes-int-or-string"), path
    if schema.get("type") == "object" and path.count(".") > 0:
        assert (
            "properties" in schema
            or "additionalProperties" in schema
            or schema.get("x-kubernetes-preserve-unknown-fields")
        ), f"{path}: an object without properties would be pruned empty"


def test_subresources_and_printer_columns() -> None:
    assert VERSION["subresources"]["status"] == {}
    scale = VERSION["subresources"]["scale"]
    for key in ("specReplicasPath", "statusReplicasPath", "labelSelectorPath"):
        assert scale[key].lstrip(".") in FIELDS
    columns = {c["name"]: c["jsonPath"] for c in VERSION["additionalPrinterColumns"]}
    assert {"Ready", "Desired", "Backlog", "Oldest-Ready", "Dead", "Status", "Age"} <= set(columns)
    assert {"Oldest-Unfinished", "Destinations"} <= set(columns)
    assert columns["Destinations"] == '.status.conditions[?(@.type=="DestinationReachable")].reason'
    # Two pauses, named apart: the resource's own (its workers stop) is named after its field,
    # so that `false` beside DESTINATIONS `Paused` (a destination a person paused) reads right.
    assert columns["Spec-Paused"] == ".spec.paused"
    assert not {"Paused", "PAUSED", "paused"} & set(columns)
    for path in columns.values():
        plain = path.split("[")[0].lstrip(".")
        assert plain in FIELDS or plain.startswith("metadata"), path


def test_every_cel_rule_compiles() -> None:
    env = celpy.Environment()
    rules = [r["rule"] for s in FIELDS.values() for r in s.get("x-kubernetes-validations", ())]
    rules += [r["rule"] for r in SCHEMA["properties"]["spec"].get("x-kubernetes-validations", ())]
    assert len(rules) >= 6
    for rule in rules:
        env.compile(rule)


def test_the_docs_field_tables_are_generated_from_the_crd() -> None:
    result = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "crd_docs.py"), "--check"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    doc = (ROOT / "docs" / "operator.md").read_text()
    for path in FIELDS:
        if path.startswith(("spec", "status")) and "[]" not in path:
            assert f"| `{path}` |" in doc, path


# -- the destination gate: the same syntax and ranges as the worker's settings ---------------


def _errors(publisher: dict[str, Any]) -> list[str]:
    from chart.chart import custom_resource_errors

    spec = {"database": {"dsnSecretRef": {"name": "db"}}, "publisher": {"type": "log", **publisher}}
    body = {
        "apiVersion": "outbox.dev/v1alpha1",
        "kind": "OutboxDispatcher",
        "metadata": {"name": "orders", "namespace": "shop"},
        "spec": spec,
    }
    return custom_resource_errors(body)


def _worker_accepts(convert: Any, text: str) -> bool:
    try:
        convert(text)
    except ValueError:
        return False
    return True


@pytest.mark.parametrize(
    "rate",
    ["50/s", "600/m", "36/h", "0.5/s", "1.5/m", "1000000/s", "10/h", "0/s", "0.001/s",
     "1000001/s", "60000060/m"],
)  # fmt: skip
def test_the_rate_limit_takes_what_the_worker_takes(rate: str) -> None:
    from outbox.worker.settings import parse_rate

    assert (_errors({"rateLimit": rate}) == []) == _worker_accepts(parse_rate, rate), rate


@pytest.mark.parametrize("rate", ["50", "50/d", "fast", "-1/s", "50 /s", "1e3/s", "5/sec"])
def test_the_rate_limit_takes_only_a_number_and_a_unit(rate: str) -> None:
    assert _errors({"rateLimit": rate}), rate


@pytest.mark.parametrize(
    ("field", "setting", "values"),
    [
        ("window", "breaker_window", ["999ms", "1s", "1.5s", "60s", "24h", "1441m", "25h"]),
        ("probeDelayMax", "probe_delay_max", ["1s", "1999ms", "2s", "30s", "1h", "61m"]),
        ("failures", "breaker_failures", [-1, 0, 5, 100, 101]),
    ],
)
def test_the_breaker_takes_what_the_worker_takes(
    field: str, setting: str, values: list[Any]
) -> None:
    from outbox.worker.settings import CONVERTERS

    for value in values:
        crd = _errors({"breaker": {field: value}}) == []
        assert crd == _worker_accepts(CONVERTERS[setting], str(value)), (field, value)


# -- one set of ranges: what the CRD admits the worker accepts, and what it refuses the worker
# refuses (the worker's settings are the source; the values reach it through the rendered env)


def _body(spec: dict[str, Any], name: str = "orders") -> dict[str, Any]:
    base: dict[str, Any] = {
        "database": {"dsnSecretRef": {"name": "db"}},
        "publisher": {"type": "log"},
    }
    for path, value in spec.items():
        target = base
        *parents, leaf = path.split(".")
        for part in parents:
            target = target.setdefault(part, {})
        target[leaf] = value
    return {
        "apiVersion": "outbox.dev/v1alpha1",
        "kind": "OutboxDispatcher",
        "metadata": {"name": name, "namespace": "shop", "uid": "u-1"},
        "spec": base,
    }


def _crd_errors(body: dict[str, Any]) -> list[str]:
    from chart.chart import custom_resource_errors

    return custom_resource_errors(body)


def _worker_error(body: dict[str, Any], secrets: Path | None = None) -> str | None:
    """The worker's own refusal of the env the operator renders for `body`, or None. With
    `secrets` (a directory), Secret values are filled in and the mounted files made there,
    and the publisher is built too (what it refuses at start)."""
    import copy

    from chart.chart import crd_schema
    from k8s.expansion import expand

    from outbox.controller.render import render_deployment
    from outbox.plumbing.errors import SettingError
    from outbox.worker.cli import make_publisher
    from outbox.worker.metrics import Metrics
    from outbox.worker.settings import load_settings

    body = copy.deepcopy(body)
    crd_schema().default(body)  # the defaults an API server stores, as the operator reads them
    deployment = render_deployment(
        DispatcherSpec.parse(body), replicas=1, default_image="outbox-dispatcher:test"
    )
    env = {"OUTBOX_DSN": "postgresql://app@db/orders", "OUTBOX_OWNER": "orders-worker-1"}
    for item in deployment["spec"]["template"]["spec"]["containers"][0]["env"]:
        if "value" in item:  # as the kubelet reads it
            env[item["name"]] = expand(item["value"], env)
        elif secrets is not None and "secretKeyRef" in item.get("valueFrom", {}):
            env.setdefault(item["name"], "from-a-secret")
    if secrets is not None:
        for name, value in env.items():
            if value.startswith("/etc/outbox/"):  # a mounted Secret: a file, as the kubelet makes
                env[name] = str(secrets / name)
                (secrets / name).write_text("mounted\n")
    try:
        settings = load_settings([], env)
        if secrets is not None:
            make_publisher(settings, Metrics())
    except SettingError as exc:
        return str(exc)
    return None


_HTTP = {"publisher.type": "http", "publisher.http": {"url": "http://sink.example/in"}}
_NATS = {"publisher.type": "nats", "publisher.nats": {"urls": ["nats://n:4222"]}}
_KAFKA = {"publisher.type": "kafka", "publisher.kafka": {"bootstrapServers": "k:9092"}}
# The publisher's timeout is probed under a lease of 24h: the CRD's own rule that the lease
# outlasts the timeout is not a range, and the worker warns about it instead.
_LONG_LEASE = {"lease": "24h"}
TIMEOUTS = ["0s", "0.5ms", "1ms", "250ms", "10s", "1.5h", "23h", "25h", "720h"]

# (field, values probed, other fields): the worker's boundaries, either side, and the values
# that crash-looped workers the CRD had admitted (lease 0s, 500ms, 720h; http timeout 0s).
SAME_RANGE = [
    ("lease", ["0s", "500ms", "999ms", "1s", "1.5s", "60s", "1440m", "24h", "1441m", "25h",
               "720h", "0.5h", "99999999999h"], {}),
    ("publisher.http.timeout", TIMEOUTS, {**_HTTP, **_LONG_LEASE}),
    ("publisher.nats.timeout", TIMEOUTS, {**_NATS, **_LONG_LEASE}),
    ("publisher.kafka.timeout", TIMEOUTS, {**_KAFKA, **_LONG_LEASE}),
    ("batchSize", [0, 1, 100, 10000, 10001], {}),
    ("concurrency", [0, 1, 4097, 10000, 10001], {}),
    ("maxAttempts", [0, 1, 1001, 2**31 - 1, 2**31], {}),
    ("ordering", ["none", "aggregate", "random"], {}),
    ("worker.tracing.parent", ["link", "parent", "Link", "child"],
     {"worker.tracing.endpoint": "http://otel-collector:4318"}),
]  # fmt: skip
# Fields the CRD keeps narrower than the worker, and why: what the CRD admits the worker still
# accepts (checked), not the other way round.
NARROWER = [
    # Ports out of 0-65535 or not numbers stopped every worker; IPvFuture hosts ([v1.fe]) are
    # the worker's but not the CRD's.
    (
        "publisher.http.url",
        [
            "http://h/x",
            "http://h:80/x",
            "http://h:port/x",
            "http://h:99999/",
            "http://h:65535",
            "http://h:65536",
            "http://h:0",
            "http://h:/x",
            "http://[::1]:8080/x",
            "http://[::1]/x",
            "http://[::1]:99999/",
            "http://u:p@h:8080/x",
            "http://u@h:x/",
            "http://a@b@h:80/",
            "http://h:-1/",
            "http://h:1:2/",
            "http://[::1/",
            "http://[zz]:80/",
            "http://h]/",
            "http://u@/",
            "http://h:80?x",
            "https://h:443/{event_type}?a={aggregate_id}",
            "http://[v1.fe]:8/",
        ],
        {"publisher.type": "http"},
    ),
    # 0 is "any free port" to the worker; a pod's probes and scrapes need a known one.
    ("worker.metricsPort", [-1, 0, 1, 9000, 65535, 65536], {}),
    # The pod's termination grace is this plus a margin; beyond an hour no drain waits.
    ("worker.shutdownGraceSeconds", [0, 1, 3600, 3601], {}),
    # The worker upper-cases its level; the CRD takes the canonical spelling only.
    ("worker.logLevel", ["DEBUG", "INFO", "WARNING", "ERROR", "info", "TRACE"], {}),
]


@pytest.mark.parametrize(("field", "values", "other"), SAME_RANGE, ids=[f for f, *_ in SAME_RANGE])
def test_the_crd_admits_exactly_what_the_worker_accepts(
    field: str, values: list[Any], other: dict[str, Any]
) -> None:
    for value in values:
        body = _body({**other, field: value})
        crd, worker = _crd_errors(body), _worker_error(body)
        assert (crd == []) == (worker is None), (field, value, crd, worker)


@pytest.mark.parametrize(("field", "values", "other"), NARROWER, ids=[f for f, *_ in NARROWER])
def test_what_the_crd_admits_of_a_narrower_field_the_worker_accepts(
    field: str, values: list[Any], other: dict[str, Any]
) -> None:
    admitted = 0
    for value in values:
        body = _body({**other, field: value})
        if _crd_errors(body) == []:
            admitted += 1
            assert _worker_error(body) is None, (field, value)
    assert 0 < admitted < len(values)


_REF = {"name": "nats", "key": "k"}


@pytest.mark.parametrize(
    "nats",
    [
        {"userSecretRef": _REF},
        {"passwordSecretRef": _REF},
        {"userSecretRef": _REF, "passwordSecretRef": _REF},
        {"tokenSecretRef": _REF},
        {"credsSecretRef": _REF},
        {"tokenSecretRef": _REF, "userSecretRef": _REF, "passwordSecretRef": _REF},
        {"credsSecretRef": _REF, "tokenSecretRef": _REF},
        {"urls": ["ws://a:80", "wss://b:443"]},
        {"urls": ["nats://a:4222", "ws://b:80"]},
        {"urls": ["tls://a:4222", "nats://b:4222"]},
    ],
)
def test_the_crd_refuses_the_nats_settings_the_worker_refuses(
    nats: dict[str, Any], tmp_path: Path
) -> None:
    body = _body({**_NATS, "publisher.nats": {"urls": ["nats://n:4222"], **nats}})
    crd, worker = _crd_errors(body), _worker_error(body, secrets=tmp_path)
    assert (crd == []) == (worker is None), (nats, crd, worker)


@pytest.mark.parametrize(
    ("kafka", "refused"),
    [
        ({"config": {"acks": "all"}}, False),
        ({"configSecretRef": {"name": "kafka", "key": "k"}}, False),
        ({"config": {"acks": "all"}, "configSecretRef": {"name": "kafka", "key": "k"}}, True),
    ],
)
def test_kafka_properties_come_from_the_resource_or_a_secret_never_both(
    kafka: dict[str, Any], refused: bool
) -> None:
    # Both render the worker's one OUTBOX_KAFKA_CONFIG: one would silently replace the other.
    body = _body({**_KAFKA, "publisher.kafka": {"bootstrapServers": "k:9092", **kafka}})
    said = (
        'spec.publisher.kafka: Invalid value: "object": give kafka.config or '
        "kafka.configSecretRef, not both"
    )
    assert _crd_errors(body) == ([said] if refused else [])


def test_the_refusals_name_the_range() -> None:
    [error] = _crd_errors(_body({"lease": "0s"}))
    assert error.startswith("spec.lease: ") and "between 1s and 24h" in error
    [error] = _crd_errors(_body({**_HTTP, "publisher.http.timeout": "0s"}))
    assert "spec.publisher.http.timeout" in error and "between 1ms and 24h" in error


@pytest.mark.parametrize(
    ("retention", "admitted"),
    [("0s", False), ("0ms", False), ("0.0h", False), ("00d", False), ("0.5s", True),
     ("1ms", True), ("7d", True), ("10d", True), ("12h", True), ("1.0h", True), ("-1s", False)],
)  # fmt: skip
def test_retention_is_more_than_zero(retention: str, admitted: bool) -> None:
    assert (_crd_errors(_body({"retention": retention})) == []) == admitted, retention


# Retention's boundaries as the operator meets them: microseconds that round to zero (0.5µs
# rounds to even, zero), the longest duration (36500d) and one past it, in every unit.
RETENTIONS = [
    "0s", "0ms", "0.0h", "00d", "0.0001ms", "0.0005ms", "0.00051ms", "0.0000005s",
    "0.0000006s", "0.00000001m", "0.000000001h", "0.00000000001d", "0.001ms", "1ms", "0.5s",
    "7d", "12h", "36500d", "36500.00001d", "36501d", "876000h", "876001h", "52560000m",
    "52560001m", "3153600000s", "3153600001s", "99999999999d",
]  # fmt: skip


@pytest.mark.parametrize("retention", RETENTIONS)
def test_the_crd_refuses_exactly_the_retention_the_operator_refuses(retention: str) -> None:
    from outbox.controller.problem import Problem
    from outbox.controller.spec import parse_retention

    try:
        parse_retention(retention)
    except Problem as exc:
        assert exc.reason == "InvalidRetention"
        operator = False
    else:
        operator = True
    crd = _crd_errors(_body({"retention": retention}))
    assert (crd == []) == operator, (retention, crd)


@pytest.mark.parametrize(
    ("field", "other"),
    [("lease", {}), ("publisher.http.timeout", {**_HTTP, **_LONG_LEASE}),
     ("publisher.nats.timeout", {**_NATS, **_LONG_LEASE}),
     ("publisher.kafka.timeout", {**_KAFKA, **_LONG_LEASE}),
     ("publisher.breaker.window", {}), ("publisher.breaker.probeDelayMax", {}),
     ("retention", {})],
)  # fmt: skip
def test_duration_fields_are_short_strings(field: str, other: dict[str, Any]) -> None:
    """A real API server costs CEL's duration() on a string's length: each is bounded."""
    assert FIELDS[f"spec.{field}"]["maxLength"] == 32, field
    longest, one_more = "0" * 29 + "20s", "0" * 30 + "20s"
    assert _crd_errors(_body({**other, field: longest})) == [], field
    [error] = _crd_errors(_body({**other, field: one_more}))
    assert error.startswith(f"spec.{field}"), error


# -- names: refused at admission where a label cannot hold them -------------------------------


def test_the_longest_name_fits_every_label_and_one_more_is_refused() -> None:
    from chart.chart import crd_schema, object_errors

    from outbox.controller.render import render_deployment
    from outbox.controller.resource import MAX_NAME_LENGTH

    longest = "o" * MAX_NAME_LENGTH
    assert _crd_errors(_body({}, name=longest)) == []
    [error] = _crd_errors(_body({}, name=longest + "o"))
    assert f"at most {MAX_NAME_LENGTH} characters" in error
    body = _body({}, name=longest)
    crd_schema().default(body)
    deployment = render_deployment(
        DispatcherSpec.parse(body), replicas=1, default_image="outbox-dispatcher:test"
    )
    assert object_errors(deployment) == []
    assert _label_errors(deployment) == []
    # One character more would not make a valid Deployment: the label is the limit.
    body["metadata"]["name"] += "o"
    too_long = render_deployment(
        DispatcherSpec.parse(body), replicas=1, default_image="outbox-dispatcher:test"
    )
    assert any("63" in e for e in _label_errors(too_long))


def _label_errors(deployment: dict[str, Any]) -> list[str]:
    """The API server's checks of names, labels and annotations (the emulator's)."""
    from k8s.metadata import check_meta

    template = deployment["spec"]["template"]
    found = check_meta(deployment["metadata"], "metadata") + check_meta(
        template["metadata"], "spec.template.metadata"
    )
    return [str(error) for error in found]


# -- kubectl explain: every field described -----------------------------------------------------


def _undescribed(schema: dict[str, Any], path: str) -> list[str]:
    found = [] if schema.get("description") else [path]
    for name, sub in (schema.get("properties") or {}).items():
        found += _undescribed(sub, f"{path}.{name}")
    if "items" in schema:
        found += _undescribed(schema["items"], f"{path}[]")
    return found


def test_every_field_has_a_description() -> None:
    assert _undescribed(SCHEMA, "") == []


@pytest.mark.parametrize(
    "spec",
    [
        lambda end: {"lease": f"60s{end}"},
        lambda end: {"publisher.type": "http", "publisher.http": {"url": f"http://s.example/{end}"}},
        lambda end: {"publisher.type": "http", "publisher.http": {"url": "http://s.example/"},
                     "publisher.cloudEventsSource": f"urn:shop:orders{end}"},
    ],
    ids=["lease", "http.url", "cloudEventsSource"],
)  # fmt: skip
def test_a_pattern_ends_at_the_end_of_the_text_as_on_a_real_api_server(spec: Any) -> None:
    """A schema's `pattern` is Go's RE2, whose `$` matches at the very end only: a value with
    a newline after what the pattern takes is refused (Python's `$` would take it)."""
    assert _crd_errors(_body(spec(""))) == []
    [error] = _crd_errors(_body(spec("\n")))
    assert "should match" in error
