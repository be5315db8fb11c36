"""The partition keeper follows the layout as it is recorded now: `outbox migrate
--partitions-ahead M`, the fix the producers' OutOfPartitions and the alert advise, run while
the workers run. Real worker code, the command as an operator runs it."""

from __future__ import annotations

import psycopg
import pytest
from helpers import outbox_on, seed, statuses, wait_until
from test_worker import Scripted
from workers import dispatching, settings

from outbox.partitions import Layout, read_partitions
from outbox.runner import fetch
from outbox.schema import migrate
from outbox.table import Table
from outbox.worker import partition_keeper

TABLE = Table.parse("outbox")
SIZE = 100


def _highest(conn: psycopg.Connection[tuple[object, ...]]) -> int:
    return (fetch(conn, read_partitions(TABLE)) or [])[-1].high


async def test_partitions_ahead_raised_while_workers_run_are_kept(
    empty_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Raised from 2 to 8 partitions ahead: the command makes them, then producers take 500
    ids. 399 ids are left ahead, fewer than three quarters of the new target (800) and more
    than of the old (200): the keeper tops up to 8 partitions past the highest id. It read
    the number once at its start, kept 2, and left the alert's target at 200."""
    monkeypatch.setattr(partition_keeper, "KEEP_INTERVAL", 0.1)
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        migrate(conn, TABLE, layout=Layout(SIZE, 2))
        assert _highest(conn) == 300
        async with dispatching(settings(empty_dsn, batch=40), Scripted(lambda m: None)) as r:
            target = r.metrics.partition_ids_target
            await wait_until(lambda: target._value.get() == 200, what="the first target")
            raised = outbox_on(
                empty_dsn, "migrate", "--partition-size", str(SIZE), "--partitions-ahead", "8"
            )
            assert raised.returncode == 0, raised.stderr
            assert _highest(conn) == 900
            seed(conn, 500)  # ids 1 to 500
            await wait_until(lambda: target._value.get() == 800, what="the raised target")
            await wait_until(lambda: _highest(conn) == 1400, what="8 partitions past id 500")
            ahead = r.metrics.partition_ids_ahead
            await wait_until(lambda: ahead._value.get() == 899, what="the ids left ahead")
            await wait_until(lambda: statuses(conn) == {"done": 500}, what="the drain")
