"""A pgqueuer consumer with a no-op entrypoint that exits when the queue is drained.

python -m bench.peers.pgqueuer_worker DSN DRIVER(asyncpg|psycopg) BATCH
"""

from __future__ import annotations

import sys
from typing import Any

from bench.env import uvloop_run


async def run(dsn: str, driver_name: str, batch: int) -> None:
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

    @manager.entrypoint("publish")
    async def publish(job: Any) -> None:  # a no-op publisher, like ours in this benchmark
        pass

    await manager.run(batch_size=batch, mode=QueueExecutionMode.drain)
    await connection.close()


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
    # On uvloop when it is installed, as pgqueuer's own CLI runs its workers (and as ours run).
    uvloop_run(run(sys.argv[1], sys.argv[2], int(sys.argv[3])))
