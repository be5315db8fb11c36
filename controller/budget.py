"""The worker pods' PodDisruptionBudget, kept as rendered (render.render_disruption_budget).

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
from collections.abc import Mapping, Sequence
from typing import Any

from kubernetes.aio.client.exceptions import ApiException

from outbox.controller.kube import Kube
from outbox.controller.render import render_disruption_budget
from outbox.controller.resource import deployment_name

log = logging.getLogger("outbox.controller")


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
    body: Mapping[str, Any],
    replicas: int,
    pods: Sequence[Mapping[str, Any]] | None = None,
) -> None:
    """Write the budget for `replicas` desired workers when it differs from the one there;
    `pods` the worker pods as listed this pass (None: not readable)."""
    meta = body["metadata"]
    name = deployment_name(meta["name"])
    missing = unavailable(pods)
    rendered = render_disruption_budget(body, replicas, unavailable=missing)
    try:
        current = await kube.disruption_budget(meta["namespace"], name)
    except ApiException as exc:
        # An operator whose RBAC predates budgets serves every resource that asks for none.
        if exc.status == 403 and rendered is None:
            return
        raise
    if current is not None and not _owned(current, meta.get("uid")):
        log.warning(
            "%s/%s: PodDisruptionBudget %s is not this resource's; left alone",
            meta["namespace"], meta["name"], name,
        )  # fmt: skip
        return
    if rendered is None:
        if current is None:
            return
        rendered = render_disruption_budget(body, replicas, released=True)
        assert rendered is not None
    if current is None or differs(current, rendered):
        log.info(
            "%s/%s: %s PodDisruptionBudget %s (maxUnavailable %s)",
            meta["namespace"], meta["name"], "creating" if current is None else "writing",
            name, rendered["spec"]["maxUnavailable"],
        )  # fmt: skip
        await kube.apply_disruption_budget(rendered, current)
