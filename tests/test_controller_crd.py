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


# -- destination health: the same syntax and ranges as the worker's settings -----------------


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
