"""`outbox maintain` beside the workers' keepers: the upkeep lock (outbox.partitions.
upkeep_lock) is held only while a run makes partitions, never while its DETACH ...
CONCURRENTLY waits for the transactions on the parent, and a run reads no partition made
ahead."""

from __future__ import annotations

import threading
from datetime import timedelta
from typing import Any

import psycopg
import pytest
import test_partition_maintenance
from helpers import wait_until_db
from test_partition_maintenance import _DETACHING, TABLE, _leaves

from outbox.operations import partition_maintenance as pm
from outbox.partitions import Layout, keep_ahead
from outbox.runner import observe

# 450 rows in partitions of 100 ids, 0 and 2 finished, 4 holding the newest ids, 5 made
# ahead (a run makes 6 to 9): the maintenance tests' table.
history = test_partition_maintenance.history

_ADVISORY_LOCKS = "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = %s"


async def test_a_keeper_makes_partitions_while_a_retirement_waits(history, empty_dsn):
    """A DETACH ... CONCURRENTLY waits for every transaction on the parent. The run held the
    upkeep lock all along, so a worker's keeper found it taken and made no partition for as
    long as the run lasted (a run beside a busy worker: one wait a partition). The lock is
    the keeper's once the run's partitions are made; a second run still waits its turn."""
    runs: list[Any] = []

    def run() -> None:
        with psycopg.connect(empty_dsn, autocommit=True) as conn:
            runs.append(pm.maintain(conn, TABLE, retention=timedelta(0)))

    with psycopg.connect(empty_dsn) as reader:
        reader.execute("SELECT count(*) FROM outbox")  # idle in transaction from here
        retiring = threading.Thread(target=run)
        retiring.start()
        try:
            wait_until_db(history, f"{_DETACHING} IS NOT NULL", timeout=60)
            async with await psycopg.AsyncConnection.connect(empty_dsn, autocommit=True) as keeper:
                made = await keep_ahead(keeper, TABLE, Layout(100, 8), topping_up=True)
            assert made.made == 1 and "outbox_p10" in _leaves(history)
            with psycopg.connect(empty_dsn, autocommit=True) as second:
                with pytest.raises(pm.UpkeepBusy):
                    pm.maintain(second, TABLE, retention=timedelta(0))
                held = second.execute(_ADVISORY_LOCKS, (second.info.backend_pid,)).fetchone()
                assert held == (0,)
            assert history.execute(f"SELECT {_DETACHING} IS NOT NULL").fetchone() == (True,)
        finally:
            reader.rollback()
            retiring.join(timeout=120)
    assert sorted(runs[0].retired) == ["outbox_p0", "outbox_p2"]
    assert runs[0].rows_retired == 199


def test_a_run_refused_the_upkeep_lock_keeps_no_lock(history, empty_dsn):
    """A run takes its own lock, then the upkeep lock: refused the second (a keeper making
    partitions), it lets the first go, or every later run would find the table busy."""
    with psycopg.connect(empty_dsn, autocommit=True) as keeper:
        keeper.execute(test_partition_maintenance._UPKEEP_LOCK)
        with pytest.raises(pm.UpkeepBusy):
            pm.maintain(history, TABLE, retention=timedelta(0))
        held = history.execute(_ADVISORY_LOCKS, (history.info.backend_pid,)).fetchone()
        assert held == (0,)
        keeper.execute("SELECT pg_advisory_unlock_all()")  # a closed session's may linger
    done = pm.maintain(history, TABLE, retention=timedelta(0))
    assert sorted(done.retired) == ["outbox_p0", "outbox_p2"]


def test_a_run_reads_no_partition_made_ahead(history):
    """Partitions made ahead hold no row and are never retired: a run knows them from their
    bounds and the sequence, where it read each one (a statement per partition made ahead,
    every run: with --partitions-ahead 400, 400 of them)."""
    made = pm.maintain(history, TABLE, retention=timedelta(days=7))  # as a timer runs it
    assert made.made == 4 and _leaves(history)[-5:] == [f"outbox_p{k}" for k in range(5, 10)]
    statements: list[str] = []
    observe(history, lambda statement, _: statements.append(bytes(statement).decode()))
    try:
        done = pm.maintain(history, TABLE, retention=timedelta(0))
    finally:
        observe(history, None)
    assert done.made == 0 and sorted(done.retired) == ["outbox_p0", "outbox_p2"]
    ahead = [s for s in statements if any(f'"outbox_p{k}"' in s for k in range(5, 10))]
    assert ahead == []
    assert any('"outbox_p4"' in s for s in statements)  # the newest ids' partition is read
