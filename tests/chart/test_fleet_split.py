"""Past one operator (docs/operator.md, "Running a fleet"): one release per group of
namespaces, rendered by Helm's own engine. Each release serves only its namespaces (a Role
in each, no ClusterRole, one --namespace each), elects its leader in its own namespace, and
only one release installs the CRD."""

from __future__ import annotations

from typing import Any

from .chart import Rendered, render

SPLIT = {
    "outbox-a": {"watch": {"namespaces": ["shop", "billing"]}},
    "outbox-b": {"watch": {"namespaces": ["search"]}, "crds": {"install": False}},
}


def _args(rendered: Rendered) -> list[str]:
    deployment: dict[str, Any] = rendered.one("Deployment")
    return [a for c in deployment["spec"]["template"]["spec"]["containers"] for a in c["args"]]


def test_one_release_per_group_of_namespaces_each_with_its_own_lease() -> None:
    releases = {
        namespace: render(values, namespace=namespace) for namespace, values in SPLIT.items()
    }
    for namespace, rendered in releases.items():
        served = SPLIT[namespace]["watch"]["namespaces"]
        assert not rendered.of_kind("ClusterRole") and not rendered.of_kind("ClusterRoleBinding")
        roles = rendered.of_kind("Role")
        leader = [r for r in roles if r["metadata"]["name"].endswith("leader-election")]
        assert [r["metadata"]["namespace"] for r in leader] == [namespace]
        assert sorted(r["metadata"]["namespace"] for r in roles if r not in leader) == sorted(
            served
        )
        assert sorted(a for a in _args(rendered) if a.startswith("--namespace")) == sorted(
            f"--namespace={n}" for n in served
        )
    assert len(releases["outbox-a"].of_kind("CustomResourceDefinition")) == 1
    assert not releases["outbox-b"].of_kind("CustomResourceDefinition")
