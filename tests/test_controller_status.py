"""Conditions, decisions and the backlog status: pure functions of what was observed."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from outbox.controller import status as st
from outbox.controller.decision import Decision
from outbox.controller.problem import Problem
from outbox.controller.reconcile import report
from outbox.controller.reconcile.apply import Applied
from outbox.controller.reconcile.read import Reading
from outbox.controller.spec import DispatcherSpec
from outbox.stats import DestinationState, QueueStats, Rates

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
    problem = Problem("DatabaseUnreachable", "cannot connect", database=True)
    conditions = {c.type: c for c in st.problem_conditions(problem)}
    assert conditions[st.READY].status is False
    assert conditions[st.DATABASE_REACHABLE].reason == "DatabaseUnreachable"
    secret = st.problem_conditions(Problem("SecretNotFound", "no secret"))
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

DEPLOYMENT = {"spec": {"replicas": 3}, "status": {"replicas": 3, "readyReplicas": 2}}


def by_type(found: list[st.Condition]) -> dict[str, st.Condition]:
    return {c.type: c for c in found}


def test_a_served_resource_reports_ready_from_its_pods_and_a_reachable_database() -> None:
    decision = Decision(3, "Backlog", "3 workers for the backlog")
    found = by_type(st.conditions(decision, DEPLOYMENT, stats(), None, paused=False))
    assert (found[st.READY].status, found[st.READY].reason) == (False, "WorkersStarting")
    assert found[st.DATABASE_REACHABLE].reason == "Connected"
    assert found[st.SCALING].status is False and found[st.PAUSED].status is False


def test_a_problem_says_what_was_checked_of_the_database() -> None:
    held = Decision(3, "HoldingSize", "size held")
    not_ours = Problem("DeploymentNotOwned", "not ours")
    found = by_type(st.conditions(held, None, stats(), not_ours, paused=False))
    assert found[st.READY].reason == "DeploymentNotOwned"
    assert found[st.DATABASE_REACHABLE].status is True  # read: the problem lies elsewhere
    secret = Problem("SecretNotFound", "no secret")
    found = by_type(st.conditions(held, DEPLOYMENT, None, secret, paused=False))
    assert found[st.DATABASE_REACHABLE].status is None
    assert found[st.DATABASE_REACHABLE].message == "not checked: no secret"
    down = Problem("DatabaseUnreachable", "cannot connect", database=True)
    found = by_type(st.conditions(held, DEPLOYMENT, None, down, paused=False))
    assert found[st.DATABASE_REACHABLE].reason == "DatabaseUnreachable"


def test_the_status_holds_the_counts_the_selector_and_the_rates() -> None:
    decision = Decision(3, "Backlog", "3 workers for the backlog")
    found = st.conditions(decision, DEPLOYMENT, stats(max_id=130), None, paused=False)
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


# -- destinations: DestinationReachable and its Events ---------------------------------------


def destination(name: str, state: str, **fields: object) -> DestinationState:
    base: dict[str, object] = dict(
        destination=name,
        state=state,
        since=T0,
        for_seconds=30.0,
        failures=5 if state == "open" else 0,
        last_error=None,
        last_failure=None,
        next_probe_at=None,
        next_probe_in=None,
        probing=None,
        reason=None,
        changed_by=None,
    )
    base.update(fields)
    return DestinationState(**base)  # type: ignore[arg-type]


def test_destination_reachable_is_true_while_every_destination_sends() -> None:
    for known in ((), (destination("http://api.test:80", "closed"),)):
        found = st.destination_condition(stats(destinations=known))
        assert (found.type, found.status, found.reason) == (
            st.DESTINATION_REACHABLE,
            True,
            "Reachable",
        )


def test_an_open_destination_is_circuit_open_with_its_last_error_redacted() -> None:
    error = "HTTP 503 from http://app:hunter2-secret@api.test/x?token=abc123 password=s3cr3t"
    found = st.destination_condition(
        stats(destinations=(destination("http://api.test:80", "open", last_error=error),))
    )
    assert (found.status, found.reason) == (False, "CircuitOpen")
    assert found.message.startswith("http://api.test:80 circuit open since 2026-01-01T12:00:00Z")
    assert "(5 failures); last error: HTTP 503 from" in found.message
    for secret in ("hunter2-secret", "abc123", "s3cr3t"):
        assert secret not in found.message


def test_a_paused_destination_says_who_and_why_and_an_open_one_wins() -> None:
    paused = destination("kafka://main", "paused", changed_by="alice", reason="migration")
    found = st.destination_condition(stats(destinations=(paused,)))
    assert (found.status, found.reason) == (False, "Paused")
    assert found.message == "kafka://main paused by alice since 2026-01-01T12:00:00Z: migration"
    both = (paused, destination("http://z.test:80", "open"))
    found = st.destination_condition(stats(destinations=both))
    assert found.reason == "CircuitOpen"
    assert found.message.index("http://z.test:80") < found.message.index("kafka://main")


def test_a_destination_no_worker_serves_any_more_is_no_outage_but_is_named() -> None:
    """After a URL change the old origin's row stays open and no worker will probe it: the
    condition stays True (no Warning, no page), and its message says what is left over."""
    old = destination("http://old.test:80", "open", idle=True, last_error="publish timed out")
    new = destination("http://new.test:80", "closed")
    found = st.destination_condition(stats(destinations=(old, new)))
    assert (found.status, found.reason) == (True, "Reachable")
    assert found.message == (
        "no destination a worker serves is open or paused; idle, not counted: "
        "http://old.test:80 open"
    )
    # The new origin going down is an outage all the same, named alone.
    down = st.destination_condition(stats(destinations=(old, replace(new, state="open"))))
    assert (down.status, down.reason) == (False, "CircuitOpen")
    assert down.message.startswith("http://new.test:80 circuit open")
    assert "old.test" not in down.message


def test_many_destinations_down_are_named_up_to_a_few() -> None:
    many = tuple(destination(f"http://d{i}.test:80", "open") for i in range(5))
    found = st.destination_condition(stats(destinations=many))
    assert "http://d2.test:80" in found.message and "http://d3.test:80" not in found.message
    assert found.message.endswith("and 2 more (outbox destinations)")


def test_destination_reachable_is_reported_only_from_a_reading() -> None:
    decision = Decision(3, "Backlog", "3 workers for the backlog")
    gone = stats(destinations=(destination("http://api.test:80", "open"),))
    found = by_type(st.conditions(decision, DEPLOYMENT, gone, None, paused=False))
    assert found[st.DESTINATION_REACHABLE].reason == "CircuitOpen"
    down = Problem("DatabaseUnreachable", "cannot connect", database=True)
    found = by_type(st.conditions(decision, DEPLOYMENT, None, down, paused=False))
    assert st.DESTINATION_REACHABLE not in found  # the last reading's condition stays


def destination_reachable(status: bool, reason: str, message: str) -> list[dict[str, object]]:
    return st.merge_conditions(
        ready(True, "WorkersReady", "1/1"),
        [st.Condition(st.DESTINATION_REACHABLE, status, reason, message)],
        generation=1,
        now=T0,
    )


def test_a_destination_going_down_is_one_warning_and_coming_back_one_normal_event() -> None:
    reachable = destination_reachable(True, "Reachable", "no destination is open or paused")
    open_ = destination_reachable(False, "CircuitOpen", "http://api.test:80 circuit open")
    paused = destination_reachable(False, "Paused", "http://api.test:80 paused by bob")
    assert st.change_events(reachable, open_) == [
        st.Event("Warning", "DestinationDown", "http://api.test:80 circuit open")
    ]
    assert st.change_events(open_, open_) == []  # not on every pass
    assert st.change_events(open_, paused) == []  # the same outage, still down
    assert st.change_events(paused, reachable) == [
        st.Event(
            "Normal",
            "DestinationRecovered",
            "every destination a worker serves is sending; it was Paused: "
            "http://api.test:80 paused by bob",
        )
    ]
    # A first reading: down says so, reachable says nothing.
    assert [e.reason for e in st.change_events(ready(True, "WorkersReady"), open_)] == [
        "DestinationDown"
    ]
    assert st.change_events(ready(True, "WorkersReady"), reachable) == []


def test_backlog_status_has_the_oldest_unfinished_age_and_the_retrying_count() -> None:
    backlog = st.backlog_status(stats(oldest_pending_age=512.25, retrying=3, waiting=4), None)
    assert backlog["oldestUnfinishedAgeSeconds"] == 512.25
    assert backlog["oldestReadyAgeSeconds"] == 7.25
    assert backlog["retrying"] == 3
    assert (
        st.backlog_status(stats(oldest_pending_age=None), None)["oldestUnfinishedAgeSeconds"] == 0
    )


# -- the worker pods in status: crash loops, pull errors, configuration errors --------------


def pod(name: str, *, ready: bool = False, **container: object) -> dict[str, object]:
    status = {"name": "worker", "ready": ready, "restartCount": 0, **container}
    return {"metadata": {"name": name}, "status": {"containerStatuses": [status]}}


CRASHED = {
    "exitCode": 2,
    "reason": "Error",
    "message": "starting\noutbox-worker: error: --lease: '0s' is out of range (1s to 1d)\n",
}


def test_a_crash_looping_worker_is_workers_crashing_with_its_own_last_line() -> None:
    looping = pod(
        "orders-worker-a",
        restartCount=3,
        state={"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 10s"}},
        lastState={"terminated": CRASHED},
    )
    workers = st.workers_condition([looping, pod("orders-worker-b", ready=True)], 1, 2)
    assert (workers.type, workers.status, workers.reason) == (
        st.WORKERS_READY,
        False,
        "WorkersCrashing",
    )
    assert workers.message == (
        "pod orders-worker-a: restarted 3 times, last exit code 2: "
        "outbox-worker: error: --lease: '0s' is out of range (1s to 1d)"
    )
    # Between two back-offs the container runs for a moment: still crashing until ready.
    restarted = pod(
        "orders-worker-a",
        restartCount=4,
        state={"running": {}},
        lastState={"terminated": CRASHED},
    )
    assert st.workers_condition([restarted], 0, 1).reason == "WorkersCrashing"
    recovered = pod(
        "orders-worker-a", ready=True, restartCount=4, lastState={"terminated": CRASHED}
    )
    assert st.workers_condition([recovered], 1, 1).reason == "WorkersReady"


def test_pull_and_configuration_errors_have_reasons_of_their_own_and_a_pull_error_wins() -> None:
    pulling = pod(
        "orders-worker-p",
        state={"waiting": {"reason": "ImagePullBackOff", "message": 'Back-off pulling image "x"'}},
    )
    config = pod(
        "orders-worker-c",
        state={
            "waiting": {
                "reason": "CreateContainerConfigError",
                "message": 'secret "orders-db" not found',
            }
        },
    )
    assert st.workers_condition([config], 0, 1).reason == "WorkersMisconfigured"
    assert 'secret "orders-db" not found' in st.workers_condition([config], 0, 1).message
    both = st.workers_condition([config, pulling], 0, 2)
    assert both.reason == "ImagePullFailed"
    assert both.message == 'pod orders-worker-p: ImagePullBackOff: Back-off pulling image "x"'
    two = st.workers_condition(
        [pulling, {**pulling, "metadata": {"name": "orders-worker-q"}}], 0, 2
    )
    assert two.message.startswith("2 of 2 worker pods (e.g. orders-worker-p): ImagePullBackOff")


def test_a_json_log_line_gives_its_message_and_secrets_are_redacted() -> None:
    line = '{"level": "error", "message": "cannot connect to postgresql://app:s3cret@db/orders"}'
    looping = pod(
        "w",
        restartCount=1,
        state={"waiting": {"reason": "CrashLoopBackOff"}},
        lastState={"terminated": {"exitCode": 1, "message": line}},
    )
    message = st.workers_condition([looping], 0, 1).message
    assert "cannot connect to postgresql://" in message and "s3cret" not in message


def test_pods_that_cannot_run_make_ready_false_with_their_reason_and_a_warning() -> None:
    decision = Decision(1, "Backlog", "1 worker")
    looping = pod(
        "orders-worker-a",
        restartCount=2,
        state={"waiting": {"reason": "CrashLoopBackOff"}},
        lastState={"terminated": CRASHED},
    )
    deployment = {"spec": {"replicas": 1}, "status": {"replicas": 1}}
    found = by_type(st.conditions(decision, deployment, stats(), None, [looping], paused=False))
    assert (found[st.READY].status, found[st.READY].reason) == (False, "WorkersCrashing")
    assert found[st.WORKERS_READY].reason == "WorkersCrashing"
    starting = [st.Condition(st.READY, False, "WorkersStarting", "0/1 workers ready")]
    before = st.merge_conditions(None, starting, generation=1, now=T0)
    after = st.merge_conditions(before, found.values(), generation=1, now=T0)
    [event] = st.change_events(before, after)
    assert (event.type, event.reason) == ("Warning", "WorkersCrashing")
    assert "out of range" in event.message
    # Pods that could not be read: WorkersReady and Ready from the counts, as before.
    unread = by_type(st.conditions(decision, deployment, stats(), None, None, paused=False))
    assert unread[st.WORKERS_READY].reason == "WorkersStarting"
    assert unread[st.READY].reason == "WorkersStarting"


def test_one_transient_restart_is_not_a_crash() -> None:
    """A container that exited non-zero once and runs again, not yet ready, is starting; a
    second restart (or CrashLoopBackOff) makes it crashing."""
    once = pod(
        "orders-worker-a", restartCount=1, state={"running": {}}, lastState={"terminated": CRASHED}
    )
    workers = st.workers_condition([once], 0, 1)
    assert (workers.status, workers.reason) == (False, "WorkersStarting")
    decision = Decision(1, "Backlog", "1 worker")
    deployment = {"spec": {"replicas": 1}, "status": {"replicas": 1}}
    found = by_type(st.conditions(decision, deployment, stats(), None, [once], paused=False))
    assert (found[st.READY].status, found[st.READY].reason) == (False, "WorkersStarting")
    starting = [st.Condition(st.READY, False, "WorkersStarting", "0/1 workers ready")]
    before = st.merge_conditions(None, starting, generation=1, now=T0)
    after = st.merge_conditions(before, found.values(), generation=1, now=T0)
    assert st.change_events(before, after) == []  # no Warning
    twice = pod(
        "orders-worker-a", restartCount=2, state={"running": {}}, lastState={"terminated": CRASHED}
    )
    assert st.workers_condition([twice], 0, 1).reason == "WorkersCrashing"
    looping = pod(
        "orders-worker-a",
        restartCount=1,
        state={"waiting": {"reason": "CrashLoopBackOff"}},
        lastState={"terminated": CRASHED},
    )
    assert st.workers_condition([looping], 0, 1).reason == "WorkersCrashing"


def test_one_bad_pod_among_enough_ready_ones_leaves_ready_true() -> None:
    decision = Decision(2, "Backlog", "2 workers")
    looping = pod(
        "orders-worker-c",
        restartCount=5,
        state={"waiting": {"reason": "CrashLoopBackOff"}},
        lastState={"terminated": CRASHED},
    )
    good = [pod("orders-worker-a", ready=True), pod("orders-worker-b", ready=True)]
    enough = {"spec": {"replicas": 2}, "status": {"replicas": 3, "readyReplicas": 2}}
    found = by_type(st.conditions(decision, enough, stats(), None, [*good, looping], paused=False))
    assert (found[st.READY].status, found[st.READY].reason) == (True, "WorkersReady")
    workers = found[st.WORKERS_READY]
    assert (workers.status, workers.reason) == (False, "WorkersCrashing")
    assert workers.message.startswith("pod orders-worker-c: restarted 5 times")
    # Too few ready: Ready degrades, with the pods' reason.
    short = {"spec": {"replicas": 2}, "status": {"replicas": 2, "readyReplicas": 1}}
    found = by_type(st.conditions(decision, short, stats(), None, [good[0], looping], paused=False))
    assert (found[st.READY].status, found[st.READY].reason) == (False, "WorkersCrashing")


# -- drift: the live template against the rendered one --------------------------------------


def test_drift_names_a_changed_image_and_an_added_env_variable() -> None:
    from outbox.controller.drift import template_drift

    rendered = {
        "metadata": {"labels": {"app": "x"}},
        "spec": {
            "containers": [
                {
                    "name": "worker",
                    "image": "outbox:1",
                    "env": [{"name": "OUTBOX_LEASE", "value": "30s"}],
                    "resources": {"requests": {"cpu": "0.5", "memory": "2048Mi"}},
                }
            ]
        },
    }
    # What the server stores: defaults added, quantities canonical, a restart annotation.
    live = {
        "metadata": {"labels": {"app": "x"}, "annotations": {"kubectl.kubernetes.io/r": "t"}},
        "spec": {
            "restartPolicy": "Always",
            "containers": [
                {
                    "name": "worker",
                    "image": "outbox:1",
                    "terminationMessagePath": "/dev/termination-log",
                    "env": [{"name": "OUTBOX_LEASE", "value": "30s"}],
                    "resources": {"requests": {"cpu": "500m", "memory": "2Gi"}},
                }
            ],
        },
    }
    assert template_drift(rendered, live) == ()
    container = live["spec"]["containers"][0]  # type: ignore[index]
    container["image"] = "evil:latest"
    container["env"].append({"name": "FOO", "value": "1"})
    container["env"][0]["value"] = "1h"
    assert set(template_drift(rendered, live)) == {
        "spec.containers[worker].image evil:latest (rendered: outbox:1)",
        "spec.containers[worker].env[FOO] added",
        "spec.containers[worker].env[OUTBOX_LEASE].value changed",
    }
    live["metadata"]["labels"] = {}  # type: ignore[index]
    assert "metadata.labels.app removed" in template_drift(rendered, live)


# -- one table, one resource ----------------------------------------------------------------


def test_the_older_resource_keeps_its_table_and_a_tie_goes_by_name() -> None:
    from outbox.controller.database import TableIdentity
    from outbox.controller.tables import Tables

    orders = TableIdentity("42/16384/public.outbox", "table public.outbox of database shop")
    other = TableIdentity("42/16384/public.billing", "table public.billing of database shop")
    tables = Tables()
    assert tables.first("shop", "orders", "2026-01-01T00:00:05Z", orders) is None
    # Newer: the first is named; older or on a tie with a smaller name: it is the first.
    assert tables.first("shop", "copy", "2026-01-01T00:00:09Z", orders) == ("shop", "orders")
    assert tables.first("a-team", "zzz", "2026-01-01T00:00:05Z", orders) is None
    assert tables.first("shop", "orders", "2026-01-01T00:00:05Z", orders) == ("a-team", "zzz")
    # Another table is no conflict; a deleted resource frees its table.
    assert tables.first("shop", "billing", "2026-01-01T00:00:09Z", other) is None
    tables.forget("a-team", "zzz")
    assert tables.first("shop", "orders", "2026-01-01T00:00:05Z", orders) is None
    assert tables.first("shop", "copy", "2026-01-01T00:00:09Z", orders) == ("shop", "orders")
    # Pointed at another table, the copy no longer conflicts.
    assert tables.first("shop", "copy", "2026-01-01T00:00:09Z", other) == ("shop", "billing")


def test_drift_names_removed_items_and_other_changes() -> None:
    from outbox.controller.drift import template_drift

    rendered = {
        "spec": {
            "containers": [{"name": "worker", "volumeMounts": [{"name": "tmp"}]}],
            "volumes": [{"name": "tmp", "emptyDir": {"sizeLimit": "64Mi"}}],
            "securityContext": {"runAsNonRoot": True},
        }
    }
    live = {
        "spec": {
            "containers": [{"name": "worker", "volumeMounts": []}],
            "volumes": [{"name": "tmp", "emptyDir": {"sizeLimit": "64Mi"}}],
            "securityContext": {"runAsNonRoot": False},
        }
    }
    assert set(template_drift(rendered, live)) == {
        "spec.containers[worker].volumeMounts[tmp] removed",
        "spec.securityContext.runAsNonRoot changed",
    }
    live["spec"]["containers"].append({"name": "sidecar"})  # type: ignore[index]
    assert "spec.containers[sidecar] added" in template_drift(rendered, live)


def test_drift_sees_what_is_added_by_hand_where_the_operator_renders_nothing() -> None:
    from outbox.controller.drift import template_drift

    rendered = {
        "metadata": {"labels": {"app": "x"}},
        "spec": {
            "containers": [
                {"name": "worker", "image": "outbox:1", "ports": [{"containerPort": 9000}]}
            ],
            "volumes": [{"name": "certs", "secret": {"secretName": "certs"}}],
        },
    }
    # What the API server stores of it: its defaults, each at its default value.
    live = {
        "metadata": {"labels": {"app": "x"}, "creationTimestamp": None},
        "spec": {
            "restartPolicy": "Always",
            "terminationGracePeriodSeconds": 30,
            "dnsPolicy": "ClusterFirst",
            "schedulerName": "default-scheduler",
            "securityContext": {},
            "containers": [
                {
                    "name": "worker",
                    "image": "outbox:1",
                    "imagePullPolicy": "IfNotPresent",
                    "terminationMessagePath": "/dev/termination-log",
                    "terminationMessagePolicy": "File",
                    "resources": {},
                    "ports": [{"containerPort": 9000, "protocol": "TCP"}],
                }
            ],
            "volumes": [{"name": "certs", "secret": {"secretName": "certs", "defaultMode": 420}}],
        },
    }
    assert template_drift(rendered, live) == ()
    spec: dict[str, Any] = live["spec"]  # type: ignore[assignment]
    container = spec["containers"][0]
    spec.update(
        hostNetwork=True,
        hostPID=True,
        nodeName="node-1",
        serviceAccountName="admin",
        serviceAccount="admin",
        tolerations=[{"operator": "Exists"}],
        dnsPolicy="None",  # a default key with another value is someone's
    )
    container["securityContext"] = {"privileged": True, "capabilities": {"add": ["SYS_ADMIN"]}}
    container["envFrom"] = [{"secretRef": {"name": "other-teams-db"}}]
    assert set(template_drift(rendered, live)) == {
        "spec.hostNetwork added",
        "spec.hostPID added",
        "spec.nodeName added",
        "spec.serviceAccountName added",
        "spec.tolerations added",
        "spec.dnsPolicy added",
        "spec.containers[worker].securityContext added",
        "spec.containers[worker].envFrom added",
    }
    # Where the operator renders a securityContext, a key added to it is named.
    rendered["spec"]["containers"][0]["securityContext"] = {"runAsNonRoot": True}  # type: ignore[index]
    container["securityContext"] = {"runAsNonRoot": True, "privileged": True}
    assert "spec.containers[worker].securityContext.privileged added" in template_drift(
        rendered, live
    )


async def test_no_resource_runs_workers_until_every_one_listed_at_start_is_read(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """After a start or a failover the newer resource may read first: it finds itself alone,
    so it waits until the older one is read before it may run workers."""
    from outbox.controller import tables as registry
    from outbox.controller.database import TableIdentity
    from outbox.controller.tables import Tables

    orders = TableIdentity("7@5432/16384/16390", "table public.outbox of database shop")
    older, newer = "2026-01-01T00:00:05Z", "2026-01-01T00:00:09Z"
    listed = {("shop", "orders"), ("shop", "copy"), ("shop", "gone")}

    async def listing() -> set[tuple[str, str]]:
        return set(listed)

    tables = Tables()
    await tables.start(listing)
    assert tables.first("shop", "copy", newer, orders) is None  # alone, so far
    tables.read("shop", "copy")
    waiting = asyncio.create_task(tables.settled("shop", "copy", listing))
    await asyncio.sleep(0)  # let it look
    assert not waiting.done()
    assert tables.pending("shop", "copy") == {("shop", "orders"), ("shop", "gone")}
    assert tables.first("shop", "orders", older, orders) is None
    tables.read("shop", "orders")
    assert tables.pending("shop", "copy") == {("shop", "gone")}
    # One listed at start and deleted before it was read: not waited for once listed again.
    monkeypatch.setattr(registry, "RELIST_SECONDS", 0.05)
    listed.discard(("shop", "gone"))
    await asyncio.wait_for(waiting, timeout=5)
    assert tables.first("shop", "copy", newer, orders) == ("shop", "orders")

    # The server restarted: every key of its tables changed. The newer reads first again:
    # it waits until the older one, which held the old key, is read again.
    restarted = TableIdentity("8@5432/16384/16390", orders.text)
    assert tables.first("shop", "copy", newer, restarted) is None
    tables.read("shop", "copy")
    assert tables.pending("shop", "copy") == {("shop", "orders")}
    assert tables.first("shop", "orders", older, restarted) is None
    tables.read("shop", "orders")
    assert tables.pending("shop", "copy") == set()
    await asyncio.wait_for(tables.settled("shop", "copy", listing), timeout=5)
    assert tables.first("shop", "copy", newer, restarted) == ("shop", "orders")


def test_the_report_step_reads_the_resource_through_its_typed_spec_alone() -> None:
    body = {
        "metadata": {"name": "orders", "namespace": "shop", "uid": "u-1", "generation": 3},
        "spec": {
            "database": {"dsnSecretRef": {"name": "orders-db"}},
            "publisher": {"type": "log"},
            "paused": True,
        },
        "status": {"purgedTotal": 4},
    }
    spec = DispatcherSpec.parse(body)
    assert spec.status == {"purgedTotal": 4}
    assert spec.reference == {"metadata": {"name": "orders", "namespace": "shop", "uid": "u-1"}}
    reading = Reading(spec, T0, spec.status, "", stats(), None, None)
    paused = Decision(0, "Paused", "paused")
    written = report.status(reading, paused, Applied(None, False, purged=2), None)
    found = {c["type"]: c for c in written["conditions"]}
    assert (found[st.PAUSED]["status"], found[st.READY]["reason"]) == ("True", "Paused")
    assert (written["observedGeneration"], written["purgedTotal"]) == (3, 6)
