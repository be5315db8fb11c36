"""A pgqueuer consumer with a no-op entrypoint that exits when the queue is drained.

python -m bench.peers.pgqueuer_worker DSN DRIVER(asyncpg|psycopg) BATCH
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

from bench.env import uvloop_run


async def run(dsn: str, driver_name: str, batch: int, latency_count: int = 0) -> None:
    from pgqueuer import QueueManager
    from pgqueuer.db import AsyncpgDriver, PsycopgDriver
    from pgqueuer.queries import Queries
    from pgqueuer.types import QueueExecutionMode

    if driver_name == "asyncpg":
        import asyncpg

        connection = await asyncpg.connect(dsn)
        driver = AsyncpgDriver(connection)
    else:
        import psycopg

        connection = await psycopg.AsyncConnection.connect(dsn, autocommit=True)
        driver = PsycopgDriver(connection)
    manager = QueueManager(Queries(driver))

    latencies: list[float] = []

    @manager.entrypoint("publish")
    async def publish(job: Any) -> None:  # a no-op publisher, like ours in this benchmark
        if latency_count:
            latencies.append(time.time() - json.loads(job.payload)["t"])
            if len(latencies) >= latency_count:
                manager.shutdown.set()

    mode = QueueExecutionMode.continuous if latency_count else QueueExecutionMode.drain
    await manager.run(batch_size=batch, mode=mode)
    await connection.close()
    if latency_count:
        print(json.dumps(latencies))


async def install_and_enqueue(dsn: str, count: int, payload: bytes) -> None:
    import asyncpg
    from pgqueuer.db import AsyncpgDriver
    from pgqueuer.queries import Queries

    connection = await asyncpg.connect(dsn)
    queries = Queries(AsyncpgDriver(connection))
    await queries.install()
    for start in range(0, count, 10_000):
        n = min(10_000, count - start)
        await queries.enqueue(["publish"] * n, [payload] * n, [0] * n)
    await connection.execute("VACUUM ANALYZE")
    await connection.close()


if __name__ == "__main__":
    count = int(sys.argv[5]) if len(sys.argv) > 5 and sys.argv[4] == "latency" else 0
    # On uvloop when it is installed, as pgqueuer's own CLI runs its workers (and as ours run).
    uvloop_run(run(sys.argv[1], sys.argv[2], int(sys.argv[3]), count))
