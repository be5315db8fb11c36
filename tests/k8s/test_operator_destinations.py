"""The real operator (kopf, against the emulator) and a destination that stops answering:
the breaker's row in the table's destinations is written with the workers' own rules, and
stamped as served as the workers stamp it (no workers run here;
tests/k8s/test_autoscaling_loop.py has them), and the test waits for what people see,
`kubectl get obd`, the condition, the Events, the Deployment's size, the metrics.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
import pytest

from outbox import destinations as dest
from outbox.operations.pausing import change_by_hand
from outbox.runner import fetch
from outbox.table import Table

from .cluster import LocalCluster
from .test_operator import (
    Operator,
    apply,
    condition,
    deployment_of,
    dispatcher_manifest,
    enqueue,
    events,
    get,
    scaled_up,
    secret_manifest,
    wait_for,
)

pytestmark = pytest.mark.slow


TABLE = Table.parse("outbox")
DESTINATION = "http://api.shop.test:80"
# The downstream's answer, quoting a URL with credentials: they never reach the cluster.
ERROR = "HTTP 503 Service Unavailable from http://app:hunter2-secret@api.shop.test/ingest"


@contextmanager
def serving(dsn: str, destination: str) -> Iterator[None]:
    """The dispatcher's workers, as far as the destination gate goes: they stamp the
    destination they are configured for, as often as a worker does (or more)."""
    stop = threading.Event()

    def stamp() -> None:
        with psycopg.connect(dsn, autocommit=True) as conn:
            while True:
                fetch(conn, dest.served(TABLE, [destination], owner="orders-worker-0"))
                if stop.wait(dest.SERVED_INTERVAL.total_seconds() / 4):
                    return

    thread = threading.Thread(target=stamp, name="stamps", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=30)


def open_breaker(dsn: str, destination: str = DESTINATION) -> None:
    """Five different messages fail at the destination, as five worker publishes report it
    (outbox.destinations' rules, the default policy): its breaker opens."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        for message_id in range(1, 6):
            failure = dest.Failure(message_id, ERROR)
            change = dest.change_sync(
                conn,
                TABLE,
                destination,
                lambda row, now, f=failure: dest.failed(
                    row, f, owner="orders-worker-0", now=now, policy=dest.Policy()
                ),
            )
    assert change.after is not None and change.after.state == dest.OPEN


def by_hand(dsn: str, verb: str, reason: str | None = None) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        done = change_by_hand(
            conn, TABLE, verb, DESTINATION, reason=reason, actor="oncall", via="test"
        )  # type: ignore[arg-type]
    assert done.changed, done


def column(k8s: LocalCluster, name: str) -> str:
    """One column of `kubectl get obd orders`, by its header."""
    header, row = k8s.kubectl("get", "obd", "orders").stdout.splitlines()[:2]
    return dict(zip(header.split(), row.split(), strict=True))[name]


def status(k8s: LocalCluster) -> dict[str, Any]:
    return (get(k8s, "outboxdispatchers", "orders") or {}).get("status") or {}


def passes(operator: Operator, n: int) -> None:
    """Wait for `n` more passes of the operator (each reads the table anew; the status is
    written only when it changed, so its passes are counted, not its writes)."""

    def done() -> float:
        return operator.metric("outbox_controller_passes_total", dispatcher="orders") or 0.0

    before = done()
    wait_for(f"{n} more passes", lambda: done() >= before + n, timeout=60)


def destination_events(k8s: LocalCluster) -> list[tuple[str, str, str]]:
    return [
        (e["type"], e["reason"], e["message"])
        for e in sorted(events(k8s, "orders"), key=lambda e: int(e["metadata"]["resourceVersion"]))
        if e["reason"].startswith("Destination")
    ]


def test_an_open_destination_is_shown_holds_the_workers_and_its_recovery_is_told(
    cluster: LocalCluster, operators: Callable[..., Operator], dsn: str
) -> None:
    with serving(dsn, DESTINATION):
        _an_open_destination_is_shown_holds_the_workers_and_its_recovery_is_told(
            cluster, operators, dsn
        )


def _an_open_destination_is_shown_holds_the_workers_and_its_recovery_is_told(
    cluster: LocalCluster, operators: Callable[..., Operator], dsn: str
) -> None:
    operator = operators()
    enqueue(dsn, 2000)  # enough for the most workers the resource allows, at once
    open_breaker(dsn)
    scaling = {
        "minReplicas": 1,
        "maxReplicas": 3,
        "pollIntervalSeconds": 1,
        "targetOldestReadyAgeSeconds": 0.5,
    }
    apply(cluster, secret_manifest("orders-db", dsn=dsn), dispatcher_manifest(scaling=scaling))

    down = wait_for(
        "DestinationReachable=False",
        lambda: (
            (c := condition(cluster, "orders", "DestinationReachable")).get("status") == "False"
            and c
        ),
    )
    assert down["reason"] == "CircuitOpen"
    assert down["message"].startswith(f"{DESTINATION} circuit open since ")
    assert "(5 failures); last error: HTTP 503 Service Unavailable from http://" in down["message"]
    assert wait_for("the column", lambda: column(cluster, "DESTINATIONS") == "CircuitOpen")
    [warning] = wait_for("the DestinationDown event", lambda: destination_events(cluster))
    assert warning == ("Warning", "DestinationDown", down["message"])

    # The backlog asks for three workers; the open destination holds the one there is (the
    # first pass, before that worker exists, says it starts one to probe).
    held = wait_for(
        "the size held for the destination",
        lambda: (
            (c := condition(cluster, "orders", "Scaling")).get("reason") == "DestinationUnreachable"
            and "holding" in c.get("message", "")
            and c
        ),
    )
    assert f"holding 1 workers while {DESTINATION} is open" in held["message"]
    assert "the policy wanted 3" in held["message"]
    passes(operator, 3)
    assert scaled_up(cluster) == 1 and status(cluster)["desiredReplicas"] == 1
    assert (
        operator.metric(
            "outbox_controller_destination_state", destination=DESTINATION, state="open"
        )
        == 1
    )

    # A person pauses it while it is open: still down, the same outage, no second Event.
    by_hand(dsn, "pause", "the API's maintenance window")
    paused = wait_for(
        "Paused",
        lambda: (
            (c := condition(cluster, "orders", "DestinationReachable")).get("reason") == "Paused"
            and c
        ),
    )
    assert paused["message"].startswith(f"{DESTINATION} paused by oncall since ")
    assert paused["message"].endswith(
        ": the API's maintenance window; last error: "
        "HTTP 503 Service Unavailable from http://***@api.shop.test/ingest"
    )
    assert column(cluster, "DESTINATIONS") == "Paused"
    passes(operator, 2)
    assert [reason for _, reason, _ in destination_events(cluster)] == ["DestinationDown"]
    assert scaled_up(cluster) == 1

    # Resumed: reachable again, said once, and the workers are sized for what piled up.
    by_hand(dsn, "resume")
    wait_for(
        "DestinationReachable=True",
        lambda: condition(cluster, "orders", "DestinationReachable").get("status") == "True",
    )
    assert column(cluster, "DESTINATIONS") == "Reachable"
    recovered = wait_for(
        "the DestinationRecovered event",
        lambda: [e for e in destination_events(cluster) if e[1] == "DestinationRecovered"],
    )
    assert recovered == [
        (
            "Normal",
            "DestinationRecovered",
            f"every destination a worker serves is sending; it was Paused: {paused['message']}",
        )
    ]
    wait_for("the scale-up for the backlog", lambda: scaled_up(cluster) == 3)
    assert condition(cluster, "orders", "Scaling")["reason"] in ("Backlog", "MaxReplicas")
    assert (
        operator.metric(
            "outbox_controller_destination_state", destination=DESTINATION, state="closed"
        )
        == 1
    )

    everything = json.dumps(
        [get(cluster, "outboxdispatchers", "orders"), events(cluster, "orders")]
    )
    assert "hunter2-secret" not in everything
    assert "hunter2-secret" not in operator.log()
    deployment = deployment_of(cluster)
    assert deployment is not None


def test_a_breaker_nobody_sends_to_any_more_does_not_hold_the_workers(
    cluster: LocalCluster, operators: Callable[..., Operator], dsn: str
) -> None:
    """A demo left its API's origin open and its workers are gone; a dispatcher on the same
    table sends elsewhere. The old row holds nothing back: the operator scales for the
    backlog, reports the destination reachable (naming the leftover), and pages nobody."""
    old = "http://demo-api.test:8080"
    operator = operators()
    enqueue(dsn, 2000)
    open_breaker(dsn, old)
    with psycopg.connect(dsn, autocommit=True) as conn:
        fetch(conn, dest.served(TABLE, [old], owner="demo-worker-1"))
        conn.execute(
            "UPDATE outbox_destinations SET served_at = now() - interval '10 minutes' "
            "WHERE destination = %s",
            (old,),
        )
    scaling = {
        "minReplicas": 1,
        "maxReplicas": 3,
        "pollIntervalSeconds": 1,
        "targetOldestReadyAgeSeconds": 0.5,
    }
    with serving(dsn, DESTINATION):
        apply(cluster, secret_manifest("orders-db", dsn=dsn), dispatcher_manifest(scaling=scaling))
        wait_for("the scale-up for the backlog", lambda: scaled_up(cluster) == 3)
        # The pass that scaled writes its status after the Deployment: wait for it.
        wait_for(
            "Scaling for the backlog",
            lambda: (
                condition(cluster, "orders", "Scaling").get("reason") in ("Backlog", "MaxReplicas")
            ),
        )
        reachable = wait_for(
            "DestinationReachable",
            lambda: (c := condition(cluster, "orders", "DestinationReachable")).get("status") and c,
        )
        assert (reachable["status"], reachable["reason"]) == ("True", "Reachable")
        assert reachable["message"].endswith(f"idle, not counted: {old} open")
        assert column(cluster, "DESTINATIONS") == "Reachable"
        assert (
            wait_for(
                "the idle series",
                lambda: operator.metric(
                    "outbox_controller_destination_state", destination=old, state="idle"
                ),
            )
            == 1
        )
        assert (
            operator.metric("outbox_controller_destination_state", destination=old, state="open")
            == 0
        )
        passes(operator, 2)
        assert destination_events(cluster) == []  # no DestinationDown: nothing is down
