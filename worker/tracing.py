"""Publish spans, following OpenTelemetry's messaging conventions (docs/tracing.md).

With the `otel` extra installed and the standard OTEL_* environment asking for traces, each
publish of a message is a `send` span of kind PRODUCER, named `send <destination>`, with
the conventions' attributes and the attempt (`outbox.attempt`). The producer's trace context,
stored in the message's headers by `enqueue`, is the span's **link** by default: the
conventions say a creation context "SHOULD NOT be modified", and the publish may happen long
after the producer's trace ended, once per attempt. `--otel-parent parent` makes it the
span's parent instead (one trace per message). Either way each attempt is a span of its own,
never a child of the previous attempt's.

Nothing here imports OpenTelemetry unless the environment asks for traces: a worker without
the extra, or without OTEL_* variables, publishes through the publisher's own methods, with
no wrapper in between.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from outbox.models import Message
from outbox.worker.publishers.base import PublisherBase, reason

if TYPE_CHECKING:
    from opentelemetry.context import Context
    from opentelemetry.trace import Span, Tracer

log = logging.getLogger("outbox.worker")

Publish = Callable[[Message], Awaitable[None]]
PublishBatch = Callable[[Sequence[Message]], Awaitable[Sequence[Exception | None]]]

# What asks for traces: an exporter chosen, or an OTLP endpoint given (the exporter's default,
# `otlp`, then applies). Without any of them the worker does not trace, installed or not.
_ASKING = (
    "OTEL_TRACES_EXPORTER",
    "OTEL_EXPORTER_OTLP_ENDPOINT",
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
)
SERVICE_NAME = "outbox-worker"  # unless OTEL_SERVICE_NAME or OTEL_RESOURCE_ATTRIBUTES say


def wanted(env: Mapping[str, str]) -> bool:
    """Whether the environment asks for traces (and does not turn the SDK off)."""
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    exporters = env.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if exporters == "none":
        return False
    return any(env.get(name, "").strip() for name in _ASKING)


def publish_calls(
    publisher: PublisherBase, parent: str, env: Mapping[str, str] = os.environ
) -> tuple[Publish | None, PublishBatch | None]:
    """The publisher's `publish`, or `publish_batch` when it is `batched` (None for the other
    one), making a span per message when the environment asks for traces; untouched
    otherwise."""
    publish: Publish | None = None if publisher.batched else publisher.publish
    publish_batch: PublishBatch | None = publisher.publish_batch if publisher.batched else None
    if not wanted(env):
        return publish, publish_batch
    try:
        spans = Spans(publisher, parent, env)
    except ImportError as exc:
        log.warning(
            "OTEL_* variables ask for traces but OpenTelemetry is not installed (%s); install "
            "outbox-dispatcher[otel] for publish spans",
            exc,
        )
        return publish, publish_batch
    return (
        None if publish is None else spans.wrap(publish),
        None if publish_batch is None else spans.wrap_batch(publish_batch),
    )


class Spans:
    """Makes the publish spans of one publisher; imports OpenTelemetry when made."""

    def __init__(self, publisher: PublisherBase, parent: str, env: Mapping[str, str]) -> None:
        from opentelemetry import trace
        from opentelemetry.context import Context
        from opentelemetry.propagate import extract
        from opentelemetry.trace import Link, SpanKind, Status, StatusCode

        self._tracer: Tracer = _tracer(env)
        self._extract, self._empty, self._span_of = extract, Context(), trace.get_current_span
        self._link, self._producer, self._error = Link, SpanKind.PRODUCER, Status
        self._error_code, self._reason = StatusCode.ERROR, reason  # redacted as last_error is
        self._as_parent = parent == "parent"
        self._system = publisher.name
        self._name, self._template, self._destination = _destination(publisher)
        # Where it is known (the HTTP origin, a broker cluster's first server): the
        # conventions' `server.address` and `server.port`, the same for every message.
        self._server: dict[str, Any] = {}
        server = publisher.server
        if server is not None:
            self._server["server.address"] = server[0]
            if server[1] is not None:
                self._server["server.port"] = server[1]

    def start(self, message: Message) -> Span:
        """The span of one attempt to send `message`, started now."""
        links = []
        context: Context = self._empty  # a root of its own: never a child of what runs now
        headers = message.headers
        if headers:
            stored = self._extract(headers, context=self._empty)
            span_context = self._span_of(stored).get_span_context()
            if span_context.is_valid:
                if self._as_parent:
                    context = stored
                else:
                    links.append(self._link(span_context))
        attributes: dict[str, Any] = {
            "messaging.system": self._system,
            "messaging.operation.type": "send",
            "messaging.operation.name": "send",
            "messaging.destination.name": self._destination(message),
            "messaging.message.id": str(message.id),
            "outbox.attempt": message.attempts,
            "outbox.aggregate_type": message.aggregate_type,
            "outbox.event_type": message.event_type,
        }
        if self._template is not None:
            attributes["messaging.destination.template"] = self._template
        attributes.update(self._server)
        return self._tracer.start_span(
            self._name, context=context, kind=self._producer, links=links, attributes=attributes
        )

    def end(self, span: Span, error: BaseException | None) -> None:
        """End a span with how its publish went: an error's type and reason, or nothing."""
        if error is not None:
            span.set_attribute("error.type", type(error).__qualname__)
            span.set_status(self._error(self._error_code, self._reason(error)))
        span.end()

    def wrap(self, publish: Publish) -> Publish:
        async def traced(message: Message) -> None:
            span = self.start(message)
            try:
                await publish(message)
            except BaseException as exc:  # a timeout's cancel too: the span says so
                self.end(span, exc)
                raise
            self.end(span, None)

        return traced

    def wrap_batch(self, publish_batch: PublishBatch) -> PublishBatch:
        async def traced(messages: Sequence[Message]) -> Sequence[Exception | None]:
            spans = [self.start(message) for message in messages]
            try:
                results = await publish_batch(messages)
            except BaseException as exc:
                for span in spans:
                    self.end(span, exc)
                raise
            for span, error in zip(spans, results, strict=False):
                self.end(span, error)
            for span in spans[len(results) :]:  # a wrong count: the loop reports it
                self.end(span, None)
            return results

        return traced


def _tracer(env: Mapping[str, str]) -> Tracer:
    """The tracer of a provider configured from the OTEL_* environment, or of the one the
    process already has (e.g. under `opentelemetry-instrument`)."""
    from opentelemetry import trace

    if not isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider):
        return trace.get_tracer("outbox.worker")
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter

    resource = Resource.create()
    if str(resource.attributes.get("service.name", "")).startswith("unknown_service"):
        resource = resource.merge(Resource({"service.name": SERVICE_NAME}))
    provider = TracerProvider(resource=resource)  # sampler from OTEL_TRACES_SAMPLER
    names = [n.strip().lower() for n in env.get("OTEL_TRACES_EXPORTER", "otlp").split(",")]
    for name in filter(None, names):
        if name == "otlp":
            protocol = env.get(
                "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", env.get("OTEL_EXPORTER_OTLP_PROTOCOL", "")
            )
            if protocol.strip() not in ("", "http/protobuf"):
                log.warning(
                    "OTLP protocol %r is not supported; exporting with http/protobuf", protocol
                )
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

            # Endpoint, headers, timeout, compression: the exporter reads OTEL_EXPORTER_OTLP_*.
            provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
        elif name == "console":
            provider.add_span_processor(BatchSpanProcessor(ConsoleSpanExporter()))
        else:
            log.warning("OTEL_TRACES_EXPORTER %r is not supported (use otlp or console)", name)
    # Global, so that client instrumentation in the same process joins the same provider; it
    # flushes what it holds when the process exits.
    trace.set_tracer_provider(provider)
    return provider.get_tracer("outbox.worker")


def _destination(
    publisher: PublisherBase,
) -> tuple[str, str | None, Callable[[Message], str]]:
    """The span name (`send` and the destination's template: few distinct names), the
    template when names are rendered per message, and each message's destination name: the
    publisher's `destination_name(message)` where it has a template (a NATS subject's, a
    Kafka topic's), the template when that refuses the message; else the destination the
    worker tracks (the HTTP origin: never a URL's path, query or credentials)."""
    template = publisher.destination_template
    if template is None:
        return f"send {publisher.one_destination()}", None, publisher.destination_of
    rendered = template if "{" in template else None
    name_of = publisher.destination_name

    def subject_of(message: Message) -> str:
        try:
            return name_of(message)
        except Exception:  # a name the publisher refuses: its publish says why
            return template

    return f"send {template}", rendered, subject_of
