"""values.yaml documented field by field and held to values.schema.json; bad values refused by
Helm with a message naming the field."""

from __future__ import annotations

import json
import re
from typing import Any

import helm_python as helm
import pytest
import yaml

from chart import chart as c

VALUES = c.CHART / "values.yaml"
SCHEMA = json.loads((c.CHART / "values.schema.json").read_text())


@pytest.mark.parametrize(
    ("values", "says"),
    [
        ({"replicaCount": "two"}, "at '/replicaCount': got string, want integer"),
        ({"replicaCount": 11}, "at '/replicaCount'"),
        ({"replicas": 2}, "additional properties 'replicas' not allowed"),
        ({"watch": {"namespace": ["shop"]}}, "at '/watch': additional properties 'namespace'"),
        ({"watch": {"namespaces": ["Shop_Floor"]}}, "at '/watch/namespaces/0'"),
        ({"watch": {"namespaces": ["shop", "shop"]}}, "at '/watch/namespaces'"),
        ({"image": {"pullPolicy": "Sometimes"}}, "at '/image/pullPolicy': value must be one of"),
        ({"image": {"digest": "latest"}}, "at '/image/digest'"),
        ({"leaderElection": {"leaseDuration": "15"}}, "at '/leaderElection/leaseDuration'"),
        ({"healthPort": 70000}, "at '/healthPort'"),
        ({"logging": {"format": "yaml"}}, "at '/logging/format'"),
        ({"extraArgs": ["namespace=shop"]}, "at '/extraArgs/0'"),
        (
            {"prometheusRule": {"disabledAlerts": ["OutboxTypo"]}},
            "at '/prometheusRule/disabledAlerts/0'",
        ),
        (
            {"prometheusRule": {"oldestMessageSLOSeconds": "5m"}},
            "at '/prometheusRule/oldestMessageSLOSeconds'",
        ),
        (
            {"prometheusRule": {"oldestUnfinishedSLOSeconds": 0}},
            "at '/prometheusRule/oldestUnfinishedSLOSeconds'",
        ),
        (
            {"metrics": {"serviceMonitor": {"enabled": "yes"}}},
            "at '/metrics/serviceMonitor/enabled'",
        ),
        ({"nodeSelector": {"zone": 1}}, "at '/nodeSelector/zone'"),
    ],
    ids=lambda v: json.dumps(v) if isinstance(v, dict) else None,
)
def test_bad_values_are_refused_with_the_field_named(values: dict[str, Any], says: str) -> None:
    with pytest.raises(helm.HelmValuesError) as refused:
        c.render(values)
    message = str(refused.value)
    assert says in message, message
    assert "outbox-dispatcher" in message


def test_inconsistent_values_fail_with_a_sentence() -> None:
    with pytest.raises(helm.HelmError, match=r"serviceAccount\.name is required"):
        c.render({"serviceAccount": {"create": False}})
    with pytest.raises(helm.HelmError, match=r"needs service\.enabled"):
        c.render({"service": {"enabled": False}, "metrics": {"serviceMonitor": {"enabled": True}}})


def test_the_defaults_satisfy_the_schema_and_every_key_is_in_it() -> None:
    defaults = yaml.safe_load(VALUES.read_text())
    with helm.Chart.load(c.CHART) as chart:
        chart.validate_schema(defaults)
    assert sorted(defaults) == sorted(SCHEMA["properties"])
    for path in _leaves(defaults):
        assert _in_schema(path), f"{'.'.join(path)} is not described by values.schema.json"


def test_every_field_of_values_yaml_is_documented() -> None:
    """Each field has a `# --` comment above it (helm-docs' convention); a section heading
    (a key holding only fields) needs none, and the keys inside a documented default value
    (resources.requests.cpu) are part of that value."""
    lines = VALUES.read_text().splitlines()
    keys = [
        (index, len(match.group(1)), match.group(2), match.group(3))
        for index, line in enumerate(lines)
        if (match := re.match(r"^(\s*)([A-Za-z][\w.]*):(.*)$", line))
    ]
    documented = {index for index, *_ in keys if _comment_above(lines, index).startswith("# --")}
    undocumented = []
    ancestors: list[tuple[int, int]] = []  # (indent, line index) of the enclosing keys
    for position, (index, indent, key, rest) in enumerate(keys):
        while ancestors and ancestors[-1][0] >= indent:
            ancestors.pop()
        nested = position + 1 < len(keys) and keys[position + 1][1] > indent
        is_section = not rest.strip() and nested
        if not (is_section or index in documented or any(a in documented for _, a in ancestors)):
            undocumented.append(f"line {index + 1}: {key}")
        ancestors.append((indent, index))
    assert undocumented == []


def _comment_above(lines: list[str], index: int) -> str:
    """The first line of the comment block right above a key."""
    block: list[str] = []
    for line in reversed(lines[:index]):
        if line.strip().startswith("#"):
            block.insert(0, line.strip())
        else:
            break
    return block[0] if block else ""


def _leaves(values: Any, path: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    if isinstance(values, dict) and values:
        return [leaf for key, value in values.items() for leaf in _leaves(value, (*path, key))]
    return [path]


def _in_schema(path: tuple[str, ...]) -> bool:
    node: dict[str, Any] = SCHEMA
    for key in path:
        node = _resolve(node)
        properties = node.get("properties")
        if properties is None:
            return "type" in node or "additionalProperties" in node  # a free-form object
        if key not in properties:
            return False
        node = properties[key]
    return True


def _resolve(node: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in node:
        node = SCHEMA["definitions"][node["$ref"].rsplit("/", 1)[-1]]
    return node
