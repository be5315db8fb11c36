"""Conditions, decisions and the backlog status: pure functions of what was observed."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from outbox.controller import status as st
from outbox.controller.decision import Decision
from outbox.stats import QueueStats, Rates

T0 = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)


def stats(**fields: object) -> QueueStats:
    base: dict[str, object] = dict(
        table="outbox",
        sampled_at=T0,
        pending=5,
        ready=4,
        processing=2,
        dead=1,
        done=100,
        done_is_estimate=True,
        expired_leases=0,
        oldest_pending_age=9.0,
        oldest_ready_age=7.25,
        max_id=120,
        attempts={1: 7},
    )
    base.update(fields)
    return QueueStats(**base)  # type: ignore[arg-type]


def test_last_transition_time_moves_only_when_the_status_changes() -> None:
    first = st.merge_conditions(
        None, [st.Condition(st.READY, False, "SecretNotFound", "no secret")], generation=1, now=T0
    )
    later = T0 + timedelta(minutes=5)
    same = st.merge_conditions(
        first, [st.Condition(st.READY, False, "TableMissing", "no table")], generation=2, now=later
    )
    (ready,) = same
    assert ready["lastTransitionTime"] == st.timestamp(T0)
    assert (ready["reason"], ready["observedGeneration"]) == ("TableMissing", 2)
    flipped = st.merge_conditions(
        same, [st.Condition(st.READY, True, "WorkersReady", "ok")], generation=2, now=later
    )
    assert flipped[0]["lastTransitionTime"] == st.timestamp(later)
    assert flipped[0]["status"] == "True"


def test_conditions_keep_one_entry_per_type_in_a_stable_order() -> None:
    merged = st.merge_conditions(
        [{"type": "Custom", "status": "True"}],
        [
            st.Condition(st.PAUSED, False, "NotPaused", ""),
            st.Condition(st.READY, True, "WorkersReady", ""),
            st.Condition(st.DATABASE_REACHABLE, None, "NotChecked", ""),
        ],
        generation=3,
        now=T0,
    )
    assert [c["type"] for c in merged] == [st.READY, st.DATABASE_REACHABLE, st.PAUSED, "Custom"]
    assert merged[1]["status"] == "Unknown"


def test_ready_condition() -> None:
    assert st.ready_condition(0, 0).reason == "ScaledToZero"
    assert st.ready_condition(2, 3).status is False
    assert st.ready_condition(3, 3).reason == "WorkersReady"


def test_a_problem_sets_ready_false_and_database_reachable_false_when_it_is_the_database() -> None:
    problem = st.Problem("DatabaseUnreachable", "cannot connect", database=True)
    conditions = {c.type: c for c in st.problem_conditions(problem)}
    assert conditions[st.READY].status is False
    assert conditions[st.DATABASE_REACHABLE].reason == "DatabaseUnreachable"
    secret = st.problem_conditions(st.Problem("SecretNotFound", "no secret"))
    assert [c.type for c in secret] == [st.READY]


def test_backlog_status_reports_counts_age_and_rates() -> None:
    backlog = st.backlog_status(stats(), Rates(2.5, 1.25))
    assert backlog["backlog"] == 7 and backlog["dead"] == 1
    assert backlog["oldestReadyAgeSeconds"] == 7.25
    assert (backlog["arrivalRate"], backlog["completionRate"]) == (2.5, 1.25)
    assert st.backlog_status(stats(oldest_ready_age=None), None)["oldestReadyAgeSeconds"] == 0


def test_scaling_is_true_while_the_pods_have_not_reached_the_decided_count() -> None:
    decision = Decision(3, "Backlog", "3 workers for the backlog")
    assert st.scaling_condition(decision, 1).status is True
    assert st.scaling_condition(decision, 3).status is False
    assert st.scaling_condition(decision, None).status is False  # no Deployment yet
    assert st.scaling_condition(decision, 1).reason == "Backlog"


def test_counts_at_the_limit_say_they_are_lower_bounds() -> None:
    exact = st.backlog_status(stats(count_limit=10_000), None)
    assert exact["countsExact"] is True and exact["readyEstimate"] == 4
    capped = st.backlog_status(
        stats(ready=10_000, pending=10_000, count_limit=10_000, oldest_ready_id=1, max_id=50_000),
        None,
    )
    assert capped["countsExact"] is False
    assert capped["readyEstimate"] == 50_000


# -- the report step: conditions, status and Events of one pass -----------------------------

SPEC = {"paused": False, "scaling": {"minReplicas": 0, "maxReplicas": 4}}
DEPLOYMENT = {"spec": {"replicas": 3}, "status": {"replicas": 3, "readyReplicas": 2}}


def by_type(found: list[st.Condition]) -> dict[str, st.Condition]:
    return {c.type: c for c in found}


def test_a_served_resource_reports_ready_from_its_pods_and_a_reachable_database() -> None:
    decision = Decision(3, "Backlog", "3 workers for the backlog")
    found = by_type(st.conditions(SPEC, decision, DEPLOYMENT, stats(), None))
    assert (found[st.READY].status, found[st.READY].reason) == (False, "WorkersStarting")
    assert found[st.DATABASE_REACHABLE].reason == "Connected"
    assert found[st.SCALING].status is False and found[st.PAUSED].status is False


def test_a_problem_says_what_was_checked_of_the_database() -> None:
    held = Decision(3, "HoldingSize", "size held")
    not_ours = st.Problem("DeploymentNotOwned", "not ours")
    found = by_type(st.conditions(SPEC, held, None, stats(), not_ours))
    assert found[st.READY].reason == "DeploymentNotOwned"
    assert found[st.DATABASE_REACHABLE].status is True  # read: the problem lies elsewhere
    secret = st.Problem("SecretNotFound", "no secret")
    found = by_type(st.conditions(SPEC, held, DEPLOYMENT, None, secret))
    assert found[st.DATABASE_REACHABLE].status is None
    assert found[st.DATABASE_REACHABLE].message == "not checked: no secret"
    down = st.Problem("DatabaseUnreachable", "cannot connect", database=True)
    found = by_type(st.conditions(SPEC, held, DEPLOYMENT, None, down))
    assert found[st.DATABASE_REACHABLE].reason == "DatabaseUnreachable"


def test_the_status_holds_the_counts_the_selector_and_the_rates() -> None:
    decision = Decision(3, "Backlog", "3 workers for the backlog")
    found = st.conditions(SPEC, decision, DEPLOYMENT, stats(max_id=130), None)
    status = st.resource_status(
        name="orders",
        generation=4,
        now=T0,
        before={},
        found=found,
        decision=decision,
        deployment=DEPLOYMENT,
        stats=stats(sampled_at=T0 + timedelta(seconds=5), max_id=130),
        previous=stats(),
    )
    assert (status["replicas"], status["readyReplicas"], status["desiredReplicas"]) == (3, 2, 3)
    assert status["observedGeneration"] == 4 and "instance=orders" in status["selector"]
    assert status["backlog"]["arrivalRate"] == 2.0  # 10 messages in 5 s
    assert {c["type"] for c in status["conditions"]} == set(st.CONDITION_TYPES)


def test_a_changed_count_is_a_scale_event() -> None:
    up = st.scale_event(1, Decision(3, "Backlog", "claimable"))
    assert up == st.Event("Normal", "ScaledUp", "1 -> 3 workers: claimable")
    down = st.scale_event(3, Decision(0, "Paused", "paused"))
    assert down is not None and down.reason == "ScaledDown"
    assert st.scale_event(2, Decision(2, "Backlog", "")) is None


def ready(status: bool | None, reason: str, message: str = "") -> list[dict[str, object]]:
    return st.merge_conditions(
        None, [st.Condition(st.READY, status, reason, message)], generation=1, now=T0
    )


def test_a_new_problem_is_one_warning_and_its_end_one_recovered_event() -> None:
    starting, working = ready(False, "WorkersStarting", "0/1"), ready(True, "WorkersReady", "1/1")
    broken = ready(False, "SecretNotFound", "no secret")
    assert st.change_events(starting, broken) == [
        st.Event("Warning", "SecretNotFound", "no secret")
    ]
    assert st.change_events(broken, broken) == []  # not on every pass
    assert st.change_events(broken, starting) == [
        st.Event("Normal", "Recovered", "recovered from SecretNotFound: 0/1")
    ]
    assert st.change_events(starting, working) == []  # pods starting is no problem
    assert st.change_events(None, working) == []
