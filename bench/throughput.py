"""Throughput with a no-op publisher: outbox-dispatcher beside a plain loop of its own
statements, pgqueuer and the article's design, each draining the same number of ~200-byte
messages from a fresh database."""

from __future__ import annotations

import asyncio
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import psycopg
from psycopg import sql

from bench.cpu import cpu_seconds
from bench.env import Bench, measure_drain, python_module, seed_outbox

# What a user gets: every setting at its default but the batch.
WORKER_FLAGS = ("--publisher", "null", "--batch", "500")
BATCH = 500

# The two seeds: the harness's usual spread over 1,000 aggregates, and one aggregate per row
# (what an application emitting one event per entity looks like).
SEEDS = {"1,000 aggregates": 1000, "one aggregate per row": None}


@dataclass(frozen=True)
class Contender:
    name: str
    peer: str  # "ours", "plain-loop", "pgqueuer-default", "pgqueuer-best", "article"
    processes: int
    detail: str
    seed: str = "1,000 aggregates"


def _seeded(seed: str) -> tuple[Contender, ...]:
    suffix = "" if seed == "1,000 aggregates" else f", {seed}"
    ours = "defaults, --batch 500, batched fenced finalize"
    plain = "psycopg sync, one connection: our claim, then our batched fenced finalize"
    return (
        Contender(f"outbox-dispatcher, 1 process{suffix}", "ours", 1, ours, seed),
        Contender(f"plain loop, 1 process{suffix}", "plain-loop", 1, plain, seed),
        Contender(f"outbox-dispatcher, 2 processes{suffix}", "ours", 2, ours, seed),
        Contender(f"plain loop, 2 processes{suffix}", "plain-loop", 2, plain, seed),
    )


# Each ratio's two sides run back to back (the worker beside the plain loop, then beside the
# SQL ceiling), so the ratio of one round compares runs the machine's load drifted little
# between.
CONTENDERS = (
    *_seeded("1,000 aggregates"),
    Contender(
        "outbox-dispatcher, 4 processes",
        "ours",
        4,
        "defaults, --batch 500, batched fenced finalize",
    ),
    Contender("article design, 1 process", "article", 1, "batch 50, one UPDATE tx per message"),
    Contender("article design, 4 processes", "article", 4, "batch 50, one UPDATE tx per message"),
    Contender("pgqueuer defaults", "pgqueuer-default", 1, "psycopg driver, batch 10"),
    Contender("pgqueuer best", "pgqueuer-best", 2, "asyncpg driver, batch 500, 2 processes"),
    *_seeded("one aggregate per row"),
)


def _remaining_outbox(dsn: str) -> Callable[[], int]:
    conn = psycopg.connect(dsn, autocommit=True)
    query = "SELECT count(*) FROM outbox WHERE status IN ('pending', 'processing')"
    return lambda: int(conn.execute(query).fetchone()[0])  # type: ignore[index]


def _remaining_pgqueuer(dsn: str) -> Callable[[], int]:
    conn = psycopg.connect(dsn, autocommit=True)
    return lambda: int(conn.execute("SELECT count(*) FROM pgqueuer").fetchone()[0])  # type: ignore[index]


@contextmanager
def _start_gate(dsn: str, table: str, processes: int, timeout: float = 120) -> Iterator[None]:
    """Hold the queue locked until every process waits on it, then let them all go at once.

    Without it the first process to finish importing drains alone while the others start
    (an import is a sizeable share of a 20,000-message drain), and the CPU read at the start
    of the drain would count their start-up. EXCLUSIVE lets the harness count rows meanwhile.
    """
    with psycopg.connect(dsn) as gate:
        gate.execute(sql.SQL("LOCK TABLE {} IN EXCLUSIVE MODE").format(sql.Identifier(table)))
        yield
        deadline = time.monotonic() + timeout
        with psycopg.connect(dsn, autocommit=True) as watch:
            while _lock_waiters(watch) < processes:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"not all {processes} processes reached the queue")
                time.sleep(0.02)
        gate.rollback()


def _lock_waiters(conn: psycopg.Connection[tuple[object, ...]]) -> int:
    query = (
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
        "AND wait_event_type = 'Lock'"
    )
    return int(conn.execute(query).fetchone()[0])  # type: ignore[index]


class _CpuOverDrain:
    """`remaining` for measure_drain that also reads the workers' CPU seconds at each poll:
    the last reading with nothing done yet and the first with everything done bound the
    drain, as measure_drain's clock does."""

    def __init__(self, remaining: Callable[[], int], total: int, pids: list[int]) -> None:
        self._remaining, self._total, self._pids = remaining, total, pids
        self.start = self.end = 0.0

    def __call__(self) -> int:
        left = self._remaining()
        cpu = sum(cpu_seconds(pid) for pid in self._pids)
        if left == self._total:
            self.start = cpu
        elif left == 0:
            self.end = cpu
        return left


@dataclass(frozen=True)
class Drained:
    messages_per_second: float
    cpu_us_per_message: float | None  # the contender's own processes, not the database's


def run_contender(bench: Bench, contender: Contender, messages: int) -> Drained:
    with bench.database(outbox=not contender.peer.startswith("pgqueuer")) as dsn:
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
            seed_outbox(dsn, messages, aggregates=SEEDS[contender.seed] or messages)
            remaining = _remaining_outbox(dsn)
            if contender.peer == "ours":
                args = ("outbox.worker", "--dsn", dsn, *WORKER_FLAGS)
            elif contender.peer == "plain-loop":
                args = ("bench.peers.plain_loop", dsn, str(BATCH))
            else:
                args = ("bench.peers.article", dsn, "50")
        # The plain loop prints its own CPU seconds as it exits (read here once it has).
        stdout = subprocess.PIPE if contender.peer == "plain-loop" else subprocess.DEVNULL
        try:
            with _start_gate(dsn, "pgqueuer" if contender.peer.startswith("pgqueuer") else "outbox",
                             contender.processes):  # fmt: skip
                procs = [python_module(*args, stdout=stdout) for _ in range(contender.processes)]
            if contender.peer == "ours":
                cpu = _CpuOverDrain(remaining, messages, [p.pid for p in procs])
                rate = measure_drain(cpu, messages, procs, timeout=600)
                return Drained(rate, 1e6 * (cpu.end - cpu.start) / messages)
            rate = measure_drain(remaining, messages, procs, timeout=600)
            if contender.peer == "plain-loop":
                spent = sum(float(p.communicate(timeout=60)[0]) for p in procs)
                return Drained(rate, 1e6 * spent / messages)
            return Drained(rate, None)
        finally:
            for proc in procs:
                if proc.poll() is None:
                    proc.terminate()
                proc.wait()
