"""pgqueuer delivering to the latency benchmark's receiver: its entrypoint POSTs each job.

python -m bench.peers.pgqueuer_http DSN URL

pgqueuer's QueueManager with its defaults (batch size 10, continuous mode, LISTEN for its
NOTIFY) on asyncpg and uvloop, as its own CLI runs workers. The entrypoint sends the job's
payload in one POST keyed by the job id (Idempotency-Key), over one aiohttp session kept for
the process, as an application would. Runs until SIGTERM.
"""

from __future__ import annotations

import asyncio
import signal
import sys
from typing import Any

import aiohttp

from bench.env import uvloop_run

# The worker's default connection limit (its concurrency), so that neither side has more
# connections to the receiver than the other.
CONNECTIONS = 32


async def run(dsn: str, url: str) -> None:
    import asyncpg
    from pgqueuer import QueueManager
    from pgqueuer.db import AsyncpgDriver
    from pgqueuer.queries import Queries

    connection = await asyncpg.connect(dsn)
    manager = QueueManager(Queries(AsyncpgDriver(connection)))
    async with aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=CONNECTIONS),
        timeout=aiohttp.ClientTimeout(),
        headers={"Content-Type": "application/json", "User-Agent": "pgqueuer"},
    ) as session:

        @manager.entrypoint("publish")
        async def publish(job: Any) -> None:
            headers = {"Idempotency-Key": str(job.id)}
            async with session.post(url, data=job.payload, headers=headers) as reply:
                await reply.read()
                reply.raise_for_status()

        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, manager.shutdown.set)
        await manager.run()
    await connection.close()


if __name__ == "__main__":
    uvloop_run(run(sys.argv[1], sys.argv[2]))
