"""The benchmark harness, run at smoke size: every scenario produces a complete report.

No timing is asserted: these machines are shared and noisy. The figures live in bench/.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

# The run has its own deadline below; a loaded machine may need more than the default.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(660)]

ROOT = Path(__file__).resolve().parent.parent


def test_bench_smoke_run_writes_a_complete_report(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "bench", "--smoke", "--out", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads((tmp_path / "report.json").read_text())
    env = report["environment"]
    assert env["postgresql"].startswith("18.") and env["cores"] >= 1 and env["commit"]
    throughput = report["throughput"]
    peers = {row["peer"] for row in throughput.values()}
    assert peers == {
        "ours", "plain-loop", "article", "pgqueuer-default", "pgqueuer-best", "ceiling",
        "ceiling-ordered",
    }  # fmt: skip
    # The worker, the plain loop of its own statements and the SQL ceiling on both seeds.
    for peer in ("ours", "plain-loop", "ceiling", "ceiling-ordered"):
        assert {
            (row["seed"], row["processes"]) for row in throughput.values() if row["peer"] == peer
        } >= {(seed, n) for seed in ("1,000 aggregates", "one aggregate per row") for n in (1, 2)}
    assert all(
        row["cpu_us_per_message"]["median"] > 0
        for row in throughput.values()
        if row["peer"] in ("ours", "plain-loop")
    )
    assert {(c["seed"], c["variant"]) for c in report["costs"]} == {
        (seed, variant)
        for seed in ("1,000 aggregates", "one aggregate per row")
        for variant in (
            "as shipped",
            "with outbox_aggregate (--ordering aggregate)",
            "without outbox_waiting (the stats')",
        )
    }
    assert all(c["claim_wal_bytes"] > 0 and c["claim_buffers"] > 0 for c in report["costs"])
    assert all(
        row["median"] > 0 and row["min"] <= row["median"] <= row["max"]
        for row in throughput.values()
    )
    http = report["http"]
    layouts = [http, http["pinned"]] if len(os.sched_getaffinity(0)) >= 2 else [http]
    for figures in layouts:  # every process on every core; PostgreSQL on a core of its own
        for name in ("server_capacity", "outbox_dispatcher", "loadgen_cpu_us", "worker_cpu_us",
                     "server_cpu_us_worker", "database_cpu_us", "null_worker_cpu_us"):  # fmt: skip
            assert figures[name]["median"] > 0, name
        cpu = figures["worker_cpu_us"]["median"] / figures["loadgen_cpu_us"]["median"]
        assert figures["cpu_ratio"]["median"] == pytest.approx(cpu)  # one round at smoke size
    parts = http["profile"]["parts_us"]
    assert parts["aiohttp: request and response"]["worker"] > 0
    assert parts["aiohttp: request and response"]["loadgen"] > 0
    # Commit to receiver: the worker, the floor and pgqueuer, every message delivered.
    cells = report["latency"]["cells"]
    assert {(c["contender"], c["mode"]) for c in cells} == {
        ("worker", "unordered"), ("worker", "ordered"), ("worker", "ordered-pairs"),
        ("floor", "unordered"), ("floor", "ordered"), ("floor", "ordered-pairs"),
        ("pgqueuer", "unordered"),
    }  # fmt: skip
    assert all(c["samples"] > 0 and c["p50_ms"] > 0 for c in cells)
    assert all(r["missing"] == 0 for r in report["latency"]["runs"])
    assert [row["done_rows"] for row in report["scale_done_rows"]] == [1_000, 10_000]
    assert all(row["messages"] == report["messages"] for row in report["scale_done_rows"])
    assert [row["aggregates"] for row in report["ordered"]] == [10, 100]
    assert report["memory"]["rss_mib_peak"] > 0
    assert [row["concurrency"] for row in report["publisher_bound"]] == [1, 8]
    text = (tmp_path / "report.md").read_text()
    for heading in (
        "Throughput",
        "ratio",
        "outbox-dispatcher / plain loop, 1 process",
        "What one message costs the database",
        "What the gap is made of",
        "HTTP publisher",
        "CPU, worker / load generator",
        "Where the worker's CPU goes",
        "Latency",
        "Scale",
        "Ordered",
        "Memory",
    ):
        assert heading in text
    assert (tmp_path / "report.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (tmp_path / "latency.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
