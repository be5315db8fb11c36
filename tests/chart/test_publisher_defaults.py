"""The chart's `publisherDefaults`: a cluster-wide wire format (and CloudEvents source) for
every dispatcher whose spec.publisher does not say, passed to the operator as
--publisher-defaults, checked as the CRD checks a resource's, and rendered into the worker
pods' OUTBOX_FORMAT and OUTBOX_CLOUDEVENTS_SOURCE; the resource's own value wins."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import helm_python as helm
import pytest
import yaml

from chart import chart as c
from chart.test_worker_defaults import VALUES, operator_settings
from outbox.controller.defaults import (
    CLOUDEVENTS_SOURCE,
    CLOUDEVENTS_SOURCE_MAX_LENGTH,
    PUBLISHER_DEFAULT_FIELDS,
    PUBLISHER_FORMATS,
    PUBLISHER_TYPES,
    QUANTITY,
)
from outbox.controller.render import render_deployment
from outbox.controller.settings import load_settings
from outbox.controller.spec import DispatcherSpec
from outbox.plumbing.errors import SettingError

SPEC = yaml.safe_load(c.CRD_SOURCE.read_text())["spec"]["versions"][0]["schema"]["openAPIV3Schema"][
    "properties"
]["spec"]["properties"]
PUBLISHER = SPEC["publisher"]["properties"]
CHART_SCHEMA = json.loads((c.CHART / "values.schema.json").read_text())["properties"][
    "publisherDefaults"
]["properties"]


def test_the_operator_checks_what_the_crd_checks() -> None:
    # One source: the operator's constants are the CRD's enum, pattern and length.
    assert list(PUBLISHER_FORMATS) == PUBLISHER["format"]["enum"]
    assert list(PUBLISHER_TYPES) == PUBLISHER["type"]["enum"]  # what --worker-publishers names
    quantity = SPEC["worker"]["properties"]["resources"]["properties"]["requests"]
    assert QUANTITY.pattern == quantity["additionalProperties"]["pattern"]
    source = PUBLISHER["cloudEventsSource"]
    assert CLOUDEVENTS_SOURCE.pattern == source["pattern"]
    assert source["maxLength"] == CLOUDEVENTS_SOURCE_MAX_LENGTH
    assert source["minLength"] == 1
    # The chart's schema: the same, with "" for "not set".
    assert CHART_SCHEMA["format"]["enum"] == ["", *PUBLISHER_FORMATS]
    assert CHART_SCHEMA["cloudEventsSource"]["pattern"] == source["pattern"].replace("+", "*")
    assert CHART_SCHEMA["cloudEventsSource"]["maxLength"] == source["maxLength"]
    assert set(VALUES["publisherDefaults"]) == set(PUBLISHER_DEFAULT_FIELDS)


def dispatcher(publisher: dict[str, Any] | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {
        "apiVersion": "outbox.dev/v1alpha1",
        "kind": "OutboxDispatcher",
        "metadata": {"name": "orders", "namespace": "shop", "uid": "u-1"},
        "spec": {
            "database": {"dsnSecretRef": {"name": "db"}},
            "publisher": {
                "type": "http",
                "http": {"url": "http://sink.example/in"},
                **(publisher or {}),
            },
        },
    }
    c.crd_schema().default(body)
    return body


def worker_env(body: dict[str, Any], publisher_defaults: Any) -> dict[str, str]:
    deployment = render_deployment(
        DispatcherSpec.parse(body),
        replicas=1,
        default_image="i:1",
        publisher_defaults=publisher_defaults,
    )
    [container] = deployment["spec"]["template"]["spec"]["containers"]
    return {e["name"]: e["value"] for e in container["env"] if "value" in e}


def test_the_default_reaches_a_resource_that_omits_the_field() -> None:
    admin = {"format": "cloudevents-binary", "cloudEventsSource": "urn:shop"}
    env = worker_env(dispatcher(), admin)
    assert env["OUTBOX_FORMAT"] == "cloudevents-binary"
    assert env["OUTBOX_CLOUDEVENTS_SOURCE"] == "urn:shop"
    # What the admin may default, an author may write: the CRD admits it in spec.publisher.
    assert c.custom_resource_errors(dispatcher(admin)) == []


def test_the_resources_own_value_wins_field_by_field() -> None:
    admin = {"format": "cloudevents-binary", "cloudEventsSource": "urn:shop"}
    env = worker_env(dispatcher({"format": "envelope"}), admin)
    assert env["OUTBOX_FORMAT"] == "envelope"
    assert env["OUTBOX_CLOUDEVENTS_SOURCE"] == "urn:shop"
    env = worker_env(dispatcher({"cloudEventsSource": "/orders"}), admin)
    assert env["OUTBOX_FORMAT"] == "cloudevents-binary"
    assert env["OUTBOX_CLOUDEVENTS_SOURCE"] == "/orders"


def test_without_defaults_the_worker_keeps_its_own_and_the_template_is_unchanged() -> None:
    body = dispatcher()
    env = worker_env(body, {})
    assert "OUTBOX_FORMAT" not in env and "OUTBOX_CLOUDEVENTS_SOURCE" not in env
    # Upgrading the operator rolls no worker: the same template as before the option.
    assert render_deployment(
        DispatcherSpec.parse(body), replicas=1, default_image="i:1"
    ) == render_deployment(
        DispatcherSpec.parse(body), replicas=1, default_image="i:1", publisher_defaults={}
    )
    assert "publisher" in body["spec"] and "format" not in body["spec"]["publisher"]


def test_the_flag_and_its_variable_are_read() -> None:
    flag = '{"format": "cloudevents-structured", "cloudEventsSource": "/shop"}'
    settings = load_settings(["--publisher-defaults", flag], {"POD_NAMESPACE": "ns"})
    assert settings.publisher_defaults == json.loads(flag)
    settings = load_settings(
        [], {"POD_NAMESPACE": "ns", "OUTBOX_PUBLISHER_DEFAULTS": '{"format": "envelope"}'}
    )
    assert settings.publisher_defaults == {"format": "envelope"}
    assert load_settings([], {"POD_NAMESPACE": "ns"}).publisher_defaults == {}


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ("not json", "not JSON"),
        ('["envelope"]', "JSON object"),
        ('{"format": "cloudevents"}', "format: expected one of envelope"),
        ('{"format": 1}', "format"),
        ('{"cloudEventsSource": "has space"}', "cloudEventsSource"),
        ('{"cloudEventsSource": ""}', "cloudEventsSource"),
        ('{"cloudEventsSource": "é"}', "cloudEventsSource"),
        (json.dumps({"cloudEventsSource": "/" * 1025}), "cloudEventsSource"),
        ('{"type": "http"}', "type: not one of format, cloudEventsSource"),
    ],
)
def test_a_bad_value_is_refused_naming_the_flag(value: str, says: str) -> None:
    with pytest.raises(SettingError) as refused:
        load_settings(["--publisher-defaults", value], {"POD_NAMESPACE": "ns"})
    assert str(refused.value).startswith("--publisher-defaults: ")
    assert says in str(refused.value)


def test_the_operator_exits_2_naming_the_flag() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "outbox.controller", '--publisher-defaults={"format": "xml"}'],
        capture_output=True,
        text=True,
        env={"POD_NAMESPACE": "ns", "PATH": ""},
        timeout=60,
    )
    assert result.returncode == 2
    assert "--publisher-defaults: format: expected one of" in result.stderr


def test_the_chart_passes_no_flag_by_default() -> None:
    [container] = c.render({}).one("Deployment")["spec"]["template"]["spec"]["containers"]
    assert not any(a.startswith("--publisher-defaults") for a in container["args"])
    assert operator_settings({}).publisher_defaults == {}


def test_the_chart_value_reaches_the_operator() -> None:
    values = {"publisherDefaults": {"format": "cloudevents-binary", "cloudEventsSource": "urn:x"}}
    [container] = c.render(values).one("Deployment")["spec"]["template"]["spec"]["containers"]
    [arg] = [a for a in container["args"] if a.startswith("--publisher-defaults=")]
    assert json.loads(arg.partition("=")[2]) == values["publisherDefaults"]
    settings = operator_settings(values)
    assert settings.publisher_defaults == values["publisherDefaults"]
    # An empty entry is left out: the worker's own default holds for it.
    settings = operator_settings({"publisherDefaults": {"format": "cloudevents-structured"}})
    assert settings.publisher_defaults == {"format": "cloudevents-structured"}


@pytest.mark.parametrize(
    ("defaults", "field"),
    [
        ({"format": "cloudevents"}, "format"),
        ({"cloudEventsSource": "has space"}, "cloudEventsSource"),
        ({"type": "http"}, "type"),
    ],
)
def test_helm_refuses_a_bad_default(defaults: dict[str, Any], field: str) -> None:
    with pytest.raises(helm.HelmValuesError) as refused:
        c.render({"publisherDefaults": defaults})
    assert "publisherDefaults" in str(refused.value)
    assert field in str(refused.value)
