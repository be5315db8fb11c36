"""Status and conditions as pure functions, in the style of CloudNativePG and the Kubernetes
API conventions: one condition per type, CamelCase reasons, `lastTransitionTime` moving only
when the status changes, each stamped with the generation it describes."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from outbox.controller.decision import Decision
from outbox.stats import QueueStats, Rates

READY = "Ready"
DATABASE_REACHABLE = "DatabaseReachable"
SCALING = "Scaling"
PAUSED = "Paused"
CONDITION_TYPES = (READY, DATABASE_REACHABLE, SCALING, PAUSED)


@dataclass(frozen=True)
class Condition:
    type: str
    status: bool | None  # None = Unknown
    reason: str
    message: str

    @property
    def status_text(self) -> str:
        return {True: "True", False: "False", None: "Unknown"}[self.status]


class Problem(Exception):
    """Why a resource cannot be served: a CamelCase reason and a message for people.

    Raised while reconciling; reported as Ready=False (and DatabaseReachable=False when
    `database` is set) with an Event, never as a traceback.
    """

    def __init__(self, reason: str, message: str, *, database: bool = False) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message
        self.database = database


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
    order = {t: i for i, t in enumerate(CONDITION_TYPES)}
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


def paused_condition(spec: Mapping[str, Any]) -> Condition:
    if spec.get("paused"):
        return Condition(PAUSED, True, "PausedBySpec", "spec.paused is true: scaled to zero")
    return Condition(PAUSED, False, "NotPaused", "the workers run as sized")


def ready_condition(ready_replicas: int, desired: int) -> Condition:
    if desired == 0:
        return Condition(READY, True, "ScaledToZero", "nothing to do: no workers are needed")
    if ready_replicas >= desired:
        return Condition(READY, True, "WorkersReady", f"{ready_replicas}/{desired} workers ready")
    return Condition(READY, False, "WorkersStarting", f"{ready_replicas}/{desired} workers ready")


def problem_conditions(problem: Problem) -> list[Condition]:
    found = [Condition(READY, False, problem.reason, problem.message)]
    if problem.database:
        found.append(Condition(DATABASE_REACHABLE, False, problem.reason, problem.message))
    return found
