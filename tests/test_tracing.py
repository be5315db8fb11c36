"""Trace context through the outbox, with OpenTelemetry's own libraries.

`enqueue` stores the active span's W3C context in the message's headers; a real worker
process (the `otel` extra, configured by OTEL_* variables) exports its publish spans to a
real OTLP/HTTP receiver started here, whose requests are decoded with `opentelemetry-proto`.
Without OpenTelemetry in use, neither side imports it.
"""

from __future__ import annotations

import gzip
import os
import subprocess
import sys
import textwrap
import threading
import urllib.parse
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import psycopg
import pytest
from helpers import wait_until
from opentelemetry import baggage, context, trace
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.trace.v1.trace_pb2 import Span as SpanProto
from opentelemetry.proto.trace.v1.trace_pb2 import Status as StatusProto
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.trace import (
    NonRecordingSpan,
    SpanContext,
    SpanKind,
    TraceFlags,
    TraceState,
)
from workers import stop_worker

from outbox import Event, enqueue, enqueue_many
from outbox.demo.sink import Reply, Sink

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent


# -- a real OTLP/HTTP receiver -----------------------------------------------------------------


class OtlpReceiver:
    """An OTLP/HTTP traces endpoint: decodes each ExportTraceServiceRequest and keeps its
    spans, with their resource's attributes."""

    def __init__(self) -> None:
        self.spans: list[tuple[dict[str, Any], SpanProto]] = []
        self._changed = threading.Condition()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                request = ExportTraceServiceRequest.FromString(body)
                receiver._took(self.path, request)
                answer = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self.paths: list[str] = []

    @property
    def endpoint(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}/v1/traces"

    def _took(self, path: str, request: ExportTraceServiceRequest) -> None:
        with self._changed:
            self.paths.append(path)
            for resource_spans in request.resource_spans:
                resource = _attributes(resource_spans.resource.attributes)
                for scope_spans in resource_spans.scope_spans:
                    self.spans.extend((resource, span) for span in scope_spans.spans)
            self._changed.notify_all()

    def wait_for(self, predicate: Callable[[], bool], timeout: float = 60.0) -> bool:
        with self._changed:
            return self._changed.wait_for(predicate, timeout)

    def publish_spans(self, message_id: int) -> list[SpanProto]:
        with self._changed:
            return sorted(
                (
                    span
                    for _, span in self.spans
                    if _attributes(span.attributes).get("messaging.message.id") == str(message_id)
                ),
                key=lambda span: span.start_time_unix_nano,
            )

    def __enter__(self) -> OtlpReceiver:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()


def _attributes(values: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for kv in values:
        which = kv.value.WhichOneof("value")
        out[kv.key] = getattr(kv.value, which) if which else None
    return out


@pytest.fixture
def otlp() -> Iterator[OtlpReceiver]:
    with OtlpReceiver() as receiver:
        yield receiver


# -- the producer side -------------------------------------------------------------------------


@pytest.fixture
def tracer() -> trace.Tracer:
    """A tracer of an SDK provider of the test's own (the global one is left alone)."""
    return TracerProvider().get_tracer("tests.producer")


def _traceparent(span_context: SpanContext) -> str:
    flags = int(span_context.trace_flags)  # sampled, and W3C level 2's random trace id bit
    return f"00-{span_context.trace_id:032x}-{span_context.span_id:016x}-{flags:02x}"


def _headers_of(conn: psycopg.Connection, message_id: int) -> Any:
    return conn.execute("SELECT headers FROM outbox WHERE id = %s", (message_id,)).fetchone()[0]


def test_enqueue_stores_the_active_span_context_and_baggage(conn, tracer):
    upstream = SpanContext(
        trace_id=0x0AF7651916CD43DD8448EB211C80319C,
        span_id=0xB7AD6B7169203331,
        is_remote=True,
        trace_flags=TraceFlags(TraceFlags.SAMPLED),
        trace_state=TraceState([("vendor", "v1"), ("other", "x")]),
    )
    remote = trace.set_span_in_context(NonRecordingSpan(upstream))
    with tracer.start_as_current_span("checkout", context=remote) as span:
        token = context.attach(baggage.set_baggage("tenant", "t-1"))
        try:
            with conn.transaction():
                one = enqueue(conn, aggregate_type="order", aggregate_id="1", event_type="Paid",
                              payload={}, headers={"x-tenant": "t-1"})  # fmt: skip
                [two] = enqueue_many(conn, [Event("order", "1", "Paid", {})])
                off = enqueue(conn, aggregate_type="order", aggregate_id="1", event_type="Paid",
                              payload={}, trace_context=False)  # fmt: skip
                own = enqueue(conn, aggregate_type="order", aggregate_id="1", event_type="Paid",
                              payload={}, headers={"traceparent": "mine"})  # fmt: skip
        finally:
            context.detach(token)
    producer = span.get_span_context()
    assert producer.trace_id == upstream.trace_id  # the test's span is the upstream's child
    stored = {
        "traceparent": _traceparent(producer),
        "tracestate": "vendor=v1,other=x",
        "baggage": "tenant=t-1",
    }
    assert _headers_of(conn, one) == {**stored, "x-tenant": "t-1"}
    assert _headers_of(conn, two) == stored
    assert _headers_of(conn, off) is None
    assert _headers_of(conn, own) == {**stored, "traceparent": "mine"}  # the caller's wins


def test_without_an_active_span_nothing_is_stored(conn, tracer):
    with conn.transaction():
        message_id = enqueue(conn, aggregate_type="a", aggregate_id="1", event_type="E",
                             payload={})  # fmt: skip
    assert _headers_of(conn, message_id) is None
    with tracer.start_as_current_span("done"):
        pass  # ended: no longer active
    with conn.transaction():
        message_id = enqueue(conn, aggregate_type="a", aggregate_id="1", event_type="E",
                             payload={})  # fmt: skip
    assert _headers_of(conn, message_id) is None


# As if OpenTelemetry were not installed: no finder finds it.
_ABSENT = """
class Absent:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "opentelemetry":
            raise ModuleNotFoundError(name)
sys.meta_path.insert(0, Absent())
"""

_PRODUCER_SCRIPT = """
import sys
{before}
import psycopg
from outbox import enqueue

with psycopg.connect(sys.argv[1], autocommit=True) as conn:
    message_id = enqueue(conn, aggregate_type="a", aggregate_id="1", event_type="E",
                         payload={{}}, headers={{"k": "v"}})
    print(message_id)
print(sorted(name for name in sys.modules if name.split(".")[0] == "opentelemetry"))
"""


@pytest.mark.parametrize(
    ("before", "imported"),
    [
        ("", "[]"),  # installed (this venv has the extra) and unused: never imported
        (_ABSENT, "[]"),  # not installed
    ],
    ids=["unused", "not-installed"],
)
def test_a_producer_without_opentelemetry_imports_nothing_of_it(dsn, conn, before, imported):
    script = _PRODUCER_SCRIPT.format(before=before)
    out = subprocess.run(
        [sys.executable, "-c", script, dsn], capture_output=True, text=True, check=True, timeout=60
    ).stdout.split("\n")
    assert out[1] == imported
    assert _headers_of(conn, int(out[0])) == {"k": "v"}


# -- the worker side ---------------------------------------------------------------------------


def _spawn(dsn: str, tmp_path: Path, *args: str, env: dict[str, str]) -> subprocess.Popen[bytes]:
    """A real `outbox-worker` with only the OTEL_* variables given; its stderr (JSON logs
    and, with -X importtime, every import) to a file."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    log = open(tmp_path / "worker.log", "ab")  # noqa: SIM115
    return subprocess.Popen(
        [sys.executable, "-X", "importtime", "-m", "outbox.worker", "--owner", "traced",
         "--poll-interval", "100ms", "--backoff-base", "10ms", "--backoff-cap", "20ms", *args],
        env={**base, "OUTBOX_DSN": dsn, "OUTBOX_LOG_FORMAT": "json", **env},
        stdout=log,
        stderr=log,
    )  # fmt: skip


_HTTP = ("--publisher", "http")


def _otel_env(otlp: OtlpReceiver) -> dict[str, str]:
    # The standard variables, as a Deployment would set them; spans exported within 50 ms.
    return {
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": otlp.endpoint,
        "OTEL_BSP_SCHEDULE_DELAY": "50",
    }


def _produce(conn: psycopg.Connection, tracer: trace.Tracer) -> tuple[int, SpanContext]:
    with (
        tracer.start_as_current_span("place order", kind=SpanKind.SERVER) as span,
        conn.transaction(),
    ):
        message_id = enqueue(conn, aggregate_type="order", aggregate_id="o-1",
                             event_type="OrderPlaced", payload={"n": 1})  # fmt: skip
    return message_id, span.get_span_context()


def _status(conn: psycopg.Connection, message_id: int) -> str:
    return str(conn.execute("SELECT status FROM outbox WHERE id = %s", (message_id,)).fetchone()[0])


def _origin(sink: Sink) -> str:
    return sink.url.removesuffix("/events")


async def test_publish_spans_link_to_the_producer_and_each_retry_is_a_span_of_its_own(
    dsn, conn, tracer, otlp, tmp_path
):
    def fail_first(body: dict[str, Any], nth: int) -> Reply:
        return Reply(status=503 if nth == 1 else 200)

    with Sink(fail_first) as sink:
        message_id, producer = _produce(conn, tracer)
        worker = _spawn(dsn, tmp_path, *_HTTP, "--http-url", sink.url, env=_otel_env(otlp))
        try:
            await wait_until(lambda: _status(conn, message_id) == "done", what="delivered")
            assert otlp.wait_for(lambda: len(otlp.publish_spans(message_id)) == 2)
        finally:
            assert stop_worker(worker) == 0
    first, second = otlp.publish_spans(message_id)
    assert otlp.paths == ["/v1/traces"] * len(otlp.paths)
    assert {resource["service.name"] for resource, _ in otlp.spans} == {"outbox-worker"}
    for attempt, span in enumerate((first, second), start=1):
        assert span.name == f"send {_origin(sink)}"
        assert span.kind == SpanProto.SPAN_KIND_PRODUCER
        # Linked, not nested: a root of its own, whose one link is the producer's span.
        assert span.parent_span_id == b""
        assert span.trace_id != producer.trace_id.to_bytes(16, "big")
        [link] = span.links
        assert link.trace_id == producer.trace_id.to_bytes(16, "big")
        assert link.span_id == producer.span_id.to_bytes(8, "big")
        assert _attributes(span.attributes) == {
            "messaging.system": "http",
            "messaging.operation.type": "send",
            "messaging.operation.name": "send",
            "messaging.destination.name": _origin(sink),
            "messaging.message.id": str(message_id),
            "outbox.attempt": attempt,
            "outbox.aggregate_type": "order",
            "outbox.event_type": "OrderPlaced",
            "server.address": urllib.parse.urlsplit(sink.url).hostname,
            "server.port": urllib.parse.urlsplit(sink.url).port,
            **({"error.type": "RetryableError"} if attempt == 1 else {}),
        }
    assert first.status.code == StatusProto.STATUS_CODE_ERROR
    assert "503" in first.status.message
    assert second.status.code == StatusProto.STATUS_CODE_UNSET
    assert first.trace_id != second.trace_id  # the retry does not nest in the first attempt


async def test_otel_parent_makes_the_producer_span_the_parent(dsn, conn, tracer, otlp, tmp_path):
    with Sink() as sink:
        message_id, producer = _produce(conn, tracer)
        worker = _spawn(
            dsn,
            tmp_path,
            *_HTTP,
            "--http-url",
            sink.url,
            "--otel-parent",
            "parent",
            env=_otel_env(otlp),
        )
        try:
            assert otlp.wait_for(lambda: len(otlp.publish_spans(message_id)) == 1)
        finally:
            assert stop_worker(worker) == 0
    [span] = otlp.publish_spans(message_id)
    assert span.trace_id == producer.trace_id.to_bytes(16, "big")
    assert span.parent_span_id == producer.span_id.to_bytes(8, "big")
    assert list(span.links) == []


async def test_the_receiver_gets_the_stored_traceparent_unchanged(
    dsn, conn, tracer, otlp, tmp_path
):
    """The HTTP publisher forwards the message's headers: the receiver continues the
    producer's trace, whatever span the worker made."""
    with Sink() as sink:
        message_id, producer = _produce(conn, tracer)
        worker = _spawn(dsn, tmp_path, *_HTTP, "--http-url", sink.url, env=_otel_env(otlp))
        try:
            assert sink.wait_for(lambda s: len(s.delivered()) == 1)
            assert otlp.wait_for(lambda: len(otlp.publish_spans(message_id)) == 1)
        finally:
            assert stop_worker(worker) == 0
    [request] = sink.delivered()
    received = {name.lower(): value for name, value in request.headers.items()}
    assert (
        received["traceparent"]
        == _traceparent(producer)
        == _headers_of(conn, message_id)["traceparent"]
    )


async def test_a_batch_publisher_makes_a_span_per_message(dsn, conn, tracer, otlp, tmp_path):
    """Kafka publishes in batches: still one span per message, each linked to its own
    producer span."""
    from kafka_mock import mock_cluster

    with mock_cluster(3) as cluster:
        cluster.create_topic("order", partitions=2, replication_factor=3)
        produced = [_produce(conn, tracer) for _ in range(3)]
        worker = _spawn(
            dsn, tmp_path, "--publisher", "kafka", "--kafka-bootstrap-servers",
            cluster.bootstraps, env=_otel_env(otlp),
        )  # fmt: skip
        try:
            assert otlp.wait_for(
                lambda: all(len(otlp.publish_spans(i)) == 1 for i, _ in produced), timeout=60
            )
        finally:
            assert stop_worker(worker) == 0
    for message_id, producer in produced:
        [span] = otlp.publish_spans(message_id)
        assert span.name == "send {aggregate_type}"  # the topic's template: few names
        assert span.kind == SpanProto.SPAN_KIND_PRODUCER
        [link] = span.links
        assert link.span_id == producer.span_id.to_bytes(8, "big")
        attributes = _attributes(span.attributes)
        assert attributes["messaging.system"] == "kafka"
        assert attributes["messaging.destination.template"] == "{aggregate_type}"
        # The rendered topic, not its template; the first bootstrap server.
        assert attributes["messaging.destination.name"] == "order"
        host, port = cluster.bootstraps.split(",")[0].rsplit(":", 1)
        assert (attributes["server.address"], attributes["server.port"]) == (host, int(port))
        assert attributes["outbox.attempt"] == 1
    assert len({span.trace_id for i, _ in produced for span in otlp.publish_spans(i)}) == 3


async def test_a_worker_without_otel_variables_imports_nothing_of_opentelemetry(
    dsn, conn, tracer, tmp_path
):
    with Sink() as sink:
        message_id, _ = _produce(conn, tracer)
        worker = _spawn(dsn, tmp_path, *_HTTP, "--http-url", sink.url, env={})
        try:
            await wait_until(lambda: _status(conn, message_id) == "done", what="delivered")
        finally:
            assert stop_worker(worker) == 0
    imports = (tmp_path / "worker.log").read_text()
    assert "outbox.worker.publishing" in imports  # -X importtime lists every module imported
    assert "opentelemetry" not in imports


def test_otel_sdk_disabled_or_no_exporter_means_no_tracing():
    from outbox.worker.tracing import wanted

    endpoint = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}
    assert wanted(endpoint)
    assert wanted({"OTEL_TRACES_EXPORTER": "console"})
    assert not wanted({})
    assert not wanted({"OTEL_SERVICE_NAME": "x"})  # naming a service asks for nothing
    assert not wanted({**endpoint, "OTEL_SDK_DISABLED": "true"})
    assert not wanted({**endpoint, "OTEL_TRACES_EXPORTER": "none"})


def test_the_worker_modules_import_no_opentelemetry_when_not_asked():
    script = textwrap.dedent(
        """
        import sys
        from outbox.worker import publishing, tracing
        from outbox.worker.publishers.base import declared

        class Publisher:
            name = "p"
            async def publish(self, message): ...

        p = declared(Publisher())
        publish, batch = tracing.publish_calls(p, "link", {})
        assert publish == p.publish and batch is None
        print(sorted(n for n in sys.modules if n.split(".")[0] == "opentelemetry"))
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=60
    ).stdout
    assert out.strip() == "[]"


def test_each_publisher_names_its_server_without_credentials():
    """`server.address` and `server.port` come from the publisher's first server, the
    scheme's port when none is written, never the user-info."""
    from outbox.worker.publishers.http import HttpPublisher
    from outbox.worker.publishers.kafka import KafkaPublisher
    from outbox.worker.publishers.nats import NatsPublisher

    assert NatsPublisher(["nats://user:pw@nats-a:4223", "nats://nats-b"]).server == ("nats-a", 4223)
    assert NatsPublisher(["tls://nats-b"]).server == ("nats-b", 4222)
    assert KafkaPublisher("[::1]:9093,broker-b:9092").server == ("::1", 9093)
    assert KafkaPublisher("broker-a").server == ("broker-a", 9092)
    assert HttpPublisher("https://u:p@hooks.example/in", owner="o").server == ("hooks.example", 443)
    assert HttpPublisher("http://hooks.example:8080/{event_type}", owner="o").server == (
        "hooks.example",
        8080,
    )
