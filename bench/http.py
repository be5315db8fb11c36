"""The HTTP publisher beside a plain client of the same server, alone or within `python -m bench`.

python -m bench.http                        # 3 rounds, 20,000 messages; updates the report
python -m bench.http --repeat 5 --messages 8000 --no-profile --out /tmp/try

Each round runs the plain load generator and then the worker against one fresh server, once
with every process free to use every core and once pinned: PostgreSQL on a core of its own,
the server, the load generator and the worker on the other. Ratios are taken within a round
and their median reported. Standalone, the `http` block of an existing report.json is
replaced and report.md rendered again; the other sections are left as they were.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench import scenarios
from bench.cpu import cpu_seconds
from bench.env import ROOT, Bench, python_module
from bench.profile import samples, stop_profiled
from outbox.demo.embedded import free_port

CONCURRENCY = 64


def _summary(values: list[float]) -> dict[str, Any]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values),
            "runs": values}  # fmt: skip


def _summarize(rounds: list[dict[str, float]]) -> dict[str, Any]:
    figures = {name: _summary([r[name] for r in rounds]) for name in rounds[0]}
    # Within a round, then the median: both sides of a ratio saw the same machine load.
    figures["cpu_ratio"] = _summary([r["worker_cpu_us"] / r["loadgen_cpu_us"] for r in rounds])
    figures["throughput_ratio"] = _summary(
        [r["outbox_dispatcher"] / r["server_capacity"] for r in rounds]
    )
    return figures


def run_http(
    bench: Bench, messages: int, repeat: int, log: Callable[[str], None], *, profile: bool = True
) -> dict[str, Any]:
    """Unpinned figures at the top level; the pinned ones under "pinned" (two cores or more);
    py-spy's view of both clients under "profile"."""
    can_pin = len(os.sched_getaffinity(0)) >= 2
    free: list[dict[str, float]] = []
    pinned: list[dict[str, float]] = []
    for n in range(repeat):
        log(f"http: plain load generator, then the http publisher ({n + 1}/{repeat})")
        free.append(scenarios.http_throughput(bench, messages, CONCURRENCY))
        if can_pin:
            log(f"http: the same, PostgreSQL pinned to a core of its own ({n + 1}/{repeat})")
            pinned.append(scenarios.http_throughput(bench, messages, CONCURRENCY, pinned=True))
    env = bench.environment()
    report: dict[str, Any] = {
        "messages": messages,
        "concurrency": CONCURRENCY,
        "commit": env["commit"],
        "started": env["started"],
        **_summarize(free),
    }
    if pinned:
        report["pinned"] = _summarize(pinned)
    if profile:
        log("http: py-spy on the load generator, then on the worker (asyncio's loop)")
        report["profile"] = profile_http(bench, messages)
    return report


# Where a sample of a stack goes: the first part (in this order) one of whose frames it
# holds, so each part counts what it calls too.
PROFILE_PARTS = (
    ("envelope JSON", ("envelope (",)),
    ("aiohttp: request and response", (
        "(aiohttp/client.py", "(aiohttp/client_proto.py", "_bounded_body (",
        "client (bench/loadgen.py",  # the load generator's loop: nothing but requests
    )),
    ("HttpPublisher.publish, the rest (headers, encode)", ("HttpPublisher.publish (",)),
    # Its own code only: every publish runs inside InFlight.publish's frame.
    ("dispatch loop: publish timeout", ("(asyncio/timeouts.py", "innermost:(worker/in_flight.py")),
    ("dispatch loop: metrics", ("(prometheus_client/",)),
    ("claim (psycopg)", ("Claimer._claim (",)),
    ("finalize (psycopg)", ("Finalizer._finalize (",)),
    # The services around the ledger that the publishes, claims and finalizes run under.
    ("dispatch loop: the rest (tasks, queue)", tuple(
        f"(worker/{module}.py" for module in (
            "publishing", "ledger", "claimer", "finalizer", "replica", "lease_keeper",
            "listener", "health", "tracing", "retry", "service", "metrics",
        )
    )),
    ("event loop: sockets, callbacks, selector", ("(asyncio/", "(selectors.py")),
)  # fmt: skip


def _holds(frames: list[str], needle: str) -> bool:
    """Whether a stack holds `needle` in any frame, or in its innermost with `innermost:`."""
    if needle.startswith("innermost:"):
        return needle.removeprefix("innermost:") in frames[-1]
    return any(needle in frame for frame in frames)


def _parts(raw: str) -> dict[str, float]:
    """Share of the samples per PROFILE_PARTS (imports left out: start-up, not the run)."""
    counts = dict.fromkeys([name for name, _ in PROFILE_PARTS] + ["other"], 0)
    for stack, count in samples(raw):
        if "_find_and_load" in stack:
            continue
        frames = stack.split(";")
        part = next(
            (name for name, needles in PROFILE_PARTS if any(_holds(frames, n) for n in needles)),
            "other",
        )
        counts[part] += count
    total = max(sum(counts.values()), 1)
    return {name: n / total for name, n in counts.items()}


def profile_http(bench: Bench, messages: int) -> dict[str, Any]:
    """py-spy samples of the load generator and then of the worker draining to one local
    server, both on asyncio's own loop so that the frames are visible (uvloop's are C), with
    each one's CPU µs per request or message in the same run: the shares of PROFILE_PARTS
    times that give µs per part."""
    py_spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    if not Path(py_spy).exists():
        return {"skipped": "py-spy is not installed (pip install '.[bench]')"}
    record = [py_spy, "record", "--format", "raw", "--rate", "250", "--output"]
    port = free_port()
    url = f"http://127.0.0.1:{port}/events"
    server = python_module("bench.http_server", str(port))
    try:
        scenarios._wait_for_port(port)
        with tempfile.TemporaryDirectory() as tmp:
            loadgen_raw, worker_raw = Path(tmp) / "loadgen.txt", Path(tmp) / "worker.txt"
            loadgen = subprocess.run(
                [*record, str(loadgen_raw), "--", sys.executable, "-m", "bench.loadgen", url,
                 str(messages), str(CONCURRENCY), "asyncio"],
                capture_output=True, text=True, check=True, cwd=ROOT,
            )  # fmt: skip
            # py-spy writes its own lines to the same stdout.
            plain = json.loads(next(ln for ln in loadgen.stdout.splitlines() if ln[:1] == "{"))
            with bench.database() as dsn:
                scenarios.seed_outbox(dsn, messages)
                worker = python_module(
                    "outbox.worker", "--dsn", dsn, "--publisher", "http", "--http-url", url,
                    "--batch", "500", "--concurrency", str(CONCURRENCY), "--log-level",
                    "WARNING", "--event-loop", "asyncio",
                )  # fmt: skip
                progress = scenarios._Progress(dsn)
                spy = None
                try:
                    while progress.left() == messages:
                        time.sleep(0.01)
                    cpu_before = cpu_seconds(worker.pid)
                    spy = subprocess.Popen(
                        [*record, str(worker_raw), "--pid", str(worker.pid)],
                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                    )  # fmt: skip
                    while not progress.finished():
                        time.sleep(0.02)
                    worker_cpu = cpu_seconds(worker.pid) - cpu_before
                finally:
                    stop_profiled(spy, worker)
                    progress.conn.close()
            loadgen_text, worker_text = loadgen_raw.read_text(), worker_raw.read_text()
    finally:
        server.terminate()
        server.wait()
    loadgen_us = plain["cpu_seconds"] * 1e6 / messages
    # The first claim came before the window: close enough, over a drain of many batches.
    worker_us = worker_cpu * 1e6 / messages
    loadgen_parts, worker_parts = _parts(loadgen_text), _parts(worker_text)
    return {
        "messages": messages,
        "loadgen_cpu_us": loadgen_us,
        "worker_cpu_us": worker_us,
        "parts_us": {
            name: {
                "worker": worker_parts[name] * worker_us,
                "loadgen": loadgen_parts[name] * loadgen_us,
            }
            for name in worker_parts
        },
    }


def _log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def main() -> None:
    from bench.report import render

    parser = argparse.ArgumentParser(prog="python -m bench.http", description=__doc__)
    parser.add_argument("--messages", type=int, default=20_000, help="messages per round")
    parser.add_argument("--repeat", type=int, default=3, help="rounds (3)")
    parser.add_argument("--out", default="bench/results", help="where report.json/.md are")
    parser.add_argument(
        "--no-profile", dest="profile", action="store_false", help="skip the py-spy profile"
    )
    args = parser.parse_args()
    with Bench() as bench:
        figures = run_http(bench, args.messages, args.repeat, _log, profile=args.profile)
    print(json.dumps(figures, indent=2))
    report_json = Path(args.out) / "report.json"
    if report_json.exists():
        report = json.loads(report_json.read_text())
        report["http"] = figures
        report_json.write_text(json.dumps(report, indent=2))
        (Path(args.out) / "report.md").write_text(render(report))
        print(f"\nupdated the http block of {report_json} and rendered report.md again")


if __name__ == "__main__":
    main()
