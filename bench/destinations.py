"""The destination gate beside today's behaviour, in one run: a downed HTTP API and the rate limit.

python -m bench.destinations                    # the full run (about 20 minutes on 2 cores)
python -m bench.destinations --smoke --out DIR  # tiny sizes: checks the harness only
python -m bench.destinations --outage 90 --rate 20 --workers 2,4 --limit 50

**Outage.** Real `outbox-worker` processes (default settings, the http publisher) deliver
messages that a producer process enqueues at a steady rate (one `enqueue` per transaction)
to an HTTP API running in a process of its own. After a warm-up the API answers 503 to
everything for `--outage` seconds (or is killed, so connections are refused, and started
again on the same port), then answers 200 again. Each setting runs twice, back to back: with
`--breaker-failures 0` (today's behaviour: every message retried on its own, full-jitter
backoff) and with every breaker setting at its default. Measured:
- requests reaching the downed API during the outage (503: counted by the API; refused: the
  workers' own count of failed publishes, `outbox_destination_failures_total`, since nothing
  listens), per message arriving during the outage and per second (mean, and the busiest
  10 s);
- attempts spent (`attempts` of every message at the end: the most, and the total against
  the number of messages), dead messages;
- time from recovery to the first delivery and to an empty backlog (every message created
  before the recovery finished); arrivals go on meanwhile.

**Rate limit.** `--rate-limit R/s` with 1, 2 and 4 worker processes against the same API
answering 200 at once, with a backlog deeper than the run can drain. Every request's arrival
time is taken at the API; the figure is the busiest 10 s window (any start) against R x 10:
the goal is 1.1 at most.

Writes destinations.json and destinations.md into --out, with the machine's load (load
average and the share of CPU busy, from /proc/stat) over each measurement.
"""

from __future__ import annotations

import argparse
import bisect
import contextlib
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from datetime import datetime
from pathlib import Path
from typing import Any

import psycopg

from bench.env import Bench, python_module
from bench.env import seed_outbox as seed_backlog
from outbox.demo.embedded import free_port

WINDOW = 10.0  # seconds: the rate limit's goal holds over any window this long
GOAL = 1.1  # the busiest window against the limit
SAMPLE_EVERY = 1.0  # seconds between two looks at the table and the workers' counters


@dataclass(frozen=True)
class Sizes:
    rate: float  # messages arriving per second during the outage runs
    warmup: float  # seconds of healthy delivery before the outage
    outage: float  # seconds
    drain_timeout: float  # seconds after the recovery before giving up on an empty backlog
    outage_workers: tuple[int, ...]  # worker processes, 503 runs
    refused_workers: tuple[int, ...]  # worker processes, refused-connection runs
    limit: float  # --rate-limit, messages/s
    limit_seconds: float  # measured from the first request
    limit_workers: tuple[int, ...]


FULL = Sizes(
    rate=20, warmup=10, outage=60, drain_timeout=400, outage_workers=(2, 4),
    refused_workers=(2,), limit=50, limit_seconds=40, limit_workers=(1, 2, 4),
)  # fmt: skip
SMOKE = Sizes(
    rate=10, warmup=3, outage=8, drain_timeout=90, outage_workers=(2,), refused_workers=(2,),
    limit=20, limit_seconds=12, limit_workers=(1, 2),
)  # fmt: skip

# The two sides of every outage comparison: the same workers, the breaker off or at defaults.
CONTENDERS: dict[str, tuple[str, ...]] = {
    "today": ("--breaker-failures", "0"),
    "breaker": (),
}
WORKER_FLAGS = ("--publisher", "http", "--log-level", "WARNING")


ANALYSIS = "\n## What the figures say\n"


def _log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


# -- the machine's load ------------------------------------------------------------------------


def _cpu_times() -> tuple[int, int]:
    """(busy, total) jiffies of all cores since boot."""
    with open("/proc/stat") as stat:
        fields = [int(v) for v in stat.readline().split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    return sum(fields) - idle, sum(fields)


class Load:
    """The load average and the share of all cores busy (everything on the machine, this
    benchmark included) between start and stop."""

    def __init__(self) -> None:
        self.before = os.getloadavg()
        self._cpu = _cpu_times()

    def figures(self) -> dict[str, float]:
        busy, total = _cpu_times()
        after = os.getloadavg()
        return {
            "loadavg_1m_before": round(self.before[0], 2),
            "loadavg_1m_after": round(after[0], 2),
            "cpu_busy_share": round((busy - self._cpu[0]) / max(total - self._cpu[1], 1), 3),
        }


# -- the downstream API ------------------------------------------------------------------------


def serve_downstream(port: int, status: int, log_path: str) -> None:
    """The API (a process of its own, so that serving costs the measuring process nothing):
    answers `status` to every POST, then whatever status a line on stdin says; writes one
    line per request (monotonic arrival time, status, Idempotency-Key); ends at stdin's end."""
    import asyncio

    from aiohttp import web

    answer = {"status": status}
    log = open(log_path, "a", buffering=1)  # noqa: SIM115  # a line reaches the file at once

    async def receive(request: web.Request) -> web.Response:
        arrived = time.monotonic()
        await request.read()
        code = answer["status"]
        log.write(f"{arrived:.6f} {code} {request.headers.get('Idempotency-Key', '-')}\n")
        return web.Response(status=code, text="{}", content_type="application/json")

    async def main() -> None:
        app = web.Application()
        app.router.add_post("/events", receive)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port, reuse_address=True).start()
        print("ready", flush=True)
        loop = asyncio.get_running_loop()
        while line := await loop.run_in_executor(None, sys.stdin.readline):
            answer["status"] = int(line)
            print("ok", flush=True)
        await runner.cleanup()

    asyncio.run(main())


@dataclass(frozen=True)
class Received:
    at: float  # time.monotonic() at arrival (the clock is the machine's: every process's)
    status: int
    key: str


class Downstream:
    """The API, seen from the benchmark: switched between 200 and 503, or killed (connections
    refused) and started again on the same port."""

    def __init__(self, log: Path) -> None:
        self.log = log
        self.port = free_port()
        self.proc: subprocess.Popen[str] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/events"

    def start(self, status: int = 200) -> Downstream:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "bench.destinations", "downstream", str(self.port),
             str(status), str(self.log)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        if self._reply() != "ready":
            raise RuntimeError(f"the downstream API did not start on port {self.port}")
        return self

    def answer(self, status: int) -> None:
        """From now on, answer `status` (returns once the API has taken it)."""
        assert self.proc is not None and self.proc.stdin is not None
        self.proc.stdin.write(f"{status}\n")
        self.proc.stdin.flush()
        if self._reply() != "ok":
            raise RuntimeError("the downstream API did not take the new status")

    def kill(self) -> None:
        """Gone at once: its port refuses connections, open ones are reset."""
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait()
        self.proc = None

    def stop(self) -> None:
        if self.proc is None:
            return
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.proc = None

    def _reply(self) -> str:
        assert self.proc is not None and self.proc.stdout is not None
        return self.proc.stdout.readline().strip()

    def received(self) -> list[Received]:
        if not self.log.exists():
            return []
        rows = []
        for line in self.log.read_text().splitlines():
            at, status, key = line.split(" ", 2)
            rows.append(Received(float(at), int(status), key))
        return sorted(rows, key=lambda r: r.at)


# -- the producer ------------------------------------------------------------------------------


def produce(dsn: str, rate: float) -> None:
    """Enqueue one message per transaction, `rate` a second on a fixed schedule, until stdin
    ends; then print how many and how far behind the schedule it ever fell."""
    from outbox.producer import enqueue

    stop = threading.Event()
    threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
    sent, late = 0, 0.0
    with psycopg.connect(dsn, autocommit=True) as conn:
        print("ready", flush=True)
        started = time.monotonic()
        while not stop.is_set():
            wait = started + sent / rate - time.monotonic()
            if wait > 0:
                stop.wait(wait)
                continue
            late = max(late, -wait)
            with conn.transaction():
                enqueue(
                    conn, aggregate_type="order", aggregate_id=f"order-{sent % 1000}",
                    event_type="OrderPlaced", payload={"order": sent, "note": "x" * 160},
                )  # fmt: skip
            sent += 1
    print(json.dumps({"sent": sent, "max_late_seconds": round(late, 3)}), flush=True)


class Producer:
    def __init__(self, dsn: str, rate: float) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "bench.destinations", "produce", dsn, f"{rate:g}"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        assert self.proc.stdout is not None
        if self.proc.stdout.readline().strip() != "ready":
            raise RuntimeError("the producer did not start")

    def stop(self) -> dict[str, Any]:
        out, _ = self.proc.communicate(timeout=30)
        if self.proc.returncode != 0:
            raise RuntimeError("the producer failed")
        return dict(json.loads(out))


# -- the workers -------------------------------------------------------------------------------


@dataclass
class Worker:
    proc: subprocess.Popen[bytes]
    metrics_port: int

    def get(self, path: str) -> str:
        url = f"http://127.0.0.1:{self.metrics_port}{path}"
        with urllib.request.urlopen(url, timeout=5) as response:
            return str(response.read().decode())


def start_workers(dsn: str, url: str, count: int, flags: Sequence[str], logs: Path) -> list[Worker]:
    workers = []
    for i in range(count):
        port = free_port()
        log = open(logs / f"worker-{i}.log", "ab")  # noqa: SIM115  # the child writes to it
        proc = python_module(
            "outbox.worker", "--dsn", dsn, *WORKER_FLAGS, "--http-url", url, "--owner",
            f"bench-{i}", "--metrics-port", str(port), *flags, stdout=log, stderr=log,
        )  # fmt: skip
        log.close()
        workers.append(Worker(proc, port))
    deadline = time.monotonic() + 120
    for worker in workers:
        while True:
            if worker.proc.poll() is not None:
                raise RuntimeError(f"a worker exited ({worker.proc.returncode}); see {logs}")
            with contextlib.suppress(OSError):
                worker.get("/readyz")
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"a worker did not become ready; see {logs}")
            time.sleep(0.1)
    return workers


def stop_workers(workers: list[Worker]) -> list[int]:
    for worker in workers:
        if worker.proc.poll() is None:
            worker.proc.terminate()
    codes = []
    for worker in workers:
        try:
            codes.append(worker.proc.wait(timeout=60))
        except subprocess.TimeoutExpired:
            worker.proc.kill()
            codes.append(worker.proc.wait())
    return codes


def failed_publishes(workers: list[Worker]) -> float:
    """Retryable publish failures counted by every worker (each one a request or a connection
    attempt that met the outage), summed over destinations."""
    total = 0.0
    for worker in workers:
        for line in worker.get("/metrics").splitlines():
            if line.startswith("outbox_destination_failures_total"):
                total += float(line.rsplit(" ", 1)[1])
    return total


# -- the table ---------------------------------------------------------------------------------


def db_now(conn: psycopg.Connection[Any]) -> datetime:
    row = conn.execute("SELECT clock_timestamp()").fetchone()
    assert row is not None
    return row[0]  # type: ignore[no-any-return]


def unfinished_before(conn: psycopg.Connection[Any], moment: datetime) -> int:
    row = conn.execute(
        "SELECT count(*) FROM outbox WHERE status IN ('pending', 'processing') AND created_at < %s",
        [moment],
    ).fetchone()
    assert row is not None
    return int(row[0])


def table_figures(conn: psycopg.Connection[Any]) -> dict[str, Any]:
    row = conn.execute(
        "SELECT count(*), count(*) FILTER (WHERE status = 'done'), "
        "count(*) FILTER (WHERE status = 'dead'), "
        "count(*) FILTER (WHERE status IN ('pending', 'processing')), "
        "coalesce(max(attempts), 0), coalesce(sum(attempts), 0) FROM outbox"
    ).fetchone()
    assert row is not None
    messages, done, dead, unfinished, most, total = row
    by_attempts = conn.execute(
        "SELECT attempts, count(*) FROM outbox GROUP BY attempts ORDER BY attempts"
    ).fetchall()
    return {
        "messages": messages, "done": done, "dead": dead, "unfinished": unfinished,
        "max_attempts": most, "total_attempts": int(total),
        "messages_by_attempts": {str(a): n for a, n in by_attempts},
    }  # fmt: skip


def arrived_between(conn: psycopg.Connection[Any], start: datetime, end: datetime) -> int:
    row = conn.execute(
        "SELECT count(*) FROM outbox WHERE created_at >= %s AND created_at < %s", [start, end]
    ).fetchone()
    assert row is not None
    return int(row[0])


def sleep_sampling(seconds: float, sample: Callable[[], None]) -> None:
    """Sleep `seconds`, calling `sample` every SAMPLE_EVERY and at the end."""
    end = time.monotonic() + seconds
    while (left := end - time.monotonic()) > 0:
        time.sleep(min(SAMPLE_EVERY, left))
        sample()


# -- windows -----------------------------------------------------------------------------------


def busiest_window(times: Sequence[float], width: float = WINDOW) -> int:
    """The most events in any window [t, t + width): some busiest window starts at an event."""
    ordered = sorted(times)
    return max(
        (bisect.bisect_left(ordered, t + width) - i for i, t in enumerate(ordered)), default=0
    )


def quietest_window(times: Sequence[float], start: float, end: float, width: float = WINDOW) -> int:
    """The fewest events in a window [t, t + width) within [start, end], t on a 0.1 s grid."""
    ordered = sorted(times)
    counts = []
    t = start
    while t + width <= end + 1e-9:
        counts.append(bisect.bisect_left(ordered, t + width) - bisect.bisect_left(ordered, t))
        t += 0.1
    return min(counts, default=0)


def busiest_rate(samples: Sequence[tuple[float, float]], width: float = WINDOW) -> float:
    """The highest rate between two samples of a cumulative count about `width` apart."""
    best = 0.0
    for i, (t0, c0) in enumerate(samples):
        later = [(t, c) for t, c in samples[i + 1 :] if t - t0 <= width + SAMPLE_EVERY / 2]
        if later and later[-1][0] - t0 >= width - SAMPLE_EVERY / 2:
            t1, c1 = later[-1]
            best = max(best, (c1 - c0) / (t1 - t0))
    return best


# -- one outage --------------------------------------------------------------------------------


def outage_run(
    bench: Bench, kind: str, workers: int, contender: str, sizes: Sizes, workdir: Path
) -> dict[str, Any]:
    """One outage (`kind`: 503 or refused) met by `workers` worker processes."""
    workdir.mkdir(parents=True)
    load = Load()
    with bench.database() as dsn, psycopg.connect(dsn, autocommit=True) as conn:
        api = Downstream(workdir / "requests.log").start(200)
        procs: list[Worker] = []
        producer: Producer | None = None
        try:
            procs = start_workers(dsn, api.url, workers, CONTENDERS[contender], workdir)
            producer = Producer(dsn, sizes.rate)
            time.sleep(sizes.warmup)
            if table_figures(conn)["done"] == 0:
                raise RuntimeError(f"nothing delivered in the warm-up; see {workdir}")

            samples: list[tuple[float, float]] = []  # (monotonic, failed publishes so far)

            def sample() -> None:
                samples.append((time.monotonic(), failed_publishes(procs)))

            sample()
            went_down, down_at = time.monotonic(), db_now(conn)
            if kind == "503":
                api.answer(503)
            else:
                api.kill()
            sleep_sampling(sizes.outage, sample)
            if kind == "503":
                api.answer(200)
            else:
                api.start(200)  # still refusing until it listens again: count that too
            sample()
            came_back, back_at = time.monotonic(), db_now(conn)
            during = samples[-1][1] - samples[0][1]
            backlog_at_recovery = unfinished_before(conn, back_at)
            drained: float | None = None
            while time.monotonic() - came_back < sizes.drain_timeout:
                if unfinished_before(conn, back_at) == 0:
                    drained = time.monotonic() - came_back
                    break
                time.sleep(0.2)
            produced = producer.stop()
            producer = None
            # What arrived after the recovery goes out within seconds; a message still
            # waiting out a backoff past the drain timeout stays unfinished.
            deadline = time.monotonic() + (30 if drained is not None else 5)
            while table_figures(conn)["unfinished"] and time.monotonic() < deadline:
                time.sleep(0.2)
            figures = table_figures(conn)
            arrived = arrived_between(conn, down_at, back_at)
        finally:
            if producer is not None:
                producer.stop()
            codes = stop_workers(procs)
            api.stop()
    received = api.received()
    hit = [r.at for r in received if went_down <= r.at <= came_back and r.status != 200]
    delivered = {r.key for r in received if r.status == 200}
    first = next((r.at for r in received if r.at >= came_back and r.status == 200), None)
    # 503: the API counted them; refused: nothing listened, the workers counted them.
    requests = len(hit) if kind == "503" else during
    outage = came_back - went_down
    width = min(WINDOW, outage)
    return {
        "kind": kind,
        "workers": workers,
        "contender": contender,
        "flags": list(CONTENDERS[contender]),
        "outage_seconds": round(outage, 1),
        "arrived_during_outage": arrived,
        "requests_during_outage": int(requests),
        "failed_publishes_counted_by_workers": int(during),
        "requests_per_arriving_message": round(requests / max(arrived, 1), 3),
        "requests_per_second": round(requests / outage, 2),
        # An outage shorter than the window has one window: the outage.
        "busiest_10s_requests_per_second": round(
            busiest_window(hit, width) / width if kind == "503" else busiest_rate(samples, width),
            2,
        ),
        "backlog_at_recovery": backlog_at_recovery,
        "recovery_to_first_delivery_seconds": (
            round(first - came_back, 1) if first is not None else None
        ),
        "recovery_to_empty_backlog_seconds": round(drained, 1) if drained is not None else None,
        **figures,
        "attempts_per_message": round(figures["total_attempts"] / max(figures["messages"], 1), 3),
        "delivered_distinct": len(delivered),
        "produced": produced["sent"],
        "producer_max_late_seconds": produced["max_late_seconds"],
        "worker_exit_codes": codes,
        **load.figures(),
    }


# -- the rate limit ----------------------------------------------------------------------------


def rate_run(bench: Bench, workers: int, sizes: Sizes, workdir: Path) -> dict[str, Any]:
    """`workers` processes under `--rate-limit`, a fast API and a backlog they cannot drain."""
    workdir.mkdir(parents=True)
    limit, seconds = sizes.limit, sizes.limit_seconds
    load = Load()
    with bench.database() as dsn:
        backlog = int(limit * (seconds + 30) * 1.5)
        seed_backlog(dsn, backlog)
        api = Downstream(workdir / "requests.log").start(200)
        procs: list[Worker] = []
        try:
            procs = start_workers(
                dsn, api.url, workers, ("--rate-limit", f"{limit:g}/s"), workdir
            )  # fmt: skip
            # The measured stretch starts at the first request the API sees.
            deadline = time.monotonic() + 60
            while not api.received():
                if time.monotonic() > deadline:
                    raise RuntimeError(f"no request reached the API; see {workdir}")
                time.sleep(0.05)
            first = api.received()[0].at
            time.sleep(max(0.0, first + seconds - time.monotonic()))
            end = time.monotonic()
        finally:
            codes = stop_workers(procs)
            api.stop()
    received = api.received()
    times = [r.at for r in received if r.at <= end]
    busiest = busiest_window(times)
    quietest = quietest_window(times, first, end)
    return {
        "workers": workers,
        "limit_per_second": limit,
        "backlog": backlog,
        "seconds": round(end - first, 1),
        "requests": len(times),
        "non_2xx": sum(1 for r in received if r.status != 200),
        "mean_per_second": round(len(times) / (end - first), 2),
        "busiest_10s": busiest,
        "busiest_10s_ratio": round(busiest / (limit * WINDOW), 3),
        "quietest_10s": quietest,
        "quietest_10s_ratio": round(quietest / (limit * WINDOW), 3),
        "busiest_1s": busiest_window(times, 1.0),
        "worker_exit_codes": codes,
        **load.figures(),
    }


# -- the run -----------------------------------------------------------------------------------


def run(sizes: Sizes, workdir: Path) -> dict[str, Any]:
    report: dict[str, Any] = {"sizes": asdict(sizes), "outages": [], "rate_limit": []}
    with Bench() as bench:
        report["environment"] = bench.environment()
        plan = [("503", n) for n in sizes.outage_workers] + [
            ("refused", n) for n in sizes.refused_workers
        ]
        for i, (kind, workers) in enumerate(plan):
            # Both sides of a comparison back to back; which goes first alternates.
            names = list(CONTENDERS) if i % 2 == 0 else list(reversed(CONTENDERS))
            for name in names:
                _log(f"outage: {kind}, {workers} workers, {name}: {sizes.outage:g} s down")
                row = outage_run(
                    bench, kind, workers, name, sizes, workdir / f"{kind}-{workers}-{name}"
                )  # fmt: skip
                _log(
                    f"  {row['requests_during_outage']} requests for "
                    f"{row['arrived_during_outage']} arrivals, max attempts "
                    f"{row['max_attempts']}, dead {row['dead']}, drained after "
                    f"{row['recovery_to_empty_backlog_seconds']} s"
                )
                report["outages"].append(row)
        for workers in sizes.limit_workers:
            _log(f"rate limit: {sizes.limit:g}/s, {workers} workers, {sizes.limit_seconds:g} s")
            row = rate_run(bench, workers, sizes, workdir / f"limit-{workers}")
            _log(f"  busiest 10 s: {row['busiest_10s_ratio']} x the limit")
            report["rate_limit"].append(row)
    return report


def _cell(value: Any, suffix: str = "") -> str:
    return "not within the timeout" if value is None else f"{value:g}{suffix}"


def _after_first(row: dict[str, Any]) -> str:
    first, empty = (
        row["recovery_to_first_delivery_seconds"],
        row["recovery_to_empty_backlog_seconds"],
    )
    return "-" if first is None or empty is None else f"{max(0.0, empty - first):.1f}"


def render(report: dict[str, Any], command: str) -> str:
    sizes, env = report["sizes"], report["environment"]
    lines = [
        "# The destination gate beside today's behaviour",
        "",
        f"`{command}` at {env['commit']}, {env['started']}; PostgreSQL {env['postgresql']} "
        f"(embedded, stock settings), {env['cores']} cores, Python {env['python']}, "
        f"{env['event_loop']}"
        + (" (smoke sizes: checks the harness only)." if report["smoke"] else "."),
        "",
        "The machine is shared: the load columns are everything running on it over each "
        "measurement (load average over the last minute at its start and end; share of all "
        "cores busy, from /proc/stat).",
        "",
        "## A downed HTTP API",
        "",
        f"{sizes['rate']:g} messages/s arriving (a producer process, one `enqueue` per "
        f"transaction); {sizes['warmup']:g} s healthy, then the API down for "
        f"{sizes['outage']:g} s: answering 503 to everything, or killed (connections "
        "refused) and started again on the same port. Workers at default settings with the "
        "http publisher; *today* is `--breaker-failures 0`, *breaker* every breaker setting "
        "at its default (5 failing messages in 1 min open it; probes from 2 s up to 30 s "
        "apart).",
        "",
        "| API | workers | | arrived while down | requests while down | per arriving "
        "message | per s (mean) | per s (busiest 10 s) | max attempts | failed attempts "
        "| dead | recovery → first delivery (s) | recovery → empty backlog (s) | first "
        "delivery → empty backlog (s) | load 1m | CPU busy |",
        "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in report["outages"]:
        api = "503" if r["kind"] == "503" else "refused"
        lines.append(
            f"| {api} | {r['workers']} | {r['contender']} | {r['arrived_during_outage']} | "
            f"{r['requests_during_outage']} | {r['requests_per_arriving_message']:g} | "
            f"{r['requests_per_second']:g} | {r['busiest_10s_requests_per_second']:g} | "
            f"{r['max_attempts']} | {r['total_attempts'] - r['messages']} | {r['dead']} | "
            f"{_cell(r['recovery_to_first_delivery_seconds'])} | "
            f"{_cell(r['recovery_to_empty_backlog_seconds'])} | {_after_first(r)} | "
            f"{r['loadavg_1m_before']:g} → {r['loadavg_1m_after']:g} | "
            f"{r['cpu_busy_share'] * 100:.0f} % |"
        )
    lines += [
        "",
        "- Requests while down: with 503, the requests the API answered 503 (counted by the "
        "API); refused, the failed publishes the workers counted "
        "(`outbox_destination_failures_total`), one per connection attempt, since nothing "
        "listened.",
        "- Attempts: the `attempts` column of every message of the run at its end (those "
        "arriving before and after the outage included); failed attempts = their sum less one "
        "per message (the one that delivered it): the attempts that were spent and not "
        "refunded. Dead: messages in `dead` at the end.",
        "- Recovery → empty backlog: until every message created before the recovery was "
        "finished (arrivals go on meanwhile). Recovery → first delivery: the first 200 the API "
        "answered after it came back.",
        "",
        "## The rate limit across replicas",
        "",
        f"`--rate-limit {sizes['limit']:g}/s`, a backlog deeper than the run drains, the API "
        f"answering 200 at once; {sizes['limit_seconds']:g} s measured at the API from its "
        "first request. Busiest 10 s: the most requests in any 10 s window (any start); goal "
        f"≤ {GOAL:g} x the limit x 10 s. Quietest: the fewest in a 10 s window (starts 0.1 s "
        "apart), i.e. whether the limit is reached, not just kept.",
        "",
        "| workers | limit (/s) | requests | mean (/s) | busiest 10 s | busiest / (limit x 10) "
        "| quietest / (limit x 10) | busiest 1 s | goal met | load 1m | CPU busy |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|",
    ]
    for r in report["rate_limit"]:
        met = "yes" if r["busiest_10s_ratio"] <= GOAL else "**no**"
        lines.append(
            f"| {r['workers']} | {r['limit_per_second']:g} | {r['requests']} | "
            f"{r['mean_per_second']:g} | {r['busiest_10s']} | {r['busiest_10s_ratio']:.3f} | "
            f"{r['quietest_10s_ratio']:.3f} | {r['busiest_1s']} | {met} | "
            f"{r['loadavg_1m_before']:g} → {r['loadavg_1m_after']:g} | "
            f"{r['cpu_busy_share'] * 100:.0f} % |"
        )
    lines.append("")
    return "\n".join(lines)


def _counts(text: str) -> tuple[int, ...]:
    return tuple(int(n) for n in text.split(",") if n)


def main(argv: list[str] | None = None) -> None:
    args_in = sys.argv[1:] if argv is None else argv
    # The benchmark's own child processes: the API and the producer.
    if args_in[:1] == ["downstream"]:
        serve_downstream(int(args_in[1]), int(args_in[2]), args_in[3])
        return
    if args_in[:1] == ["produce"]:
        produce(args_in[1], float(args_in[2]))
        return
    parser = argparse.ArgumentParser(
        prog="python -m bench.destinations",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--smoke", action="store_true", help="tiny sizes: checks the harness")
    parser.add_argument("--rate", type=float, help="messages/s arriving in the outage runs (20)")
    parser.add_argument("--warmup", type=float, help="seconds healthy before the outage (10)")
    parser.add_argument("--outage", type=float, help="seconds the API is down (60)")
    parser.add_argument("--drain-timeout", type=float, help="seconds to wait for the drain (400)")
    parser.add_argument("--workers", type=_counts, help="worker processes, 503 runs (2,4)")
    parser.add_argument(
        "--refused-workers", type=_counts, help="worker processes, refused runs (2; '' none)"
    )
    parser.add_argument("--limit", type=float, help="--rate-limit of the rate runs, /s (50)")
    parser.add_argument("--limit-seconds", type=float, help="seconds measured per rate run (40)")
    parser.add_argument("--limit-workers", type=_counts, help="worker processes (1,2,4)")
    parser.add_argument("--out", type=Path, default=Path("bench/results"))
    args = parser.parse_args(args_in)
    sizes = SMOKE if args.smoke else FULL
    chosen = {
        "rate": args.rate, "warmup": args.warmup, "outage": args.outage,
        "drain_timeout": args.drain_timeout, "outage_workers": args.workers,
        "refused_workers": args.refused_workers, "limit": args.limit,
        "limit_seconds": args.limit_seconds, "limit_workers": args.limit_workers,
    }  # fmt: skip
    sizes = replace(sizes, **{k: v for k, v in chosen.items() if v is not None})
    # The workers' logs and the API's request logs: kept when a run fails, to read why.
    workdir = Path(tempfile.mkdtemp(prefix="bench-destinations-"))
    report = run(sizes, workdir)
    shutil.rmtree(workdir)
    report["smoke"] = args.smoke
    command = shlex.join(["python", "-m", "bench.destinations", *args_in])
    report["command"] = command
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "destinations.json").write_text(json.dumps(report, indent=2) + "\n")
    text = render(report, command)
    page = args.out / "destinations.md"
    # What the figures say is written by hand below them: a new run keeps it.
    kept = page.read_text().partition(ANALYSIS)[2] if page.exists() else ""
    page.write_text(text + (ANALYSIS + kept if kept else ""))
    print(text)
    _log(f"wrote {args.out / 'destinations.md'}")
    lost = [r for r in report["outages"] if r["delivered_distinct"] < r["done"]]
    failed = [
        r for r in report["outages"] + report["rate_limit"] if any(r["worker_exit_codes"])
    ]  # fmt: skip
    if lost or failed:
        sys.exit("a run lost deliveries or a worker failed: see destinations.json")


if __name__ == "__main__":
    main()
