"""The alert rules and the dashboard as data, for the tests that check them."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
FILES = ROOT / "charts" / "outbox-dispatcher" / "files"
RULES = FILES / "prometheus-rules.yaml"
DASHBOARD = FILES / "dashboard.json"
UNIT_TESTS = Path(__file__).with_name("alerts_test.yaml")
RUNBOOK = ROOT / "docs" / "monitoring.md"

# Values Grafana puts into a query before sending it.
GRAFANA_VARIABLES = {"$namespace": ".*", "$dispatcher": ".*", "$__rate_interval": "1m"}

_SELECTOR = re.compile(r"\b(outbox_[a-z_]+)(\{[^}]*\})?")
# A comparison with a number: the alert's threshold. Label matchers compare with quoted
# strings, so they never match this.
_THRESHOLD = re.compile(r"(==|!=|>=|<=|>|<)\s*-?\d+(\.\d+)?\b")


@dataclass(frozen=True)
class Query:
    """One PromQL expression to evaluate, and where it comes from."""

    origin: str  # "alert OutboxDeadMessages" or "panel Backlog by state (A)"
    expr: str

    @property
    def selectors(self) -> list[str]:
        return sorted({name + (matchers or "") for name, matchers in _SELECTOR.findall(self.expr)})

    @property
    def needs_operator(self) -> bool:
        return all(s.startswith("outbox_controller_") for s in self.selectors)

    @property
    def needs_partitioned_table(self) -> bool:
        """Its quantity is a ratio of what partition maintenance keeps made ahead: on a plain
        table both sides are 0 and the ratio is no number (promtool's cases cover it)."""
        return any(s.startswith("outbox_partition_ids") for s in self.selectors)

    def opened(self) -> str:
        """The expression with every threshold opened up (`> 300` becomes `>= -Inf`): what
        is left is the quantity the alert compares, over the same joins and labels."""
        return _THRESHOLD.sub(">= -Inf", self.expr)


def rules() -> list[dict[str, Any]]:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return [rule for group in groups for rule in group["rules"]]


def alert_queries() -> list[Query]:
    return [Query(f"alert {rule['alert']}", rule["expr"]) for rule in rules()]


def dashboard() -> dict[str, Any]:
    return dict(json.loads(DASHBOARD.read_text()))


def panels() -> list[dict[str, Any]]:
    return [panel for panel in dashboard()["panels"] if panel["type"] != "row"]


def panel_queries() -> list[Query]:
    found = []
    for panel in panels():
        for target in panel["targets"]:
            expr = target["expr"]
            for variable, value in GRAFANA_VARIABLES.items():
                expr = expr.replace(variable, value)
            found.append(Query(f"panel {panel['title']} ({target['refId']})", expr))
    return found
