"""What a scale Event says is what happened and why: a scale-up to the floor says the floor
(not "wanted 0: idle for 0s"), a scale-up after a resume says the window's peak (not "needs
0, holding"), a pinned count adds no workers while the inputs fail their check, and a paused
resource says Paused rather than ScaledToZero; and a retention of zero is refused."""

from __future__ import annotations

from dataclasses import replace

from test_scaling import Queue, snap

from outbox.controller import status as st
from outbox.controller.decision import Limits, Observed, decide, describe_reading
from outbox.controller.problem import Problem
from outbox.controller.scaling import ScalingPolicy


def _limits(**overrides: object) -> Limits:
    return replace(Limits(min_replicas=1, max_replicas=4), **overrides)  # type: ignore[arg-type]


def test_a_new_resource_raised_to_min_replicas_says_the_floor_and_the_backlog() -> None:
    policy = ScalingPolicy({"minReplicas": 1})
    empty = Observed(snap(0, max_id=0), None, replicas=0, ready_replicas=0)
    decision = decide(empty, _limits(), lambda: policy)
    event = st.scale_event(0, decision)
    assert event is not None
    assert event == st.Event(
        "Normal", "ScaledUp", "0 -> 1 workers: minReplicas is 1; nothing waiting"
    )
    waiting = Observed(snap(0, max_id=12, ready=12, age=4.2), None, replicas=0, ready_replicas=0)
    # Whatever the policy wants below the floor, the floor says what waits.
    message = decide(waiting, _limits(min_replicas=3), lambda: policy).message
    assert message.startswith("minReplicas is 3; 12 messages ready, oldest 4s"), message


def test_a_hold_at_the_floor_still_says_what_the_policy_wanted() -> None:
    policy = ScalingPolicy({"minReplicas": 2, "maxReplicas": 4})
    queue = Queue(policy, mu=200, replicas=2)
    queue.run(900, rate=0)
    idle = Observed(snap(queue.t + 5, max_id=queue.arrived), None, 2, 2)
    decision = decide(idle, _limits(min_replicas=2), lambda: policy)
    assert decision.reason == "MinReplicas"
    assert decision.message.startswith("minReplicas is 2; wanted 0: "), decision.message


def test_the_reading_in_words() -> None:
    assert describe_reading(None) == "no backlog reading"
    assert describe_reading(snap(0, max_id=0)) == "nothing waiting"
    busy = snap(0, max_id=9, ready=7, age=12.6, processing=2)
    assert describe_reading(busy) == "7 messages ready, oldest 13s, 2 in flight"


def test_a_resume_scales_up_to_the_windows_peak_and_says_so_not_holding() -> None:
    policy = ScalingPolicy({"maxReplicas": 50, "scaleDownStabilizationSeconds": 300})
    queue = Queue(policy, mu=200, replicas=1)
    queue.run(600, rate=1000)
    busy = queue.replicas
    assert busy >= 5 and policy.drain_rate.measured
    # Paused for two minutes (no arrivals: the arrival median falls to 0), then resumed.
    for _ in range(24):
        queue.t += 5
        stats = snap(queue.t, max_id=queue.arrived)
        policy.decide_explained(stats, replicas=0, ready_replicas=0, paused=True)
    resumed = policy.decide_explained(
        snap(queue.t + 5, max_id=queue.arrived), replicas=0, ready_replicas=0
    )
    assert resumed.replicas > 0
    assert resumed.reason != "ScaleDownStabilizing", resumed
    assert "holding" not in resumed.message and "needs 0" not in resumed.message
    assert "/s in the last 300s" in resumed.message, resumed.message


def test_a_real_hold_still_says_holding() -> None:
    policy = ScalingPolicy({"maxReplicas": 50, "scaleDownStabilizationSeconds": 300})
    queue = Queue(policy, mu=200, replicas=1)
    queue.run(600, rate=1000)
    busy = queue.replicas
    held = queue.run(120, rate=200)
    assert all(d.replicas == busy for d in held)
    assert held[-1].reason == "ScaleDownStabilizing"
    assert "holding for 300s" in held[-1].message


def test_a_pinned_count_adds_no_workers_while_the_inputs_fail_their_check() -> None:
    problem = Problem("InvalidDsn", "key `dsn` of Secret `default/orders-db` is not a libpq …")
    broken = Observed(None, problem, replicas=1, ready_replicas=1)
    held = decide(broken, _limits(pinned=3), lambda: ScalingPolicy({}))
    assert (held.replicas, held.reason) == (1, "HoldingSize")
    assert "spec.replicas pins 3" in held.message and "InvalidDsn" not in held.reason
    assert problem.message in held.message
    # Fewer is allowed (nothing starts), and so is a pause; fixed inputs get the pinned count.
    assert decide(broken, _limits(pinned=0), lambda: ScalingPolicy({})).replicas == 0
    assert decide(broken, _limits(paused=True), lambda: ScalingPolicy({})).reason == "Paused"
    fixed = Observed(snap(0, max_id=0), None, replicas=1, ready_replicas=1)
    assert decide(fixed, _limits(pinned=3), lambda: ScalingPolicy({})).replicas == 3


def test_a_paused_resource_is_ready_with_reason_paused_not_scaled_to_zero() -> None:
    decision = _limits(paused=True).fixed()
    assert decision is not None
    found = st.conditions(decision, None, snap(0, max_id=0), None, paused=True)
    ready = next(c for c in found if c.type == st.READY)
    assert (ready.status, ready.reason) == (True, "Paused")
    assert "spec.paused" in ready.message
    idle = st.conditions(
        replace(decision, reason="Idle"), None, snap(0, max_id=0), None, paused=False
    )
    assert next(c for c in idle if c.type == st.READY).reason == "ScaledToZero"


def test_a_retention_of_zero_is_refused_by_the_operator_too() -> None:
    from datetime import timedelta

    import pytest

    from outbox.controller.spec import parse_retention

    assert parse_retention(None) is None
    assert parse_retention("7d") == timedelta(days=7)
    assert parse_retention("1ms") == timedelta(milliseconds=1)
    for zero in ("0s", "0.0h", "0ms"):
        with pytest.raises(Problem) as refused:
            parse_retention(zero)
        assert refused.value.reason == "InvalidRetention"
        assert f"spec.retention {zero!r} must be more than zero" in refused.value.message
    with pytest.raises(Problem, match="is not a duration"):
        parse_retention("soon")


def test_from_zero_the_one_worker_for_an_open_destination_is_a_probe_not_a_hold() -> None:
    from test_controller_decision import down

    gone = down("http://api.test:80")
    waiting = snap(0, max_id=50, ready=50, age=30)
    decision = decide(
        Observed(replace(waiting, destinations=gone), None, 0, 0, gone),
        _limits(min_replicas=0),
        lambda: ScalingPolicy({}),
    )
    assert (decision.replicas, decision.reason) == (1, "DestinationUnreachable")
    event = st.scale_event(0, decision)
    assert event is not None
    assert event.message.startswith(
        "0 -> 1 workers: one worker to probe the destination while http://api.test:80 is open"
    ), event.message
    assert "holding" not in event.message
