"""checkov on the rendered chart and on the Dockerfile: what it finds is exactly the skips the
chart's README justifies (no undocumented finding, no stale skip)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from chart import chart as c

# checkov lives in a virtual environment of its own (its pins clash with the project's).
CHECKOV = shutil.which("checkov") or str(c.ROOT / "build" / "checkov" / "bin" / "checkov")
pytestmark = pytest.mark.skipif(
    not Path(CHECKOV).exists(),
    reason="needs checkov in its own venv: python3 -m venv build/checkov && "
    "build/checkov/bin/pip install checkov (.ci/run does it)",
)

EVERYTHING = {
    "metrics": {"serviceMonitor": {"enabled": True}, "workerPodMonitor": {"enabled": True}},
    "prometheusRule": {"enabled": True},
    "grafanaDashboard": {"enabled": True},
}
HARDENED = {
    **EVERYTHING,
    "image": {"repository": "registry.example/outbox-dispatcher", "digest": "sha256:" + "0" * 64,
              "pullPolicy": "Always"},
}  # fmt: skip


def documented_skips() -> list[tuple[str, str]]:
    """(check id, when) for every row of the README's checkov table."""
    readme = (c.CHART / "README.md").read_text()
    section = readme.split("## checkov", 1)[1]
    rows = []
    for line in section.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) == 4 and cells[0].startswith("CKV"):
            for check in re.findall(r"CKV\w+", cells[0]):
                rows.append((check, cells[2]))
    return rows


def checkov(path: Path, framework: str) -> set[str]:
    result = subprocess.run(
        [CHECKOV, "-f", str(path), "--framework", framework, "-o", "json", "--quiet",
         "--skip-download"],
        capture_output=True, text=True, check=False, timeout=300,
    )  # fmt: skip
    assert result.returncode in (0, 1), result.stderr[-2000:]
    report: dict[str, Any] = json.loads(result.stdout) if result.stdout.strip() else {}
    failed = report.get("results", {}).get("failed_checks", [])
    return {check["check_id"] for check in failed}


def test_the_chart_fails_only_the_documented_checks(tmp_path: Path) -> None:
    skips = documented_skips()
    always = {check for check, when in skips if when == "always" and "DOCKER" not in check}
    with_defaults = {check for check, when in skips if when == "default values"}
    for values, expected in ((EVERYTHING, always | with_defaults), (HARDENED, always)):
        manifest = tmp_path / "chart.yaml"
        manifest.write_text(yaml.safe_dump_all(c.render(values).objects))
        assert checkov(manifest, "kubernetes") == expected, values.get("image", "defaults")


def test_the_dockerfile_fails_only_the_documented_checks() -> None:
    documented = {check for check, _ in documented_skips() if "DOCKER" in check}
    assert checkov(c.ROOT / "Dockerfile", "dockerfile") == documented
