"""The destination gate benchmark (`python -m bench.destinations`) at smoke size: both sides
of each outage ran against a real downed API with real worker processes, the rate limit ran
with several workers, and the report is complete.

No figure is compared with a goal: they are measured on a shared machine (bench/results).
What is asserted is that each run really happened: the outage met requests, every message
was delivered and none went dead, and the limited workers sent at about the limit.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(660)]

ROOT = Path(__file__).resolve().parent.parent


def test_smoke_run_writes_a_complete_report(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "bench.destinations", "--smoke", "--out", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    report = json.loads((tmp_path / "destinations.json").read_text())
    assert report["smoke"] and report["environment"]["postgresql"].startswith("18.")
    runs = {(r["kind"], r["workers"], r["contender"]): r for r in report["outages"]}
    assert set(runs) == {
        (kind, 2, side) for kind in ("503", "refused") for side in ("today", "breaker")
    }
    for key, row in runs.items():
        assert row["arrived_during_outage"] > 0, (key, row)
        assert row["requests_during_outage"] > 0, (key, row)  # the outage was met
        assert row["dead"] == 0 and row["unfinished"] == 0, (key, row)
        assert row["done"] == row["messages"] == row["produced"], (key, row)
        assert row["delivered_distinct"] == row["messages"], (key, row)
        assert row["recovery_to_empty_backlog_seconds"] is not None, (key, row)
        assert row["max_attempts"] >= 1 and row["worker_exit_codes"] == [0, 0], (key, row)
    # Today's behaviour retries every message on its own: more than one request per arrival.
    for kind in ("503", "refused"):
        assert runs[(kind, 2, "today")]["requests_per_arriving_message"] > 1
    limited = report["rate_limit"]
    assert [r["workers"] for r in limited] == [1, 2]
    for row in limited:
        assert row["non_2xx"] == 0 and row["busiest_10s"] > 0, row
        # Far more backlog than the limit lets out: the workers were held to about it.
        assert row["requests"] < row["backlog"] / 2, row
    text = (tmp_path / "destinations.md").read_text()
    for heading in ("A downed HTTP API", "The rate limit across replicas", "python -m bench"):
        assert heading in text
