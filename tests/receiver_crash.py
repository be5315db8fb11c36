"""Receivers for crash tests.

    python tests/receiver_crash.py nats DSN NATS_URL DURABLE COUNT
    python tests/receiver_crash.py kafka DSN BOOTSTRAPS TOPIC COUNT

It applies COUNT messages through the inbox (each committed with its effect), then exits at
once, with no ack sent (NATS) and no offset committed (Kafka): what a consumer killed right
after its commits leaves behind. It prints `applied N` before dying.

    python tests/receiver_crash.py http DSN PORT APPLICATION_NAME

An ASGI receiver (uvicorn) whose handler writes its effect and then never returns: its
transaction stays open, for the test to kill the process between the effect and the commit.
"""

from __future__ import annotations

import asyncio
import os
import sys
from contextlib import asynccontextmanager
from typing import Any

import psycopg


def effect(conn: psycopg.Connection[Any], message_id: str) -> None:
    conn.execute("INSERT INTO effects VALUES (%s, '', 'crashed')", (message_id,))


async def nats_main(dsn: str, url: str, durable: str, count: int) -> None:
    import nats

    from outbox.receiver.nats import ID_HEADER, NatsInbox

    @asynccontextmanager
    async def connect():  # type: ignore[no-untyped-def]
        async with await psycopg.AsyncConnection.connect(dsn) as conn:
            yield conn

    async def apply(conn: psycopg.AsyncConnection[Any], msg: Any) -> None:
        await conn.execute(
            "INSERT INTO effects VALUES (%s, '', 'crashed')", (msg.headers[ID_HEADER],)
        )

    nc = await nats.connect(url)
    sub = await nc.jetstream().pull_subscribe("outbox.>", durable=durable)
    receiver = NatsInbox(apply, connect=connect, consumer="billing")
    applied = 0
    while applied < count:
        for msg in await sub.fetch(count - applied, timeout=10):
            await receiver.apply(msg, msg.headers[ID_HEADER])  # committed; no ack follows
            applied += 1
    print(f"applied {applied}", flush=True)
    os._exit(0)


def kafka_main(dsn: str, bootstraps: str, topic: str, count: int) -> None:
    from confluent_kafka import Consumer, TopicPartition

    from outbox.receiver.kafka import ID_HEADER, KafkaInbox

    consumer = Consumer({
        "bootstrap.servers": bootstraps, "group.id": "billing", "auto.offset.reset": "earliest",
        "enable.auto.offset.store": False, "auto.commit.interval.ms": 60000,
    })  # fmt: skip
    # Assigned, not subscribed: no group membership for the next consumer to wait out; the
    # offsets are the group's all the same.
    partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
    consumer.assign([TopicPartition(topic, p) for p in partitions])
    conn = psycopg.connect(dsn)

    def apply(conn: psycopg.Connection[Any], message: Any) -> None:
        effect(conn, dict(message.headers())[ID_HEADER].decode())

    receiver = KafkaInbox(consumer, conn, apply, consumer_name="billing")
    applied = 0
    while applied < count:
        message = consumer.poll(1.0)
        if message is None or message.error():
            continue
        receiver.process(message)  # committed, offset stored, not yet committed to Kafka
        applied += 1
    print(f"applied {applied}", flush=True)
    os._exit(0)


def http_main(dsn: str, port: int, application_name: str) -> None:
    import uvicorn

    from outbox.receiver.asgi import InboxEndpoint

    @asynccontextmanager
    async def connect():  # type: ignore[no-untyped-def]
        conninfo = f"{dsn} application_name={application_name}"
        async with await psycopg.AsyncConnection.connect(conninfo) as conn:
            yield conn

    async def hang(conn: psycopg.AsyncConnection[Any], delivery: Any) -> None:
        await conn.execute("INSERT INTO effects VALUES (%s, '', 'killed')", (delivery.message_id,))
        await asyncio.Event().wait()  # killed here, before the commit

    endpoint = InboxEndpoint(hang, connect=connect, consumer="billing")
    uvicorn.run(endpoint, host="127.0.0.1", port=port, log_level="warning")


if __name__ == "__main__":
    kind, dsn, where, name, *count = sys.argv[1:]
    if kind == "http":
        http_main(dsn, int(where), name)
    elif kind == "nats":
        asyncio.run(nats_main(dsn, where, name, int(count[0])))
    else:
        kafka_main(dsn, where, name, int(count[0]))
