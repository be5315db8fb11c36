"""The benchmark scenarios beyond raw throughput: HTTP, scale, memory, slow publishers (latency:
bench/latency.py)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import psycopg

from bench.cpu import cpu_seconds, pin, tree_cpu_seconds
from bench.env import ROOT, Bench, measure_drain, python_module, seed_outbox
from outbox.demo.embedded import free_port
from outbox.lease import OrderedClaims, claim, finalize
from outbox.models import Outcome
from outbox.table import Table

TABLE = Table.parse("outbox")


def _remaining(dsn: str) -> Any:
    conn = psycopg.connect(dsn, autocommit=True)
    query = "SELECT count(*) FROM outbox WHERE status IN ('pending', 'processing')"
    return lambda: int(conn.execute(query).fetchone()[0])  # type: ignore[index]


def _stop(procs: list[subprocess.Popen[bytes]]) -> None:
    for proc in procs:
        if proc.poll() is None:
            proc.terminate()
        proc.wait()


def _wait_for_port(port: int, timeout: float = 20) -> None:
    import socket

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.05)
    raise TimeoutError(f"nothing listens on port {port}")


# -- HTTP publisher against what the server can take ---------------------------------------


@contextlib.contextmanager
def _database_pinned(bench: Bench, core: int | None) -> Iterator[None]:
    """PostgreSQL's postmaster and its running children on `core`; the backends it forks
    meanwhile inherit that. All cores again afterwards. `core` None: left alone."""
    postmaster = bench.server.pid
    if core is None or postmaster is None:
        yield
        return
    every = os.sched_getaffinity(postmaster)
    pin(postmaster, {core}, tree=True)
    try:
        yield
    finally:
        pin(postmaster, every, tree=True)


def _on(core: int | None, module: str, *args: str) -> subprocess.Popen[bytes]:
    pin = ("taskset", "--cpu-list", str(core)) if core is not None else ()
    return subprocess.Popen([*pin, sys.executable, "-m", module, *args], cwd=ROOT)


class _Progress:
    """Where a drain is, asked cheaply: a count of what is left only until the drain starts
    (the worker is idle then), afterwards whether anything is left (the partial index's first
    entry), so that polling takes little from the contenders while they run."""

    def __init__(self, dsn: str) -> None:
        self.conn = psycopg.connect(dsn, autocommit=True)
        self.backend_pid: int = self.conn.info.backend_pid

    def left(self) -> int:
        query = "SELECT count(*) FROM outbox WHERE status IN ('pending', 'processing')"
        return int(self.conn.execute(query).fetchone()[0])  # type: ignore[index]

    def finished(self) -> bool:
        query = "SELECT NOT EXISTS (SELECT FROM outbox WHERE status IN ('pending', 'processing'))"
        return bool(self.conn.execute(query).fetchone()[0])  # type: ignore[index]


def _drain_with_cpu(
    progress: _Progress,
    total: int,
    worker: subprocess.Popen[bytes],
    sample: Callable[[], dict[str, float]],
) -> tuple[float, dict[str, float]]:
    """Messages per second and `sample()`'s CPU seconds over the same window: from the last
    poll at which nothing was done yet to the first at which everything was (start-up left
    out, as in measure_drain). A poll lands within 20 ms of either end."""
    deadline = time.monotonic() + 600
    started_at, cpu_before = time.monotonic(), sample()
    while True:
        cpu_now, left, now = sample(), progress.left(), time.monotonic()
        if left < total:
            break
        started_at, cpu_before = now, cpu_now
        _check_alive(worker, deadline)
        time.sleep(0.02)
    while not progress.finished():
        _check_alive(worker, deadline)
        time.sleep(0.02)
        cpu_now, now = sample(), time.monotonic()
    spent = {name: cpu_now[name] - cpu_before[name] for name in cpu_now}
    return total / max(now - started_at, 1e-6), spent


def _check_alive(worker: subprocess.Popen[bytes], deadline: float) -> None:
    if time.monotonic() > deadline:
        raise TimeoutError("the drain did not finish")
    if worker.poll() not in (None, 0):
        raise RuntimeError("the worker process failed")


def _worker_drain(
    bench: Bench,
    messages: int,
    publisher: tuple[str, ...],
    concurrency: int,
    cores: tuple[int | None, int | None],
    server: subprocess.Popen[bytes] | None = None,
) -> tuple[float, dict[str, float]]:
    """One worker draining `messages` fresh rows: its rate, and CPU µs per message of the
    worker, the database and (given) the HTTP server. `cores`: (database's, everyone else's)."""
    db_core, app_core = cores
    postmaster = bench.server.pid
    assert postmaster is not None
    with bench.database() as dsn, _database_pinned(bench, db_core):
        seed_outbox(dsn, messages)
        worker = _on(
            app_core, "outbox.worker", "--dsn", dsn, *publisher, "--batch", "500",
            "--concurrency", str(concurrency), "--log-level", "WARNING",
        )  # fmt: skip
        progress = _Progress(dsn)

        def sample() -> dict[str, float]:
            return {
                "worker": cpu_seconds(worker.pid),
                "database": tree_cpu_seconds(postmaster, progress.backend_pid),
                **({"server": cpu_seconds(server.pid)} if server else {}),
            }

        try:
            rate, spent = _drain_with_cpu(progress, messages, worker, sample)
        finally:
            _stop([worker])
            progress.conn.close()
    return rate, {name: seconds * 1e6 / messages for name, seconds in spent.items()}


def http_throughput(
    bench: Bench, messages: int, concurrency: int = 64, *, pinned: bool = False
) -> dict[str, float]:
    """The plain load generator, the worker, the load generator again, against one server in
    one run: rates, and CPU µs per request (load generator) and per delivered message
    (worker), server and database beside them; then the worker with the no-op publisher, the
    dispatch loop's own share.
    `pinned`: PostgreSQL on one core, everything else on another."""
    cores = sorted(os.sched_getaffinity(0))
    if pinned and len(cores) < 2:
        raise RuntimeError("pinning needs two cores")
    db_core, app_core = (cores[-1], cores[0]) if pinned else (None, None)
    port = free_port()
    url = f"http://127.0.0.1:{port}/events"
    server = _on(app_core, "bench.http_server", str(port))

    def plain_client() -> tuple[float, float, float]:
        """(requests/s, its CPU µs per request, the server's CPU µs per request)"""
        server_cpu_before = cpu_seconds(server.pid)
        loadgen = subprocess.run(
            [*(("taskset", "--cpu-list", str(app_core)) if pinned else ()), sys.executable,
             "-m", "bench.loadgen", url, str(messages), str(concurrency)],
            capture_output=True, text=True, check=True, cwd=ROOT,
        )  # fmt: skip
        # The server did nothing else meanwhile: its whole CPU is the load generator's.
        server_us = (cpu_seconds(server.pid) - server_cpu_before) * 1e6 / messages
        plain = json.loads(loadgen.stdout)
        return plain["requests_per_second"], plain["cpu_seconds"] * 1e6 / messages, server_us

    try:
        _wait_for_port(port)
        # The load generator before and after the worker, averaged: the shared machine's load
        # drifts, and bracketing cancels a drift that is steady over the round.
        before = plain_client()
        http = ("--publisher", "http", "--http-url", url)
        ours, spent = _worker_drain(bench, messages, http, concurrency, (db_core, app_core), server)
        after = plain_client()
    finally:
        _stop([server])
    rate, loadgen_us, server_us = ((b + a) / 2 for b, a in zip(before, after, strict=True))
    _, null = _worker_drain(
        bench, messages, ("--publisher", "null"), concurrency, (db_core, app_core)
    )
    return {
        "server_capacity": rate,
        "outbox_dispatcher": ours,
        "loadgen_cpu_us": loadgen_us,
        "worker_cpu_us": spent["worker"],
        "server_cpu_us_loadgen": server_us,
        "server_cpu_us_worker": spent["server"],
        "database_cpu_us": spent["database"],
        "null_worker_cpu_us": null["worker"],
        "null_database_cpu_us": null["database"],
    }


# -- scale: claim and finalize cost as done rows pile up; ordered mode ----------------------


async def _drain_in_process(dsn: str, ordered: bool, batch: int = 500) -> tuple[float, int]:
    """(microseconds of claim + finalize per message, messages) with one connection."""
    async with await psycopg.AsyncConnection.connect(
        dsn, autocommit=True, prepare_threshold=None
    ) as conn:
        total, spent = 0, 0.0
        plan = OrderedClaims()  # the worker's own choice of ordered claim
        while True:
            started = time.perf_counter()
            messages = await claim(
                conn, TABLE, owner="bench", batch=batch, lease=timedelta(minutes=1),
                max_attempts=12, ordered=ordered, by_aggregate=plan.by_aggregate,
            )  # fmt: skip
            plan.observe(len(messages), batch)
            if not messages:
                return (1e6 * spent / max(total, 1), total)
            await finalize(conn, TABLE, [Outcome.done(m) for m in messages])
            spent += time.perf_counter() - started
            total += len(messages)


def scale_done_rows(bench: Bench, done_rows: int, messages: int) -> dict[str, float]:
    with bench.database() as dsn:
        seed_outbox(dsn, done_rows, status="done")
        seed_outbox(dsn, messages)
        micros, drained = asyncio.run(_drain_in_process(dsn, ordered=False))
    return {"done_rows": done_rows, "us_per_message": micros, "messages": drained}


def ordered_aggregates(bench: Bench, aggregates: int, messages: int) -> dict[str, float]:
    with bench.database(ordering="aggregate") as dsn:
        seed_outbox(dsn, messages, aggregates=aggregates)
        started = time.perf_counter()
        micros, drained = asyncio.run(_drain_in_process(dsn, ordered=True))
        elapsed = time.perf_counter() - started
    return {
        "aggregates": aggregates,
        "us_per_message": micros,
        "messages_per_second": drained / elapsed,
    }


# -- memory over a long drain -----------------------------------------------------------------


def _rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def memory_drain(bench: Bench, messages: int) -> dict[str, Any]:
    with bench.database() as dsn:
        seed_outbox(dsn, messages)
        worker = python_module(
            "outbox.worker", "--dsn", dsn, "--publisher", "null", "--batch", "500",
            "--concurrency", "64", "--log-level", "WARNING",
        )  # fmt: skip
        remaining = _remaining(dsn)
        samples: list[tuple[int, int]] = []  # (messages left, RSS KiB)
        try:
            while True:
                left = remaining()
                samples.append((left, _rss_kib(worker.pid)))
                if left == 0:
                    break
                if worker.poll() is not None:
                    raise RuntimeError("the worker died")
                time.sleep(0.25)
        finally:
            _stop([worker])
    # Start-up (imports, first connections) is not the drain: compare the second tenth of the
    # drain with the last one.
    progress = [((messages - left) / messages, kib) for left, kib in samples if kib]
    early = [kib for done, kib in progress if 0.1 <= done < 0.2] or [progress[0][1]]
    late = [kib for done, kib in progress if done >= 0.9] or [progress[-1][1]]
    return {
        "messages": messages,
        "rss_mib_early": statistics.median(early) / 1024,
        "rss_mib_late": statistics.median(late) / 1024,
        "rss_mib_peak": max(kib for _, kib in progress) / 1024,
        "samples": [(messages - left, kib) for left, kib in samples],
    }


# -- publisher-bound workloads ------------------------------------------------------------------


def publisher_bound(bench: Bench, concurrency: int, delay_ms: int = 50) -> dict[str, float]:
    messages = max(200, concurrency * 20)
    with bench.database() as dsn:
        seed_outbox(dsn, messages)
        worker = python_module(
            "outbox.worker", "--dsn", dsn, "--publisher", "bench.publishers:SlowPublisher",
            "--slow-publish-delay", f"{delay_ms}ms", "--concurrency", str(concurrency),
            "--batch", str(min(500, concurrency * 2)), "--log-level", "WARNING",
        )  # fmt: skip
        try:
            rate = measure_drain(_remaining(dsn), messages, [worker], timeout=600)
        finally:
            _stop([worker])
    return {
        "concurrency": concurrency,
        "messages_per_second": rate,
        "ideal": concurrency * 1000 / delay_ms,
    }
