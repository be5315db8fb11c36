"""The report step: metrics, Events and the status of what one pass saw, decided and did.

Their content is `status`'s pure functions; this step composes them and writes them. The
status is written only when it changed (`due`): a pass that finds the same table, the same
decision and the same cluster writes nothing (a fleet of idle dispatchers sends no writes, and
kopf gets no watch event back for each). What it shows changes in two kinds: its state
(conditions' status and reason, replica counts, observed generation, purge and scale times)
is written by the pass that sees it change; its figures alone (`status.backlog`'s counts,
ages and rates, the conditions' messages that quote them) at most every
`FIGURES_EVERY_SECONDS`, always as one pass read them whole (never a count that was not true
at `backlog.sampledAt`). `sampledAt` alone changing is no change.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from typing import Any

from kubernetes.aio.client.exceptions import ApiException

from outbox.controller import status as st
from outbox.controller.decision import Decision
from outbox.controller.kube import UNREACHABLE, failure_reason
from outbox.controller.reconcile.apply import Applied
from outbox.controller.reconcile.context import Context, step
from outbox.controller.reconcile.read import Reading
from outbox.controller.spec import DispatcherSpec
from outbox.plumbing.durations import format_duration
from outbox.stats import QueueStats

log = logging.getLogger("outbox.controller")

# The default poll interval: a resource polled faster writes its changing counts this often.
FIGURES_EVERY_SECONDS = 5.0
API_ERROR = "ApiError"  # Ready's reason while the API server refuses what a pass does
DRIFT_CORRECTED = "DriftCorrected"  # the Event when a hand-changed template is put back


def status(
    reading: Reading, decision: Decision, applied: Applied, previous: QueueStats | None
) -> dict[str, Any]:
    """The status this pass writes; `previous` is the last pass's stats (for the rates)."""
    spec, before = reading.spec, reading.status_before
    found = st.conditions(
        decision,
        applied.deployment,
        reading.stats,
        reading.problem,
        reading.pods,
        paused=spec.paused,
    )
    older = format_duration(spec.retention) if spec.retention is not None else ""
    retention = st.retention_condition(applied.purged, applied.retention_failed, older)
    if retention is not None:
        found.append(retention)
    written = st.resource_status(
        name=spec.name,
        generation=spec.generation,
        now=reading.now,
        before=before,
        found=found,
        decision=decision,
        deployment=applied.deployment,
        stats=reading.stats,
        previous=previous,
    )
    if spec.retention is None:  # no retention, nothing to say of it
        written["conditions"] = [
            c for c in written["conditions"] if c.get("type") != st.RETENTION_HEALTHY
        ]
    if applied.purged is not None:
        written["lastPurgeTime"] = st.timestamp(reading.now)
    if applied.purged is not None or applied.purged_partly:
        # A run stopped or failed part-way deleted its batches before: they count too.
        total = int(before.get("purgedTotal") or 0)
        written["purgedTotal"] = total + (applied.purged or 0) + applied.purged_partly
    if applied.scaled:
        written["lastScaleTime"] = st.timestamp(reading.now)
    return written


def events(
    reading: Reading, decision: Decision, applied: Applied, written: Mapping[str, Any]
) -> list[st.Event]:
    found = []
    scaled = st.scale_event(reading.replicas, decision) if applied.scaled else None
    if scaled is not None:
        found.append(scaled)
    if applied.drift:
        message = "put back as rendered: " + "; ".join(applied.drift)
        found.append(st.Event("Warning", DRIFT_CORRECTED, message))
    if applied.purged and reading.spec.retention is not None:
        older = format_duration(reading.spec.retention)
        message = f"deleted {applied.purged} done messages older than {older}"
        found.append(st.Event("Normal", "Purged", message))
    if applied.purged_partly:
        message = (
            f"deleted {applied.purged_partly} done messages before the retention run "
            "stopped (the spec's retention changed) or failed"
        )
        found.append(st.Event("Normal", "Purged", message))
    before = reading.status_before.get("conditions")
    return [*found, *st.change_events(before, written["conditions"])]


def measure(context: Context, reading: Reading, decision: Decision, applied: Applied) -> None:
    metrics, labels = context.metrics, (reading.spec.namespace, reading.spec.name)
    if reading.problem is not None:  # counted on every pass that could not serve it
        metrics.reconcile_errors.labels(*labels, reading.problem.reason).inc()
    if applied.scaled:
        direction = "up" if decision.replicas > reading.replicas else "down"
        metrics.scale_decisions.labels(*labels, direction).inc()
    ready = int(((applied.deployment or {}).get("status") or {}).get("readyReplicas") or 0)
    metrics.observe_replicas(*labels, decision.replicas, ready)
    if reading.stats is not None:
        metrics.observe_backlog(*labels, reading.stats)


async def post(context: Context, spec: DispatcherSpec, event: st.Event) -> None:
    level = logging.WARNING if event.type == "Warning" else logging.INFO
    log.log(level, "%s/%s: %s: %s", spec.namespace, spec.name, event.reason, event.message)
    with step(f"posting a {event.reason} Event"):
        await context.kube.event(spec.reference, event.type, event.reason, event.message)


def _state(status: Mapping[str, Any], keys: Iterable[str]) -> dict[str, Any]:
    """What of `status` is written at once when it changes: all but the figures."""
    state = {key: status.get(key) for key in keys if key != "backlog"}
    state["conditions"] = [
        {k: v for k, v in c.items() if k != "message"} for c in status.get("conditions") or ()
    ]
    return state


def _figures(status: Mapping[str, Any]) -> Any:
    backlog = {k: v for k, v in (status.get("backlog") or {}).items() if k != "sampledAt"}
    messages = [(c.get("type"), c.get("message")) for c in status.get("conditions") or ()]
    return backlog, messages


def due(
    before: Mapping[str, Any], written: Mapping[str, Any], last: datetime | None, now: datetime
) -> bool:
    """Whether this pass writes `written` over `before` (see the module); `last` is when
    this replica last wrote it."""
    if _state(written, written) != _state(before, written):
        return True
    if _figures(written) == _figures(before):
        return False
    return last is None or (now - last).total_seconds() >= FIGURES_EVERY_SECONDS


async def report(
    context: Context,
    reading: Reading,
    decision: Decision,
    applied: Applied,
    previous: QueueStats | None,
    last_written: datetime | None,
) -> tuple[dict[str, Any], bool]:
    """Measure, post and write the status if it is `due`; the status as it stands after, and
    whether it was written."""
    spec = reading.spec
    written = status(reading, decision, applied, previous)
    measure(context, reading, decision, applied)
    for event in events(reading, decision, applied, written):
        await post(context, spec, event)
    if not due(reading.status_before, written, last_written, reading.now):
        return dict(reading.status_before), False
    with step("writing the status"):
        await context.kube.patch_status(spec.namespace, spec.name, written)
    return {**reading.status_before, **written}, True


async def report_api_error(
    context: Context, spec: DispatcherSpec, before: Mapping[str, Any], message: str
) -> Mapping[str, Any] | None:
    """An API error in status (Ready=False, `ApiError`, the server's own words) and, when
    Ready changes to it, a Warning Event; best effort, as the API may refuse these too. The
    status as it stands after, None when it could not be written."""
    conditions = st.merge_conditions(
        before.get("conditions"),
        [st.Condition(st.READY, False, API_ERROR, message)],
        generation=spec.generation,
        now=datetime.now(UTC),
    )
    try:
        for event in st.change_events(before.get("conditions"), conditions):
            level = logging.WARNING if event.type == "Warning" else logging.INFO
            log.log(level, "%s/%s: %s: %s", spec.namespace, spec.name, event.reason, event.message)
            await context.kube.event(spec.reference, event.type, event.reason, event.message)
        await context.kube.patch_status(spec.namespace, spec.name, {"conditions": conditions})
    except (ApiException, *UNREACHABLE) as exc:
        reason = failure_reason(exc) if isinstance(exc, ApiException | TimeoutError) else exc
        log.warning(
            "%s/%s: cannot report the API error either: %s", spec.namespace, spec.name, reason
        )
        return None
    return {**before, "conditions": conditions}
