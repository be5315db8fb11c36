"""Two conversions of one table at once, each given its name another way (`outbox` and
`public.outbox`, as two deployments' OUTBOX_TABLE may spell it): they take turns as two runs
of one spelling do, and the later finds the table partitioned."""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor

import psycopg
from helpers import seed, statuses

from outbox.operations.conversion import Converted, convert
from outbox.partitions import Layout, read_partitions
from outbox.runner import fetch
from outbox.table import Table

LAYOUT = Layout(100, 2)


def _waits_on_a_lock(conn: psycopg.Connection[tuple[object, ...]], pid: int) -> bool:
    row = conn.execute(
        "SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE pid = %s", (pid,)
    ).fetchone()
    return bool(row and row[0])


def test_a_run_naming_the_schema_waits_for_one_that_does_not(dsn: str) -> None:
    """The first run stops just before its swap until the second has either ended or waits
    for it. Keyed on the name as given, the second went on: it swapped the table, and the
    first's swap then failed in PostgreSQL's words (relation "outbox_p0" already exists)."""
    with (
        psycopg.connect(dsn, autocommit=True) as first,
        psycopg.connect(dsn, autocommit=True) as second,
        psycopg.connect(dsn, autocommit=True) as watcher,
        ThreadPoolExecutor(1) as pool,
    ):
        seed(watcher, 30)
        started = threading.Event()
        later: list[Future[Converted | None]] = []

        def at_the_swap() -> None:
            later.append(pool.submit(convert, second, Table.parse("public.outbox"), LAYOUT))
            started.set()
            deadline = time.monotonic() + 30
            pid = second.info.backend_pid
            while not later[0].done() and not _waits_on_a_lock(watcher, pid):
                assert time.monotonic() < deadline, "the second run neither ended nor waited"
                time.sleep(0.01)

        done = convert(first, Table.parse("outbox"), LAYOUT, before_swap=at_the_swap)
        assert started.is_set()
        assert done is not None and done.steps == ["bound", "validate", "swap"]
        assert later[0].result(timeout=60) is None
        leaves = fetch(watcher, read_partitions(Table.parse("outbox"))) or []
        assert [(p.name, p.low, p.high) for p in leaves] == [
            ("outbox_p0", 0, 300),
            ("outbox_p3", 300, 400),
        ]
        assert statuses(watcher) == {"pending": 30}
