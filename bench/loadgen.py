"""A plain HTTP load generator: what the local server can take without any dispatcher.

python -m bench.loadgen URL REQUESTS CONCURRENCY [asyncio]
    # prints {"requests_per_second": ..., "cpu_seconds": ...} as JSON; `asyncio`: on asyncio's
    # own loop rather than uvloop, for a profile that shows the frames

Both figures cover the requests only, from just before the first to just after the last: the
interpreter's start-up, imports and the session's set-up are left out, as the worker's are.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time

import aiohttp

from bench.cpu import own_cpu_seconds
from bench.env import uvloop_run

# What the worker posts for one of the benchmark's rows (bench.env.seed_outbox), to the byte.
BODY = (
    b'{"id":1,"aggregate_type":"order","aggregate_id":"order-1","event_type":"OrderPlaced",'
    b'"created_at":"2026-12-01T12:41:25.775632+00:00","attempt":1,'
    b'"payload":{"note": "' + b"x" * 160 + b'", "order": 1}}'
)


async def run(url: str, requests: int, concurrency: int) -> dict[str, float]:
    left = requests
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=concurrency)) as session:

        async def client() -> None:
            nonlocal left
            while left > 0:
                left -= 1
                async with session.post(
                    url, data=BODY, headers={"Content-Type": "application/json"}
                ) as response:
                    await response.read()

        cpu_before, started = own_cpu_seconds(), time.perf_counter()
        await asyncio.gather(*(client() for _ in range(concurrency)))
        elapsed, cpu = time.perf_counter() - started, own_cpu_seconds() - cpu_before
    return {"requests_per_second": requests / elapsed, "cpu_seconds": cpu}


if __name__ == "__main__":
    # The same event loop as the worker's HTTP client, so the comparison is of the clients' use.
    loop_run = asyncio.run if sys.argv[4:] == ["asyncio"] else uvloop_run
    print(json.dumps(loop_run(run(sys.argv[1], int(sys.argv[2]), int(sys.argv[3])))))
