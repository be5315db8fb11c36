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
