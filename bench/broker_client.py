"""The plain client loops the broker benchmark puts beside the worker: each library used as
its authors mean it at its fastest, with nothing of the worker's shape.

python -m bench.broker_client nats URL MESSAGES
python -m bench.broker_client kafka BOOTSTRAP_SERVERS MESSAGES

Each sends the worker's bytes (the envelope of a seeded row, the same headers, for Kafka the
same key) and checks every acknowledgement: nats-py publishes asynchronously and gathers the
PubAcks; confluent-kafka produces in a synchronous loop with poll(0), then flushes (every
delivery report checked). Start-up is kept out of the measurement the way the benchmark keeps
it out of the worker's: the client connects, prints `ready`, and starts only when a line
arrives on its standard input; it prints its result and then waits for standard input to
close, so the benchmark reads its CPU time from /proc at both ends of the measured stretch
alone. One warm-up message goes first (connections, the PubAck inbox, Kafka's producer id).
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from datetime import UTC, datetime
from typing import Any

from bench.env import PAYLOAD_BYTES, uvloop_run
from outbox.models import Message
from outbox.worker.publishers.envelope import envelope

AGGREGATES = 1000  # as bench.env.seed_outbox spreads its rows
STREAM_SUBJECT = "outbox.order.OrderPlaced"  # what the worker's default template renders
TOPIC = "order"


def body(n: int) -> bytes:
    """The envelope the worker sends for seeded row `n`."""
    payload = json.dumps({"note": "x" * (PAYLOAD_BYTES - 40), "order": n}, separators=(", ", ": "))
    message = Message(
        id=n, lease_version=1, attempts=1, aggregate_type="order",
        aggregate_id=f"order-{n % AGGREGATES}", event_type="OrderPlaced",
        payload_json=payload, created_at=datetime.now(UTC),
    )  # fmt: skip
    return envelope(message).encode()


def _handshake() -> None:
    print("ready", flush=True)
    sys.stdin.readline()


def _finish(messages: int, seconds: float, errors: int) -> None:
    print(json.dumps({"messages": messages, "seconds": seconds, "errors": errors}), flush=True)
    sys.stdin.read()  # the benchmark reads our CPU time, then closes standard input


async def nats_loop(url: str, messages: int) -> None:
    """JetStream as nats-py means it for throughput: asynchronous publishes (at most the
    client's own limit of PubAcks pending), then every PubAck gathered and checked."""
    import nats

    nc = await nats.connect(url)
    js = nc.jetstream()
    value = body(1)
    # One message first, as the worker has sent none before its measured stretch either: the
    # PubAck inbox subscription is set up.
    await (await js.publish_async(STREAM_SUBJECT, value, headers={"Nats-Msg-Id": "warm-up"}))
    await asyncio.get_running_loop().run_in_executor(None, _handshake)
    started = time.perf_counter()
    acks = []
    for n in range(1, messages + 1):
        headers = {
            "Nats-Msg-Id": str(n),
            "Outbox-Event-Type": "OrderPlaced",
            "Outbox-Aggregate-Type": "order",
            "Outbox-Aggregate-Id": f"order-{n % AGGREGATES}",
        }
        acks.append(await js.publish_async(STREAM_SUBJECT, value, headers=headers))
    results = await asyncio.gather(*acks, return_exceptions=True)
    seconds = time.perf_counter() - started
    # A duplicate would mean a message not stored: count it as an error, as a failure.
    errors = sum(1 for ack in results if isinstance(ack, BaseException) or ack.duplicate)
    await nc.close()
    _finish(messages, seconds, errors)


def kafka_loop(bootstrap: str, messages: int) -> None:
    """confluent-kafka as its authors mean it for throughput: a synchronous loop of
    produce() with poll(0) after each (serving the delivery reports that are in), and a
    final flush(); every delivery report is checked."""
    from confluent_kafka import Producer

    producer = Producer({
        "bootstrap.servers": bootstrap,
        "enable.idempotence": True,
        "acks": "all",
        "partitioner": "murmur2_random",  # as the worker's publisher
    })  # fmt: skip
    value = body(1)
    delivered = 0
    errors = 0

    def report(error: Any, _: Any) -> None:
        nonlocal delivered, errors
        delivered += 1
        errors += error is not None

    # One message first: connections, topic metadata and the idempotent producer id are set up
    # then, as the worker's are before its measured stretch.
    producer.produce(TOPIC, value=value, key=b"warm-up")
    producer.flush(10)
    _handshake()
    started = time.perf_counter()
    for n in range(1, messages + 1):
        headers = [
            ("outbox-id", str(n).encode()),
            ("outbox-event-type", b"OrderPlaced"),
            ("outbox-aggregate-type", b"order"),
            ("outbox-attempt", b"1"),
        ]
        while True:
            try:
                producer.produce(
                    TOPIC, value=value, key=f"order-{n % AGGREGATES}".encode(), headers=headers,
                    on_delivery=report,
                )  # fmt: skip
                break
            except BufferError:  # librdkafka's queue is full: serve reports, then again
                producer.poll(0.1)
        producer.poll(0)
    producer.flush(30)
    seconds = time.perf_counter() - started
    errors += messages - delivered  # a report that never came is a failure too
    _finish(messages, seconds, errors)


if __name__ == "__main__":
    broker, address, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
    if broker == "nats":
        uvloop_run(nats_loop(address, count))
    else:
        kafka_loop(address, count)
