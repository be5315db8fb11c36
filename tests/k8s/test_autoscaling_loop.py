"""Autoscaling in the closed loop: the real operator and its `ScalingPolicy`, the emulator,
the local kubelet running real workers, and a downstream that takes a fixed time per message
(so a worker's drain rate is known: its concurrency / that time).

A step in arrivals scales up, the oldest ready age comes back under the target, the backlog
drains, and after the stabilization window the Deployment goes to minReplicas (0); the next
message wakes it again. The test asserts the sequence of decisions and the Events, never how
long anything took.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest

from outbox.demo.sink import Reply, Sink
from outbox.models import Event
from outbox.producer import enqueue_many
from outbox.table import Table

from .cluster import LocalCluster
from .kubelet import Kubelet
from .test_operator import (
    Operator,
    apply,
    condition,
    dispatcher_manifest,
    events,
    get,
    secret_manifest,
    wait_for,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]  # minutes of real scaling


PUBLISH_SECONDS = 0.05  # the downstream's time per message
CONCURRENCY = 2  # per worker: 2 / 0.05 s = 40 msg/s


def sink_dispatcher(sink_url: str, scaling: dict[str, Any]) -> dict[str, Any]:
    """The resource these stories scale: workers POSTing to the demo sink, CONCURRENCY each."""
    return dispatcher_manifest(
        publisher={"type": "http", "http": {"url": sink_url, "timeout": "5s"}},
        concurrency=CONCURRENCY,
        batchSize=CONCURRENCY,
        scaling=scaling,
    )


TARGET = 10  # targetOldestReadyAgeSeconds
WINDOW = 10  # scaleDownStabilizationSeconds
MAX_REPLICAS = 4
SCALED = re.compile(r"^(\d+) -> (\d+) workers: (.*)$", re.DOTALL)


class Arrivals:
    """Enqueues at a steady rate from a thread until stopped, in batches about every 0.1 s."""

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        self.rate = 0.0
        self.sent = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        owed = 0.0
        last = time.monotonic()
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            while not self._stop.wait(0.1):
                # By the clock, not by the tick: a loaded machine wakes late, the rate holds.
                now = time.monotonic()
                owed += self.rate * (now - last)
                last = now
                n = int(owed)
                if n:
                    owed -= n
                    events = [Event("order", f"o{self.sent + i}", "placed", {}) for i in range(n)]
                    enqueue_many(conn, events, table=Table.parse("outbox"))
                    self.sent += n

    def __enter__(self) -> Arrivals:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)


@pytest.fixture
def sink() -> Iterator[Sink]:
    with Sink(lambda body, nth: Reply(delay=PUBLISH_SECONDS)) as server:
        yield server


def unfinished(dsn: str) -> int:
    with psycopg.connect(dsn) as conn:
        row = conn.execute("SELECT count(*) FROM outbox WHERE status <> 'done'").fetchone()
    return int(row[0]) if row else -1


def scale_events(k8s: LocalCluster) -> list[tuple[int, int, str]]:
    """(from, to, the policy's message) of every scale Event, in the order they were written."""
    found = []
    for event in sorted(events(k8s, "orders"), key=lambda e: int(e["metadata"]["resourceVersion"])):
        match = SCALED.match(event.get("message", ""))
        if event["reason"] in ("ScaledUp", "ScaledDown") and match:
            found.append((int(match[1]), int(match[2]), match[3]))
    return found


def replicas(k8s: LocalCluster) -> int:
    deployment = get(k8s, "deployments", "orders-worker")
    return int(deployment["spec"]["replicas"]) if deployment else -1


def status(k8s: LocalCluster) -> dict[str, Any]:
    return (get(k8s, "outboxdispatchers", "orders") or {}).get("status") or {}


# `dsn` first: the database outlives the workers at teardown.
def test_a_step_scales_up_drains_scales_to_zero_and_wakes_again(
    dsn: str,
    cluster: LocalCluster,
    kubelet: Kubelet,
    sink: Sink,
    operators: Callable[..., Operator],
) -> None:
    operators("--worker-publishers", "log,http,null")
    scaling = {
        "minReplicas": 0,
        "maxReplicas": MAX_REPLICAS,
        "pollIntervalSeconds": 1,
        "targetOldestReadyAgeSeconds": TARGET,
        "scaleDownStabilizationSeconds": WINDOW,
    }
    apply(
        cluster,
        secret_manifest("orders-db", dsn=dsn),
        sink_dispatcher(sink.url, scaling),
    )
    wait_for("an idle Deployment at zero", lambda: replicas(cluster) == 0)

    with Arrivals(dsn) as arrivals:
        arrivals.rate = 10  # a quarter of one worker's drain rate
        wait_for("the wake-up from zero", lambda: replicas(cluster) >= 1)
        wait_for("a ready worker", lambda: status(cluster).get("readyReplicas", 0) >= 1)
        before_step = len(scale_events(cluster))
        arrivals.rate = 120  # three workers' worth
        wait_for(
            "a scale-up for the step",
            lambda: any(to >= 3 for _, to, _ in scale_events(cluster)[before_step:]),
            timeout=90,
        )
        wait_for(
            "the oldest ready age back under the target, arrivals still at the step",
            lambda: (
                status(cluster).get("readyReplicas", 0) >= 3
                and status(cluster)["backlog"]["oldestReadyAgeSeconds"] < TARGET
            ),
            timeout=120,
        )
    sent = arrivals.sent
    wait_for("the backlog to drain", lambda: unfinished(dsn) == 0, timeout=180)
    drained_at = len(scale_events(cluster))
    wait_for("the scale-down to zero after the window", lambda: replicas(cluster) == 0, timeout=120)
    # The Event follows the resize: wait for it, so the story below is read whole.
    wait_for("the Event of the scale to zero", lambda: scale_events(cluster)[-1][1] == 0)
    wait_for("every worker process gone", lambda: not kubelet.pods("default", "orders-worker"))
    assert condition(cluster, "orders", "Ready")["reason"] == "ScaledToZero"
    assert sink.wait_idle()  # a reply is recorded after it is sent: the row may be done first
    assert len(set(sink.delivered_ids())) == sent

    # The next message wakes it at once, and it goes back to zero after the window.
    asleep = len(scale_events(cluster))
    with psycopg.connect(dsn, autocommit=True) as conn:
        enqueue_many(conn, [Event("order", "late", "placed", {})], table=Table.parse("outbox"))
    wait_for("the wake-up on the next message", lambda: replicas(cluster) >= 1)
    wait_for("its delivery", lambda: len(set(sink.delivered_ids())) == sent + 1, timeout=90)
    wait_for("zero again", lambda: replicas(cluster) == 0, timeout=120)
    wait_for("the Event of the second scale to zero", lambda: scale_events(cluster)[-1][1] == 0)

    story = scale_events(cluster)

    sizes = [to for _, to, _ in story]
    assert story[0][0] == 0 and story[0][1] >= 1, story  # woken from zero
    assert max(sizes) <= MAX_REPLICAS, story
    assert max(sizes[before_step:drained_at]) >= 3, story  # the step asked for three or more
    # To zero only after the drain and a whole idle window, and said why.
    to_zero = [i for i, (_, to, _) in enumerate(story) if to == 0]
    assert to_zero and min(to_zero) >= drained_at, story
    assert all("nothing claimable or in flight" in story[i][2] for i in to_zero), story
    # Zero, then the wake-up on the next message, then zero again: nothing else after it.
    assert story[asleep][0] == 0 and story[asleep][1] >= 1, story
    assert story[-1][1] == 0 and [to for _, to, _ in story[asleep:]].count(0) == 1, story


def destination_events(k8s: LocalCluster) -> list[tuple[int, str, str]]:
    """(resourceVersion, reason, message) of the Events a destination posts, in order."""
    return sorted(
        (int(e["metadata"]["resourceVersion"]), e["reason"], e["message"])
        for e in events(k8s, "orders")
        if e["reason"] in ("DestinationDown", "DestinationRecovered")
    )


def scale_events_at(k8s: LocalCluster) -> list[tuple[int, int, int, str]]:
    """(resourceVersion, from, to, message) of every scale Event, in order."""
    found = []
    for event in events(k8s, "orders"):
        match = SCALED.match(event.get("message", ""))
        if event["reason"] in ("ScaledUp", "ScaledDown") and match:
            found.append(
                (int(event["metadata"]["resourceVersion"]), int(match[1]), int(match[2]), match[3])
            )
    return sorted(found)


def test_a_downstream_outage_holds_the_workers_and_they_catch_up_after(
    dsn: str,
    cluster: LocalCluster,
    kubelet: Kubelet,
    operators: Callable[..., Operator],
) -> None:
    down = threading.Event()

    def downstream(body: dict[str, Any], nth: int) -> Reply:
        return Reply(503) if down.is_set() else Reply(delay=PUBLISH_SECONDS)

    operators("--worker-publishers", "log,http,null")
    scaling = {
        "minReplicas": 1,
        "maxReplicas": MAX_REPLICAS,
        "pollIntervalSeconds": 1,
        "targetOldestReadyAgeSeconds": TARGET,
        "scaleDownStabilizationSeconds": WINDOW,
    }
    with Sink(downstream) as sink:
        resource = sink_dispatcher(sink.url, scaling)
        # Probes at most 2 s apart (the shortest the worker takes), so recovery is seen soon.
        resource["spec"]["publisher"]["breaker"] = {"probeDelayMax": "2s"}
        apply(cluster, secret_manifest("orders-db", dsn=dsn), resource)
        with Arrivals(dsn) as arrivals:
            arrivals.rate = 20  # half of one worker's drain rate
            wait_for("a ready worker", lambda: status(cluster).get("readyReplicas", 0) >= 1)
            wait_for(
                "the first deliveries", lambda: len(set(sink.delivered_ids())) >= 40, timeout=90
            )

            down.set()  # every request answered 503 from now on
            opened = wait_for(
                "DestinationReachable=False",
                lambda: (
                    (c := condition(cluster, "orders", "DestinationReachable")).get("status")
                    == "False"
                    and c
                ),
                timeout=90,
            )
            assert opened["reason"] == "CircuitOpen"
            assert "last error: HTTP 503" in opened["message"], opened
            wait_for("the DestinationDown event", lambda: destination_events(cluster))
            # The pass that saw it open held the count: no worker is added from here on.
            before = replicas(cluster)
            # Arrivals pile up and wait claimable (the workers hold back what is for an open
            # destination): the ready age passes the target, which alone would add workers.
            wait_for(
                "the ready age past the target",
                lambda: status(cluster)["backlog"]["oldestReadyAgeSeconds"] > 2 * TARGET,
                timeout=90,
            )
            held = condition(cluster, "orders", "Scaling")
            assert held["reason"] == "DestinationUnreachable", held
            assert replicas(cluster) == before
            requests_down = len(sink.requests)
            during = scale_events_at(cluster)

            down.clear()  # the downstream is back
            wait_for(
                "DestinationReachable=True",
                lambda: (
                    condition(cluster, "orders", "DestinationReachable").get("status") == "True"
                ),
                timeout=90,
            )
            wait_for(
                "the DestinationRecovered event",
                lambda: any(r == "DestinationRecovered" for _, r, _ in destination_events(cluster)),
            )
            wait_for(
                "a scale-up for the backlog that piled up",
                lambda: any(to > before for _, _, to, _ in scale_events_at(cluster)),
                timeout=60,
            )
        sent = arrivals.sent
        wait_for("the backlog to drain", lambda: unfinished(dsn) == 0, timeout=180)
        assert sink.wait_idle()  # the last reply recorded
        delivered = set(sink.delivered_ids())
        refused = [r for r in sink.requests[:requests_down] if r.status == 503]

    # The story in the Events: down, then back, once each; no worker added while it was
    # down; the catch-up after it, sized for the backlog.
    story = destination_events(cluster)
    assert [reason for _, reason, _ in story] == ["DestinationDown", "DestinationRecovered"]
    down_at = story[0][0]
    assert not [s for s in during if s[0] > down_at and s[2] > s[1]], during
    catch_up = [s for s in scale_events_at(cluster) if s not in during and s[2] > before]
    assert catch_up and "claimable" in catch_up[0][3], scale_events_at(cluster)
    # Every message delivered, none dead; the downed API saw requests, not a storm.
    assert len(delivered) == sent
    with psycopg.connect(dsn) as conn:
        dead = conn.execute("SELECT count(*) FROM outbox WHERE status = 'dead'").fetchone()
    assert dead == (0,)
    assert refused, "the outage was never met"
