"""The operator's retention run on a partitioned table says, in its log, what `outbox
maintain` prints besides its counts: a run held off by a running replay (it retired nothing,
and says why and whose session), and partitions it attached back."""

from __future__ import annotations

import asyncio
import logging
from datetime import timedelta
from typing import Any

import psycopg
from helpers import seed
from psycopg import sql

from outbox.operations.maintenance import retire_done_async
from outbox.operations.partition_maintenance import replays_lock
from outbox.partitions import Layout
from outbox.schema import migrate
from outbox.table import Table

TABLE = Table.parse("outbox")


def _retire(dsn: str) -> int:
    async def run() -> int:
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            return await retire_done_async(conn, TABLE, older_than=timedelta(0))

    return asyncio.run(run())


def test_a_run_held_off_by_a_replay_says_so_in_the_log(empty_dsn: str, caplog: Any) -> None:
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        migrate(conn, TABLE, layout=Layout(100, 2))
        seed(conn, 250)
        conn.execute("UPDATE outbox SET status = 'done', done_at = now()")
        with psycopg.connect(empty_dsn, autocommit=True) as replay:  # a replay's session
            replay.execute(
                sql.SQL("SELECT pg_advisory_lock_shared({key})").format(key=replays_lock(TABLE))
            )
            pid = replay.info.backend_pid
            with caplog.at_level(logging.INFO, logger="outbox"):
                assert _retire(empty_dsn) == 0
            said = [r.getMessage() for r in caplog.records if "replay" in r.getMessage()]
            assert any(f"pid {pid}" in line and "table outbox:" in line for line in said), said
        # The replay's session gone, the next run retires the finished partitions.
        assert _retire(empty_dsn) >= 100
