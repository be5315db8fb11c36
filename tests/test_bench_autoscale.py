"""The autoscaling simulation (`python -m bench.autoscale`): complete reports, and the goal.

The simulation is deterministic (seeded arrivals, 1-second steps, no clock), so its figures
are the same on every machine; the goal below is a property of the policy, not of speed.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
AUTOSCALERS = {"outbox-dispatcher", "KEDA on age", "KEDA on pending"}
TRACES = {"steady", "step", "spikes", "wave", "idle"}


def _run(out: Path, *extra: str) -> dict:
    result = subprocess.run(
        [sys.executable, "-m", "bench.autoscale", "--out", str(out), *extra],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads((out / "autoscaling.json").read_text())


def test_smoke_run_writes_a_complete_report(tmp_path):
    report = _run(tmp_path, "--smoke")
    assert report["smoke"] and report["seconds"] == 1200
    (world,) = report["worlds"].values()
    assert set(world["traces"]) == TRACES
    for rows in world["traces"].values():
        assert set(rows) == AUTOSCALERS
        for row in rows.values():
            assert row["replica_seconds"] > 0
            assert 0 <= row["reversals"] <= row["scale_changes"]
    text = (tmp_path / "autoscaling.md").read_text()
    assert "All traces summed" in text and "KEDA on pending" in text
    assert (tmp_path / "autoscaling.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.slow
def test_full_run_meets_the_goal_against_keda(tmp_path):
    report = _run(tmp_path)
    assert set(report["worlds"]) == {"200", "100", "400", "200-unsteady"}
    goal = report["goal"]
    assert goal["violations_vs_keda_on_age"] <= 0.005, goal
    assert goal["violations_vs_keda_on_pending"] <= 0.01, goal
    assert goal["replica_seconds_vs_keda_on_pending"] <= 1.2, goal
    assert goal["reversals"] <= goal["reversals_keda_on_pending"], goal
    for world in goal["other_worlds"].values():
        assert world["violations_vs_keda_on_pending"] <= 0.05, goal
    assert goal["met"]


@pytest.mark.slow
def test_snapshot_cost_smoke_run_writes_a_complete_report(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "bench.snapshot_cost", "--smoke", "--out", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads((tmp_path / "autoscaling_snapshot_cost.json").read_text())
    assert [row["pending"] for row in report["rows"]] == [1_000, 10_000]
    for row in report["rows"]:
        assert (
            set(row["ms"])
            == set(row["buffers"])
            == {
                "bounded",
                "bounded, ordered",
                "exact (peer)",
            }
        )
        assert all(value > 0 for value in row["buffers"].values())
        # Every pending row but the 50 in flight is claimable, and the estimate says so.
        assert row["ready_estimate"] == row["pending"] - 50
    assert "peer / bounded" in (tmp_path / "autoscaling_snapshot_cost.md").read_text()
