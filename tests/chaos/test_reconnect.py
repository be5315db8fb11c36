"""After the database drops every connection of a worker at once (a restart, a failover,
terminated backends), the worker must not meet its pool's dead connections one by one,
each failure doubling its back-off, while its leases run out."""

from __future__ import annotations

import asyncio
import time
from datetime import timedelta

import psycopg
import pytest
from helpers import seed, statuses, wait_until
from test_worker import Scripted
from workers import dispatching, settings

pytestmark = pytest.mark.chaos


def _terminate(conn: psycopg.Connection, owner: str) -> int:
    return int(
        conn.execute(
            "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity"
            " WHERE datname = current_database() AND application_name = %s",
            (owner,),
        ).fetchone()[0]
    )


async def test_one_failure_after_every_backend_is_terminated_not_one_per_dead_connection(conn, dsn):
    seed(conn, 30)
    gate = asyncio.Event()

    async def publish(message):
        await gate.wait()

    # Publishes wait for the gate: a publish timeout that cannot pass while the test looks.
    s = settings(
        dsn, batch=10, concurrency=10, lease=timedelta(seconds=120),
        publish_timeout=timedelta(seconds=60), owner="w-pool",
    )  # fmt: skip
    async with dispatching(s, Scripted(publish)) as d:
        # Two batches, or three: a publisher not measured yet is claimed ahead of.
        await wait_until(lambda: statuses(conn).get("processing", 0) >= 20, what="claims")
        # Let the pool hold several idle connections, as a busy worker's does.
        async with d.pool.connection(), d.pool.connection(), d.pool.connection():
            pass
        assert _terminate(conn, "w-pool") >= 3
        started = time.monotonic()
        gate.set()  # twenty outcomes or more to write, on a pool of dead connections
        await wait_until(lambda: statuses(conn).get("done", 0) >= 20, what="finalized")
        elapsed = time.monotonic() - started
        failures = d.metrics.db_errors.labels("finalize")._value.get()
    assert failures <= 1, f"{failures:g} failed finalizes in a row"
    # One back-off step, not one per dead connection (the count above says so; the time
    # only catches a retry loop that waits without failing, so a loaded machine's seconds
    # are allowed for).
    assert elapsed < 30.0
