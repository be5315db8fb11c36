"""The alert rules and the dashboard: promtool's checks and unit tests, a firing and a quiet
case for every alert, a runbook section for every alert, a well-formed dashboard."""

from __future__ import annotations

import re
import shutil
import subprocess
from typing import Any

import pytest
import yaml

from monitoring import monitoring as m

PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(
    PROMTOOL is None, reason="needs promtool (Debian package prometheus; .ci/run installs it)"
)


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    assert PROMTOOL is not None
    return subprocess.run([PROMTOOL, *args], capture_output=True, text=True, check=False)


@needs_promtool
def test_promtool_checks_the_rules() -> None:
    result = promtool("check", "rules", str(m.RULES))
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(m.rules())} rules found" in result.stdout


@needs_promtool
def test_promtool_unit_tests_pass() -> None:
    result = promtool("test", "rules", str(m.UNIT_TESTS))
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_alert_has_a_case_that_fires_it_and_one_that_must_not() -> None:
    tests = yaml.safe_load(m.UNIT_TESTS.read_text())["tests"]
    fired: set[str] = set()
    quiet: set[str] = set()
    for test in tests:
        for case in test.get("alert_rule_test", []):
            (fired if case.get("exp_alerts") else quiet).add(case["alertname"])
    alerts = {rule["alert"] for rule in m.rules()}
    assert alerts - fired == set(), "alerts no unit test fires"
    assert alerts - quiet == set(), "alerts no unit test shows quiet"
    assert (fired | quiet) - alerts == set(), "unit tests of alerts that do not exist"


def test_every_alert_has_a_severity_a_summary_and_its_runbook_section() -> None:
    runbook = m.RUNBOOK.read_text()
    anchors = {_anchor(title) for title in re.findall(r"^#+ (.+)$", runbook, re.MULTILINE)}
    for rule in m.rules():
        assert rule["labels"]["severity"] in ("critical", "warning"), rule["alert"]
        assert rule["annotations"]["summary"], rule["alert"]
        page, _, anchor = rule["annotations"]["runbook"].partition("#")
        assert page == "docs/monitoring.md", rule["alert"]
        assert anchor == rule["alert"].lower(), rule["alert"]
        assert anchor in anchors, f"docs/monitoring.md has no section {rule['alert']}"


def test_the_dashboard_is_well_formed() -> None:
    dashboard = m.dashboard()
    assert dashboard["uid"] == "outbox-dispatcher"
    ids = [panel["id"] for panel in dashboard["panels"]]
    assert len(ids) == len(set(ids)), "panel ids repeat"
    variables = {v["name"] for v in dashboard["templating"]["list"]}
    assert variables == {"datasource", "namespace", "dispatcher"}
    for panel in m.panels():
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        assert panel["targets"], panel["title"]
        assert panel["description"], panel["title"]
        ref_ids = [target["refId"] for target in panel["targets"]]
        assert len(ref_ids) == len(set(ref_ids)), panel["title"]
        _assert_fits_the_grid(panel)


def test_every_panel_query_filters_on_the_dashboard_variables() -> None:
    for panel in m.panels():
        for target in panel["targets"]:
            expr: str = target["expr"]
            if "outbox_controller_leader" in expr:
                continue  # the operator's own series carry no dispatcher
            for selector in re.findall(r"outbox_[a-z_]+\{([^}]*)\}", expr):
                assert 'namespace=~"$namespace"' in selector, (panel["title"], expr)
                assert 'dispatcher=~"$dispatcher"' in selector, (panel["title"], expr)


def _assert_fits_the_grid(panel: dict[str, Any]) -> None:
    grid = panel["gridPos"]
    assert grid["x"] >= 0 and grid["x"] + grid["w"] <= 24, panel["title"]


def _anchor(title: str) -> str:
    """The anchor a Markdown renderer gives a heading (GitHub's rules, for plain titles)."""
    return re.sub(r"[^\w\- ]", "", title.strip().lower()).replace(" ", "-")
