"""The closed-loop autoscaling benchmark (`python -m bench.operator_loop`) at smoke size:
every contender runs the trace through the operator's loop and the report is complete.

No figure is compared: they are measured on a shared machine. What is asserted is that each
contender really ran the loop (it scaled for the step, delivered everything it was sent).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(660)]

ROOT = Path(__file__).resolve().parent.parent
CONTENDERS = {"outbox-dispatcher", "KEDA on age", "KEDA on pending"}


def test_smoke_run_writes_a_complete_report(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "bench.operator_loop", "--smoke", "--out", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    report = json.loads((tmp_path / "operator_loop.json").read_text())
    assert report["smoke"] and set(report["contenders"]) == CONTENDERS
    minimum = report["scaling"]["minReplicas"]
    for name, row in report["contenders"].items():
        assert row["sent"] > 0 and row["lost"] == 0, (name, row)
        assert row["replica_seconds"] > 0 and row["violation_seconds"] >= 0, (name, row)
        assert row["largest"] > minimum, (name, row)  # the step made it scale up
        assert len(row["decisions"]) == row["scale_changes"] >= 2, (name, row)
    text = (tmp_path / "operator_loop.md").read_text()
    assert all(name in text for name in CONTENDERS) and "violation-seconds" in text
