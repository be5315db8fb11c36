"""The worker pods' PodDisruptionBudget: rendered (`render_disruption_budget`) and kept so.

Each pass writes it when it differs: the allowed evictions follow the desired replicas (a
minAvailable is rewritten as the evictions it allows at each count, never fewer than one), and
a hand's edit is put back. While the worker pods not ready (a Pending replacement a drain's
eviction left unschedulable) use up what it allows, it allows every eviction, so it never
holds a drain for longer than one poll interval. The operator deletes nothing (its RBAC has
no delete, and the budget goes with the resource, its owner): a budget the resource no longer
asks for is rewritten to allow every eviction. A budget of the same name that is not the
resource's is left alone.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from typing import Any

from kubernetes.aio.client.exceptions import ApiException

from outbox.controller.kube import Kube
from outbox.controller.resource import deployment_name, labels, owner_reference, selector_labels
from outbox.controller.spec import DispatcherSpec

log = logging.getLogger("outbox.controller")


# -- rendering ----------------------------------------------------------

DISRUPTION_BUDGET_API = "policy/v1"
# What a budget the resource no longer asks for becomes: the operator deletes nothing (its
# RBAC has no delete; the budget goes with the resource), so it lets every eviction through.
NO_BUDGET = "100%"


def _needed(min_available: int | str, replicas: int) -> int:
    """Healthy pods a minAvailable keeps, as the disruption controller counts them: a
    percentage of the replicas, rounded up."""
    if isinstance(min_available, str):
        return math.ceil(int(min_available.rstrip("%")) * replicas / 100)
    return int(min_available)


def max_unavailable(budget: Mapping[str, Any], replicas: int) -> int | str:
    """The budget as the evictions it allows with `replicas` desired workers, never fewer
    than one: a budget that allows none blocks every node drain for good.

    maxUnavailable (1 or more; a percentage rounds up, so at least one pod) is taken as it is.
    minAvailable M is what it means while the replicas exceed it, R - M; at or below it (2 of
    2, 100%, or any count once the autoscaler goes down to it) it would allow no eviction at
    all, so it allows one: a drain goes on one pod at a time, each waiting for a replacement
    to be ready. The operator rewrites the budget whenever the replicas change."""
    if "maxUnavailable" in budget:
        return budget["maxUnavailable"]  # type: ignore[no-any-return]
    return max(1, replicas - _needed(budget["minAvailable"], replicas))


def evictions(allowed: int | str, replicas: int) -> int:
    """A maxUnavailable as the disruption controller counts it for `replicas` expected pods:
    a percentage rounds up."""
    if isinstance(allowed, str):
        return math.ceil(int(allowed.rstrip("%")) * replicas / 100)
    return int(allowed)


def render_disruption_budget(
    spec: DispatcherSpec, replicas: int, *, released: bool = False, unavailable: int = 0
) -> dict[str, Any] | None:
    """The worker pods' PodDisruptionBudget for `replicas` desired workers, or None when the
    resource asks for none; `released`: the budget that replaces one the resource no longer
    asks for (it allows every eviction); `unavailable`: the worker pods not ready now.

    The disruption controller allows maxUnavailable minus the pods not ready, so a budget
    of 1 with one pod Pending (evicted by a drain, its replacement unschedulable) allows
    none, and the drain would wait for ever. While the pods not ready use up what the budget
    allows, it is written to allow every eviction (NO_BUDGET), and restored once they are
    ready; otherwise it allows max_unavailable, always one or more. Unhealthy pods may always
    be evicted (unhealthyPodEvictionPolicy AlwaysAllow), so a crash-looping worker, which
    protects nothing, never holds a node. The autoscaler's own scale-downs are not
    evictions: no budget slows them."""
    budget: Mapping[str, Any] = spec.worker.get("disruptionBudget") or {}
    if released:
        allowed: int | str = NO_BUDGET
    elif budget:
        allowed = max_unavailable(budget, replicas)
        if unavailable > 0 and unavailable >= evictions(allowed, replicas):
            allowed = NO_BUDGET
    else:
        return None
    name = spec.name
    return {
        "apiVersion": DISRUPTION_BUDGET_API,
        "kind": "PodDisruptionBudget",
        "metadata": {
            "name": deployment_name(name),
            "namespace": spec.namespace,
            "labels": labels(name),
            "ownerReferences": [owner_reference(name, spec.uid)],
        },
        "spec": {
            "maxUnavailable": allowed,
            "selector": {"matchLabels": selector_labels(name)},
            "unhealthyPodEvictionPolicy": "AlwaysAllow",
        },
    }


# -- keeping


def differs(current: Mapping[str, Any], rendered: Mapping[str, Any]) -> bool:
    """Whether the budget in the cluster is not the one rendered: its spec or labels."""
    meta = current.get("metadata") or {}
    want = rendered["metadata"]["labels"]
    return current.get("spec") != rendered["spec"] or {**(meta.get("labels") or {}), **want} != (
        meta.get("labels") or {}
    )


def _owned(current: Mapping[str, Any], uid: object) -> bool:
    owners = (current.get("metadata") or {}).get("ownerReferences") or []
    return any(ref.get("uid") == uid and ref.get("controller") for ref in owners)


def _unready(pod: Mapping[str, Any]) -> bool:
    if (pod.get("metadata") or {}).get("deletionTimestamp"):
        return False  # going (evicted): its replacement, Pending, is the one that counts
    status = pod.get("status") or {}
    return not any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in status.get("conditions") or ()
    )


def unavailable(pods: Sequence[Mapping[str, Any]] | None) -> int:
    """The worker pods not ready now (Pending, unschedulable, starting, crashing), which the
    disruption controller counts against the budget; 0 when the pods could not be read
    (RBAC: the budget is then written as asked)."""
    return sum(1 for pod in pods or () if _unready(pod))


async def keep_disruption_budget(
    kube: Kube,
    spec: DispatcherSpec,
    replicas: int,
    pods: Sequence[Mapping[str, Any]] | None = None,
) -> None:
    """Write the budget for `replicas` desired workers when it differs from the one there;
    `pods` the worker pods as listed this pass (None: not readable)."""
    name = deployment_name(spec.name)
    missing = unavailable(pods)
    rendered = render_disruption_budget(spec, replicas, unavailable=missing)
    try:
        current = await kube.disruption_budget(spec.namespace, name)
    except ApiException as exc:
        # An operator whose RBAC predates budgets serves every resource that asks for none.
        if exc.status == 403 and rendered is None:
            return
        raise
    if current is not None and not _owned(current, spec.uid):
        log.warning(
            "%s/%s: PodDisruptionBudget %s is not this resource's; left alone",
            spec.namespace, spec.name, name,
        )  # fmt: skip
        return
    if rendered is None:
        if current is None:
            return
        rendered = render_disruption_budget(spec, replicas, released=True)
        assert rendered is not None
    if current is None or differs(current, rendered):
        log.info(
            "%s/%s: %s PodDisruptionBudget %s (maxUnavailable %s)",
            spec.namespace, spec.name, "creating" if current is None else "writing",
            name, rendered["spec"]["maxUnavailable"],
        )  # fmt: skip
        await kube.apply_disruption_budget(rendered, current)
