"""CPU per message of each wire format beside the envelope, on HTTP and Kafka.

python -m bench.formats                       # 3 rounds of 4,000 messages; writes the report
python -m bench.formats --rounds 1 --messages 500 --out /tmp/try

The publisher runs in this process against a receiver in another one (an aiohttp server; a
librdkafka mock cluster), so this process's CPU time is the publisher's alone: the format's
encoding, its headers through the client, and the client itself, which is the same for every
format. Per round each format publishes the same messages (with a `traceparent` row header:
the forwarding path; and the envelope without one: its path as it was before row headers, and
signed) after a warm-up, the formats taking turns (each goes first in some round)
so that machine load falls on all alike; the median over rounds is reported, with the ratio
to the envelope within each round.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import textwrap
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from outbox.demo.embedded import free_port
from outbox.models import Message
from outbox.worker.publishers.formats import FORMATS

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
SIGNING_KEY = bytes(range(32))
PAYLOAD = json.dumps({"order": "o-1", "lines": [{"sku": "A-1", "qty": 2}] * 4, "total": 1234})
HEADERS = {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}

_SERVER = textwrap.dedent(
    """
    import sys
    from aiohttp import web

    async def ok(request):
        await request.read()
        return web.Response(status=204)

    app = web.Application()
    app.router.add_post("/in", ok)
    web.run_app(app, host="127.0.0.1", port=int(sys.argv[1]), print=None, access_log=None)
    """
)
_CLUSTER = textwrap.dedent(
    """
    import sys
    sys.path.insert(0, "tests")
    from kafka_mock import mock_cluster

    with mock_cluster(1) as cluster:
        cluster.create_topic("order", partitions=4, replication_factor=1)
        print(cluster.bootstraps, flush=True)
        sys.stdin.read()
    """
)


def messages(count: int, headers: dict[str, str] | None = HEADERS) -> list[Message]:
    now = datetime.now(UTC)
    return [
        Message(i, 1, 1, "order", f"o-{i % 100}", "OrderPaid", PAYLOAD, now, headers)
        for i in range(1, count + 1)
    ]


# (name, --format, signing keys, row headers): every format, and the envelope's path as it
# was before row headers (none) and with signing.
VARIANTS: list[tuple[str, str, tuple[bytes, ...], dict[str, str] | None]] = [
    *((name, name, (), HEADERS) for name in FORMATS),
    ("envelope, no row headers", "envelope", (), None),
]
HTTP_VARIANTS = [*VARIANTS, ("envelope, signed", "envelope", (SIGNING_KEY,), HEADERS)]


async def _cpu_per_message(publish_all: Callable[[], Awaitable[None]], count: int) -> float:
    start = time.process_time()
    await publish_all()
    return (time.process_time() - start) / count * 1e6


def _turn(variants: list[Any], round_no: int) -> list[Any]:
    """The variants in a rotated order: each goes first in some round."""
    shift = round_no % len(variants)
    return variants[shift:] + variants[:shift]


async def http_round(url: str, count: int, round_no: int) -> dict[str, float]:
    from outbox.worker.publishers.http import HttpPublisher

    figures: dict[str, float] = {}
    for name, wire, keys, headers in _turn(HTTP_VARIANTS, round_no):
        batch = messages(count, headers)
        publisher = HttpPublisher(url, owner="bench", wire_format=wire, signing_keys=keys)
        await publisher.start()

        async def publish_all(
            publisher: HttpPublisher = publisher, batch: list[Message] = batch
        ) -> None:
            for start in range(0, count, 64):
                await asyncio.gather(*map(publisher.publish, batch[start : start + 64]))

        try:
            # Connections made, code warm.
            await asyncio.gather(*map(publisher.publish, batch[:64]))
            figures[name] = await _cpu_per_message(publish_all, count)
        finally:
            await publisher.close()
    return figures


async def kafka_round(bootstraps: str, count: int, round_no: int) -> dict[str, float]:
    from outbox.worker.publishers.kafka import KafkaPublisher

    figures: dict[str, float] = {}
    for name, wire, _, headers in _turn(VARIANTS, round_no):
        batch = messages(count, headers)
        publisher = KafkaPublisher(bootstraps, wire_format=wire, publish_timeout=30.0)
        await publisher.start()

        async def publish_all(
            publisher: KafkaPublisher = publisher, batch: list[Message] = batch
        ) -> None:
            for start in range(0, count, 500):
                results = await publisher.publish_batch(batch[start : start + 500])
                assert not any(results), results

        try:
            await publisher.publish_batch(batch[:500])  # metadata, producer id, code warm
            figures[name] = await _cpu_per_message(publish_all, count)
        finally:
            await publisher.close()
    return figures


def _summary(rounds: list[dict[str, float]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name in rounds[0]:
        values = [r[name] for r in rounds]
        ratios = [r[name] / r["envelope"] for r in rounds]
        out[name] = {
            "cpu_us_per_message": statistics.median(values),
            "ratio_to_envelope": statistics.median(ratios),
            "runs": values,
        }
    return out


def run(rounds: int, count: int) -> dict[str, Any]:
    port = free_port()
    server = subprocess.Popen([sys.executable, "-c", _SERVER, str(port)])
    cluster = subprocess.Popen(
        [sys.executable, "-c", _CLUSTER], cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    try:
        assert cluster.stdout is not None
        bootstraps = cluster.stdout.readline().decode().strip()
        url = f"http://127.0.0.1:{port}/in"
        _wait_for_port(port)
        http, kafka = [], []
        for n in range(rounds):
            http.append(asyncio.run(http_round(url, count, n)))
            kafka.append(asyncio.run(kafka_round(bootstraps, count, n)))
    finally:
        server.terminate()
        if cluster.stdin is not None:
            cluster.stdin.close()
        cluster.terminate()
        server.wait(10)
        cluster.wait(10)
    return {"messages": count, "rounds": rounds, "http": _summary(http), "kafka": _summary(kafka)}


def _wait_for_port(port: int, timeout: float = 15.0) -> None:
    import socket

    deadline = time.monotonic() + timeout
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def render(result: dict[str, Any]) -> str:
    lines = [
        "# Wire formats: CPU per message beside the envelope",
        "",
        f"`python -m bench.formats`: {result['messages']} messages a format, median of "
        f"{result['rounds']} rounds; the publisher's process only (the receiver runs in "
        "another), each message with a `traceparent` row header unless said otherwise.",
        "",
        "| transport | format | CPU µs / message | x envelope |",
        "|---|---|---|---|",
    ]
    for transport in ("http", "kafka"):
        for name, figures in result[transport].items():
            lines.append(
                f"| {transport} | {name} | {figures['cpu_us_per_message']:.1f} | "
                f"{figures['ratio_to_envelope']:.2f} |"
            )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.formats", description=__doc__)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--messages", type=int, default=4000)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    result = run(args.rounds, args.messages)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "formats.json").write_text(json.dumps(result, indent=2) + "\n")
    (args.out / "formats.md").write_text(render(result))
    print(render(result))


if __name__ == "__main__":
    main()
