"""The report step as pure functions: a resource's status, its conditions and the Events a
pass posts, in the style of CloudNativePG and the Kubernetes API conventions: one condition
per type, CamelCase reasons, `lastTransitionTime` moving only when the status changes, each
stamped with the generation it describes, and an Event when a condition changes, not on
every pass.

A new condition is a function from what the pass saw to a `Condition`, added in
`conditions()`; an Event on its changes is an entry of `ON_CHANGE`.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from outbox import destinations as dest
from outbox.controller.decision import Decision
from outbox.controller.problem import RETENTION_FAILED, Problem
from outbox.controller.resource import selector_string
from outbox.plumbing.redact import redact_text
from outbox.stats import DestinationState, QueueStats, Rates, rates

READY = "Ready"
DATABASE_REACHABLE = "DatabaseReachable"
DESTINATION_REACHABLE = "DestinationReachable"
SCALING = "Scaling"
PAUSED = "Paused"
WORKERS_READY = "WorkersReady"
# The retention runs: True once one succeeded, False with RETENTION_FAILED while they fail;
# present only while spec.retention is set, and from the first run's end.
RETENTION_HEALTHY = "RetentionHealthy"
RETENTION_SUCCEEDED = "RetentionSucceeded"
RETENTION_RECOVERED = "RetentionRecovered"  # the Normal Event when a run succeeds again
CONDITION_TYPES = (
    READY,
    WORKERS_READY,
    DATABASE_REACHABLE,
    DESTINATION_REACHABLE,
    SCALING,
    PAUSED,
)
# Their order in status; RETENTION_HEALTHY is there only with a retention (above).
CONDITION_ORDER = (*CONDITION_TYPES, RETENTION_HEALTHY)
WORKERS_STARTING = "WorkersStarting"  # Ready=False that is no problem: pods on their way
# WorkersReady=False (and Ready=False) reasons read from the worker pods: what keeps them
# from running, by the container's waiting reason (kubelet's words), worst first.
WORKERS_CRASHING = "WorkersCrashing"
IMAGE_PULL_FAILED = "ImagePullFailed"
WORKERS_MISCONFIGURED = "WorkersMisconfigured"
WAITING_REASONS = {
    "ErrImagePull": IMAGE_PULL_FAILED,
    "ImagePullBackOff": IMAGE_PULL_FAILED,
    "InvalidImageName": IMAGE_PULL_FAILED,
    "ErrImageNeverPull": IMAGE_PULL_FAILED,
    "CreateContainerConfigError": WORKERS_MISCONFIGURED,
    "CreateContainerError": WORKERS_MISCONFIGURED,
    "CrashLoopBackOff": WORKERS_CRASHING,
    "RunContainerError": WORKERS_CRASHING,
    "StartError": WORKERS_CRASHING,
}
POD_REASON_ORDER = (IMAGE_PULL_FAILED, WORKERS_MISCONFIGURED, WORKERS_CRASHING)
# Restarts after which a running, unready container that last exited non-zero reads as
# crashing (CrashLoopBackOff itself always does): one restart is a transient failure.
CRASH_RESTARTS = 2
SHOWN_LINE_CHARS = 300  # of a container's last line in a condition message


@dataclass(frozen=True)
class Condition:
    type: str
    status: bool | None  # None = Unknown
    reason: str
    message: str

    @property
    def status_text(self) -> str:
        return {True: "True", False: "False", None: "Unknown"}[self.status]


def timestamp(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def merge_conditions(
    current: Sequence[Mapping[str, Any]] | None,
    updates: Iterable[Condition],
    *,
    generation: int,
    now: datetime,
) -> list[dict[str, Any]]:
    """The conditions after `updates`; lastTransitionTime kept unless the status changed."""
    by_type = {c["type"]: dict(c) for c in current or () if "type" in c}
    for update in updates:
        before = by_type.get(update.type)
        changed = before is None or before.get("status") != update.status_text
        by_type[update.type] = {
            "type": update.type,
            "status": update.status_text,
            "reason": update.reason,
            "message": update.message,
            "lastTransitionTime": timestamp(now)
            if changed
            else before.get("lastTransitionTime", timestamp(now)),  # type: ignore[union-attr]
            "observedGeneration": generation,
        }
    order = {t: i for i, t in enumerate(CONDITION_ORDER)}
    return sorted(by_type.values(), key=lambda c: (order.get(c["type"], len(order)), c["type"]))


def condition(conditions: Sequence[Mapping[str, Any]] | None, type_: str) -> Mapping[str, Any]:
    for item in conditions or ():
        if item.get("type") == type_:
            return item
    return {}


def backlog_status(stats: QueueStats, rates: Rates | None) -> dict[str, Any]:
    status: dict[str, Any] = {
        "pending": stats.pending,
        "ready": stats.ready,
        "processing": stats.processing,
        "backlog": stats.backlog,
        "dead": stats.dead,
        "oldestReadyAgeSeconds": round(stats.oldest_ready_age or 0.0, 3),
        # Backoff included: what the ready age leaves out during an outage (outbox.stats).
        "oldestUnfinishedAgeSeconds": round(stats.oldest_unfinished_age or 0.0, 3),
        "retrying": stats.retrying,
        "sampledAt": timestamp(stats.sampled_at),
        # Counts stop at the stats' count limit (cheap at any size); then they read "at least".
        "countsExact": stats.counts_exact,
        "readyEstimate": stats.ready_estimate,
    }
    if rates is not None:
        status["arrivalRate"] = round(rates.arrivals_per_second, 3)
        status["completionRate"] = round(rates.completions_per_second, 3)
    return status


def scaling_condition(decision: Decision, running: int | None) -> Condition:
    """Scaling is True while the Deployment's pods (`running`, None without a Deployment)
    have not reached the decided count yet."""
    moving = running is not None and running != decision.replicas
    return Condition(SCALING, moving, decision.reason, decision.message)


def paused_condition(paused: bool) -> Condition:
    if paused:
        return Condition(PAUSED, True, "PausedBySpec", "spec.paused is true: scaled to zero")
    return Condition(PAUSED, False, "NotPaused", "the workers run as sized")


def ready_condition(ready_replicas: int, desired: int, *, paused: bool = False) -> Condition:
    if paused:  # a person's decision, not an idle table: says so and how to undo it
        message = "spec.paused is true: no workers run until it is false"
        return Condition(READY, True, "Paused", message)
    if desired == 0:
        return Condition(READY, True, "ScaledToZero", "nothing to do: no workers are needed")
    if ready_replicas >= desired:
        return Condition(READY, True, "WorkersReady", f"{ready_replicas}/{desired} workers ready")
    return Condition(READY, False, WORKERS_STARTING, f"{ready_replicas}/{desired} workers ready")


def json_message(text: str) -> str | None:
    """The `message` of a JSON object (a JSON log line, an API server's Status), else None."""
    try:
        record = json.loads(text)
    except ValueError:
        return None
    if isinstance(record, dict) and isinstance(record.get("message"), str):
        return str(record["message"])
    return None


def _last_line(text: str) -> str:
    """A container's own last line: the last non-empty one; a JSON log line's message."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if not lines:
        return ""
    line = lines[-1]
    if line.startswith("{") and (message := json_message(line)) is not None:
        line = message
    if len(line) > SHOWN_LINE_CHARS:
        line = line[: SHOWN_LINE_CHARS - 1] + "…"
    return line


@dataclass(frozen=True)
class PodTrouble:
    """Why one worker pod does not run: a WorkersReady reason and what the kubelet said."""

    reason: str  # one of POD_REASON_ORDER
    pod: str
    text: str


def _pod_trouble(pod: Mapping[str, Any]) -> PodTrouble | None:
    name = str((pod.get("metadata") or {}).get("name") or "?")
    for container in (pod.get("status") or {}).get("containerStatuses") or ():
        if container.get("ready"):
            continue
        state = container.get("state") or {}
        waiting = state.get("waiting") or {}
        last = (container.get("lastState") or {}).get("terminated") or {}
        reason = WAITING_REASONS.get(str(waiting.get("reason") or ""))
        failed_before = bool(last) and (last.get("exitCode") or 0) != 0
        restarted = int(container.get("restartCount") or 0) >= CRASH_RESTARTS
        if reason is None and not (failed_before and restarted and "running" in state):
            continue
        # A container restarted more than once that has not become ready again is still
        # crashing: between two back-offs it runs for a moment, which must not read as a
        # recovery. One restart (a transient exit, a database failover) is not a crash yet.
        reason = reason or WORKERS_CRASHING
        if reason == WORKERS_CRASHING:
            restarts = int(container.get("restartCount") or 0)
            text = f"restarted {restarts} times"
            if last:
                text += f", last exit code {last.get('exitCode')}"
                if last.get("reason") not in (None, "Error"):
                    text += f" ({last.get('reason')})"
                line = _last_line(str(last.get("message") or ""))
                if line:
                    text += f": {line}"
        else:
            text = str(waiting.get("reason"))
            if waiting.get("message"):
                text += f": {_last_line(str(waiting['message']))}"
        return PodTrouble(reason, name, text)
    return None


def workers_condition(
    pods: Sequence[Mapping[str, Any]], ready_replicas: int, desired: int
) -> Condition:
    """WorkersReady, from the worker pods' own states (kubelet's waiting reasons and the last
    termination): False with `WorkersCrashing`, `ImagePullFailed` or `WorkersMisconfigured`
    and the container's own last line when a pod cannot run, whatever the ready count; else
    from the ready count. The message is shown through outbox.plumbing.redact: a container's line
    may quote anything."""
    troubles = [t for t in map(_pod_trouble, pods) if t is not None]
    if troubles:
        first = min(troubles, key=lambda t: (POD_REASON_ORDER.index(t.reason), t.pod))
        alike = sum(1 for t in troubles if t.reason == first.reason)
        count = f"{alike} of {len(pods)} worker pods" if alike > 1 else f"pod {first.pod}"
        where = f"{count} (e.g. {first.pod})" if alike > 1 else count
        return Condition(WORKERS_READY, False, first.reason, redact_text(f"{where}: {first.text}"))
    if desired == 0:
        return Condition(WORKERS_READY, True, "ScaledToZero", "no workers are needed")
    if ready_replicas >= desired:
        return Condition(WORKERS_READY, True, "WorkersReady", f"{ready_replicas}/{desired} ready")
    return Condition(
        WORKERS_READY, False, WORKERS_STARTING, f"{ready_replicas}/{desired} workers ready"
    )


def problem_conditions(problem: Problem) -> list[Condition]:
    found = [Condition(READY, False, problem.reason, problem.message)]
    if problem.database:
        found.append(Condition(DATABASE_REACHABLE, False, problem.reason, problem.message))
    return found


CONNECTED = Condition(DATABASE_REACHABLE, True, "Connected", "the table is a usable outbox table")

# The reason of DestinationReachable=False per state of the destination (outbox.destinations).
DESTINATION_REASONS = {dest.OPEN: "CircuitOpen", dest.PAUSED: "Paused"}
# How many destinations the message names one by one, and how much of each last error: a
# condition message is read on a terminal.
SHOWN_DESTINATIONS = 3
SHOWN_ERROR_CHARS = 200


def _unreachable_text(d: DestinationState) -> str:
    since = f" since {timestamp(d.since)}" if d.since is not None else ""
    if d.state == dest.PAUSED:
        who = f" by {d.changed_by}" if d.changed_by else ""
        why = f": {d.reason}" if d.reason else ""
        text = f"{d.destination} paused{who}{since}{why}"
    else:
        text = f"{d.destination} circuit open{since} ({d.failures} failures)"
        if d.reason:  # Retry-After: the destination asked for the pause itself
            text += f", {d.reason}"
    if d.last_error:
        error = " ".join(d.last_error.split())
        if len(error) > SHOWN_ERROR_CHARS:
            error = error[: SHOWN_ERROR_CHARS - 1] + "…"
        text += f"; last error: {error}"
    return text


def destination_condition(stats: QueueStats) -> Condition:
    """DestinationReachable: False while any destination a worker serves is open
    (`CircuitOpen`, which wins) or paused (`Paused`), naming each with its last error; the
    message goes through outbox.plumbing.redact, since errors and plugin destination keys may quote
    anything. An idle destination (no worker serves it any more: its URL changed) counts for
    nothing, whatever its row says; the message names such rows, so nobody wonders."""
    down = stats.unreachable
    if not down:
        message = "no destination is open or paused"
        left = [d for d in stats.destinations if d.idle and not d.sending]
        if left:
            names = ", ".join(f"{d.destination} {d.state}" for d in left[:SHOWN_DESTINATIONS])
            more = (
                f" and {len(left) - SHOWN_DESTINATIONS} more"
                if len(left) > SHOWN_DESTINATIONS
                else ""
            )
            message = (
                f"no destination a worker serves is open or paused; idle, not counted: "
                f"{names}{more}"
            )
        return Condition(DESTINATION_REACHABLE, True, "Reachable", redact_text(message))
    reason = "CircuitOpen" if any(d.state == dest.OPEN for d in down) else "Paused"
    # The open ones first: they are the outage; a pause is someone's decision.
    shown = sorted(down, key=lambda d: (d.state != dest.OPEN, d.destination))
    parts = [_unreachable_text(d) for d in shown[:SHOWN_DESTINATIONS]]
    if len(shown) > SHOWN_DESTINATIONS:
        parts.append(f"and {len(shown) - SHOWN_DESTINATIONS} more (outbox destinations)")
    return Condition(DESTINATION_REACHABLE, False, reason, redact_text(" | ".join(parts)))


def conditions(
    decision: Decision,
    deployment: Mapping[str, Any] | None,
    stats: QueueStats | None,
    problem: Problem | None,
    pods: Sequence[Mapping[str, Any]] | None = None,
    *,
    paused: bool,
) -> list[Condition]:
    """Every condition one pass reports, from what it read, decided and applied
    (`deployment` as it stands after the pass, None when there is none of ours; `pods` its
    worker pods, None when they could not be read; `paused` the typed spec's, as the
    resource is parsed once: controller/spec.py)."""
    dstatus: Mapping[str, Any] = (deployment or {}).get("status") or {}
    ready = int(dstatus.get("readyReplicas") or 0)
    found = [
        paused_condition(paused),
        scaling_condition(decision, int(dstatus.get("replicas") or 0) if deployment else None),
    ]
    # Pods that could not be read (RBAC): WorkersReady from the ready count alone.
    workers = workers_condition(pods or (), ready, decision.replicas)
    found.append(workers)
    if stats is not None:
        # Without a reading the last one's stays: no new fact, and no Event on a flicker.
        found.append(destination_condition(stats))
    if problem is None:
        if workers.reason in POD_REASON_ORDER and ready < decision.replicas:
            # Pods that cannot run, and too few ready, are the resource's problem: Ready says
            # so too (and its change posts the Warning Event), not "starting" for ever. One
            # bad pod among enough ready ones shows in WorkersReady only.
            return [*found, CONNECTED, Condition(READY, False, workers.reason, workers.message)]
        return [*found, CONNECTED, ready_condition(ready, decision.replicas, paused=paused)]
    found.extend(problem_conditions(problem))
    if stats is not None:
        found.append(CONNECTED)  # the problem lies elsewhere
    elif not problem.database:
        found.append(
            Condition(DATABASE_REACHABLE, None, "NotChecked", f"not checked: {problem.message}")
        )
    return found


def resource_status(
    *,
    name: str,
    generation: int,
    now: datetime,
    before: Mapping[str, Any],
    found: Iterable[Condition],
    decision: Decision,
    deployment: Mapping[str, Any] | None,
    stats: QueueStats | None,
    previous: QueueStats | None,
) -> dict[str, Any]:
    """The status subresource a pass writes (merged into what is there); `previous` is the
    last pass's stats, for the rates."""
    dstatus: Mapping[str, Any] = (deployment or {}).get("status") or {}
    status: dict[str, Any] = {
        "observedGeneration": generation,
        "replicas": int(dstatus.get("replicas") or 0),
        "readyReplicas": int(dstatus.get("readyReplicas") or 0),
        "desiredReplicas": decision.replicas,
        "selector": selector_string(name),
        "conditions": merge_conditions(
            before.get("conditions"), found, generation=generation, now=now
        ),
    }
    if stats is not None:
        status["backlog"] = backlog_status(stats, rates(previous, stats) if previous else None)
    return status


@dataclass(frozen=True)
class Event:
    """A core/v1 Event about the resource, as `kubectl describe` shows it."""

    type: str  # Normal or Warning
    reason: str
    message: str


def scale_event(current: int, decision: Decision) -> Event | None:
    """ScaledUp or ScaledDown when the decided count differs from the Deployment's."""
    if decision.replicas == current:
        return None
    reason = "ScaledUp" if decision.replicas > current else "ScaledDown"
    return Event("Normal", reason, f"{current} -> {decision.replicas} workers: {decision.message}")


def _ready_changed(was: Mapping[str, Any], now: Mapping[str, Any]) -> Event | None:
    if now.get("status") == "False" and now.get("reason") != WORKERS_STARTING:
        return Event("Warning", now["reason"], now["message"])  # a Problem
    if was.get("status") == "False" and was.get("reason") not in (None, WORKERS_STARTING):
        return Event("Normal", "Recovered", f"recovered from {was.get('reason')}: {now['message']}")
    return None


def _destination_changed(was: Mapping[str, Any], now: Mapping[str, Any]) -> Event | None:
    # Down when it leaves True (or first appears False), up when it leaves False: a change
    # between CircuitOpen and Paused is the same outage and posts nothing.
    if now.get("status") == "False" and was.get("status") != "False":
        return Event("Warning", "DestinationDown", now["message"])
    if now.get("status") == "True" and was.get("status") == "False":
        # Closed, or no worker serves it any more (its URL changed): either way, what the
        # workers send to is sending.
        message = f"every destination a worker serves is sending; it was {was.get('reason')}: "
        return Event("Normal", "DestinationRecovered", message + str(was.get("message")))
    return None


def retention_condition(
    purged: int | None, failed: Problem | None, older_than: str
) -> Condition | None:
    """RetentionHealthy from the run that ended this pass (None: none did): True after a
    run that succeeded, False with RETENTION_FAILED and the failure in one line."""
    if failed is not None:
        return Condition(RETENTION_HEALTHY, False, RETENTION_FAILED, redact_text(failed.message))
    if purged is None:
        return None
    message = f"the last run deleted {purged} done messages older than {older_than}"
    return Condition(RETENTION_HEALTHY, True, RETENTION_SUCCEEDED, message)


def _retention_changed(was: Mapping[str, Any], now: Mapping[str, Any]) -> Event | None:
    # Once per failure (a new one, e.g. a privilege granted and then a timeout, again), not
    # at every run that fails the same way; once when a run succeeds again.
    if now.get("status") == "False":
        if was.get("status") == "False" and was.get("message") == now.get("message"):
            return None
        return Event("Warning", RETENTION_FAILED, now["message"])
    if now.get("status") == "True" and was.get("status") == "False":
        message = f"a retention run succeeded again; it was failing: {was.get('message')}"
        return Event("Normal", RETENTION_RECOVERED, message)
    return None


# Per condition type: the Event its change posts, if any (from the condition before and after).
ON_CHANGE: dict[str, Callable[[Mapping[str, Any], Mapping[str, Any]], Event | None]] = {
    READY: _ready_changed,
    DESTINATION_REACHABLE: _destination_changed,
    RETENTION_HEALTHY: _retention_changed,
}
# Types whose message is part of what changes (a new failure is a new Event): the others'
# messages quote figures that move at every pass.
MESSAGE_CHANGES = frozenset({RETENTION_HEALTHY})


def change_events(
    before: Sequence[Mapping[str, Any]] | None, after: Sequence[Mapping[str, Any]]
) -> list[Event]:
    """The Events for the conditions whose status or reason changed between two statuses."""
    found = []
    for type_, on_change in ON_CHANGE.items():
        was, now = condition(before, type_), condition(after, type_)
        if not now:
            continue
        same = (was.get("reason"), was.get("status")) == (now.get("reason"), now.get("status"))
        if same and (type_ not in MESSAGE_CHANGES or was.get("message") == now.get("message")):
            continue
        event = on_change(was, now)
        if event is not None:
            found.append(event)
    return found
