"""A plain table converted while it is in use: real worker processes publishing over HTTP to a
real receiver, a producer inserting throughout, `outbox migrate --partition-size` run as a
command. Nothing in flight is lost or delivered twice, and the workers go on partition-aware."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
from collections import Counter
from pathlib import Path
from typing import Any

import psycopg
import pytest
from helpers import seed, wait_until, wait_until_db
from workers import listening, spawn_worker, stop_worker

from outbox import enqueue
from outbox.demo.sink import Reply, Sink
from outbox.partitions import read_partitions
from outbox.runner import fetch
from outbox.schema import migrate
from outbox.table import Table

TABLE = Table.parse("outbox")
WORKERS = ("w-0", "w-1")


class Producer(threading.Thread):
    """Inserts one message a transaction, as an application does, until stopped; the ids."""

    def __init__(self, dsn: str) -> None:
        super().__init__(daemon=True)
        self.dsn = dsn
        self.ids: list[int] = []
        self.stopping = threading.Event()
        self.error: Exception | None = None

    def run(self) -> None:
        try:
            with psycopg.connect(self.dsn, autocommit=True) as conn:
                # Paced (a few hundred a second) so the receiver keeps up after the swap.
                while not self.stopping.wait(0.003):
                    self.ids.append(
                        enqueue(conn, aggregate_type="order", aggregate_id=str(len(self.ids) % 7),
                                event_type="Placed", payload={"n": len(self.ids)})
                    )  # fmt: skip
        except Exception as exc:  # the test reports it
            self.error = exc


@pytest.mark.parametrize("ordering", ["none", "aggregate"])
async def test_nothing_in_flight_is_lost_or_sent_twice_across_a_conversion(
    conn: Any, dsn: str, tmp_path: Path, ordering: str
) -> None:
    migrate(conn, TABLE, ordering)
    backlog = seed(conn, 2000, aggregates=10)
    # 20 ms a message, 4 at a time a worker: the drain outlasts the conversion, so rows are
    # held (processing) while it swaps the table.
    with Sink(lambda body, nth: Reply(delay=0.02)) as sink:
        logs = {owner: tmp_path / f"{owner}.log" for owner in WORKERS}
        workers = [
            spawn_worker(dsn, "--publisher", "http", "--http-url", sink.url, "--batch", "50",
                         "--concurrency", "4", "--ordering", ordering, owner=owner,
                         log_path=str(logs[owner]))
            for owner in WORKERS
        ]  # fmt: skip
        producer = Producer(dsn)
        try:
            await wait_until(lambda: listening(conn, WORKERS) == 2, what="two workers")
            producer.start()
            await wait_until(lambda: len(sink.delivered()) >= 200, timeout=60, what="deliveries")
            held = conn.execute("SELECT count(*) FROM outbox WHERE status = 'processing'")
            assert held.fetchone()[0] > 0  # type: ignore[index]
            converted = await asyncio.to_thread(
                subprocess.run,
                [sys.executable, "-m", "outbox", "migrate", "--dsn", dsn, "--partition-size",
                 "1000", "--partitions-ahead", "4"],
                capture_output=True, text=True, timeout=120,
            )  # fmt: skip
            assert converted.returncode == 0, converted.stderr
            assert "attached without a scan" in converted.stdout, converted.stdout
            first = fetch(conn, read_partitions(TABLE))[0]  # type: ignore[index]
            # Inserts go on past the swap, into the new partitions.
            await wait_until(lambda: producer.ids[-1] >= first.high + 100, what="new ids")
            producer.stopping.set()
            producer.join(timeout=30)
            assert producer.error is None, producer.error
            wait_until_db(conn, "NOT EXISTS (SELECT FROM outbox WHERE status <> 'done')", 120)
            for owner in WORKERS:
                await wait_until(
                    lambda o=owner: "is partitioned now" in logs[o].read_text(),  # type: ignore[misc]
                    what=f"{owner} learnt the layout",
                )
        finally:
            producer.stopping.set()
            codes = [stop_worker(w) for w in workers]
        assert codes == [0, 0]
        assert sink.wait_idle()
    ids = backlog + producer.ids
    delivered = Counter(sink.delivered_ids())
    assert sorted(delivered) == sorted(ids)  # every id delivered
    assert [i for i, n in delivered.items() if n > 1] == []  # none twice
    # Each row taken once: no lease was lost across the swap, the held ones included.
    rows = conn.execute("SELECT count(*), max(attempts), min(attempts) FROM outbox").fetchone()
    assert rows == (len(ids), 1, 1)
    if ordering == "aggregate":  # each aggregate's messages arrived in id order, across it
        arrived: dict[str, list[int]] = {}
        for r in sink.delivered():
            arrived.setdefault(str(r.body["aggregate_id"]), []).append(int(r.body["id"]))
        assert all(got == sorted(got) for got in arrived.values())
    before = [i for i in producer.ids if i < first.high]
    after = [i for i in producer.ids if i >= first.high]
    assert before and after and max(before) < min(after)
