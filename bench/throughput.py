"""Throughput with a no-op publisher: outbox-dispatcher beside pgqueuer and the article's
design, each draining the same number of ~200-byte messages from a fresh database."""

from __future__ import annotations

import asyncio
import subprocess
from collections.abc import Callable
from dataclasses import dataclass

import psycopg

from bench.env import Bench, measure_drain, python_module, seed_outbox

WORKER_FLAGS = (
    "--publisher",
    "null",
    "--batch",
    "500",
    "--concurrency",
    "64",
    "--log-level",
    "WARNING",
)


@dataclass(frozen=True)
class Contender:
    name: str
    peer: str  # "ours", "pgqueuer", "article"
    processes: int
    detail: str


CONTENDERS = (
    Contender("outbox-dispatcher, 1 process", "ours", 1, "batch 500, batched fenced finalize"),
    Contender("outbox-dispatcher, 2 processes", "ours", 2, "batch 500, batched fenced finalize"),
    Contender("outbox-dispatcher, 4 processes", "ours", 4, "batch 500, batched fenced finalize"),
    Contender("article design, 1 process", "article", 1, "batch 50, one UPDATE tx per message"),
    Contender("article design, 4 processes", "article", 4, "batch 50, one UPDATE tx per message"),
    Contender("pgqueuer defaults", "pgqueuer-default", 1, "psycopg driver, batch 10"),
    Contender("pgqueuer best", "pgqueuer-best", 2, "asyncpg driver, batch 500, 2 processes"),
)


def _remaining_outbox(dsn: str) -> Callable[[], int]:
    conn = psycopg.connect(dsn, autocommit=True)
    query = "SELECT count(*) FROM outbox WHERE status IN ('pending', 'processing')"
    return lambda: int(conn.execute(query).fetchone()[0])  # type: ignore[index]


def _remaining_pgqueuer(dsn: str) -> Callable[[], int]:
    conn = psycopg.connect(dsn, autocommit=True)
    return lambda: int(conn.execute("SELECT count(*) FROM pgqueuer").fetchone()[0])  # type: ignore[index]


def run_contender(bench: Bench, contender: Contender, messages: int) -> float:
    with bench.database(outbox=contender.peer in ("ours", "article")) as dsn:
        procs: list[subprocess.Popen[bytes]] = []
        if contender.peer.startswith("pgqueuer"):
            from bench.peers.pgqueuer_worker import install_and_enqueue

            asyncio.run(install_and_enqueue(dsn, messages, b"x" * 200))
            remaining = _remaining_pgqueuer(dsn)
            driver, batch = (
                ("asyncpg", "500") if contender.peer == "pgqueuer-best" else ("psycopg", "10")
            )
            args = ("bench.peers.pgqueuer_worker", dsn, driver, batch)
        else:
            seed_outbox(dsn, messages)
            remaining = _remaining_outbox(dsn)
            if contender.peer == "ours":
                args = ("outbox.worker", "--dsn", dsn, *WORKER_FLAGS)
            else:
                args = ("bench.peers.article", dsn, "50")
        try:
            procs = [
                python_module(*args, stdout=subprocess.DEVNULL) for _ in range(contender.processes)
            ]
            return measure_drain(remaining, messages, procs, timeout=600)
        finally:
            for proc in procs:
                if proc.poll() is None:
                    proc.terminate()
                proc.wait()
