"""CloudEvents on every transport, in both modes, parsed by the `cloudevents` SDK itself:
`from_http` on what a real HTTP server received, `from_kafka` on what a consumer read from
librdkafka's mock cluster, and the NATS messages stored by a real JetStream converted to the
SDK's HTTP message (the NATS binding's headers are the HTTP binding's `ce-` headers) and parsed.
Every attribute is compared with the row it came from."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import pytest
from cloudevents.core.base import BaseCloudEvent
from cloudevents.core.bindings.http import HTTPMessage, from_http
from cloudevents.core.bindings.kafka import KafkaMessage, from_kafka
from cloudevents.core.formats.json import JSONFormat
from helpers import row, wait_until
from kafka_mock import MockCluster, mock_cluster
from test_kafka import FREED_UNSENT, REFUSED, consume_all
from test_nats import create_stream, stream_messages
from wire import Receiver
from workers import dispatching, settings

from outbox import Event, enqueue_many
from outbox.controller.spec import DispatcherSpec
from outbox.models import Message
from outbox.worker.cli import make_publisher
from outbox.worker.metrics import Metrics
from outbox.worker.publishers.base import PermanentError
from outbox.worker.publishers.formats import (
    CloudEvents,
    cloudevents_source,
    default_source,
    percent_encoded,
)
from outbox.worker.publishers.http import HttpPublisher
from outbox.worker.publishers.kafka import KafkaPublisher
from outbox.worker.publishers.nats import NatsPublisher
from outbox.worker.settings import load_settings

MODES = ["cloudevents-binary", "cloudevents-structured"]
SOURCE = "/outbox/orders"
# Strings a header must percent-encode (space, quote, percent, non-ASCII) and JSON must escape.
EVENTS = [
    Event("order", 'ö 1/"50%"', "order.paid v2", {"total": 12, "note": "é"}),
    Event("Order Line", "ol-2", "LineAdded", [1, 2, {"x": None}]),
]


@pytest.fixture
def cluster() -> Iterator[MockCluster]:
    with mock_cluster(3) as mc:
        mc.create_topic("order", partitions=4, replication_factor=3)
        mc.create_topic("Order_Line", partitions=2, replication_factor=3)
        yield mc


def _seed(conn) -> dict[int, Event]:
    with conn.transaction():
        ids = enqueue_many(conn, EVENTS, trace_context=False)
    return dict(zip(ids, EVENTS, strict=True))


async def _all_done(conn, ids) -> None:
    await wait_until(lambda: all(row(conn, i)["status"] == "done" for i in ids), timeout=30)


def _assert_matches_row(event: BaseCloudEvent, conn, seeded: dict[int, Event]) -> None:
    message_id = int(event.get_id())
    stored, given = row(conn, message_id), seeded[message_id]
    assert event.get_specversion() == "1.0"
    assert event.get_source() == SOURCE
    assert event.get_type() == stored["event_type"] == given.event_type
    assert event.get_subject() == stored["aggregate_id"] == given.aggregate_id
    assert event.get_time() == stored["created_at"]
    assert event.get_datacontenttype() == "application/json"
    assert event.get_extension("aggregatetype") == stored["aggregate_type"]
    assert str(event.get_extension("attempt")) == str(stored["attempts"]) == "1"
    data = event.get_data()
    assert (json.loads(data) if isinstance(data, bytes | str) else data) == given.payload


@pytest.mark.parametrize("mode", MODES)
async def test_http_requests_parse_as_cloudevents(conn, dsn, mode):
    seeded = _seed(conn)
    async with Receiver() as receiver:
        publisher = HttpPublisher(receiver.url, owner="t", wire_format=mode, source=SOURCE)
        async with dispatching(settings(dsn), publisher):
            requests = await receiver.wait_for(len(seeded))
            await _all_done(conn, seeded)
    for request in requests:
        event = from_http(HTTPMessage(dict(request.headers), request.body), JSONFormat())
        _assert_matches_row(event, conn, seeded)
        # The project's own headers stay in every format.
        assert request.headers["Idempotency-Key"] == event.get_id()
        assert request.headers["Outbox-Attempt"] == "1"
        if mode == "cloudevents-binary":
            assert request.headers["Content-Type"] == "application/json"
            assert json.loads(request.body) == seeded[int(event.get_id())].payload  # verbatim
        else:
            assert request.headers["Content-Type"].startswith("application/cloudevents+json")
            assert not any(name.lower().startswith("ce-") for name in request.headers)


@pytest.mark.parametrize("mode", MODES)
async def test_kafka_records_parse_as_cloudevents_and_keep_the_key(conn, dsn, cluster, mode):
    seeded = _seed(conn)
    publisher = KafkaPublisher(cluster.bootstraps, wire_format=mode, source=SOURCE)
    async with dispatching(settings(dsn), publisher):
        await _all_done(conn, seeded)
    records = consume_all(cluster.bootstraps, "order", 1) + consume_all(
        cluster.bootstraps, "Order_Line", 1
    )
    assert len(records) == len(seeded)
    for record in records:
        headers = dict(record.headers())
        message = KafkaMessage(headers=headers, key=record.key(), value=record.value())
        event = from_kafka(message, JSONFormat())
        _assert_matches_row(event, conn, seeded)
        assert record.key() == seeded[int(event.get_id())].aggregate_id.encode()
        assert headers["outbox-id"] == event.get_id().encode()
        if mode == "cloudevents-binary":
            assert headers["content-type"] == b"application/json"
            # The SDK reads the record's key as the partitionkey extension.
            assert event.get_extension("partitionkey") == record.key().decode()
        else:
            assert headers["content-type"].startswith(b"application/cloudevents+json")


@pytest.mark.parametrize("mode", MODES)
async def test_nats_messages_parse_as_cloudevents(conn, dsn, nats_server, mode):
    await create_stream(nats_server.url)
    seeded = _seed(conn)
    publisher = NatsPublisher(
        [nats_server.url], subject="outbox.{aggregate_type}", wire_format=mode, source=SOURCE
    )
    async with dispatching(settings(dsn), publisher):
        await _all_done(conn, seeded)
    stored = await stream_messages(nats_server.url)
    assert len(stored) == len(seeded)
    for message in stored:
        headers = dict(message.headers or {})
        if mode == "cloudevents-binary":
            # Every attribute is a header, `datacontenttype` included (the NATS binding).
            assert headers["ce-datacontenttype"] == "application/json"
            assert "Content-Type" not in headers
        else:
            assert headers["Content-Type"].startswith("application/cloudevents+json")
        event = from_http(HTTPMessage(headers, message.data or b""), JSONFormat())
        _assert_matches_row(event, conn, seeded)
        assert headers["Nats-Msg-Id"] == event.get_id()


# -- settings and edges ------------------------------------------------------------------------


def test_format_and_source_reach_every_publisher_from_flags_and_variables(cluster):
    base = ["--dsn", "", "--table", "app.orders"]
    for publisher, options in [
        ("http", ["--http-url", "http://127.0.0.1:1/"]),
        ("nats", []),
        ("kafka", ["--kafka-bootstrap-servers", cluster.bootstraps]),
    ]:
        chosen = load_settings(
            [*base, "--publisher", publisher, *options], {"OUTBOX_FORMAT": "cloudevents-binary"}
        )
        made: Any = make_publisher(chosen, Metrics())
        assert made.format == "cloudevents-binary"
        assert made._cloudevents.source == "/outbox/app.orders" == default_source("app.orders")
    given = load_settings(["--format", "cloudevents-structured", "--cloudevents-source", "urn:x"])
    assert (given.format, given.cloudevents_source) == ("cloudevents-structured", "urn:x")
    assert load_settings([]).format == "envelope"


@pytest.mark.parametrize(
    ("argv", "error"),
    [
        (["--format", "cloudevents"], "--format: 'cloudevents' is not one of envelope, "),
        (["--cloudevents-source", "a b"], "--cloudevents-source: 'a b' is not a URI-reference"),
        (["--cloudevents-source", ""], "--cloudevents-source: '' is not a URI-reference"),
    ],
)
def test_bad_format_settings_are_refused(argv, error):
    from outbox.plumbing.errors import SettingError

    with pytest.raises(SettingError, match="^" + error.replace("(", r"\(")):
        load_settings(argv, {})


@pytest.mark.parametrize(
    ("field", "value", "reason"),
    [
        ("event_type", "", "event_type is empty: a CloudEvent needs a type"),
        ("event_type", "Paid\r\nX: 1", "event_type 'Paid\\r\\nX: 1' holds a control character"),
        ("aggregate_type", "a\x00b", "aggregate_type 'a\\x00b' holds a control character"),
        ("aggregate_id", "x\x85", "aggregate_id 'x\\x85' holds a control character"),
    ],
)
def test_a_message_that_cannot_be_a_cloudevent_is_permanent(field, value, reason):
    from datetime import UTC, datetime

    message = Message(1, 1, 1, "order", "o-1", "Paid", "{}", datetime.now(UTC))
    message = message._replace(**{field: value})
    events = CloudEvents(SOURCE)
    for encode in (events.structured, events.http_binary, events.nats_binary, events.kafka_binary):
        with pytest.raises(PermanentError, match="^" + reason.replace("\\", "\\\\")):
            encode(message)


def test_an_empty_aggregate_id_leaves_the_subject_out():
    from datetime import UTC, datetime

    message = Message(1, 1, 1, "order", "", "Paid", "{}", datetime.now(UTC))
    event = from_http(
        HTTPMessage({**CloudEvents(SOURCE).http_binary(message)}, b"{}"), JSONFormat()
    )
    assert event.get_subject() is None
    assert '"subject"' not in CloudEvents(SOURCE).structured(message)


def test_header_values_are_percent_encoded_as_the_binding_says():
    assert percent_encoded("plain-ASCII_1.0:/x") == "plain-ASCII_1.0:/x"
    assert (
        percent_encoded('Euro € 😀 "q" 50%') == "Euro%20%E2%82%AC%20%F0%9F%98%80%20%22q%22%2050%25"
    )


@pytest.mark.parametrize("mode", ["envelope", *MODES])
async def test_kafka_failures_reported_later_land_on_their_own_cloudevents(cluster, mode, caplog):
    """A delivery report carries the value, which is no longer the envelope: a failure is
    still placed on its own message, never spread over the batch as "in doubt"."""
    from datetime import UTC, datetime

    from kafka_mock import PRODUCE

    from outbox.worker.publishers.kafka import KafkaError

    cluster.push_request_errors(PRODUCE, KafkaError.TOPIC_AUTHORIZATION_FAILED)
    publisher = KafkaPublisher(cluster.bootstraps, wire_format=mode, source=SOURCE)
    await publisher.start()
    try:
        messages = [
            Message(i, 1, 1, "order", f"o-{i}", "Paid", f'{{"n": {i}}}', datetime.now(UTC))
            for i in range(1, 41)
        ]
        results = await publisher.publish_batch(messages)
    finally:
        await publisher.close()
    failed = {m.id for m, r in zip(messages, results, strict=True) if r is not None}
    assert failed
    # Each failure was placed (librdkafka may fail the topic's other requests too).
    assert "could not be placed" not in caplog.text
    # The injected error, and at most librdkafka's retryable _DESTROY for a message the
    # topic's removal dropped unsent (test_kafka.py says when): nothing else.
    outcomes = {(type(r), str(r)) for r in results if r is not None}
    assert REFUSED in outcomes
    assert outcomes <= {REFUSED, FREED_UNSENT}, outcomes
    consumed = consume_all(cluster.bootstraps, "order", 40 - len(failed))
    delivered = sorted(int(dict(m.headers())["outbox-id"]) for m in consumed)
    assert delivered == sorted(m.id for m in messages if m.id not in failed)


# -- the operator ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("publisher", "spec"),
    [
        ("http", {"publisher.http": {"url": "http://e.example/in/{event_type}"}}),
        ("nats", {"publisher.nats": {"urls": ["nats://n:4222"]}}),
        ("kafka", {"publisher.kafka": {"bootstrapServers": "k:9092"}}),
    ],
)
@pytest.mark.parametrize("mode", ["envelope", *MODES])
def test_the_crd_format_reaches_the_worker(publisher, spec, mode):
    from test_controller_crd import _body, _crd_errors, _worker_error

    from outbox.controller.render import render_deployment

    body = _body(
        {
            "publisher.type": publisher,
            **spec,
            "publisher.format": mode,
            "publisher.cloudEventsSource": "urn:shop:orders",
        }
    )
    from chart.chart import crd_schema

    assert _crd_errors(body) == []
    assert _worker_error(body) is None
    crd_schema().default(body)  # as an API server stores it
    container = render_deployment(DispatcherSpec.parse(body), replicas=1, default_image="x")[
        "spec"
    ]["template"]
    env = {e["name"]: e.get("value") for e in container["spec"]["containers"][0]["env"]}
    assert (env["OUTBOX_FORMAT"], env["OUTBOX_CLOUDEVENTS_SOURCE"]) == (mode, "urn:shop:orders")


@pytest.mark.parametrize(
    ("fields", "admitted", "worker_accepts"),
    [
        ({"publisher.format": "cloudevents"}, False, False),
        ({"publisher.cloudEventsSource": "has space"}, False, False),
        # An empty variable is an unset one to the worker (its default); the CRD says so.
        ({"publisher.cloudEventsSource": ""}, False, True),
        ({"publisher.type": "log", "publisher.format": "cloudevents-binary"}, False, True),
        ({"publisher.format": "cloudevents-structured"}, True, True),
        ({"publisher.cloudEventsSource": "urn:" + "x" * 1020}, True, True),
        ({"publisher.cloudEventsSource": "urn:" + "x" * 1021}, False, False),
    ],
)
def test_the_crd_refuses_what_the_worker_would(fields, admitted, worker_accepts):
    from test_controller_crd import _body, _crd_errors, _worker_error

    http = {"publisher.type": "http", "publisher.http": {"url": "http://e.example/in"}}
    body = _body({**http, **fields})
    if fields.get("publisher.type") == "log":
        del body["spec"]["publisher"]["http"]
    assert (_crd_errors(body) == []) is admitted
    assert (_worker_error(body) is None) is worker_accepts


# Characters Python's `\s` matches and a Go (RE2) API server's does not, and a plain value.
RE2_TRAPS = {
    "no-break space": "/outbox/a\u00a0b",
    "next line (U+0085)": "/outbox/a\u0085b",
    "line separator (U+2028)": "/outbox/a\u2028b",
    "plain": "urn:shop:orders",
}
# Classes whose meaning differs between Python's re and RE2 (Unicode or ASCII).
ENGINE_DEPENDENT = re.compile(r"\\[sSwWdDbB]")


def _crd_pattern(*path: str) -> str:
    from test_controller_crd import SCHEMA

    node = SCHEMA
    for name in path:
        node = node["properties"][name]
    return str(node["pattern"])


@pytest.mark.parametrize("what", list(RE2_TRAPS))
def test_the_crd_pattern_and_the_worker_agree_on_the_cloudevents_source(what):
    """The CRD's pattern has no engine-dependent class, so Python's re reads it as an API
    server's RE2 does (with or without re.ASCII), and admits exactly what the worker takes."""
    from test_controller_crd import _body, _crd_errors, _worker_error

    pattern = _crd_pattern("spec", "publisher", "cloudEventsSource")
    assert ENGINE_DEPENDENT.search(pattern) is None, pattern
    value = RE2_TRAPS[what]
    admitted = re.search(pattern, value) is not None
    assert (re.search(pattern, value, re.ASCII) is not None) is admitted
    body = _body(
        {
            "publisher.type": "http",
            "publisher.http": {"url": "http://e.example/in"},
            "publisher.cloudEventsSource": value,
        }
    )
    assert (_crd_errors(body) == []) is admitted
    try:
        cloudevents_source(value)
        worker_accepts = True
    except ValueError:
        worker_accepts = False
    assert worker_accepts is admitted is (what == "plain")
    assert (_worker_error(body) is None) is admitted
