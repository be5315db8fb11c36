"""The decide step: the count a pass runs and why, from what it read (no Kubernetes, no
database: hand-made stats and the real scaling policy)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from outbox.controller.decision import (
    PAUSED_DECISION,
    Decision,
    Limits,
    Observed,
    SizingPolicy,
    decide,
)
from outbox.controller.problem import Problem
from outbox.controller.scaling import ScalingPolicy
from outbox.controller.spec import ScalingSettings
from outbox.stats import DestinationState, QueueStats

T0 = datetime(2026, 1, 1, tzinfo=UTC)
SCALING = {"minReplicas": 1, "maxReplicas": 4}


def backlog(t: float = 0, *, ready: int = 5000, age: float = 120.0) -> QueueStats:
    return QueueStats(
        table="outbox",
        sampled_at=T0 + timedelta(seconds=t),
        pending=ready,
        ready=ready,
        processing=0,
        dead=0,
        done=0,
        done_is_estimate=False,
        expired_leases=0,
        oldest_pending_age=age,
        oldest_ready_age=age,
        max_id=ready,
        attempts={},
    )


def limits(*, paused: bool = False, replicas: int | None = None) -> Limits:
    return Limits.of(ScalingSettings.from_spec(SCALING), paused=paused, pinned=replicas)


def never() -> SizingPolicy:
    raise AssertionError("the policy was asked without a reading")


class Wants:
    """A policy that wants a fixed count and ignores the bounds (as the benchmark's KEDA
    models do)."""

    def __init__(self, replicas: int) -> None:
        self.replicas = replicas

    def wish(
        self, stats: QueueStats, *, replicas: int, ready_replicas: int, paused: bool = False
    ) -> Decision:
        return Decision(self.replicas, "KedaHpa", "metric 9.0, target 1 per replica")

    def decided(self, decision: Decision, *, replicas: int, ready_replicas: int) -> None:
        pass

    def reconfigure(self, scaling: ScalingSettings) -> None:
        pass


def test_paused_wins_over_a_pinned_count_and_pinned_is_capped_at_max() -> None:
    paused = limits(paused=True, replicas=3).fixed()
    assert paused is not None and paused.replicas == 0 and paused.reason == "Paused"
    pinned = limits(paused=False, replicas=9).fixed()
    assert pinned is not None and pinned.replicas == 4 and pinned.reason == "ReplicasPinned"
    assert limits(paused=False).fixed() is None


def test_bounded_never_leaves_min_and_max() -> None:
    bounds = limits()
    wanted = [Decision(n, "Backlog", "") for n in (0, 1, 3, 4, 50)]
    assert [bounds.bound(d).replicas for d in wanted] == [1, 1, 3, 4, 4]


def test_paused_is_zero_with_or_without_a_reading_and_the_policy_still_learns() -> None:
    policy = ScalingPolicy(SCALING)
    read = Observed(backlog(), None, replicas=3, ready_replicas=3)
    assert decide(read, limits(paused=True), lambda: policy) == PAUSED_DECISION
    assert policy.last_decision == PAUSED_DECISION  # asked, told it is paused: it sized nothing
    broken = Observed(None, Problem("SecretNotFound", "no Secret"), replicas=3, ready_replicas=3)
    assert decide(broken, limits(paused=True, replicas=2), never) == PAUSED_DECISION


def test_a_pinned_count_wins_but_the_policy_is_asked_and_learns() -> None:
    policy = ScalingPolicy(SCALING)
    read = Observed(backlog(), None, replicas=1, ready_replicas=1)
    decision = decide(read, limits(replicas=9), lambda: policy)
    assert (decision.replicas, decision.reason) == (4, "ReplicasPinned")
    assert policy.last_decision is not None and policy.last_decision.reason != "ReplicasPinned"


@pytest.mark.parametrize("stats", [None, backlog()], ids=["unread", "read"])
def test_a_problem_holds_the_current_size_without_asking_the_policy(stats) -> None:
    # With stats too: a Deployment that is not ours is read, but nothing is sized for it.
    problem = Problem("DeploymentNotOwned", "Deployment default/orders-worker is not ours")
    decision = decide(Observed(stats, problem, replicas=2, ready_replicas=1), limits(), never)
    assert decision == Decision(2, "HoldingSize", f"size held: {problem.message}")


def test_the_scaling_policys_answer_is_the_decision() -> None:
    policy = ScalingPolicy(SCALING)
    decision = decide(Observed(backlog(), None, 1, 1), limits(), lambda: policy)
    # The policy's wish, within the bounds (applied once, by decide).
    assert policy.last_decision is not None
    assert decision == limits().bound(policy.last_decision)
    assert SCALING["minReplicas"] <= decision.replicas <= SCALING["maxReplicas"]


@pytest.mark.parametrize(
    ("wanted", "replicas", "reason", "says"),
    [
        (0, 1, "MinReplicas", "minReplicas is 1; wanted 0: metric 9.0"),
        (9, 4, "MaxReplicas", "wanted more: metric 9.0"),
        (3, 3, "KedaHpa", "metric 9.0"),
    ],
)
def test_any_policys_answer_is_kept_within_the_bounds(wanted, replicas, reason, says) -> None:
    decision = decide(Observed(backlog(), None, 2, 2), limits(), lambda: Wants(wanted))
    assert (decision.replicas, decision.reason) == (replicas, reason)
    assert decision.message.startswith(says), decision.message


def test_the_policy_is_built_only_when_there_is_a_reading() -> None:
    built: list[SizingPolicy] = []

    def policy() -> SizingPolicy:
        built.append(ScalingPolicy(SCALING))
        return built[-1]

    problem = Problem("DatabaseUnreachable", "cannot connect", database=True)
    decide(Observed(None, problem, 1, 1), limits(), policy)
    assert built == []
    decide(Observed(backlog(), None, 1, 1), limits(), policy)
    assert len(built) == 1


# -- a destination open or paused: no worker added ------------------------------------------


def down(*names: str, state: str = "open") -> tuple[DestinationState, ...]:
    return tuple(
        DestinationState(
            destination=name,
            state=state,
            since=T0,
            for_seconds=60.0,
            failures=5,
            last_error="HTTP 503 Service Unavailable",
            last_failure=T0,
            next_probe_at=None,
            next_probe_in=None,
            probing=None,
            reason=None,
            changed_by=None,
        )
        for name in names
    )


def test_an_open_destination_adds_no_worker_and_says_so() -> None:
    read = Observed(backlog(), None, 2, 2, down("http://api.test:80"))
    decision = decide(read, limits(), lambda: Wants(4))
    assert (decision.replicas, decision.reason) == (2, "DestinationUnreachable")
    assert "http://api.test:80 is open" in decision.message
    assert "the policy wanted 4: metric 9.0" in decision.message
    # The same reading with every destination closed: the policy's answer.
    assert decide(Observed(backlog(), None, 2, 2), limits(), lambda: Wants(4)).replicas == 4


def test_a_paused_destination_holds_too_and_several_are_counted() -> None:
    paused = down("kafka://a", state="paused")
    decision = decide(Observed(backlog(), None, 3, 3, paused), limits(), lambda: Wants(4))
    assert (decision.replicas, decision.reason) == (3, "DestinationUnreachable")
    assert "kafka://a is paused" in decision.message
    both = (*paused, *down("http://b:80"))
    decision = decide(Observed(backlog(), None, 3, 3, both), limits(), lambda: Wants(4))
    assert "2 destinations are open or paused" in decision.message


def test_fewer_workers_are_allowed_while_a_destination_is_open() -> None:
    read = Observed(backlog(), None, 3, 3, down("http://api.test:80"))
    decision = decide(read, limits(), lambda: Wants(2))
    assert decision == Decision(2, "KedaHpa", "metric 9.0, target 1 per replica")


def test_from_zero_one_worker_starts_to_probe_the_open_destination() -> None:
    read = Observed(backlog(), None, 0, 0, down("http://api.test:80"))
    with_floor = Limits(min_replicas=0, max_replicas=4)
    decision = decide(read, with_floor, lambda: Wants(4))
    assert (decision.replicas, decision.reason) == (1, "DestinationUnreachable")
    assert decide(read, with_floor, lambda: Wants(0)).replicas == 0  # nothing wanted: none


def test_the_bounds_and_the_spec_still_win_over_the_hold() -> None:
    gone = down("http://api.test:80")
    # maxReplicas lowered below what runs: the bound lowers it.
    decision = decide(Observed(backlog(), None, 6, 6, gone), limits(), lambda: Wants(8))
    assert (decision.replicas, decision.reason) == (4, "MaxReplicas")
    assert "DestinationUnreachable" not in decision.reason
    assert "is open" in decision.message
    paused = decide(Observed(backlog(), None, 2, 2, gone), limits(paused=True), lambda: Wants(4))
    assert paused == PAUSED_DECISION
    pinned = decide(Observed(backlog(), None, 2, 2, gone), limits(replicas=3), lambda: Wants(4))
    assert (pinned.replicas, pinned.reason) == (3, "ReplicasPinned")
    problem = Problem("DeploymentNotOwned", "not ours")
    held = decide(Observed(backlog(), problem, 2, 2, gone), limits(), never)
    assert held.reason == "HoldingSize"
