"""The simulated world: a FIFO outbox drained by worker pods, in 1-second steps.

Each pod delivers `drain_rate` messages per second once productive, `startup_delay` seconds
after it was asked for. Scaling down removes pods that are still starting first, then the
newest, as a ReplicaSet does. Arrivals of a second are spread evenly over it, so the age of
the oldest waiting message is exact to the fraction of a second.

The world shows an autoscaler only what the operator's stats show: a `QueueStats` snapshot
(database time, claimable count, oldest ready age, `max_id`) and the replica counts.

Two worlds differ in what a snapshot catches. In the *settled* world (`claim_lag=False`) the
workers take each second's arrivals within that second, so a snapshot sees only what they
left behind: nothing while they have room. In the *in-flight* world (`claim_lag=True`) a
row is claimed a second after it arrives (a claim's round trip, or the wait for the next
claim, rounded up to the world's step), so every snapshot sees the last second's arrivals
claimable although every worker has room: what a table sees when rows arrive faster than a
claim's round trip, a few thousand a second.
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Protocol

from outbox.stats import COUNT_LIMIT, QueueStats

EPOCH = datetime(2026, 1, 1, tzinfo=UTC)

# How long a claimed message is in flight (claimed, not yet finalized): what a snapshot sees
# in `processing` while work flows, by Little's law (throughput x this).
PUBLISH_SECONDS = 0.1


class Autoscaler(Protocol):
    name: str

    def step(self, t: int, world: World) -> int | None:
        """Called at the end of every second; a replica count to set, or None to leave it."""


@dataclass
class Cohort:
    second: int  # arrived evenly within [second, second + 1)
    total: float
    left: float


@dataclass
class World:
    drain_rate: float
    startup_delay: float
    t: int = 0
    arrived: int = 0
    waiting: float = 0.0
    in_flight: float = 0.0
    cohorts: deque[Cohort] = field(default_factory=deque)
    pods: list[float] = field(default_factory=list)  # when each pod becomes productive
    speed: Sequence[float] = ()  # the downstream's speed, a factor of drain_rate per second
    claim_lag: bool = False  # the in-flight world: arrivals wait a second to be claimed

    @property
    def unfinished(self) -> float:
        """Messages not delivered yet: waiting or in flight."""
        return self.waiting + self.in_flight

    @property
    def replicas(self) -> int:
        return len(self.pods)

    @property
    def ready_replicas(self) -> int:
        return sum(1 for at in self.pods if at <= self.t)

    def oldest_age(self) -> float:
        if not self.cohorts:
            return 0.0
        head = self.cohorts[0]
        return self.t - (head.second + (1 - head.left / head.total))

    def stats(self) -> QueueStats:
        """What `outbox.stats.queue_stats` reads from such a table: counts stop at the
        count limit, the head of the claim order is the oldest waiting message."""
        waiting = round(self.waiting)
        counted = min(waiting, COUNT_LIMIT)
        age = self.oldest_age() if waiting else None
        return QueueStats(
            table="outbox",
            sampled_at=EPOCH + timedelta(seconds=self.t),
            pending=counted,
            ready=counted,
            processing=round(self.in_flight),
            dead=0,
            done=self.arrived - waiting,
            done_is_estimate=True,
            expired_leases=0,
            oldest_pending_age=age,
            oldest_ready_age=age,
            max_id=self.arrived,
            attempts={0: counted} if waiting else {},
            count_limit=COUNT_LIMIT,
            oldest_ready_id=self.arrived - waiting + 1 if waiting else None,
        )

    def tick(self, arrivals: int) -> None:
        """One second: arrivals come in, productive pods deliver, the clock moves on."""
        productive = self.ready_replicas
        if arrivals and not self.claim_lag:
            self._arrive(arrivals)
        factor = self.speed[self.t] if self.t < len(self.speed) else 1.0
        capacity = total = self.drain_rate * factor * productive
        while capacity > 1e-9 and self.cohorts:
            head = self.cohorts[0]
            served = min(capacity, head.left)
            head.left -= served
            self.waiting -= served
            capacity -= served
            if head.left <= 1e-9:
                self.cohorts.popleft()
        if not self.cohorts:
            self.waiting = 0.0
        self.in_flight = (total - capacity) * PUBLISH_SECONDS
        if arrivals and self.claim_lag:
            self._arrive(arrivals)  # after the workers' turn: the snapshot sees them waiting
        self.t += 1

    def _arrive(self, arrivals: int) -> None:
        self.cohorts.append(Cohort(self.t, arrivals, arrivals))
        self.waiting += arrivals
        self.arrived += arrivals

    def scale(self, replicas: int) -> None:
        if replicas > self.replicas:
            self.pods += [self.t + self.startup_delay] * (replicas - self.replicas)
        elif replicas < self.replicas:
            # Starting pods go first, then the newest: the latest productive-at times.
            self.pods = sorted(self.pods)[:replicas]


@dataclass
class Run:
    """What one autoscaler did with one trace, second by second."""

    autoscaler: str
    ages: list[float] = field(default_factory=list)
    replicas: list[int] = field(default_factory=list)
    decisions: list[tuple[int, int]] = field(default_factory=list)  # (second, replicas)

    def summary(self, slo: float) -> dict[str, float]:
        values = [0, *(n for _, n in self.decisions)]  # every run starts with no pods
        directions = [1 if b > a else -1 for a, b in itertools.pairwise(values)]
        return {
            "violation_seconds": sum(1 for a in self.ages if a > slo),
            "max_age_seconds": round(max(self.ages, default=0.0), 1),
            "replica_seconds": sum(self.replicas),
            "scale_changes": len(directions),
            "reversals": sum(1 for a, b in itertools.pairwise(directions) if a != b),
        }


def simulate(
    autoscaler: Autoscaler,
    arrivals: Sequence[int],
    *,
    drain_rate: float,
    startup_delay: float,
    speed: Sequence[float] = (),
    claim_lag: bool = False,
) -> Run:
    world = World(
        drain_rate=drain_rate, startup_delay=startup_delay, speed=speed, claim_lag=claim_lag
    )
    run = Run(autoscaler.name)
    for count in arrivals:
        world.tick(count)
        wanted = autoscaler.step(world.t, world)
        if wanted is not None and wanted != world.replicas:
            world.scale(wanted)
            run.decisions.append((world.t, wanted))
        run.ages.append(world.oldest_age())
        run.replicas.append(world.replicas)
    return run
