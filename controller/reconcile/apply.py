"""The apply step: make the cluster and the table what the decision says.

The Deployment is created, replaced when its template changed (ours, or someone's hand: the
drift, put back), or resized; the workers' NetworkPolicy and PodDisruptionBudget are kept
as rendered; done rows past the retention are purged when a purge is due. While an input is
unusable only the size moves (paused or pinned), on the last good template. What the step
changed is an `Applied`, and what the loop keeps of it for the next pass goes back in it
(`server_made`, `purged_at`, `budget`).

The budget is read (a GET) only when what it should be changed, or once every
`KEPT_RECHECK`, and so is the NetworkPolicy (`network_policy`), which the loop also forgets
after a pass that failed (a 409 or 404 on its write included) and when the spec changes: an
idle resource's passes read neither but once a minute, so a budget or a policy deleted or
edited by hand is put back within that.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from outbox.controller.budget import keep_disruption_budget, render_disruption_budget, unavailable
from outbox.controller.database import RetentionRunning, Target
from outbox.controller.decision import Decision
from outbox.controller.drift import template_drift
from outbox.controller.network import differs as network_differs
from outbox.controller.network import render_network_policy
from outbox.controller.problem import Problem
from outbox.controller.reconcile.context import Context, step
from outbox.controller.reconcile.read import Reading
from outbox.controller.render import TEMPLATE_HASH, render_deployment
from outbox.controller.resource import deployment_name

log = logging.getLogger("outbox.controller")

# Purge at most this often, however long the retention (each purge is a few index scans).
MAX_PURGE_INTERVAL = timedelta(minutes=10)
# The budget as rendered is checked against the cluster at least this often while it stays
# the same (someone may have deleted or edited it).
KEPT_RECHECK = timedelta(minutes=1)


@dataclass(frozen=True)
class Kept:
    """An object (the budget, the NetworkPolicy) this loop last found or made as rendered,
    and when."""

    rendered: Mapping[str, Any] | None
    at: datetime


@dataclass(frozen=True)
class Applied:
    """What one pass changed."""

    deployment: Mapping[str, Any] | None  # as it stands after the pass
    scaled: bool  # the Deployment's replica count was changed
    purged: int | None  # done rows deleted; None when no purge ran (or it failed)
    drift: tuple[str, ...] = ()  # what was put back of a template changed by someone else
    # Template changes the server makes itself to what was written (never drift), as of
    # this pass: the loop hands them to the next.
    server_made: frozenset[str] = frozenset()
    purged_at: datetime | None = None  # when the last purge ran, this pass's or before
    budget: Kept | None = None
    # The NetworkPolicy as this loop last found or made it as rendered (None: none known).
    network_policy: Kept | None = None
    # Why this pass's retention run failed (status.RETENTION_HEALTHY False), None when it
    # did not fail or none ended this pass.
    retention_failed: Problem | None = None
    # Rows deleted by runs that failed or were stopped part-way (their batches before).
    purged_partly: int = 0


async def apply(
    context: Context,
    reading: Reading,
    decision: Decision,
    *,
    server_made: frozenset[str],
    purged_at: datetime | None,
    budget: Kept | None = None,
    network_policy: Kept | None = None,
) -> Applied:
    """Apply `decision` (see the module); `server_made`, `purged_at`, `budget` and
    `network_policy` as the last pass left them."""
    spec = reading.spec
    deployment = reading.deployment
    drift: tuple[str, ...] = ()
    if reading.problem is None:
        deployment, drift, server_made = await _deployment(
            context, reading, decision.replicas, server_made
        )
        if context.settings.worker_network_policy:
            network_policy = await _network_policy(context, reading, network_policy)
        budget = await _budget(context, reading, decision.replicas, budget)
    elif deployment is not None and decision.replicas != reading.replicas:
        # Paused or pinned while the inputs are broken: resize, keep the last good template.
        name = deployment_name(spec.name)
        with step(f"resizing Deployment {spec.namespace}/{name}"):
            await context.kube.scale_deployment(spec.namespace, name, decision.replicas)
    purged, failed = None, None
    dispatcher = (spec.namespace, spec.name)
    # A run in flight under a retention the spec no longer has (or for another table) stops.
    context.database.keep_retention(dispatcher, spec.table, spec.retention)
    if reading.problem is None and spec.retention is not None and _purge_due(reading, purged_at):
        purged, failed = await _purge(context, reading)
        if purged is not None:
            purged_at = reading.now
    partly = context.database.purged_unreported(dispatcher)
    scaled = deployment is not None and decision.replicas != reading.replicas
    return Applied(
        deployment,
        scaled,
        purged,
        drift,
        server_made,
        purged_at,
        budget,
        network_policy,
        retention_failed=failed,
        purged_partly=partly,
    )


async def _budget(context: Context, reading: Reading, replicas: int, kept: Kept | None) -> Kept:
    """The workers' PodDisruptionBudget kept as rendered (controller/budget.py); read only
    when the rendering changed since `kept` or `kept` is older than KEPT_RECHECK."""
    spec = reading.spec
    missing = unavailable(reading.pods)
    rendered = render_disruption_budget(spec, replicas, unavailable=missing)
    fresh = kept is not None and reading.now - kept.at < KEPT_RECHECK
    if fresh and kept is not None and kept.rendered == rendered:
        return kept
    with step(f"writing PodDisruptionBudget {spec.namespace}/{spec.name}-worker"):
        await keep_disruption_budget(context.kube, spec, replicas, reading.pods)
    return Kept(rendered, reading.now)


async def _deployment(
    context: Context, reading: Reading, replicas: int, server_made: frozenset[str]
) -> tuple[dict[str, Any], tuple[str, ...], frozenset[str]]:
    """Create the Deployment, or replace it if its template changed (our spec's or by
    someone else's hand: the drift, which it also returns), or just resize it; and what the
    server changed of what was written."""
    kube, settings, spec = context.kube, context.settings, reading.spec
    deployment = reading.deployment
    rendered = render_deployment(
        spec,
        replicas=replicas,
        default_image=settings.worker_image,
        secret_version=reading.secret_version,
        secret_versions=reading.secret_versions,
        defaults=settings.worker_defaults,
        publisher_defaults=settings.publisher_defaults,
    )
    name = f"{spec.namespace}/{rendered['metadata']['name']}"
    if deployment is None:
        log.info("%s/%s: creating Deployment %s", spec.namespace, spec.name, name)
        with step(f"creating Deployment {name}"):
            stored = await kube.create_deployment(rendered)
        return stored, (), _server_made(spec.namespace, spec.name, rendered, stored)
    annotations = deployment["metadata"].get("annotations") or {}
    version = deployment["metadata"]["resourceVersion"]
    if annotations.get(TEMPLATE_HASH) != rendered["metadata"]["annotations"][TEMPLATE_HASH]:
        log.info(
            "%s/%s: the worker template changed: rolling the workers", spec.namespace, spec.name
        )
        with step(f"replacing Deployment {name}"):
            stored = await kube.replace_deployment(rendered, version)
        return stored, (), _server_made(spec.namespace, spec.name, rendered, stored)
    drift = tuple(
        change
        for change in template_drift(rendered["spec"]["template"], deployment["spec"]["template"])
        if change not in server_made
    )
    if drift:
        # Same hash, another template: changed by hand (`kubectl set image`, `kubectl
        # edit`). Put back as rendered; the replica count is the policy's as always.
        with step(f"restoring Deployment {name}"):
            stored = await kube.replace_deployment(rendered, version)
        return stored, drift, _server_made(spec.namespace, spec.name, rendered, stored)
    if int(deployment["spec"].get("replicas", 0)) != replicas:
        with step(f"resizing Deployment {name}"):
            await kube.scale_deployment(spec.namespace, rendered["metadata"]["name"], replicas)
        resized = {**deployment, "spec": {**deployment["spec"], "replicas": replicas}}
        return resized, (), server_made
    return dict(deployment), (), server_made


def _server_made(
    namespace: str, name: str, rendered: Mapping[str, Any], stored: Mapping[str, Any]
) -> frozenset[str]:
    """What the server itself changed of the template we wrote (a value it normalizes some
    way `template_drift` does not know): never drift, never put back in a loop."""
    made = template_drift(rendered["spec"]["template"], stored["spec"]["template"])
    if made:
        log.info(
            "%s/%s: the API server stored the template otherwise: %s",
            namespace, name, "; ".join(made),
        )  # fmt: skip
    return frozenset(made)


async def _network_policy(context: Context, reading: Reading, kept: Kept | None) -> Kept:
    """The worker pods' NetworkPolicy (outbox.controller.network), kept as rendered: read,
    and written if it differs, when the rendering is not `kept`'s or `kept` is older than
    KEPT_RECHECK (see the module)."""
    kube, spec = context.kube, reading.spec
    rendered = render_network_policy(spec, context.settings.worker_metrics_from)
    if kept is not None and kept.rendered == rendered and reading.now - kept.at < KEPT_RECHECK:
        return kept
    name = rendered["metadata"]["name"]
    with step(f"writing NetworkPolicy {spec.namespace}/{name}"):
        current = await kube.network_policy(spec.namespace, name)
        if current is None or network_differs(current, rendered):
            log.info(
                "%s/%s: %s NetworkPolicy %s", spec.namespace, spec.name,
                "creating" if current is None else "restoring", name,
            )  # fmt: skip
            await kube.apply_network_policy(rendered, current)
    return Kept(rendered, reading.now)


def _purge_due(reading: Reading, purged_at: datetime | None) -> bool:
    """At most every min(retention, MAX_PURGE_INTERVAL), and at least one poll apart."""
    spec = reading.spec
    assert spec.retention is not None
    poll = timedelta(seconds=spec.poll_interval)
    every = max(poll, min(spec.retention, MAX_PURGE_INTERVAL))
    return purged_at is None or reading.now - purged_at >= every


async def _purge(context: Context, reading: Reading) -> tuple[int | None, Problem | None]:
    """Purge done rows past spec.retention; how many went (None: none ended this pass, or
    it failed), and why it failed (a skipped round, UpkeepBusy, is no failure)."""
    spec = reading.spec
    assert spec.table is not None and spec.retention is not None
    try:
        target = Target(reading.dsn, reading.secret_version)
        purged = await context.database.purge(
            (spec.namespace, spec.name), target, spec.table, spec.retention
        )
    except RetentionRunning as exc:
        log.info("%s/%s: %s", spec.namespace, spec.name, exc)
        return None, None
    except Problem as exc:
        if exc.reason == "UpkeepBusy":  # its turn comes at the next pass
            log.info("%s/%s: purge skipped: %s", spec.namespace, spec.name, exc.message)
            return None, None
        # Said in status and once in an Event (report.py), not in the log at every pass.
        log.info("%s/%s: purge failed: %s", spec.namespace, spec.name, exc.message)
        return None, exc
    return purged, None
