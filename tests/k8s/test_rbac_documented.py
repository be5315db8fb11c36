"""The operator's RBAC as the chart grants it is what the docs list: every resource and verb of
the rendered ClusterRole has its row in the chart README's table, and docs/security.md names
each resource and the cluster-wide trade-off of listing pods."""

from __future__ import annotations

from pathlib import Path

from chart import chart as c

ROOT = Path(__file__).resolve().parent.parent.parent


def _rows() -> dict[tuple[str, str], str]:
    """(API group, resource) -> verbs, from the README's RBAC table."""
    text = (c.CHART / "README.md").read_text()
    table = text.split("## RBAC: exactly what the operator calls", 1)[1].split("\n\n")[2]
    rows = {}
    for line in table.splitlines()[2:]:
        group, resource, verbs, _ = (cell.strip() for cell in line.strip("|").split("|", 3))
        rows[(group.strip("`"), resource.strip("`").split("`")[0])] = verbs
    return rows


def test_every_rule_the_chart_grants_is_in_the_readme_table() -> None:
    rendered = c.render({"networkPolicy": {"workers": {"enabled": True}}})
    rows = _rows()
    for rule in rendered.one("ClusterRole")["rules"]:
        group = rule["apiGroups"][0] or "core"
        for resource in rule["resources"]:
            assert (group, resource) in rows, (group, resource, sorted(rows))
            assert rows[(group, resource)] == ", ".join(rule["verbs"]), (resource, rule)


def test_security_names_the_new_permissions_and_the_cluster_wide_trade_off() -> None:
    security = " ".join((ROOT / "docs" / "security.md").read_text().split())
    for resource in ("poddisruptionbudgets", "pods", "deployments/scale", "networkpolicies"):
        assert f"`{resource}`" in security, resource
    assert "list every pod of the cluster" in security
    assert "plain `env` values" in security
    readme = " ".join((c.CHART / "README.md").read_text().split())
    assert "list every pod of the cluster" in readme and "`watch.namespaces`" in readme
