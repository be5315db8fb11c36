"""The HTTP publisher beside a plain client of the same server, alone or within `python -m bench`.

python -m bench.http                        # 3 rounds, 20,000 messages; updates the report
python -m bench.http --repeat 5 --messages 8000 --out bench/results

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
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench import scenarios
from bench.env import Bench

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
    bench: Bench, messages: int, repeat: int, log: Callable[[str], None]
) -> dict[str, Any]:
    """Unpinned figures at the top level; the pinned ones under "pinned" (two cores or more)."""
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
    return report


# Where a sample of the worker's stack is, by the outermost matching frame (checked in order):
# what each part of the HTTP path costs, inclusive of what it calls.
PROFILE_PARTS = (
    ("envelope JSON", ("envelope (",)),
    ("aiohttp request and response", ("_request (aiohttp", "__aenter__ (aiohttp",
                                      "_bounded_body (", "__aexit__ (aiohttp")),
    ("rest of HttpPublisher.publish", ("publish (outbox/worker/publishers/http.py",
                                       "publish (worker/publishers/http.py")),
    ("claim (psycopg)", ("_claim (",)),
    ("finalize (psycopg)", ("_finalize (", "_finalizer (")),
    ("rest of the dispatch loop", ("dispatcher.py",)),
    ("event loop: sockets and callbacks", ("_run_once (", "select (", "_read_ready",
                                           "_write", "sock_")),
)  # fmt: skip


def profile_http(bench: Bench, messages: int, raw_out: Path | None = None) -> dict[str, Any]:
    """py-spy samples of the worker draining to the local server, on asyncio's own loop so
    that the frames are visible; shares by part of the path (PROFILE_PARTS)."""
    import shutil
    import signal
    import subprocess
    import tempfile

    from bench.env import python_module, seed_outbox
    from bench.profile import summarize
    from outbox.demo.embedded import free_port

    py_spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    port = free_port()
    url = f"http://127.0.0.1:{port}/events"
    server = python_module("bench.http_server", str(port))
    try:
        scenarios._wait_for_port(port)
        with bench.database() as dsn, tempfile.TemporaryDirectory() as tmp:
            seed_outbox(dsn, messages)
            raw = Path(tmp) / "profile.txt"
            remaining = scenarios._remaining(dsn)
            worker = python_module(
                "outbox.worker", "--dsn", dsn, "--publisher", "http", "--http-url", url,
                "--batch", "500", "--concurrency", str(CONCURRENCY), "--log-level", "WARNING",
                "--event-loop", "asyncio",
            )  # fmt: skip
            spy = None
            try:
                while remaining() == messages:
                    time.sleep(0.01)
                spy = subprocess.Popen(
                    [py_spy, "record", "--format", "raw", "--rate", "250", "--output",
                     str(raw), "--pid", str(worker.pid)],
                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                )  # fmt: skip
                while remaining() > 0:
                    time.sleep(0.05)
            finally:
                if spy is not None:
                    spy.send_signal(signal.SIGINT)
                    spy.wait(timeout=60)
                worker.terminate()
                worker.wait()
            text = raw.read_text()
            if raw_out is not None:
                raw_out.write_text(text)
    finally:
        server.terminate()
        server.wait()
    parts: dict[str, int] = dict.fromkeys([name for name, _ in PROFILE_PARTS] + ["other"], 0)
    total = 0
    for line in text.splitlines():
        stack, _, count = line.rpartition(" ")
        if not count.isdigit():
            continue
        total += int(count)
        frames = stack.split(";")
        parts[_part(frames)] += int(count)
    return {
        "samples": total,
        "parts": {name: n / max(total, 1) for name, n in parts.items()},
        **summarize(text),
    }


def _part(frames: list[str]) -> str:
    for name, needles in PROFILE_PARTS:
        if any(needle in frame for frame in frames for needle in needles):
            return name
    return "other"


def _log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def main() -> None:
    from bench.report import render

    parser = argparse.ArgumentParser(prog="python -m bench.http", description=__doc__)
    parser.add_argument("--messages", type=int, default=20_000, help="messages per round")
    parser.add_argument("--repeat", type=int, default=3, help="rounds (3)")
    parser.add_argument("--out", default="bench/results", help="where report.json/.md are")
    parser.add_argument("--profile", action="store_true", help="py-spy the worker instead")
    parser.add_argument("--profile-raw", type=Path, help="keep py-spy's raw samples here")
    args = parser.parse_args()
    with Bench() as bench:
        if args.profile:
            print(json.dumps(profile_http(bench, args.messages, args.profile_raw), indent=2))
            return
        figures = run_http(bench, args.messages, args.repeat, _log)
    for layout, block in (("free", figures), ("pinned", figures.get("pinned", {}))):
        medians = {
            k: round(v["median"], 2)
            for k, v in block.items()
            if k != "pinned" and isinstance(v, dict)
        }
        print(layout, json.dumps(medians))
    report_json = Path(args.out) / "report.json"
    if report_json.exists():
        report = json.loads(report_json.read_text())
        report["http"] = figures
        report_json.write_text(json.dumps(report, indent=2))
        (Path(args.out) / "report.md").write_text(render(report))
        print(f"\nupdated the http block of {report_json} and rendered report.md again")


if __name__ == "__main__":
    main()
