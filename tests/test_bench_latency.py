"""The latency benchmark's harness (bench/latency.py): its figures, its order of runs, its
report, and a run of one quick cell end to end. No timing is asserted: the figures live in
bench/results/latency.md."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench import latency

ROOT = Path(__file__).resolve().parent.parent


def test_percentiles_are_nearest_rank_and_left_out_without_ten_samples_beyond():
    values = [float(v) for v in range(1, 1001)]  # 1..1000 ms
    figures = latency.percentiles(list(reversed(values)))
    assert figures["samples"] == 1000 and figures["max_ms"] == 1000.0
    assert (figures["p50_ms"], figures["p90_ms"], figures["p99_ms"]) == (500.0, 900.0, 990.0)
    assert figures["p999_ms"] is None  # one sample beyond it: that is the maximum, not p99.9
    assert latency.percentiles(values * 10)["p999_ms"] == 999.0
    empty = latency.percentiles([])
    assert empty["samples"] == 0 and empty["p50_ms"] is None and empty["max_ms"] is None


def test_histogram_counts_every_sample_once_on_log_bins():
    samples = [0.01, 0.1, 1.0, 1.05, 10.0, 99.0, 10**6]
    counts = latency.histogram(samples)
    assert sum(counts) == len(samples) and len(counts) == len(latency.BINS_MS) - 1
    assert counts[0] == 2  # below the first edge, and on it
    assert counts[-1] == 1  # far past the last edge
    one_ms = latency.BINS_MS.index(1.0)
    assert counts[one_ms] == 2  # [1.0, 1.12)


def test_runs_go_cell_by_cell_pgqueuer_unordered_only_order_alternating():
    plan = latency.Plan(rates=(10, 100), processes=(1,), modes=("unordered", "ordered"))
    runs = plan.runs()
    assert runs[:3] == [(10, 1, "unordered", c) for c in ("worker", "floor", "pgqueuer")]
    assert runs[3:5] == [(10, 1, "ordered", c) for c in ("floor", "worker")]
    assert runs[5:8] == [(100, 1, "unordered", c) for c in ("worker", "floor", "pgqueuer")]
    assert not [r for r in latency.Plan().runs() if r[3] == "pgqueuer" and r[2] != "unordered"]
    assert latency.Plan().duration(1000) == latency.SECONDS[1000]
    assert latency.Plan(seconds=2.5).duration(10) == 2.5


def test_later_rounds_repeat_only_the_cells_of_the_process_counts_asked_for():
    plan = latency.Plan(rates=(100,), processes=(1, 2), modes=("unordered",), repeat=3,
                        repeat_processes=(2,))  # fmt: skip
    first, second = plan.round(0), plan.round(1)
    assert first == plan.runs() and {r[1] for r in first} == {1, 2}
    assert second == [r for r in plan.runs() if r[1] == 2][::-1]
    every_round = latency.Plan(repeat=2, repeat_processes=None)
    assert every_round.round(1) == every_round.runs()[::-1]


def test_the_default_plan_is_the_issues_whole_grid_in_about_thirty_minutes():
    """Rates 10, 100 and 1,000/s, one and two processes, every mode, every contender, the
    two-process cells in three rounds: 84 runs, estimated at most 30 minutes."""
    plan = latency.Plan()
    rounds = [plan.round(n) for n in range(plan.repeat)]
    assert {(r[0], r[1], r[2], r[3]) for r in rounds[0]} == set(plan.runs())
    assert {r[0] for r in rounds[0]} == {10, 100, 1000} and {r[1] for r in rounds[0]} == {1, 2}
    assert {r[2] for r in rounds[0]} == set(latency.MODES)
    assert {r[3] for r in rounds[0]} == set(latency.CONTENDERS)
    assert plan.repeat == 3 and all({r[1] for r in later} == {2} for later in rounds[1:])
    assert sum(map(len, rounds)) == 84
    assert plan.estimate_seconds() <= 30 * 60
    # At 100/s each round's p99 has its ten samples beyond it.
    assert plan.duration(100) * 100 * 0.01 >= 10


def test_the_goals_are_judged_round_by_round_against_the_same_rounds_floor_and_peer():
    def run(n: int, contender: str, p50: float, p99: float) -> dict:
        values = [p50] * 900 + [p99] * 100
        return {"round": n, "rate": 1000, "processes": 2, "mode": "unordered",
                "contender": contender, **latency.percentiles(values)}  # fmt: skip

    runs = [
        run(0, "worker", 4.0, 9.0), run(0, "floor", 3.0, 12.0), run(0, "pgqueuer", 5.0, 16.0),
        run(1, "worker", 5.0, 19.0), run(1, "floor", 3.0, 12.0), run(1, "pgqueuer", 5.0, 16.0),
    ]  # fmt: skip
    table = "\n".join(latency._goals(runs))
    assert "| unordered | 1 | 4.0 / 9.0 | 3.0 / 12.0 | 16.0 | yes | yes | yes |" in table
    # 19 ms: above 10 ms and above 1.5 x 12 ms; 5.0 > 1.5 x 3.0; behind pgqueuer's 16 ms.
    assert "| 2 | 5.0 / 19.0 | 3.0 / 12.0 | 16.0 | **no** | **no** | **no** |" in table


def _section(load: float) -> dict:
    def figures(contender: str, scale: float) -> dict:
        values = [scale] * 20_000
        return {
            "rate": 1000, "processes": 2, "mode": "unordered", "contender": contender,
            **latency.percentiles(values), "histogram": latency.histogram(values),
            "contender_cpu_us": 100.0 * scale, "database_cpu_us": 300.0,
            "transactions_per_message": 0.5, "others_cores": 0.1,
        }  # fmt: skip

    cells = [figures("worker", 4.0), figures("floor", 2.0), figures("pgqueuer", 3.0)]
    run = {
        "load_1min": load, "others_cores": 0.1, "achieved_rate": 1000.0, "missing": 0,
        "producer_late": 0, "duplicates": 0, "receiver_cpu_share": 0.2, "rate": 1000,
        "round": 0, "processes": 2, "mode": "unordered", "contender": "worker",
        "samples": 2000,
        "commit": latency.percentiles([1.0] * 200),
        "receiver_own": latency.percentiles([0.1] * 200),
    }  # fmt: skip
    return {
        "plan": {
            "rates": [1000], "processes": [2], "modes": ["unordered"],
            "contenders": list(latency.CONTENDERS), "seconds": {1000: 2.0}, "repeat": 1,
            "batch": 100, "concurrency": 32, "aggregates": 1000, "producer_connections": 4,
        },
        "receiver_capacity_rps": 5000.0, "cores": 2, "bins_ms": latency.BINS_MS,
        "load_before": load,
        "cells": cells, "runs": [run],
    }  # fmt: skip


def test_report_sets_the_worker_beside_the_floor_and_says_when_the_machine_was_loaded(
    tmp_path,
):
    quiet = "\n".join(latency.render(_section(load=0.4)))
    assert "| 1,000 | 2 | unordered | outbox-worker | 20,000 | 4.0 |" in quiet
    assert "| 4.0 | 4.0 | 400 | 300 | 0.50 | 0.10 |" in quiet  # CPU: worker, PostgreSQL
    assert "| 1,000 | 2 | unordered | 2.0x | 2.0x | 2.0x | 2.0x | 2.0x |" in quiet
    assert "Taken on a loaded machine" not in quiet and "CLOCK_REALTIME" in quiet
    assert "not the bottleneck" in quiet and "5,000 requests/s" in quiet
    assert "**Taken on a loaded machine**" in "\n".join(latency.render(_section(load=3.1)))
    latency.plot(_section(load=0.4), tmp_path / "latency.png")
    assert (tmp_path / "latency.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_one_quick_cell_runs_end_to_end(tmp_path):
    """Every contender, every mode, one process at 100/s for one second: every message
    reaches the receiver once, and the section's three files are written; the findings
    written by hand below the figures are kept."""
    findings = "A finding written by hand.\n"
    (tmp_path / "latency.md").write_text("old figures\n" + latency.FINDINGS + findings)
    result = subprocess.run(
        [sys.executable, "-m", "bench", "--only", "latency", "--smoke", "--latency-seconds",
         "1", "--out", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=280,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    section = json.loads((tmp_path / "latency.json").read_text())["latency"]
    assert {(c["contender"], c["mode"]) for c in section["cells"]} == {
        ("worker", "unordered"), ("worker", "ordered"), ("worker", "ordered-pairs"),
        ("floor", "unordered"), ("floor", "ordered"), ("floor", "ordered-pairs"),
        ("pgqueuer", "unordered"),
    }  # fmt: skip
    for run in section["runs"]:
        assert run["samples"] == 100 and run["missing"] == 0 and run["duplicates"] == 0, run
        assert 0 < run["p50_ms"] <= run["max_ms"]
        assert run["commit"]["p50_ms"] > 0 and run["receiver_own"]["p50_ms"] >= 0
        assert run["contender_cpu_us"] > 0 and run["database_cpu_us"] > 0
        assert run["transactions_per_message"] > 0 and run["others_cores"] is not None
    assert section["receiver_capacity_rps"] > 0
    text = (tmp_path / "latency.md").read_text()
    assert "The worker beside the floor" in text and "pgqueuer" in text
    assert "old figures" not in text and text.endswith(latency.FINDINGS + findings)
    assert (tmp_path / "latency.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
