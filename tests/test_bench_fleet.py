"""The fleet benchmark (`python -m bench.fleet`) at smoke size: a baseline revision and the
current code each run a small fleet through the real operator process, and every figure of
the report is there.

No figure is compared with a goal: they are measured on a shared machine. The baseline is
HEAD, so that the revision tree (git archive, mapped into `outbox`) is exercised wherever
the repository's history is.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench.fleet_emulator import classify
from outbox.controller.database import POOL_MAX_CONNECTIONS

ROOT = Path(__file__).resolve().parent.parent


def test_requests_are_named_by_verb_and_resource():
    assert classify("GET", "/api/v1/namespaces/ns/secrets/db", {}) == "get secrets"
    assert classify("GET", "/api/v1/namespaces/ns/pods", {"labelSelector": "a=b"}) == "list pods"
    assert (
        classify("GET", "/apis/outbox.dev/v1alpha1/outboxdispatchers", {"watch": "true"})
        == "watch outboxdispatchers"
    )
    path = "/apis/outbox.dev/v1alpha1/namespaces/ns/outboxdispatchers/orders/status"
    assert classify("PATCH", path, {}) == "patch outboxdispatchers/status"
    assert classify("PUT", "/apis/coordination.k8s.io/v1/namespaces/ns/leases/x", {}) == (
        "update leases"
    )
    assert classify("POST", "/api/v1/namespaces/ns/events", {}) == "create events"
    assert classify("GET", "/version", {}) == "get version"


@pytest.mark.slow
@pytest.mark.timeout(660)
def test_smoke_run_reports_every_figure_for_both_codes(tmp_path):
    if not os.access("/usr/bin/kubectl", os.X_OK):
        pytest.skip("kubectl is not installed at /usr/bin/kubectl (Debian package kubectl)")
    result = subprocess.run(
        [sys.executable, "-m", "bench.fleet", "--smoke", "--baseline", "HEAD",
         "--out", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    report = json.loads((tmp_path / "fleet.json").read_text())
    assert report["smoke"] and set(report["codes"]) == {"baseline", "current"}
    assert report["environment"]["postgresql"].startswith("18.")
    runs = report["runs"]
    assert sorted(run["code"] for run in runs) == ["baseline", "current"]
    for run in runs:
        count = run["dispatchers"]
        assert run["first_status_seconds"] > 0 and run["resources_with_status"] == count, run
        fresh = run["freshness"]
        assert fresh["samples"] > 0 and fresh["missed"] == 0, run
        assert 0 < fresh["p50_seconds"] <= fresh["p99_seconds"] <= fresh["max_seconds"], run
        assert run["oldest_status_age_seconds"] > 0, run
        # The operator keeps a pool per database: over the window, at most one pool's
        # connections are opened, not one per pass.
        opened = run["sessions_per_second"] * report["duration_seconds"]
        assert 0 <= opened <= POOL_MAX_CONNECTIONS + 0.5, run  # the figure is rounded
        assert run["operator_cpu_cores"] > 0 and run["operator_rss_mb"] > 0, run
        requests = run["api_requests_per_second"]
        assert requests["patch outboxdispatchers/status"] > 0, run
        assert requests["update leases"] > 0, run  # the Lease is renewed
        emulator = run["emulator"]
        assert emulator["cpu_cores"] > 0 and emulator["handling_p50_ms"] > 0, run
        assert emulator["by_verb"]["patch outboxdispatchers/status"]["mean_ms"] > 0, run
        assert run["deployments_at_ramp_end"] == count, run  # minReplicas 0 still has one
        ramp = run["ramp"]
        assert ramp["seconds"] > 0 and ramp["operator_cpu_cores"] > 0, run
        assert ramp["api_requests_per_second"]["create outboxdispatchers"] > 0, run
        assert emulator["loop_lag_p99_ms"] is not None, run
        lease = run["lease"]
        assert not lease["lost"] and lease["exited_by_itself_after_seconds"] is None, run
        assert lease["renewals_seen"] >= 2 and lease["longest_renewal_gap_seconds"] > 0, run
        assert lease["slowest_lease_request_ms"] > 0, run
        assert run["machine_busy_cores"] > 0, run
    text = (tmp_path / "fleet.md").read_text()
    assert "## 5 dispatchers, 1 database" in text
    assert "new DB sessions/s" in text and "patch outboxdispatchers/status" in text
