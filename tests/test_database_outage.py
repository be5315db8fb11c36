"""A worker survives its database going away and coming back, without losing anything."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import psycopg
import pytest
from helpers import seed, wait_until
from test_worker import Scripted
from workers import dispatching, settings

from outbox.demo.embedded import EmbeddedPostgres
from outbox.schema import migrate
from outbox.table import Table

pytestmark = pytest.mark.slow


def _done(dsn: str) -> int:
    try:
        with psycopg.connect(dsn, connect_timeout=2) as c:
            return int(c.execute("SELECT count(*) FROM outbox WHERE status = 'done'").fetchone()[0])
    except psycopg.OperationalError:
        return -1


async def test_postgres_restart_mid_run(tmp_path):
    server = EmbeddedPostgres(tmp_path / "pg")  # durable: the crash must lose nothing committed
    server.start()
    try:
        dsn = server.dsn()
        with psycopg.connect(dsn, autocommit=True) as conn:
            migrate(conn, Table.parse("outbox"))
            ids = seed(conn, 200)
        gate = asyncio.Event()

        async def publish(m):
            if m.id > ids[50]:
                await gate.wait()  # hold the rest until the database has been restarted

        s = settings(dsn, batch=20, concurrency=8, lease=timedelta(seconds=5))
        async with dispatching(s, Scripted(publish)) as d:
            await wait_until(lambda: _done(dsn) >= 51)
            server.stop(mode="immediate", remove=False)  # a crash: connections drop at once
            gate.set()  # outcomes now fail to be written and must be retried
            await asyncio.to_thread(server.start)
            await wait_until(lambda: _done(dsn) == 200, timeout=90, what="everything done")
            assert d.metrics.db_errors.labels("finalize")._value.get() >= 1
        with psycopg.connect(dsn) as conn:
            states = dict(conn.execute("SELECT status, count(*) FROM outbox GROUP BY 1").fetchall())
        assert states == {"done": 200}
    finally:
        server.stop()
