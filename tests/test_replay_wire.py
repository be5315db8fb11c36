"""A replay on the wire and at the receiving end: the original id everywhere, `Outbox-Replay`
on HTTP, NATS and Kafka, the body's `replay` field (the envelope's, CloudEvents' extension
attribute as the `cloudevents` SDK reads it); and the receiving helpers, which absorb a replay
as a duplicate unless told to apply it again, keyed on the signed body's field, never on the
header, with the inbox key left the id as text."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import psycopg
import pytest
import test_receiver_http as http_tests
from cloudevents.core.bindings.http import HTTPMessage, from_http
from cloudevents.core.formats.json import JSONFormat
from helpers import row, wait_until
from kafka_mock import MockCluster, mock_cluster
from test_kafka import consume_all
from test_nats import create_stream, stream_messages
from test_receiver_http import SECRET, applying, effects, post, receiver, recorded
from wire import Receiver
from workers import dispatching, settings

from outbox import Event, enqueue_many, inbox
from outbox.models import REPLAY_HEADER, Message
from outbox.operations.replay import ReplayFilter, preview, send_batch, start
from outbox.runner import perform
from outbox.schema import SchemaError
from outbox.signing_keys import signing_key
from outbox.table import Table
from outbox.worker.publishers.formats import CloudEvents
from outbox.worker.publishers.http import HttpPublisher
from outbox.worker.publishers.kafka import KafkaPublisher
from outbox.worker.publishers.nats import NatsPublisher

receiver_dsn = http_tests.receiver_dsn
pool = http_tests.pool
EVERYTHING = ReplayFilter(
    since=datetime(2000, 1, 1, tzinfo=UTC), until=datetime(2100, 1, 1, tzinfo=UTC)
)


def _enqueue(conn, n: int = 1, event_type: str = "OrderPaid") -> list[int]:
    with conn.transaction():
        return enqueue_many(
            conn,
            [Event("order", f"o-{i}", event_type, {"n": i}) for i in range(n)],
            trace_context=False,
        )


def _replay(conn, f: ReplayFilter = EVERYTHING) -> int:
    """Send everything `f` matches again; its replay number."""
    table = Table.parse("outbox")
    progress = perform(conn, start(table, perform(conn, preview(table, f))))
    while not progress.finished:
        perform(conn, send_batch(table, progress))
    return progress.number


async def _until_done(conn, ids: list[int]) -> None:
    await wait_until(
        lambda: all(row(conn, i)["status"] == "done" for i in ids), timeout=30, what="done"
    )


def _message(replay: int | None) -> Message:
    return Message(
        42, 1, 1, "order", "o-1", "OrderPaid", '{"total": 12}',
        datetime(2026, 3, 1, 14, 2, tzinfo=UTC), None, replay,
    )  # fmt: skip


# -- on the wire ---------------------------------------------------------------------------


async def test_http_a_replay_keeps_its_id_and_says_which_replay(conn, dsn):
    [message_id] = _enqueue(conn)
    async with Receiver() as receiving:
        publisher = HttpPublisher(receiving.url, owner="t", signing_keys=[signing_key(SECRET)])
        async with dispatching(settings(dsn), publisher):
            [first] = await receiving.wait_for(1)
            await _until_done(conn, [message_id])
            number = _replay(conn)
            [_, again] = await receiving.wait_for(2)
            await _until_done(conn, [message_id])
    assert number == 1
    assert REPLAY_HEADER not in first.headers and "replay" not in json.loads(first.body)
    for name in ("Idempotency-Key", "webhook-id"):
        assert again.headers[name] == first.headers[name] == str(message_id)
    assert again.headers[REPLAY_HEADER] == "1"
    body = json.loads(again.body)
    assert (body["id"], body["replay"], body["attempt"]) == (message_id, 1, 1)
    assert row(conn, message_id)["replay"] == 1


def test_cloudevents_carry_the_replay_as_an_extension_attribute():
    events = CloudEvents("/outbox/orders")
    structured = JSONFormat().read(None, events.structured(_message(3)).encode())
    assert (structured.get_id(), structured.get_extension("replay")) == ("42", 3)
    assert (
        JSONFormat().read(None, events.structured(_message(None)).encode()).get_extension("replay")
        is None
    )
    headers = events.http_binary(_message(3))
    binary = from_http(HTTPMessage(headers=headers, body=b'{"total": 12}'), JSONFormat())
    assert (binary.get_id(), binary.get_extension("replay")) == ("42", "3")


@pytest.fixture
def cluster() -> Iterator[MockCluster]:
    with mock_cluster(1) as mc:
        mc.create_topic("order", partitions=1, replication_factor=1)
        yield mc


def _delivered_before(conn, ids: list[int]) -> None:
    """As if sent long ago: done, without this test's broker having seen them (a JetStream
    stream drops a message id it saw within its duplicate window: docs/replay.md)."""
    conn.execute("UPDATE outbox SET status = 'done', done_at = now() WHERE id = ANY(%s)", (ids,))


async def test_nats_and_kafka_carry_the_replay_header(conn, dsn, nats_server, cluster):
    await create_stream(nats_server.url)
    ids = _enqueue(conn)
    _delivered_before(conn, ids)
    _replay(conn)
    async with dispatching(settings(dsn), NatsPublisher([nats_server.url], subject="outbox.x")):
        await _until_done(conn, ids)
    [stored] = await stream_messages(nats_server.url)
    assert stored.headers is not None
    assert (stored.headers["Nats-Msg-Id"], stored.headers[REPLAY_HEADER]) == (str(ids[0]), "1")
    assert json.loads(stored.data)["replay"] == 1

    _delivered_before(conn, ids)
    _replay(conn)
    async with dispatching(settings(dsn), KafkaPublisher(cluster.bootstraps)):
        await _until_done(conn, ids)
    [record] = consume_all(cluster.bootstraps, "order", 1)
    headers = record.headers()
    assert ("outbox-id", str(ids[0]).encode()) in headers and (REPLAY_HEADER, b"2") in headers
    assert json.loads(record.value())["replay"] == 2


# -- the inbox -------------------------------------------------------------------------------


def test_record_applies_each_replay_once_only_when_asked(receiver_dsn):
    with psycopg.connect(receiver_dsn) as conn:
        first = [
            inbox.record(conn, consumer="c", message_id="7"),
            inbox.record(conn, consumer="c", message_id="7"),  # a duplicate
            inbox.record(conn, consumer="c", message_id="7", replay=1),  # replay 1: apply
            inbox.record(conn, consumer="c", message_id="7", replay=1),  # again: a duplicate
            inbox.record(conn, consumer="c", message_id="7"),  # the original again: duplicate
            inbox.record(conn, consumer="c", message_id="7", replay=3),
            inbox.record(conn, consumer="c", message_id="7", replay=2),  # older than 3: absorbed
            inbox.record(conn, consumer="c", message_id="8", replay=1),  # lost, then replayed
        ]
        keys = conn.execute("SELECT message_id, replay FROM outbox_inbox ORDER BY 1").fetchall()
    assert first == [True, False, True, False, False, True, False, True]
    assert keys == [("7", 3), ("8", 1)]  # the key stays the id as text
    with pytest.raises(ValueError, match="replay must be"):
        inbox.record_query(consumer="c", message_id="7", replay=0)


def test_a_v1_inbox_is_upgraded_in_place_and_refused_until_then(receiver_dsn):
    with psycopg.connect(receiver_dsn, autocommit=True) as conn:
        conn.execute("INSERT INTO outbox_inbox (consumer, message_id) VALUES ('c', '1')")
        conn.execute("ALTER TABLE outbox_inbox DROP COLUMN replay")
        conn.execute("COMMENT ON TABLE outbox_inbox IS 'outbox-dispatcher inbox v1'")
        with pytest.raises(SchemaError, match="at v1, this outbox-dispatcher needs v2; run"):
            inbox.check(conn)
        assert inbox.migrate(conn) is False
        inbox.check(conn)
        assert conn.execute("SELECT message_id, replay FROM outbox_inbox").fetchall() == [
            ("1", None)
        ]


# -- the receiving helpers ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("form", "replays", "applied"), [("aiohttp", "absorb", 2), ("aiohttp", "apply", 4),
                                     ("asgi", "apply", 4)],
)  # fmt: skip
async def test_a_receiver_absorbs_a_replay_unless_it_applies_replays(
    conn, dsn, receiver_dsn, pool, form, replays, applied
):
    ids = _enqueue(conn, 2)
    options = {"connect": pool.connection, "secrets": [SECRET], "replays": replays}
    async with receiver(form, applying(), consumer="c", **options) as url:
        publisher = HttpPublisher(url, owner="t", signing_keys=[signing_key(SECRET)])
        async with dispatching(settings(dsn), publisher):
            await _until_done(conn, ids)
            _replay(conn)
            await _until_done(conn, ids)
    assert len(effects(receiver_dsn)) == applied
    assert recorded(receiver_dsn) == sorted(map(str, ids))  # the keys: the ids as text


async def test_the_header_alone_never_applies_a_replay(conn, dsn, receiver_dsn, pool):
    """A captured, signed first delivery sent again with `Outbox-Replay` added (no signature
    covers headers): a duplicate. The same replay twice: applied once."""
    [message_id] = _enqueue(conn)
    async with Receiver() as receiving:
        publisher = HttpPublisher(receiving.url, owner="t", signing_keys=[signing_key(SECRET)])
        async with dispatching(settings(dsn), publisher):
            await _until_done(conn, [message_id])
            _replay(conn)
            [original, replayed] = await receiving.wait_for(2)
            await _until_done(conn, [message_id])
    hop = {"host", "content-length", "user-agent", "connection"}
    options = {"connect": pool.connection, "secrets": [SECRET], "replays": "apply"}
    async with receiver("aiohttp", applying(), consumer="c", **options) as url:
        answers = []
        for request, extra in (
            (original, {}),
            (original, {REPLAY_HEADER: "9"}),
            (replayed, {}),
            (replayed, {}),
        ):
            headers = {k: v for k, v in request.headers.items() if k.lower() not in hop}
            status, reply_headers, _ = await post(url, request.body, {**headers, **extra})
            answers.append((status, reply_headers.get("Outbox-Inbox")))
    assert answers == [(204, "applied"), (200, "duplicate"), (204, "applied"), (200, "duplicate")]
    assert len(effects(receiver_dsn)) == 2


def test_replay_number_reads_the_body_of_this_message_only():
    from outbox.receiver.http import replay_number

    envelope = json.dumps({"id": 5, "replay": 2, "payload": {}}).encode()
    assert replay_number({}, envelope, "5") == 2
    assert replay_number({}, envelope, "6") is None  # another message's body
    assert replay_number({"ce-id": "5"}, b'{"id": 5, "replay": 2}', "5") is None  # binary mode
    for bad in (True, "2", 0, -1, 1.5):
        assert replay_number({}, json.dumps({"id": 5, "replay": bad}).encode(), "5") is None
    assert replay_number({}, b"not json", "5") is None


async def test_a_replay_wakes_idle_workers_at_once(conn, dsn):
    """A replay notifies the table's channel as an insert does: a worker that would poll
    only hourly sends it again without waiting for its poll."""
    ids = _enqueue(conn, 2)
    async with Receiver() as receiving:
        publisher = HttpPublisher(receiving.url, owner="t")
        async with dispatching(settings(dsn, poll_interval=timedelta(hours=1)), publisher):
            await receiving.wait_for(2)
            await _until_done(conn, ids)
            _replay(conn)
            replayed = await receiving.wait_for(4)
            await _until_done(conn, ids)
    assert [r.headers.get(REPLAY_HEADER) for r in replayed[2:]] == ["1", "1"]
