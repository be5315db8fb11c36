"""The chart's `workerDefaults.tracing`: a cluster-wide collector for every dispatcher's
publish spans, passed to the operator as --worker-defaults and rendered into the worker pods
of each resource that does not set spec.worker.tracing itself; a bad value is refused by Helm."""

from __future__ import annotations

import json
from typing import Any

import helm_python as helm
import pytest

from chart import chart as c
from chart.test_worker_defaults import dispatcher, operator_settings
from outbox.controller.render import render_deployment
from outbox.controller.spec import DispatcherSpec

COLLECTOR = "http://otel-collector.monitoring:4318"


def worker_env(settings: Any, worker: dict[str, Any] | None = None) -> dict[str, str]:
    deployment = render_deployment(
        DispatcherSpec.parse(dispatcher(worker)),
        replicas=1,
        default_image="i:1",
        defaults=settings.worker_defaults,
    )
    [container] = deployment["spec"]["template"]["spec"]["containers"]
    return {e["name"]: e["value"] for e in container["env"] if "value" in e}


def test_no_tracing_by_default() -> None:
    settings = operator_settings({})
    assert "tracing" not in settings.worker_defaults
    assert not any(name.startswith("OTEL_") for name in worker_env(settings))


def test_a_default_collector_reaches_the_workers_of_a_resource_without_tracing() -> None:
    tracing = {"endpoint": COLLECTOR, "parent": "parent", "samplingRatio": 0.1}
    settings = operator_settings({"workerDefaults": {"tracing": tracing}})
    assert settings.worker_defaults["tracing"] == tracing
    env = worker_env(settings)
    assert env["OTEL_EXPORTER_OTLP_ENDPOINT"] == COLLECTOR
    assert env["OTEL_TRACES_EXPORTER"] == "otlp"
    assert env["OTEL_TRACES_SAMPLER_ARG"] == "0.1"
    assert env["OUTBOX_OTEL_PARENT"] == "parent"
    assert env["OTEL_RESOURCE_ATTRIBUTES"] == "k8s.namespace.name=shop,outbox.dispatcher=orders"
    # What the admin may default, an author may write: the CRD admits it in spec.worker.
    assert c.custom_resource_errors(dispatcher({"tracing": tracing})) == []
    # A resource's own block wins, whole.
    own = worker_env(settings, {"tracing": {"endpoint": "https://traces.example"}})
    assert own["OTEL_EXPORTER_OTLP_ENDPOINT"] == "https://traces.example"
    assert "OTEL_TRACES_SAMPLER_ARG" not in own and "OUTBOX_OTEL_PARENT" not in own


@pytest.mark.parametrize(
    ("tracing", "field"),
    [
        ({"endpoint": "otel-collector:4318"}, "endpoint"),
        ({"endpoint": "http://u:p@otel-collector:4318"}, "endpoint"),
        # Outside printable ASCII: the operator refuses it at start (controller/settings.py).
        ({"endpoint": "http://otel-collectör:4318"}, "endpoint"),
        ({"endpoint": "http://otel-collector:4318/v1\x7f"}, "endpoint"),
        ({"endpoint": COLLECTOR, "parent": "child"}, "parent"),
        ({"endpoint": COLLECTOR, "samplingRatio": 2}, "samplingRatio"),
        ({"parent": "link"}, "endpoint"),
        ({"endpoint": COLLECTOR, "headers": "x"}, "headers"),
    ],
)
def test_helm_refuses_a_bad_default(tracing: dict[str, Any], field: str) -> None:
    with pytest.raises(helm.HelmValuesError) as refused:
        c.render({"workerDefaults": {"tracing": tracing}})
    assert "workerDefaults" in str(refused.value) and "tracing" in str(refused.value)
    assert field in str(refused.value)


def test_the_charts_endpoint_pattern_is_the_operators() -> None:
    from outbox.controller.defaults import TRACING_ENDPOINT

    schema = json.loads((c.CHART / "values.schema.json").read_text())
    tracing = schema["properties"]["workerDefaults"]["properties"]["tracing"]
    assert tracing["properties"]["endpoint"]["pattern"] == TRACING_ENDPOINT.pattern
