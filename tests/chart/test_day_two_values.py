"""Day-two mistakes the chart refuses at render: leader-election timings the operator would
refuse at start (a crash loop after the install), and a key written twice in any manifest
(YAML keeps the last silently; `kubectl apply` and Helm's own parser disagree on such files)."""

from __future__ import annotations

from typing import Any

import helm_python as helm
import pytest
import yaml

from chart import chart as c


class _NoDuplicates(yaml.SafeLoader):
    """A YAML loader that refuses a mapping with the same key twice."""


def _mapping(loader: _NoDuplicates, node: yaml.MappingNode) -> dict[Any, Any]:
    seen: set[Any] = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=True)
        if key in seen:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {key!r}", key_node.start_mark
            )
        seen.add(key)
    return loader.construct_mapping(node, deep=True)


_NoDuplicates.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _mapping)


def test_the_loader_refuses_a_key_written_twice() -> None:
    with pytest.raises(yaml.constructor.ConstructorError, match=r"app\.kubernetes\.io/component"):
        list(
            yaml.load_all(
                "labels:\n  app.kubernetes.io/component: controller\n"
                "  app.kubernetes.io/component: test\n",
                Loader=_NoDuplicates,
            )
        )


@pytest.mark.parametrize(
    "values",
    [
        {},
        {
            "metrics": {"serviceMonitor": {"enabled": True}, "podMonitor": {"enabled": True}},
            "prometheusRule": {"enabled": True},
            "podLabels": {"team": "payments"},
            "podDisruptionBudget": {"enabled": True},
        },
    ],
    ids=["defaults", "everything-on"],
)
def test_no_manifest_writes_a_key_twice(values: dict[str, Any]) -> None:
    rendered = c.render(values)
    for name, text in rendered.manifests.items():
        if name.endswith((".yaml", ".yml")):
            list(yaml.load_all(text, Loader=_NoDuplicates))  # raises naming the key
    [test_pod] = [o for o in rendered.hooks() if o["kind"] == "Pod"]
    labels = test_pod["metadata"]["labels"]
    assert labels["app.kubernetes.io/component"] == "test"
    # The operator's Service selects component=controller: the test pod is not behind it.
    service = rendered.one("Service")
    assert service["spec"]["selector"]["app.kubernetes.io/component"] == "controller"


@pytest.mark.parametrize(
    ("election", "says"),
    [
        (
            {"leaseDuration": "5s", "renewDeadline": "10s"},
            "leaderElection.renewDeadline (10s) must be shorter than "
            "leaderElection.leaseDuration (5s)",
        ),
        (
            {"leaseDuration": "1500ms", "renewDeadline": "1.5s"},
            "leaderElection.renewDeadline (1.5s) must be shorter than "
            "leaderElection.leaseDuration (1500ms)",
        ),
        (
            {"retryPeriod": "10s"},
            "leaderElection.retryPeriod (10s) must be shorter than "
            "leaderElection.renewDeadline (10s)",
        ),
        (
            {"leaseDuration": "1m", "renewDeadline": "2m", "retryPeriod": "100ms"},
            "leaderElection.renewDeadline (2m) must be shorter than",
        ),
        ({"retryPeriod": "0s"}, "leaderElection.retryPeriod (0s) must be greater than zero"),
        ({"retryPeriod": "0.0ms"}, "leaderElection.retryPeriod (0.0ms) must be greater than zero"),
    ],
)
def test_leader_election_timings_the_operator_refuses_fail_the_render(
    election: dict[str, str], says: str
) -> None:
    with pytest.raises(helm.HelmError) as refused:
        c.render({"leaderElection": election})
    assert says in str(refused.value), refused.value


@pytest.mark.parametrize(
    "election",
    [
        {},
        {"leaseDuration": "1m", "renewDeadline": "59.5s", "retryPeriod": "500ms"},
        {"leaseDuration": "2h", "renewDeadline": "90m", "retryPeriod": "1m"},
    ],
)
def test_consistent_timings_reach_the_operator_as_given(election: dict[str, str]) -> None:
    args = c.render({"leaderElection": election}).one("Deployment")["spec"]["template"]["spec"][
        "containers"
    ][0]["args"]
    given = {"leaseDuration": "15s", "renewDeadline": "10s", "retryPeriod": "2s", **election}
    assert f"--lease-duration={given['leaseDuration']}" in args
    assert f"--renew-deadline={given['renewDeadline']}" in args
    assert f"--retry-period={given['retryPeriod']}" in args
