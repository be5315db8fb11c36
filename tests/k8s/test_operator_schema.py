"""Every constrained field of the CRD, wrong in turn: the API server (the emulator, which
validates as one does) refuses it with kubectl printing the field; nothing is stored."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import yaml

from .cluster import LocalCluster
from .test_operator import CRD, NS, dispatcher_manifest

pytestmark = pytest.mark.slow
SPEC = yaml.safe_load(CRD.read_text())["spec"]["versions"][0]["schema"]["openAPIV3Schema"][
    "properties"
]["spec"]


def constrained(schema: dict[str, Any], path: str) -> list[tuple[str, Any]]:
    """(path, a value the schema refuses) for every field with a type-level constraint."""
    found: list[tuple[str, Any]] = []
    kind = schema.get("type")
    if "enum" in schema:
        found.append((path, "not-one-of-them"))
    elif "pattern" in schema:
        found.append((path, "not valid at all!"))
    elif kind in ("integer", "number"):
        if "minimum" in schema:
            found.append((path, schema["minimum"] - 1))
        if "maximum" in schema:
            found.append((path, schema["maximum"] + 1))
        found.append((path, "seven"))
    elif kind == "boolean":
        found.append((path, "maybe"))
    elif kind == "string" and schema.get("minLength"):
        found.append((path, ""))
    for name, sub in (schema.get("properties") or {}).items():
        found.extend(constrained(sub, f"{path}.{name}"))
    return found


CASES = constrained(SPEC, "spec")


def manifest_with(path: str, value: Any) -> dict[str, Any]:
    manifest = dispatcher_manifest("wrong")
    parts = path.split(".")[1:]
    if parts[:2] == ["publisher", "nats"]:
        manifest["spec"]["publisher"] = {"type": "nats", "nats": {"urls": ["nats://n:4222"]}}
    elif parts[:2] == ["publisher", "kafka"]:
        manifest["spec"]["publisher"] = {"type": "kafka", "kafka": {"bootstrapServers": "k:9092"}}
    elif parts[:2] == ["publisher", "http"]:
        manifest["spec"]["publisher"] = {"type": "http", "http": {"url": "http://sink"}}
    elif parts[:2] == ["publisher", "plugin"]:
        manifest["spec"]["publisher"] = {"type": "plugin", "plugin": {"name": "sqs"}}
    target = manifest["spec"]
    for part in parts[:-1]:
        target = target.setdefault(part, {})
        if part.endswith("SecretRef"):
            target.setdefault("name", "s")
            target.setdefault("key", "k")
    target[parts[-1]] = copy.deepcopy(value)
    return manifest


def test_there_is_something_to_refuse() -> None:
    assert len(CASES) > 40


def test_each_field_wrong_in_turn_is_refused_naming_the_field(cluster: LocalCluster) -> None:
    accepted = []
    unnamed = []
    for path, value in CASES:
        result = cluster.kubectl(
            "apply", "-f", "-", input=yaml.safe_dump(manifest_with(path, value)), check=False
        )
        if result.returncode == 0:
            accepted.append((path, value))
            cluster.kubectl("delete", "obd", "wrong", "--ignore-not-found")
        elif path not in result.stderr:
            unnamed.append((path, value, result.stderr.strip()[-300:]))
    assert accepted == []
    assert unnamed == []
    assert cluster.objects("outbox.dev/v1alpha1", "outboxdispatchers", NS) == []


def test_the_same_manifests_with_good_values_are_accepted(cluster: LocalCluster) -> None:
    """The control: refusals above come from the wrong field, not from the rest."""
    for path, value in [
        ("spec.publisher.nats.noStream", "retry"),
        ("spec.publisher.nats.tokenSecretRef.name", "nats-auth"),
        ("spec.publisher.kafka.compression", "zstd"),
        ("spec.publisher.kafka.configSecretRef.key", "sasl"),
        ("spec.publisher.http.timeout", "5s"),
        ("spec.publisher.http.headersSecretRef.name", "headers"),
        ("spec.publisher.plugin.name", "sqs"),
        ("spec.publisher.plugin.timeout", "5s"),
        ("spec.scaling.maxReplicas", 1000),
        ("spec.worker.metricsPort", 9100),
        ("spec.retention", "7d"),
    ]:
        cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(manifest_with(path, value)))
        cluster.kubectl("delete", "obd", "wrong")


PLUGIN_BLOCK = {
    "name": "sqs",
    "options": {"sqs-queue-url": "https://sqs.example/q", "sqs-tag": "a\nb"},
    "secretRefs": {"sqs-token": {"name": "sqs", "key": "token"}},
}


@pytest.mark.parametrize(
    ("publisher", "refused"),
    [
        (None, ""),  # the control: a plugin's generic block as its author writes it
        ({"type": "plugin"}, "publisher.plugin is required when type is plugin"),
        ({"type": "http", "http": {"url": "http://sink"}, "plugin": PLUGIN_BLOCK},
         "publisher.plugin is required when type is plugin and not allowed otherwise"),
        ({"type": "plugin", "plugin": {**PLUGIN_BLOCK, "name": "kafka"}},
         "a built-in publisher is set by its own block"),
        ({"type": "plugin", "plugin": {**PLUGIN_BLOCK, "secretRefs": {"sqs-token": {"name": "s"}}}},
         "spec.publisher.plugin.secretRefs.sqs-token.key"),
        ({"type": "plugin", "plugin": {**PLUGIN_BLOCK, "options": {"sqs-depth": 3}}},
         "spec.publisher.plugin.options.sqs-depth"),
    ],
)  # fmt: skip
def test_the_generic_plugin_block_is_validated_by_the_api_server(
    cluster: LocalCluster, publisher: dict[str, Any] | None, refused: str
) -> None:
    """A plugin needs no CRD change: its block's shape is the CRD's (the operator checks its
    options against the plugin's description), and the API server refuses a malformed one."""
    manifest = dispatcher_manifest("wrong")
    manifest["spec"]["publisher"] = publisher or {"type": "plugin", "plugin": PLUGIN_BLOCK}
    result = cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(manifest), check=False)
    if not refused:
        assert result.returncode == 0, result.stderr
        [stored] = cluster.objects("outbox.dev/v1alpha1", "outboxdispatchers", NS)
        assert stored["spec"]["publisher"]["plugin"]["secretRefs"] == PLUGIN_BLOCK["secretRefs"]
        cluster.kubectl("delete", "obd", "wrong")
        return
    assert result.returncode != 0
    assert refused in result.stderr
    assert cluster.objects("outbox.dev/v1alpha1", "outboxdispatchers", NS) == []
