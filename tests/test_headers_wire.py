"""The row's headers on the wire: forwarded by HTTP (to a real server), NATS (stored by a real
JetStream) and Kafka (read back from librdkafka's mock cluster) after the project's own, which
a row can never replace; and the headers a transport cannot carry end the message `dead` with
a reason naming the header, never a broken request."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
from helpers import row, wait_until
from kafka_mock import MockCluster, mock_cluster
from psycopg.types.json import Jsonb
from test_kafka import consume_all
from test_nats import create_stream, stream_messages
from wire import Received, Receiver
from workers import dispatching, settings

from outbox import Event, enqueue_many
from outbox.limits import MAX_HEADERS_BYTES
from outbox.models import Message
from outbox.worker.publishers.base import PermanentError
from outbox.worker.publishers.headers import http_headers, kafka_headers, nats_headers
from outbox.worker.publishers.http import HttpPublisher
from outbox.worker.publishers.kafka import KafkaPublisher
from outbox.worker.publishers.nats import NatsPublisher

TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
FORWARDED = {"traceparent": TRACEPARENT, "tenant": "t-42", "X-Request-Id": "r 1"}
# A row trying to pass for the project (or the transport, or the operator's own headers).
IMPOSTORS = {
    "Idempotency-Key": "999",
    "outbox-id": "999",
    "Outbox-Attempt": "99",
    "Nats-Msg-Id": "999",
    "Nats-Rollup": "all",
    "Content-Type": "text/plain",
    "Authorization": "Bearer row",
    "webhook-id": "999",
    "ce-id": "999",
    "ce_id": "999",
    "Host": "evil.example",
    "Content-Length": "0",
}
# Headers that would change what an HTTP request means (its body's encoding, who sends it,
# where a proxy routes it): never a row's.
HTTP_IMPOSTORS = {
    "Content-Encoding": "gzip",
    "Content-Range": "bytes 0-1/2",
    "Content-Language": "fr",
    "Proxy-Authorization": "Basic cm93OnJvdw==",
    "Cookie": "session=row",
    "Forwarded": "host=evil.example",
    "X-Forwarded-Host": "evil.example",
    "X-Forwarded-For": "10.0.0.1",
    "Via": "1.1 evil",
    "Expect": "100-continue",
    "TE": "trailers",
    "Trailer": "X-Late",
    "Upgrade": "websocket",
    "Keep-Alive": "timeout=1",
    # What proxies and frameworks take the client's address, the URL, the host or the method
    # from: a row would pass for another client, or turn a POST into a DELETE.
    "X-Real-IP": "10.0.0.2",
    "X-Client-IP": "10.0.0.3",
    "True-Client-IP": "10.0.0.4",
    "CF-Connecting-IP": "10.0.0.5",
    "Fastly-Client-IP": "10.0.0.6",
    "X-Cluster-Client-IP": "10.0.0.7",
    "X-Originating-IP": "10.0.0.8",
    "X-Original-URL": "/admin",
    "X-Rewrite-URL": "/admin",
    "X-Original-URI": "/admin",
    "X-Original-Host": "evil.example",
    "X-Host": "evil.example",
    "X-HTTP-Method-Override": "DELETE",
    "X-HTTP-Method": "DELETE",
    "X-Method-Override": "DELETE",
    "X-Forwarded": "for=10.0.0.9",
    # Underscore spellings, which CGI-style servers (PHP, WSGI, nginx with
    # underscores_in_headers) fold into the same variable as the reserved names.
    "Idempotency_Key": "999",
    "webhook_id": "999",
    "X_Real_IP": "10.0.0.10",
    "X_Forwarded_For": "10.0.0.11",
    "Content_Type": "text/plain",
    "Outbox_Attempt": "99",
}


@pytest.fixture
def cluster() -> Iterator[MockCluster]:
    with mock_cluster(3) as mc:
        mc.create_topic("order", partitions=1, replication_factor=3)
        yield mc


def _enqueue(conn, headers: dict[str, str]) -> int:
    with conn.transaction():
        [message_id] = enqueue_many(
            conn, [Event("order", "o-1", "Paid", {"n": 1}, headers=headers)], trace_context=False
        )
    return message_id


async def _until(conn, message_id: int, status: str) -> dict[str, Any]:
    await wait_until(lambda: row(conn, message_id)["status"] == status, timeout=30)
    return row(conn, message_id)


async def _over_http(
    conn, dsn: str, message_id: int, headers: dict[str, str] | None = None
) -> tuple[Received, int]:
    """The one request the HTTP publisher (with the operator's `headers`) sent for the row,
    once the row is done, and the receiver's port."""
    async with Receiver() as receiver:
        publisher = HttpPublisher(receiver.url, owner="t", headers=headers)
        async with dispatching(settings(dsn), publisher):
            [request] = await receiver.wait_for(1)
            await _until(conn, message_id, "done")
    return request, receiver.port


# -- forwarded, never replacing the project's ----------------------------------------------------


async def test_http_forwards_the_row_headers_after_its_own(conn, dsn):
    message_id = _enqueue(conn, {**FORWARDED, **IMPOSTORS})
    request, port = await _over_http(conn, dsn, message_id, {"Authorization": "Bearer operator"})
    got = request.headers
    for name, value in FORWARDED.items():
        assert got.getall(name) == [value]
    assert got.getall("Idempotency-Key") == [str(message_id)]
    assert got.getall("Outbox-Attempt") == ["1"]
    assert got.getall("Content-Type") == ["application/json"]
    assert got.getall("Authorization") == ["Bearer operator"]
    assert got.getall("Host") == [f"127.0.0.1:{port}"]
    assert json.loads(request.body)["id"] == message_id  # Content-Length was the body's
    for name in ("webhook-id", "ce-id", "outbox-id"):
        assert name not in got


async def test_http_row_headers_never_change_what_the_request_means(conn, dsn):
    """A row's `Content-Encoding: gzip` would make a receiver gunzip JSON, its `Cookie` or
    `Authorization` act as someone, its `X-Forwarded-Host` route or link elsewhere: none of
    them is sent, whether or not the operator sets one; the message is delivered."""
    message_id = _enqueue(conn, {**FORWARDED, **HTTP_IMPOSTORS, "Authorization": "Bearer row"})
    request, _ = await _over_http(conn, dsn, message_id)
    got = request.headers
    for name, value in FORWARDED.items():
        assert got.getall(name) == [value]
    for name in (*HTTP_IMPOSTORS, "Authorization"):
        assert name not in got, name
    assert json.loads(request.body)["id"] == message_id  # read as sent: not gunzipped


async def test_nats_forwards_the_row_headers_after_its_own(conn, dsn, nats_server):
    await create_stream(nats_server.url)
    message_id = _enqueue(conn, {**FORWARDED, **IMPOSTORS})
    publisher = NatsPublisher([nats_server.url], subject="outbox.{aggregate_type}")
    async with dispatching(settings(dsn), publisher):
        await _until(conn, message_id, "done")
    [stored] = await stream_messages(nats_server.url)
    headers = dict(stored.headers or {})
    assert {name: headers.get(name) for name in FORWARDED} == FORWARDED
    assert headers["Nats-Msg-Id"] == str(message_id)
    lowered = {name.lower() for name in headers}
    assert not lowered & {"nats-rollup", "content-type", "ce-id", "outbox-attempt"}
    # Headers a NATS message may carry like HTTP's (Authorization, Host) pass as the row's own.
    assert headers["Authorization"] == "Bearer row"


async def test_kafka_forwards_the_row_headers_after_its_own(conn, dsn, cluster):
    message_id = _enqueue(conn, {**FORWARDED, **IMPOSTORS, "trace id": "ünïcode ok"})
    async with dispatching(settings(dsn), KafkaPublisher(cluster.bootstraps)):
        await _until(conn, message_id, "done")
    [record] = consume_all(cluster.bootstraps, "order", 1)
    headers = record.headers()
    names = [name for name, _ in headers]
    assert names.count("outbox-id") == 1 and ("outbox-id", str(message_id).encode()) in headers
    assert ("outbox-attempt", b"1") in headers
    for name, value in FORWARDED.items():
        assert (name, value.encode()) in headers
    assert ("trace id", "ünïcode ok".encode()) in headers
    assert not {"ce_id", "Content-Type", "Outbox-Attempt"} & set(names)


# -- what cannot be sent is dead, with a reason ----------------------------------------------------

HOSTILE = [
    ({"X-Evil": "a\r\nInjected: 1"}, "header 'X-Evil': its value holds a CR, LF"),
    ({"X-Esc": "a\x1b[2Jb"}, "header 'X-Esc': its value holds a CR, LF or another control"),
    ({"X-Bell": "\x07"}, "header 'X-Bell': its value holds a CR, LF or another control"),
    ({"X-C1": "a\x85b"}, "header 'X-C1': its value holds a CR, LF or another control"),
    ({"Bad Name": "v"}, "header name 'Bad Name' cannot be sent"),
    ({"Bad:Name": "v"}, "header name 'Bad:Name' cannot be sent"),
    ({"X-Über": "v"}, "header name 'X-Über' cannot be sent"),
    ({"X-Latin": "café"}, "header 'X-Latin': its value is not ASCII"),
]


@pytest.mark.parametrize("headers", [[1], "x", 7], ids=["array", "string", "number"])
def test_headers_that_are_not_a_mapping_are_permanent_on_every_transport(headers):
    """The claim lets none through; a publisher meeting one all the same fails it alone,
    with a reason (it raised an AttributeError, unclassified, on every attempt)."""
    message = Message(7, 1, 1, "order", "o-1", "Paid", "{}", datetime.now(UTC), headers)
    for transport in (http_headers(), nats_headers(), kafka_headers()):
        with pytest.raises(PermanentError) as refused:
            transport.of(message)
        assert str(refused.value) == (
            f"headers is a {type(headers).__name__}, not a mapping of names to values; not sent"
        )


@pytest.mark.parametrize(("headers", "reason"), HOSTILE)
async def test_http_headers_that_cannot_be_sent_are_dead(conn, dsn, headers, reason):
    message_id = _enqueue(conn, headers)
    async with Receiver() as receiver:
        async with dispatching(settings(dsn), HttpPublisher(receiver.url, owner="t")):
            stored = await _until(conn, message_id, "dead")
        assert receiver.requests == []
    assert stored["last_error"].startswith("permanent: " + reason), stored["last_error"]
    assert stored["attempts"] == 1


@pytest.mark.parametrize(("headers", "reason"), HOSTILE[:4])
async def test_nats_headers_that_cannot_be_sent_are_dead(conn, dsn, nats_server, headers, reason):
    await create_stream(nats_server.url)
    message_id = _enqueue(conn, headers)
    publisher = NatsPublisher([nats_server.url], subject="outbox.{aggregate_type}")
    async with dispatching(settings(dsn), publisher):
        stored = await _until(conn, message_id, "dead")
    assert reason in stored["last_error"]
    assert await stream_messages(nats_server.url) == []


@pytest.mark.parametrize(("headers", "reason"), HOSTILE[:4])
async def test_kafka_headers_that_cannot_be_sent_are_dead(conn, dsn, cluster, headers, reason):
    message_id = _enqueue(conn, headers)
    async with dispatching(settings(dsn), KafkaPublisher(cluster.bootstraps)):
        stored = await _until(conn, message_id, "dead")
    assert reason in stored["last_error"]


async def test_huge_headers_are_dead_on_every_transport(conn, dsn, cluster, nats_server):
    """The producer refuses them; a row written by other means is sent to dead by the claim,
    with the reason, before any publisher sees it."""
    await create_stream(nats_server.url)
    big = {"X-Small": "s", "X-Big": "b" * MAX_HEADERS_BYTES}
    async with Receiver() as receiver:
        for publisher in (
            HttpPublisher(receiver.url, owner="t"),
            NatsPublisher([nats_server.url], subject="outbox.{aggregate_type}"),
            KafkaPublisher(cluster.bootstraps),
        ):
            message_id = _enqueue(conn, {})
            conn.execute("UPDATE outbox SET headers = %s WHERE id = %s", (Jsonb(big), message_id))
            async with dispatching(settings(dsn), publisher):
                stored = await _until(conn, message_id, "dead")
            # `{"X-Big": "b…", "X-Small": "s"}`: 16384 bytes of value and 29 around them.
            assert stored["last_error"] == "headers of 16 kB (16413 bytes) exceed 16KiB"
            assert (stored["attempts"], stored["lease_version"]) == (0, 0), publisher.name
        assert receiver.requests == []
    assert await stream_messages(nats_server.url) == []
