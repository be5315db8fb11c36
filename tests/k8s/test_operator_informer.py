"""The operator's Deployments come from its informer (controller/informer.py), not from a GET
per pass: a change someone else makes reaches it through the watch, and a watch cut by the
server going away lists them again (its history compacted meanwhile, resuming would be too
old), after which the passes read them from memory again."""

from __future__ import annotations

from collections.abc import Callable

from .cluster import LocalCluster
from .test_operator import (
    Operator,
    apply,
    deployment_of,
    dispatcher_manifest,
    own_table,
    secret_manifest,
    wait_for,
)
from .test_operator_fleet import _gets


def _replicas(cluster: LocalCluster) -> int | None:
    found = deployment_of(cluster)
    return int(found["spec"]["replicas"]) if found else None


def _passes(operator: Operator) -> float:
    return operator.metric("outbox_controller_passes_total", dispatcher="orders") or 0.0


def _scaled_by_hand_and_put_back(cluster: LocalCluster) -> None:
    cluster.kubectl("scale", "deployment", "orders-worker", "--replicas=3")
    # The policy's one worker again: the pass saw the hand's 3 in its cache, from the watch.
    wait_for("the hand-scaled Deployment put back", lambda: _replicas(cluster) == 1)


def test_the_informer_follows_the_watch_and_lists_again_after_a_cut(
    cluster: LocalCluster, operators: Callable[..., Operator], dsn: str
) -> None:
    operator = operators()
    scaling = {"minReplicas": 1, "maxReplicas": 1, "pollIntervalSeconds": 1}
    apply(
        cluster,
        secret_manifest("orders-db", dsn=dsn),
        dispatcher_manifest(database=own_table(dsn, "orders"), scaling=scaling),
    )
    wait_for("the Deployment", lambda: _replicas(cluster) == 1)
    _scaled_by_hand_and_put_back(cluster)

    # Never a GET of the Deployment: the list, the watch and our own writes' answers.
    assert _gets(cluster, "deployments") == 0

    cluster.call(cluster.emulator.compact())
    with cluster.outage():  # every watch cut: until a list succeeds, the passes GET
        pass
    wait_for(
        "the informer listing again",
        lambda: "listed the Deployments in every namespace again" in operator.log(),
    )
    # A pass that looked before the list was done GETs, and its GET may reach the server
    # after the line is logged: counted once the pass under way has ended, and the next.
    start = _passes(operator)
    wait_for("two more passes", lambda: _passes(operator) >= start + 2)
    gets = _gets(cluster, "deployments")
    _scaled_by_hand_and_put_back(cluster)
    assert _gets(cluster, "deployments") == gets
