"""The operator's metrics from a reading: what the alerts and the dashboard read."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime

from outbox.controller.metrics import Metrics
from outbox.stats import DestinationState, QueueStats

T0 = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
NS, NAME = "shop", "orders"


def destination(name: str, state: str) -> DestinationState:
    return DestinationState(
        destination=name,
        state=state,
        since=T0,
        for_seconds=1.0,
        failures=0,
        last_error=None,
        last_failure=None,
        next_probe_at=None,
        next_probe_in=None,
        probing=None,
        reason=None,
        changed_by=None,
    )


STATS = QueueStats(
    table="outbox",
    sampled_at=T0,
    pending=40,
    ready=10,
    processing=2,
    dead=1,
    done=0,
    done_is_estimate=True,
    expired_leases=0,
    oldest_pending_age=612.5,
    oldest_ready_age=3.0,
    max_id=100,
    attempts={},
    waiting=30,
    retrying=25,
    destinations=(destination("http://a.test:80", "open"), destination("kafka://b", "closed")),
)


def sample(metrics: Metrics, name: str, **labels: str) -> float | None:
    return metrics.registry.get_sample_value(name, {"namespace": NS, "dispatcher": NAME, **labels})


def state(metrics: Metrics, destination: str, state: str) -> float | None:
    return sample(
        metrics, "outbox_controller_destination_state", destination=destination, state=state
    )


def test_the_unfinished_age_retrying_and_each_destinations_state() -> None:
    metrics = Metrics()
    metrics.observe_backlog(NS, NAME, STATS)
    assert sample(metrics, "outbox_controller_oldest_unfinished_age_seconds") == 612.5
    assert sample(metrics, "outbox_controller_oldest_ready_age_seconds") == 3.0
    assert sample(metrics, "outbox_controller_backlog_messages", state="retrying") == 25
    assert [state(metrics, "http://a.test:80", s) for s in ("closed", "open", "paused")] == [
        0,
        1,
        0,
    ]
    assert [state(metrics, "kafka://b", s) for s in ("closed", "open", "paused")] == [1, 0, 0]


def test_a_destination_that_went_away_and_a_deleted_resource_lose_their_series() -> None:
    metrics = Metrics()
    metrics.observe_backlog(NS, NAME, STATS)
    metrics.observe_backlog(NS, "other", STATS)
    metrics.observe_backlog(NS, NAME, replace(STATS, destinations=STATS.destinations[1:]))
    assert state(metrics, "http://a.test:80", "open") is None
    assert state(metrics, "kafka://b", "closed") == 1
    metrics.forget(NS, NAME)
    assert state(metrics, "kafka://b", "closed") is None
    assert sample(metrics, "outbox_controller_oldest_unfinished_age_seconds") is None
    # The other resource's series stay.
    other = metrics.registry.get_sample_value(
        "outbox_controller_destination_state",
        {
            "namespace": NS,
            "dispatcher": "other",
            "destination": "http://a.test:80",
            "state": "open",
        },
    )
    assert other == 1


def test_a_destination_no_worker_serves_is_exported_idle_not_open() -> None:
    """The alert on open or paused destinations must not page for ever on a row no worker
    will probe again (its URL changed): the series says `idle` instead."""
    metrics = Metrics()
    metrics.observe_backlog(NS, NAME, STATS)
    left = replace(STATS.destinations[0], idle=True)
    metrics.observe_backlog(NS, NAME, replace(STATS, destinations=(left, STATS.destinations[1])))
    states = ("closed", "open", "paused", "idle")
    assert [state(metrics, "http://a.test:80", s) for s in states] == [0, 0, 0, 1]
    assert [state(metrics, "kafka://b", s) for s in states] == [1, 0, 0, 0]
    # Served again (a worker of that URL started): open once more.
    metrics.observe_backlog(NS, NAME, STATS)
    assert [state(metrics, "http://a.test:80", s) for s in states] == [0, 1, 0, 0]
    metrics.forget(NS, NAME)
    assert state(metrics, "http://a.test:80", "idle") is None
