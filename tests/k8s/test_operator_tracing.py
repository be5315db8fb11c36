"""Publish spans turned on from the custom resource: `spec.worker.tracing` reaches the worker
pods as OpenTelemetry's variables through the real operator, `kubectl explain` describes it,
and a worker the local kubelet runs exports its spans to a real OTLP/HTTP receiver (decoded
with `opentelemetry-proto`), in the producer's trace and named after the dispatcher."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.trace import SpanKind
from test_tracing import OtlpReceiver, _attributes

from outbox import enqueue

from .cluster import LocalCluster
from .kubelet import Kubelet
from .test_operator import (
    NS,
    Operator,
    apply,
    condition,
    dispatcher_manifest,
    get,
    secret_manifest,
    wait_for,
)

pytestmark = pytest.mark.slow


@pytest.fixture
def otlp() -> Iterator[OtlpReceiver]:
    with OtlpReceiver() as receiver:
        yield receiver


def test_kubectl_explain_describes_the_tracing_block(cluster: LocalCluster) -> None:
    for path, says in [
        ("obd.spec.worker.tracing", "OTLP/HTTP collector"),
        ("obd.spec.worker.tracing.endpoint", "OTEL_EXPORTER_OTLP_ENDPOINT"),
        ("obd.spec.worker.tracing.parent", "--otel-parent"),
        ("obd.spec.worker.tracing.samplingRatio", "parentbased_traceidratio"),
        ("obd.spec.worker.tracing.serviceName", "OTEL_SERVICE_NAME"),
    ]:
        text = cluster.kubectl("explain", path).stdout
        assert says in " ".join(text.split()), (path, text)  # kubectl wraps the lines
        assert "<no description>" not in text, (path, text)


def test_kubectl_apply_refuses_an_endpoint_with_credentials(cluster: LocalCluster) -> None:
    import yaml

    tracing = {"endpoint": "http://user:hunter2@collector:4318"}
    manifest = dispatcher_manifest("traced", worker={"tracing": tracing})
    result = cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(manifest), check=False)
    assert result.returncode != 0
    assert "spec.worker.tracing.endpoint" in result.stderr, result.stderr
    assert cluster.objects("outbox.dev/v1alpha1", "outboxdispatchers", NS) == []


# `dsn` first: the database outlives the workers at teardown.
def test_a_worker_pod_exports_its_publish_spans_where_the_resource_says(
    dsn: str,
    cluster: LocalCluster,
    kubelet: Kubelet,
    operators: Callable[..., Operator],
    otlp: OtlpReceiver,
) -> None:
    operators()
    collector = otlp.endpoint.removesuffix("/v1/traces")  # the exporter adds the signal's path
    worker: dict[str, Any] = {
        "tracing": {"endpoint": collector, "parent": "parent", "serviceName": "orders-relay"},
        # Other OTEL_* variables still come through env: spans exported within 50 ms.
        "env": [{"name": "OTEL_BSP_SCHEDULE_DELAY", "value": "50"}],
    }
    apply(
        cluster,
        secret_manifest("orders-db", dsn=dsn),
        dispatcher_manifest(publisher={"type": "null"}, worker=worker),
    )
    wait_for(
        "a ready worker", lambda: condition(cluster, "orders", "Ready").get("status") == "True"
    )
    deployment = get(cluster, "deployments", "orders-worker")
    assert deployment is not None
    [container] = deployment["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["OTEL_EXPORTER_OTLP_ENDPOINT"] == collector
    assert env["OTEL_TRACES_EXPORTER"] == "otlp"
    assert env["OUTBOX_OTEL_PARENT"] == "parent"
    assert env["OTEL_SERVICE_NAME"] == "orders-relay"

    # A producer span, `enqueue` in it: the worker's span is its child (parent), in its trace.
    tracer = TracerProvider().get_tracer("tests.producer")
    with (
        psycopg.connect(dsn, autocommit=True) as conn,
        tracer.start_as_current_span("place order", kind=SpanKind.SERVER) as producer,
        conn.transaction(),
    ):
        message_id = enqueue(conn, aggregate_type="order", aggregate_id="o-1",
                             event_type="OrderPlaced", payload={"n": 1})  # fmt: skip
    assert otlp.wait_for(lambda: len(otlp.publish_spans(message_id)) == 1, timeout=30)
    [span] = otlp.publish_spans(message_id)
    context = producer.get_span_context()
    assert span.trace_id == context.trace_id.to_bytes(16, "big")
    assert span.parent_span_id == context.span_id.to_bytes(8, "big")
    [resource] = [r for r, s in otlp.spans if s.span_id == span.span_id]
    assert resource["service.name"] == "orders-relay"
    assert resource["outbox.dispatcher"] == "orders"
    assert resource["k8s.namespace.name"] == NS
    assert _attributes(span.attributes)["messaging.system"] == "null"
    # The pod's start-up line says so.
    [pod] = kubelet.pods(NS, "orders-worker")
    assert f"traces otlp to {collector} (parent)" in kubelet.logs(NS, pod.name)
