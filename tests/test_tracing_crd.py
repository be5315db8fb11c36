"""spec.worker.tracing: publish spans turned on from the custom resource (docs/tracing.md).

The operator renders the block as OpenTelemetry's standard variables in the worker pods; the
admin's --worker-defaults may give it to every resource that omits it; the pod policy leaves
it to the author (a destination, like the publisher's URL); and what the CRD admits, the
worker and OpenTelemetry's SDK take as the CRD describes it."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import yaml
from chart.chart import CRD_SOURCE, crd_schema, custom_resource_errors

from outbox.controller.defaults import TRACING_ENDPOINT, TRACING_FIELDS, TRACING_PARENTS
from outbox.controller.policy import UNRESTRICTED, violations
from outbox.controller.render import render_deployment
from outbox.controller.settings import ControllerSettings, load_settings
from outbox.controller.spec import DispatcherSpec
from outbox.plumbing.errors import SettingError

COLLECTOR = "http://otel-collector.monitoring:4318"
SCHEMA = yaml.safe_load(CRD_SOURCE.read_text())["spec"]["versions"][0]["schema"]
TRACING = SCHEMA["openAPIV3Schema"]["properties"]["spec"]["properties"]["worker"]["properties"][
    "tracing"
]


def body(worker: dict[str, Any] | None = None, name: str = "orders") -> dict[str, Any]:
    """A resource as the API server stores it (the CRD's defaults applied)."""
    spec: dict[str, Any] = {
        "database": {"dsnSecretRef": {"name": "db"}},
        "publisher": {"type": "http", "http": {"url": "http://sink.example/in"}},
    }
    if worker is not None:
        spec["worker"] = copy.deepcopy(worker)
    resource = {
        "apiVersion": "outbox.dev/v1alpha1",
        "kind": "OutboxDispatcher",
        "metadata": {"name": name, "namespace": "shop", "uid": "u-1"},
        "spec": spec,
    }
    crd_schema().default(resource)
    return resource


def env_list(resource: dict[str, Any], defaults: Any = None) -> list[dict[str, Any]]:
    extra = {} if defaults is None else {"defaults": defaults}
    deployment = render_deployment(
        DispatcherSpec.parse(resource), replicas=1, default_image="i:1", **extra
    )
    return deployment["spec"]["template"]["spec"]["containers"][0]["env"]  # type: ignore[no-any-return]


def env(resource: dict[str, Any], defaults: Any = None) -> dict[str, str]:
    return {e["name"]: e["value"] for e in env_list(resource, defaults) if "value" in e}


def otel(values: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in values.items() if k.startswith("OTEL_") or k == "OUTBOX_OTEL_PARENT"}


# -- rendering ------------------------------------------------------------------------------


def test_without_tracing_the_workers_get_no_otel_variable() -> None:
    assert otel(env(body())) == {}


def test_the_endpoint_alone_turns_spans_on_with_the_workers_defaults_for_the_rest() -> None:
    resource = body({"tracing": {"endpoint": COLLECTOR}})
    assert custom_resource_errors(resource) == []
    assert otel(env(resource)) == {
        "OTEL_TRACES_EXPORTER": "otlp",
        "OTEL_EXPORTER_OTLP_ENDPOINT": COLLECTOR,
        "OTEL_RESOURCE_ATTRIBUTES": "k8s.namespace.name=shop,outbox.dispatcher=orders",
    }


def test_every_field_becomes_its_variable() -> None:
    tracing = {"endpoint": COLLECTOR, "parent": "parent", "samplingRatio": 0.25,
               "serviceName": "orders-relay"}  # fmt: skip
    resource = body({"tracing": tracing}, name="billing")
    assert custom_resource_errors(resource) == []
    assert otel(env(resource)) == {
        "OTEL_TRACES_EXPORTER": "otlp",
        "OTEL_EXPORTER_OTLP_ENDPOINT": COLLECTOR,
        "OTEL_RESOURCE_ATTRIBUTES": "k8s.namespace.name=shop,outbox.dispatcher=billing",
        "OTEL_SERVICE_NAME": "orders-relay",
        "OTEL_TRACES_SAMPLER": "parentbased_traceidratio",
        "OTEL_TRACES_SAMPLER_ARG": "0.25",
        "OUTBOX_OTEL_PARENT": "parent",
    }


def test_a_variable_of_spec_worker_env_comes_after_and_so_wins() -> None:
    resource = body(
        {
            "tracing": {"endpoint": COLLECTOR},
            "env": [{"name": "OTEL_RESOURCE_ATTRIBUTES", "value": "team=payments"}],
        }
    )
    names = [e["name"] for e in env_list(resource)]
    assert names.count("OTEL_RESOURCE_ATTRIBUTES") == 2
    # Kubernetes takes the last of two variables of one name.
    assert env(resource)["OTEL_RESOURCE_ATTRIBUTES"] == "team=payments"


def test_a_changed_tracing_block_rolls_the_workers() -> None:
    def template_hash(tracing: dict[str, Any]) -> str:
        deployment = render_deployment(
            DispatcherSpec.parse(body({"tracing": tracing})), replicas=1, default_image="i:1"
        )
        return str(deployment["metadata"]["annotations"]["outbox.dev/template-hash"])

    assert template_hash({"endpoint": COLLECTOR}) != template_hash(
        {"endpoint": COLLECTOR, "parent": "parent"}
    )


# -- the admin's default ----------------------------------------------------------------------

ADMIN = {"tracing": {"endpoint": COLLECTOR, "samplingRatio": 0.5}}


def _defaults(value: Any) -> Any:
    import json

    env = {"POD_NAMESPACE": "outbox-system", "POD_NAME": "outbox-controller-abc"}
    return load_settings(["--worker-defaults", json.dumps(value)], env).worker_defaults


def test_the_admins_default_reaches_a_resource_that_omits_tracing_and_not_one_that_sets_it() -> (
    None
):
    defaults = _defaults(ADMIN)
    assert defaults == ADMIN
    assert otel(env(body(), defaults))["OTEL_TRACES_SAMPLER_ARG"] == "0.5"
    own = body({"tracing": {"endpoint": "https://traces.example"}})
    mine = otel(env(own, defaults))
    assert mine["OTEL_EXPORTER_OTLP_ENDPOINT"] == "https://traces.example"
    assert "OTEL_TRACES_SAMPLER_ARG" not in mine  # the resource's block wins, whole


@pytest.mark.parametrize(
    ("tracing", "says"),
    [
        ("http://c:4318", "tracing: expected an object"),
        ({}, "tracing.endpoint"),
        ({"endpoint": "c:4318"}, "tracing.endpoint"),
        ({"endpoint": "http://user:hunter2@c:4318"}, "without credentials"),
        ({"endpoint": COLLECTOR, "parent": "child"}, "link, parent"),
        ({"endpoint": COLLECTOR, "samplingRatio": 1.5}, "0 to 1"),
        ({"endpoint": COLLECTOR, "samplingRatio": True}, "0 to 1"),
        ({"endpoint": COLLECTOR, "serviceName": ""}, "serviceName"),
        ({"endpoint": COLLECTOR, "sampler": "always_on"}, "sampler: not one of"),
    ],
)
def test_a_bad_default_is_refused_naming_the_field_never_the_url(tracing: Any, says: str) -> None:
    with pytest.raises(SettingError) as refused:
        _defaults({"tracing": tracing})
    assert says in str(refused.value)
    assert "hunter2" not in str(refused.value)
    # What the operator refuses as a default, the CRD refuses in a resource (one range).
    if isinstance(tracing, dict):
        assert custom_resource_errors(body({"tracing": tracing})) != []


def test_the_settings_check_the_crds_own_pattern_and_choices() -> None:
    from outbox.worker.settings import OTEL_PARENTS

    properties = TRACING["properties"]
    assert TRACING_ENDPOINT.pattern == properties["endpoint"]["pattern"]
    assert tuple(properties["parent"]["enum"]) == TRACING_PARENTS == OTEL_PARENTS
    assert set(properties) == set(TRACING_FIELDS)
    assert TRACING["required"] == ["endpoint"]


# -- the pod policy ---------------------------------------------------------------------------


def test_the_policy_leaves_the_collector_to_the_author_as_it_does_the_publishers_url() -> None:
    assert "tracing" in UNRESTRICTED
    strict = ControllerSettings(worker_image="outbox-dispatcher:0.1.0")
    spec = body({"tracing": {"endpoint": "https://collector.elsewhere.example"}})["spec"]
    assert violations(spec, strict) == []


# -- what the CRD admits, the worker and OpenTelemetry's SDK take -----------------------------


@pytest.mark.parametrize(
    ("endpoint", "admitted"),
    [
        (COLLECTOR, True),
        ("https://collector.example", True),
        ("https://collector.example/otlp/", True),
        ("http://[::1]:4318", True),
        ("grpc://collector:4317", False),
        ("collector:4318", False),
        ("http://user:secret@collector:4318", False),
        ("http://collector:4318?x=1", False),
        ("http://collector:4318/#frag", False),
        ("http://collector 4318", False),
        ("http://" + "c" * 2048, False),
    ],
)
def test_the_crd_admits_an_otlp_http_base_url_without_credentials(
    endpoint: str, admitted: bool
) -> None:
    errors = custom_resource_errors(body({"tracing": {"endpoint": endpoint}}))
    assert (errors == []) == admitted, errors


def _sampler(values: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> Any:
    """The sampler OpenTelemetry's SDK makes of the rendered variables (as the worker's
    TracerProvider does: tracing.py leaves the sampler to the SDK)."""
    from opentelemetry.sdk.trace import TracerProvider

    for name in ("OTEL_TRACES_SAMPLER", "OTEL_TRACES_SAMPLER_ARG"):
        monkeypatch.delenv(name, raising=False)
        if name in values:
            monkeypatch.setenv(name, values[name])
    return TracerProvider().sampler


@pytest.mark.parametrize("ratio", [-0.1, 0, 0.001, 0.5, 1, 1.5])
def test_a_sampling_ratio_the_crd_admits_is_the_sdks_ratio(
    ratio: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    resource = body({"tracing": {"endpoint": COLLECTOR, "samplingRatio": ratio}})
    admitted = custom_resource_errors(resource) == []
    assert admitted == (0 <= ratio <= 1)
    if not admitted:
        return
    sampler = _sampler(env(resource), monkeypatch)
    # Parent-based: the ratio decides for roots, which every span is when it links.
    assert sampler.get_description().startswith(
        f"ParentBased{{root:TraceIdRatioBased{{{float(ratio)}}}"
    )


def test_without_a_ratio_the_sdk_samples_every_span(monkeypatch: pytest.MonkeyPatch) -> None:
    sampler = _sampler(env(body({"tracing": {"endpoint": COLLECTOR}})), monkeypatch)
    assert sampler.get_description().startswith("ParentBased{root:AlwaysOnSampler")


def test_the_worker_takes_the_rendered_tracing_variables() -> None:
    from outbox.worker import tracing
    from outbox.worker.settings import load_settings as worker_settings

    for parent in TRACING_PARENTS:
        values = env(body({"tracing": {"endpoint": COLLECTOR, "parent": parent}}))
        values["OUTBOX_DSN"] = "postgresql://app@db/orders"
        settings = worker_settings([], values)
        assert settings.otel_parent == parent
        assert tracing.wanted(values)
