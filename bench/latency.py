"""Latency as a producer feels it: from its commit to the first byte of the request at a real
receiver, at steady rates, for the worker beside a floor and pgqueuer in the same run.

python -m bench --only latency                                # the whole grid (~20 minutes)
python -m bench --only latency --latency-rates 100 --latency-processes 1 --latency-seconds 3
                                                              # one quick cell

What runs, per cell (rate x processes x mode):

- the producer (this process): the project's `enqueue`, one row per transaction on
  autocommit connections, at a steady rate (each message at its own time, on the first of a
  few connections that is free, so a slow commit does not hold the next one back); it notes
  `time.time_ns()` when the commit returned.
- the receiver (bench.latency_receiver, a process of its own, aiohttp's low-level server on
  uvloop): notes `time.time_ns()` when a request's first byte comes in. One machine, one
  clock (CLOCK_REALTIME) for both notes: the difference is the latency.
- the modes: unordered; ordered (one event per transaction, the aggregates taking turns);
  ordered-pairs (two events of one aggregate per transaction: the second is claimable only
  once the first is finalized, which no NOTIFY announces).
- the contenders, each in as many processes as the cell says, one after the other:
  `outbox-worker --publisher http` with its defaults; the floor (bench.latency_floor: one
  loop on one connection doing LISTEN, the project's claim up to the same batch, concurrent
  POSTs, one fenced finalize per batch); and pgqueuer (bench.peers.pgqueuer_http, its
  defaults, the entrypoint POSTing) in unordered mode only: it has no per-aggregate order.

Everything shares the machine's cores with PostgreSQL, as it does in the issue's own
measurement: the floor, run on the same machine in the same minutes, says how much of a
figure is the machine's and how much the worker's own.
"""

from __future__ import annotations

import asyncio
import bisect
import json
import math
import os
import statistics
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg

from bench.cpu import cpu_seconds, own_cpu_seconds, tree_cpu_seconds
from bench.env import ROOT, Bench, python_module
from outbox.demo.embedded import free_port
from outbox.models import Event
from outbox.producer import enqueue, enqueue_many

RATES = (10, 100, 1000)  # messages/s
PROCESSES = (1, 2)
MODES = ("unordered", "ordered", "ordered-pairs")
# ordered-pairs: ordered mode, each transaction commits two events of one aggregate (an order
# placed and paid together): the second becomes its aggregate's head only once the first is
# finalized, and no NOTIFY says so.
PER_TRANSACTION = {"unordered": 1, "ordered": 1, "ordered-pairs": 2}
CONTENDERS = ("worker", "floor", "pgqueuer")
# Seconds of steady traffic per run, by rate, chosen so that the whole default grid (84 runs:
# every cell once, the two-process cells in two more rounds) takes about 30 minutes: 10/s
# gives 60 samples a run (its goal is the median's), 100/s 3,000 (a p99 with thirty
# samples beyond it, in each round: with ten, one stall of the shared machine of 100 ms,
# a checkpoint's fsync, set a round's p99 whatever the contender did), 1,000/s 8,000
# (p99.9 from the pooled rounds). Where a percentile has fewer than ten samples beyond it,
# the report leaves it out.
SECONDS = {10: 6, 100: 30, 1000: 8}
# What a run costs besides its traffic, for the estimate logged at the start: a fresh
# database, the contender's start until its sessions are up and a second to settle, its
# stop (4-5 s measured on two cores beside other work).
RUN_OVERHEAD_SECONDS = 5.0
_TICKS = os.sysconf("SC_CLK_TCK")
AGGREGATES = 1000  # messages spread over this many aggregates (ordered mode: one head each)
# Enough that the producer keeps its rate while commits are slow: at 1,000/s a commit that
# waits 10 ms for its WAL flush on a busy machine holds ten connections.
PRODUCER_CONNECTIONS = 12
WARM_UP_SECONDS = 1.0  # the first second of each run is sent and left out (at least
WARM_UP_MESSAGES = 10  # this many messages)
BATCH, CONCURRENCY = 100, 32  # the worker's defaults, which the floor is given too
PAYLOAD = {"note": "x" * 160}  # ~200 bytes of JSON with `n`, as the other benchmarks send
# Histogram bins: 20 a decade from 0.1 ms to 100 s.
BINS_MS = [10 ** (k / 20) for k in range(-20, 101)]
QUANTILES = {"p50_ms": 0.5, "p90_ms": 0.9, "p99_ms": 0.99, "p999_ms": 0.999}


@dataclass(frozen=True)
class Plan:
    rates: tuple[int, ...] = RATES
    processes: tuple[int, ...] = PROCESSES
    modes: tuple[str, ...] = MODES
    contenders: tuple[str, ...] = CONTENDERS
    seconds: float | None = None  # every run this long; None: SECONDS by rate
    # The three runs in a row of the two-process cells, the others once.
    repeat: int = 3
    # Process counts whose cells run every round; the others run in the first only (None:
    # every cell every round).
    repeat_processes: tuple[int, ...] | None = (2,)

    def duration(self, rate: int) -> float:
        return self.seconds if self.seconds is not None else SECONDS.get(rate, 20)

    def estimate_seconds(self) -> float:
        """About how long the plan runs: its traffic, warm-ups and each run's overhead."""
        return sum(
            self.duration(rate) + warm_up_messages(rate) / rate + RUN_OVERHEAD_SECONDS
            for n in range(self.repeat)
            for rate, *_ in self.round(n)
        )

    def runs(self) -> list[tuple[int, int, str, str]]:
        """(rate, processes, mode, contender) in running order: cell by cell, the contenders
        of a cell back to back, their order reversed every other cell, so that neither the
        worker nor the floor always runs first after a change of cell."""
        order: list[tuple[int, int, str, str]] = []
        cell = 0
        for rate in self.rates:
            for processes in self.processes:
                for mode in self.modes:
                    names = [
                        c for c in self.contenders if not (c == "pgqueuer" and mode != "unordered")
                    ]
                    if cell % 2:
                        names.reverse()
                    order += [(rate, processes, mode, name) for name in names]
                    cell += 1
        return order

    def round(self, n: int) -> list[tuple[int, int, str, str]]:
        """The runs of round `n`: the first round runs every cell, the others those of
        `repeat_processes`; every other round in reverse order."""
        order = [
            run
            for run in self.runs()
            if n == 0 or self.repeat_processes is None or run[1] in self.repeat_processes
        ]
        return order if n % 2 == 0 else order[::-1]


SMOKE = Plan(rates=(100,), processes=(1,), seconds=2.0, repeat=1, repeat_processes=None)


def warm_up_messages(rate: int) -> int:
    """Messages each run sends first and leaves out of its figures."""
    return max(WARM_UP_MESSAGES, int(rate * WARM_UP_SECONDS))


# -- figures ------------------------------------------------------------------------------


def percentiles(latencies_ms: list[float]) -> dict[str, Any]:
    """Nearest-rank percentiles, the maximum and the sample count; a percentile with fewer
    than ten samples beyond it is None (it would be one of the last few samples, not a
    percentile)."""
    ordered = sorted(latencies_ms)
    n = len(ordered)
    figures: dict[str, Any] = {"samples": n, "max_ms": ordered[-1] if n else None}
    for key, q in QUANTILES.items():
        enough = n * (1 - q) >= 10 or (key == "p50_ms" and n > 0)
        figures[key] = ordered[max(0, math.ceil(q * n) - 1)] if enough else None
    return figures


def histogram(latencies_ms: list[float]) -> list[int]:
    """Counts per BINS_MS bin: bin k holds [BINS_MS[k], BINS_MS[k+1]); the first also what is
    below, the last what is above."""
    counts = [0] * (len(BINS_MS) - 1)
    for value in latencies_ms:
        k = bisect.bisect_right(BINS_MS, value) - 1
        counts[min(max(k, 0), len(counts) - 1)] += 1
    return counts


# -- the receiver -------------------------------------------------------------------------


class Receiver:
    """bench.latency_receiver in a process of its own."""

    def __init__(self) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/events"
        self.proc = python_module("bench.latency_receiver", str(self.port))
        deadline = time.monotonic() + 30
        while True:
            try:
                self.count()
                return
            except OSError:
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    raise RuntimeError("the receiver did not start") from None
                time.sleep(0.05)

    def _get(self, path: str) -> bytes:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=30) as r:
            return bytes(r.read())

    def count(self) -> int:
        return int(self._get("/count"))

    def results(self) -> dict[str, Any]:
        """Every arrival since the last call, and forget them."""
        return dict(json.loads(self._get("/results")))

    def cpu(self) -> float:
        return cpu_seconds(self.proc.pid)

    def capacity(self, requests: int = 5000) -> float:
        """Requests/s the receiver takes from a plain aiohttp client (bench.loadgen) with the
        worker's connection limit: what it could take beside what it is sent."""
        out = subprocess.run(
            [sys.executable, "-m", "bench.loadgen", self.url, str(requests), str(CONCURRENCY)],
            capture_output=True, text=True, check=True, cwd=ROOT,
        )  # fmt: skip
        self.results()  # the load generator's requests are no run's
        return float(json.loads(out.stdout)["requests_per_second"])

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
        self.proc.wait()


# -- the producer ---------------------------------------------------------------------------


@dataclass
class Produced:
    sent_ns: dict[str, int] = field(default_factory=dict)  # key -> before the statement
    committed_ns: dict[str, int] = field(default_factory=dict)  # key -> its commit returned
    order: list[str] = field(default_factory=list)  # keys in sending order
    late: int = 0  # messages that found every producer connection busy at their time


# One transaction n: -> awaitable of the ids of the rows it committed.
Insert = Callable[[psycopg.AsyncConnection[Any], int], Any]


async def _enqueue_outbox(conn: psycopg.AsyncConnection[Any], n: int) -> list[int]:
    message_id = await enqueue(
        conn, aggregate_type="order", aggregate_id=f"order-{n % AGGREGATES}",
        event_type="OrderPlaced", payload={"n": n, **PAYLOAD}, trace_context=False,
    )  # fmt: skip
    return [int(message_id)]


async def _enqueue_pair(conn: psycopg.AsyncConnection[Any], n: int) -> list[int]:
    aggregate = f"order-{n % AGGREGATES}"
    events = [
        Event(aggregate_type="order", aggregate_id=aggregate, event_type=event_type,
              payload={"n": n, **PAYLOAD})
        for event_type in ("OrderPlaced", "OrderPaid")
    ]  # fmt: skip
    return [int(i) for i in await enqueue_many(conn, events, trace_context=False)]


async def _enqueue_pgqueuer(conn: psycopg.AsyncConnection[Any], n: int) -> list[int]:
    body = json.dumps({"n": n, **PAYLOAD}).encode()
    cur = await conn.execute(
        "INSERT INTO pgqueuer (priority, entrypoint, payload, status) "
        "VALUES (0, 'publish', %s, 'queued') RETURNING id",
        (body,),
    )
    row = await cur.fetchone()
    assert row is not None
    return [int(row[0])]


async def produce(
    dsn: str, rate: float, count: int, insert: Insert, per_transaction: int = 1
) -> Produced:
    """`count` messages at `rate`, `per_transaction` to a transaction: transaction n at
    start + n * per_transaction / rate, each on a free connection."""
    produced = Produced()
    conns = [
        await psycopg.AsyncConnection.connect(dsn, autocommit=True)
        for _ in range(PRODUCER_CONNECTIONS)
    ]
    idle: asyncio.Queue[psycopg.AsyncConnection[Any]] = asyncio.Queue()
    for conn in conns:
        idle.put_nowait(conn)

    async def one(conn: psycopg.AsyncConnection[Any], n: int) -> None:
        sent = time.time_ns()
        ids = await insert(conn, n)
        committed = time.time_ns()
        for key in map(str, ids):
            produced.committed_ns[key] = committed
            produced.sent_ns[key] = sent
            produced.order.append(key)
        idle.put_nowait(conn)

    loop = asyncio.get_running_loop()
    tasks = []
    start = loop.time() + 0.05
    try:
        for n in range(count // per_transaction):
            delay = start + n * per_transaction / rate - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            if idle.empty():
                produced.late += 1
            tasks.append(asyncio.create_task(one(await idle.get(), n)))
        await asyncio.gather(*tasks)
    finally:
        for conn in conns:
            await conn.close()
    return produced


# -- contenders ---------------------------------------------------------------------------


def _start(contender: str, dsn: str, url: str, processes: int, mode: str) -> list[Any]:
    ordered = mode != "unordered"
    if contender == "worker":
        args = ["--dsn", dsn, "--publisher", "http", "--http-url", url, "--log-level", "WARNING"]
        args += ["--ordering", "aggregate"] if ordered else []
        return [python_module("outbox.worker", *args) for _ in range(processes)]
    if contender == "floor":
        args = [dsn, url, str(BATCH), str(CONCURRENCY)] + (["ordered"] if ordered else [])
        return [python_module("bench.latency_floor", *args) for _ in range(processes)]
    return [python_module("bench.peers.pgqueuer_http", dsn, url) for _ in range(processes)]


# Sessions each contender's process keeps open once it is ready: the worker's LISTEN
# connection and its pool's two, the floor's one, pgqueuer's one.
READY_QUERY = {
    "worker": "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
    "AND query LIKE 'LISTEN %'",
    "floor": "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
    "AND application_name = 'latency-floor'",
    "pgqueuer": "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
    "AND pid <> pg_backend_pid() AND application_name = ''",
}


def _wait_ready(dsn: str, contender: str, procs: list[Any], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    with psycopg.connect(dsn, autocommit=True) as conn:
        while conn.execute(READY_QUERY[contender]).fetchone()[0] < len(procs):  # type: ignore[index]
            if time.monotonic() > deadline or any(p.poll() is not None for p in procs):
                raise RuntimeError(f"{contender} did not start")
            time.sleep(0.05)
    time.sleep(1.0)  # LISTEN issued, first claims done: let start-up work settle


def _transactions(dsn: str) -> int:
    """Transactions committed or rolled back in the run's database so far (this one too)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT xact_commit + xact_rollback FROM pg_stat_database "
            "WHERE datname = current_database()"
        ).fetchone()
    assert row is not None
    return int(row[0])


def _spent(bench: Bench, procs: list[Any], receiver: Receiver) -> tuple[float, ...]:
    """CPU seconds so far: the contender's processes, PostgreSQL's, and the whole machine's
    less everything of this benchmark's (contender, PostgreSQL, receiver, this process with
    its producer): what other work took from the cores meanwhile."""
    postmaster = bench.server.pid
    database = tree_cpu_seconds(postmaster) if postmaster is not None else 0.0
    contender = sum(cpu_seconds(p.pid) for p in procs)
    ours = contender + database + receiver.cpu() + own_cpu_seconds()
    return contender, database, _machine_busy_seconds() - ours


def _machine_busy_seconds() -> float:
    """CPU seconds every core of the machine has spent busy since boot (/proc/stat)."""
    with open("/proc/stat") as stat:
        fields = [int(v) for v in stat.readline().split()[1:9]]
    idle = fields[3] + fields[4]  # idle, iowait
    return (sum(fields) - idle) / _TICKS


def _stop(procs: list[Any]) -> None:
    for proc in procs:
        if proc.poll() is None:
            proc.terminate()
    for proc in procs:
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def run_one(
    bench: Bench, receiver: Receiver, contender: str, rate: int, processes: int, mode: str,
    seconds: float,
) -> tuple[dict[str, Any], list[float]]:  # fmt: skip
    """One run: its figures, and its latencies (ms) past the warm-up."""
    warm_up = warm_up_messages(rate)
    count = warm_up + int(rate * seconds)
    ordering = None if mode == "unordered" else "aggregate"
    per_transaction = PER_TRANSACTION[mode]
    count -= count % per_transaction
    pgqueuer = contender == "pgqueuer"
    with bench.database(outbox=not pgqueuer, ordering=ordering) as dsn:
        if pgqueuer:
            from bench.peers.pgqueuer_worker import install_and_enqueue

            asyncio.run(install_and_enqueue(dsn, 0, b""))
        receiver.results()
        procs = _start(contender, dsn, receiver.url, processes, mode)
        try:
            _wait_ready(dsn, contender, procs)
            transactions_before = _transactions(dsn)
            cpu_before, started = receiver.cpu(), time.monotonic()
            spent_before = _spent(bench, procs, receiver)
            insert = (
                _enqueue_pgqueuer
                if pgqueuer
                else _enqueue_pair
                if per_transaction == 2
                else _enqueue_outbox
            )
            produced = asyncio.run(produce(dsn, rate, count, insert, per_transaction))
            deadline = time.monotonic() + 60
            while receiver.count() < count and time.monotonic() < deadline:
                if any(p.poll() is not None for p in procs):
                    raise RuntimeError(f"a {contender} process ended")
                time.sleep(0.05)
            spent = [
                after - before
                for after, before in zip(_spent(bench, procs, receiver), spent_before, strict=True)
            ]
            elapsed = time.monotonic() - started
            receiver_busy = (receiver.cpu() - cpu_before) / elapsed
            got = receiver.results()
        finally:
            _stop(procs)
        # Read once the contender's sessions have ended: a session reports its counts to
        # the statistics as it ends, and at most every second before.
        transactions = _transactions(dsn) - transactions_before - count // per_transaction
    arrivals: dict[str, list[int]] = got["arrivals"]
    measured = produced.order[warm_up:]
    latencies = [
        (arrivals[k][0] - produced.committed_ns[k]) / 1e6 for k in measured if k in arrivals
    ]
    own = [(arrivals[k][1] - arrivals[k][0]) / 1e6 for k in measured if k in arrivals]
    commits = [(produced.committed_ns[k] - produced.sent_ns[k]) / 1e6 for k in measured]
    first, last = produced.committed_ns[measured[0]], produced.committed_ns[measured[-1]]
    figures = {
        "contender": contender, "rate": rate, "processes": processes, "mode": mode,
        **percentiles(latencies),
        "missing": len(measured) - len(latencies),
        "duplicates": got["duplicates"],
        "achieved_rate": (len(measured) - 1) / max((last - first) / 1e9, 1e-9),
        "producer_late": produced.late,
        "commit": percentiles(commits),
        "receiver_own": percentiles(own),
        "receiver_cpu_share": receiver_busy,
        # CPU the contender's processes and PostgreSQL's (every backend: the producer's too)
        # spent per message over the run: what each contender asks of the shared cores.
        "contender_cpu_us": spent[0] * 1e6 / count,
        "database_cpu_us": spent[1] * 1e6 / count,
        # The database's transactions less the producer's, per message: the contender's
        # statements, and the transactions in which its listening sessions read NOTIFYs.
        "transactions_per_message": transactions / count,
        # Cores other work kept busy during the run, on average: whether the machine was
        # this benchmark's alone.
        "others_cores": spent[2] / elapsed,
        "histogram": histogram(latencies),
    }  # fmt: skip
    return figures, latencies


def run_latency(bench: Bench, plan: Plan, log: Callable[[str], None]) -> dict[str, Any]:
    load_before = os.getloadavg()[0]
    log(f"latency: {plan.repeat} round(s), about {plan.estimate_seconds() / 60:.0f} minutes")
    receiver = Receiver()
    try:
        log("latency: the receiver's capacity (plain aiohttp client)")
        capacity = receiver.capacity()
        runs: list[dict[str, Any]] = []
        pooled: dict[tuple[int, int, str, str], list[float]] = {}
        for n in range(plan.repeat):
            for rate, processes, mode, contender in plan.round(n):
                seconds = plan.duration(rate)
                log(
                    f"latency: {contender}, {processes} process(es), {mode}, {rate}/s for "
                    f"{seconds:g} s ({n + 1}/{plan.repeat})"
                )
                load = os.getloadavg()[0]
                figures, latencies = run_one(
                    bench, receiver, contender, rate, processes, mode, seconds
                )
                runs.append({"round": n, "load_1min": load, **figures})
                pooled.setdefault((rate, processes, mode, contender), []).extend(latencies)
    finally:
        receiver.close()

    def cpu(key: tuple[int, int, str, str], name: str) -> float:
        return statistics.median(
            r[name] for r in runs
            if (r["rate"], r["processes"], r["mode"], r["contender"]) == key
        )  # fmt: skip

    cells = [
        {"rate": key[0], "processes": key[1], "mode": key[2], "contender": key[3],
         **percentiles(latencies), "histogram": histogram(latencies),
         "contender_cpu_us": cpu(key, "contender_cpu_us"),
         "database_cpu_us": cpu(key, "database_cpu_us"),
         "transactions_per_message": cpu(key, "transactions_per_message"),
         "others_cores": cpu(key, "others_cores")}
        for key, latencies in pooled.items()
    ]  # fmt: skip
    settings = {
        "rates": plan.rates, "processes": plan.processes, "modes": plan.modes,
        "contenders": plan.contenders, "seconds": {r: plan.duration(r) for r in plan.rates},
        "repeat": plan.repeat, "repeat_processes": plan.repeat_processes,
        "batch": BATCH, "concurrency": CONCURRENCY,
        "aggregates": AGGREGATES, "producer_connections": PRODUCER_CONNECTIONS,
    }  # fmt: skip
    return {
        "plan": settings,
        "receiver_capacity_rps": capacity,
        "cores": os.cpu_count(),
        "load_before": load_before,
        "bins_ms": BINS_MS,
        "cells": cells,
        "runs": runs,
    }


# -- the report ---------------------------------------------------------------------------

# The heading of the findings written by hand below the figures (a new run keeps them).
FINDINGS = "\n## Where the tail came from, and what changed\n"

NAMES = {
    "worker": "outbox-worker",
    "floor": "floor (the protocol, one loop)",
    "pgqueuer": "pgqueuer",
}


def _ms(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.1f}" if value < 100 else f"{value:,.0f}"


def _ratio(a: float | None, b: float | None) -> str:
    return f"{a / b:.1f}x" if a is not None and b else "-"


LOADED = 2.5  # a 1-minute load average above this on two cores: latency figures mean little
OTHERS_LOADED = 0.5  # cores other work kept busy during a run: as much


def render(latency: dict[str, Any]) -> list[str]:
    plan = latency["plan"]
    cells = latency["cells"]
    runs = latency["runs"]
    loaded = _load_note(latency)
    seconds = ", ".join(f"{s:g} s at {r}/s" for r, s in plan["seconds"].items())
    lines = [
        "## Latency: a producer's commit to the first byte at the receiver",
        "",
        *([loaded, ""] if loaded else []),
        "A producer commits one row per transaction (two in ordered-pairs; the project's "
        "`enqueue` and `enqueue_many`, autocommit, "
        f"up to {plan['producer_connections']} connections so a slow commit never holds the "
        f"next back) at a steady rate, {plan['aggregates']:,} aggregates; each run sends its "
        f"rate for {seconds}, after a first second left out. The figure is the receiver's "
        "`time.time_ns()` at a request's first byte minus the producer's right after its "
        "commit returned: one machine, one clock (CLOCK_REALTIME). "
        f"{_rounds(plan)}, samples pooled.",
        "",
        "Contenders, one after another on the same PostgreSQL and the same two cores as the "
        "producer and the receiver:",
        "",
        f"- **outbox-worker**: `outbox-worker --publisher http` with its defaults (batch "
        f"{plan['batch']}, concurrency {plan['concurrency']}); the ordered modes add "
        "`--ordering aggregate` on a table migrated for it.",
        "- **floor**: `bench/latency_floor.py`, the same protocol without the worker's "
        "machinery: one asyncio loop on one connection doing LISTEN, the project's claim "
        "(outbox.lease) of up to the same batch, every claimed message POSTed at once over "
        "as many connections as the worker's concurrency, one fenced finalize per batch, "
        "claim again.",
        "- **pgqueuer**: its QueueManager with its defaults (batch 10), the entrypoint "
        "POSTing the job; unordered only (pgqueuer has no per-aggregate order).",
        "",
        "Modes: **unordered**; **ordered**, one event per transaction, the aggregates "
        "taking turns (an aggregate's previous event is long delivered when its next comes); "
        "**ordered-pairs**, two events of one aggregate in each transaction (an order placed "
        "and paid together), so the second becomes its aggregate's head only once the first "
        "is finalized, and no NOTIFY announces that. Both are timed from their commit.",
        "",
        _receiver_note(latency),
        "",
        "| rate/s | processes | mode | contender | samples | p50 ms | p90 ms | p99 ms "
        "| p99.9 ms | max ms | CPU µs/msg | PostgreSQL CPU µs/msg | transactions/msg "
        "| other work, cores |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for cell in cells:
        lines.append(
            f"| {cell['rate']:,} | {cell['processes']} | {cell['mode']} | "
            f"{NAMES[cell['contender']]} | {cell['samples']:,} | "
            + " | ".join(_ms(cell[k]) for k in ("p50_ms", "p90_ms", "p99_ms", "p999_ms", "max_ms"))
            + f" | {cell['contender_cpu_us']:,.0f} | {cell['database_cpu_us']:,.0f}"
            f" | {cell['transactions_per_message']:.2f} | {cell['others_cores']:.2f} |"
        )
    lines += [
        "",
        "- : fewer than ten samples beyond that percentile. CPU: the contender's processes "
        "and all of PostgreSQL's (the producer's backends too) over the run, idle waits "
        "included, per message sent: what each asks of the cores everything shares. "
        "Transactions: those of the run's database less the producer's, per message: the "
        "contender's statements (claims, finalizes, lease renewals, the rest), and one for "
        "each NOTIFY a listening session reads while idle (PostgreSQL reads its queue in a "
        "transaction of its own). Other work: the cores busy during the run with anything "
        "but this benchmark's processes, on average: other processes, and kernel threads "
        "(which the WAL's flushes and the loopback traffic keep busy too: about a third of a "
        "core at 1,000/s); a cell beside which they took much more is a loaded machine's.",
        "",
        "### The worker beside the floor (worker ÷ floor, same cell, same run)",
        "",
        "| rate/s | processes | mode | p50 | p90 | p99 | p99.9 | max |",
        "|---|---|---|---|---|---|---|---|",
    ]
    by_key = {(c["rate"], c["processes"], c["mode"], c["contender"]): c for c in cells}
    for (rate, processes, mode, contender), worker in by_key.items():
        floor = by_key.get((rate, processes, mode, "floor"))
        if contender != "worker" or floor is None:
            continue
        lines.append(
            f"| {rate:,} | {processes} | {mode} | "
            + " | ".join(
                _ratio(worker[k], floor[k])
                for k in ("p50_ms", "p90_ms", "p99_ms", "p999_ms", "max_ms")
            )
            + " |"
        )
    lines += ["", *_goals(runs), "", *_run_notes(runs)]
    return lines


def _rounds(plan: dict[str, Any]) -> str:
    repeated = plan.get("repeat_processes")
    if plan["repeat"] == 1 or not repeated:
        return f"{plan['repeat']} round(s)"
    names = " and ".join(str(n) for n in repeated)
    return f"{plan['repeat']} rounds of the cells of {names} process(es), one of the others"


# The goals for the worker, run by run: its p99 at most GOAL_P99_MS, or within
# FLOOR_RATIO of the floor's when the floor's own is above that; its p50 within FLOOR_RATIO
# of the floor's; its p99 below pgqueuer's.
GOAL_P99_MS = 10.0
FLOOR_RATIO = 1.5


def _goals(runs: list[dict[str, Any]]) -> list[str]:
    """Each cell's worker, floor and pgqueuer of the same round side by side, and which of
    the goals the worker met in that round ("-": too few samples for the percentile)."""
    by_run = {(r["round"], r["rate"], r["processes"], r["mode"], r["contender"]): r for r in runs}
    lines = [
        "### The goals, round by round (the worker's p99 ≤ 10 ms or ≤ 1.5x the floor's, "
        "p50 ≤ 1.5x the floor's, p99 below pgqueuer's)",
        "",
        "| rate/s | processes | mode | round | worker p50 / p99 ms | floor p50 / p99 ms "
        "| pgqueuer p99 ms | p99 goal | p50 goal | ahead of pgqueuer |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    keys = sorted({k[:4] for k in by_run}, key=lambda k: (k[1], k[2], MODES.index(k[3]), k[0]))
    for n, rate, processes, mode in keys:
        worker = by_run.get((n, rate, processes, mode, "worker"))
        floor = by_run.get((n, rate, processes, mode, "floor"))
        if worker is None or floor is None:
            continue
        peer = by_run.get((n, rate, processes, mode, "pgqueuer"))
        w50, w99, f50, f99 = (
            worker["p50_ms"], worker["p99_ms"], floor["p50_ms"], floor["p99_ms"]
        )  # fmt: skip
        p99_goal = (
            None if w99 is None or f99 is None
            else w99 <= max(GOAL_P99_MS, FLOOR_RATIO * f99)
        )  # fmt: skip
        p50_goal = None if w50 is None or f50 is None else w50 <= FLOOR_RATIO * f50
        ahead = (
            None if peer is None or w99 is None or peer["p99_ms"] is None
            else w99 < peer["p99_ms"]
        )  # fmt: skip
        lines.append(
            f"| {rate:,} | {processes} | {mode} | {n + 1} | {_ms(w50)} / {_ms(w99)} "
            f"| {_ms(f50)} / {_ms(f99)} | {_ms(peer['p99_ms']) if peer else '-'} "
            f"| {_met(p99_goal)} | {_met(p50_goal)} | {_met(ahead)} |"
        )
    return lines


def _met(goal: bool | None) -> str:
    return "-" if goal is None else "yes" if goal else "**no**"


def _load_note(latency: dict[str, Any]) -> str | None:
    """How busy the machine was with other work: the load average before the section
    started, and the cores other processes kept busy during each run (the load average
    once runs go on counts this benchmark's own processes). The figures are marked as a
    loaded machine's when the load was above LOADED at the start, or other work kept more
    than OTHERS_LOADED cores busy during the median run."""
    runs = latency["runs"]
    if not runs:
        return None
    before = latency.get("load_before", runs[0]["load_1min"])
    others = [r.get("others_cores", 0.0) for r in runs]
    cores = latency.get("cores") or 2
    seen = (
        f"the 1-minute load average was {before:.1f} before the first run, and other work "
        f"kept {statistics.median(others):.2f} of the {cores} cores busy during a run at the "
        f"median, {max(others):.2f} at most"
    )
    if before > LOADED or statistics.median(others) > OTHERS_LOADED:
        return (
            f"**Taken on a loaded machine**: {seen}. Other work competed for the CPU with "
            "every contender: these figures show that the harness works, not what the "
            "contenders do."
        )
    return f"Machine: {seen}."


def _receiver_note(latency: dict[str, Any]) -> str:
    runs = latency["runs"]
    busiest = max((r["receiver_cpu_share"] for r in runs), default=0.0)
    own_p90 = max((r["receiver_own"]["p90_ms"] or 0.0 for r in runs), default=0.0)
    own_max = max((r["receiver_own"]["max_ms"] or 0.0 for r in runs), default=0.0)
    rates = latency["plan"]["rates"]
    return (
        "The receiver (`bench/latency_receiver.py`, aiohttp's low-level server on uvloop in a "
        "process of its own) is not the bottleneck: a plain aiohttp client got "
        f"{latency['receiver_capacity_rps']:,.0f} requests/s from it in this run, against at "
        f"most {max(rates):,} a second sent; it was busy at most {busiest:.0%} of a core "
        "during any run, and its own share of a figure (from the first byte to its handler, "
        f"both noted) was at most {own_p90:.2f} ms at p90 and {own_max:.1f} ms at most in any "
        "run."
    )


def _run_notes(runs: list[dict[str, Any]]) -> list[str]:
    notes = []
    short = [r for r in runs if r["achieved_rate"] < 0.97 * r["rate"] or r["missing"]]
    for r in short:
        notes.append(
            f"- {NAMES[r['contender']]}, {r['processes']} process(es), {r['mode']}, "
            f"{r['rate']}/s: the producer reached {r['achieved_rate']:,.0f}/s "
            f"({r['producer_late']} messages found every producer connection busy), "
            f"{r['missing']} missing."
        )
    commits = [r["commit"]["p50_ms"] for r in runs]
    commit_p90 = [r["commit"]["p90_ms"] for r in runs if r["commit"]["p90_ms"] is not None]
    dupes = sum(r["duplicates"] for r in runs)
    return [
        f"The producer's own statement (enqueue until its commit returned, not part of the "
        f"figures): p50 {min(commits):.1f}-{max(commits):.1f} ms, p90 up to "
        f"{max(commit_p90, default=0.0):.1f} ms across runs. Duplicates at the receiver: "
        f"{dupes}.",
        *(["", *notes] if notes else []),
    ]


def plot(latency: dict[str, Any], path: Path) -> None:
    """Histograms of every cell: one panel per rate and process count, one line per
    contender and mode, counts as a share of the cell's samples on log-spaced bins."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    plan, edges = latency["plan"], latency["bins_ms"]
    rates, processes = list(plan["rates"]), list(plan["processes"])
    figure, axes = plt.subplots(
        len(processes), len(rates), figsize=(5 * len(rates), 3.6 * len(processes)),
        squeeze=False, sharex=True,
    )  # fmt: skip
    colours = {"worker": "tab:green", "floor": "tab:blue", "pgqueuer": "tab:orange"}
    longest = max((c["max_ms"] or 0.0 for c in latency["cells"]), default=0.0)
    right = min(edges[-1], max(500.0, 1.5 * longest))
    for cell in latency["cells"]:
        ax = axes[processes.index(cell["processes"])][rates.index(cell["rate"])]
        total = max(cell["samples"], 1)
        shares = [c / total for c in cell["histogram"]]
        style = {"unordered": "-", "ordered": "--"}.get(cell["mode"], ":")
        ax.stairs(
            shares, edges, color=colours[cell["contender"]], linestyle=style,
            label=f"{cell['contender']} ({cell['mode']})",
        )  # fmt: skip
        if cell["p99_ms"] is not None and cell["mode"] == "unordered":
            ax.axvline(cell["p99_ms"], color=colours[cell["contender"]], alpha=0.4, lw=0.8)
    for row, n in enumerate(processes):
        for col, rate in enumerate(rates):
            ax = axes[row][col]
            ax.set_xscale("log")
            ax.set_yscale("log")
            ax.set_xlim(0.5, right)
            ax.set_ylim(1e-5, 1)
            ax.set_title(f"{rate:,} msg/s, {n} process{'es' if n > 1 else ''}", fontsize=10)
            if row == len(processes) - 1:
                ax.set_xlabel("commit → first byte at the receiver (ms)")
            if col == 0:
                ax.set_ylabel("share of messages")
    axes[0][0].legend(fontsize=7)
    figure.suptitle("Latency histograms (thin vertical lines: unordered p99)", fontsize=11)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
