"""The autoscalers compared: the project's `ScalingPolicy`, and KEDA's PostgreSQL scaler
with an HPA as it is configured today (on the oldest age, or on the pending count).

The KEDA model follows the documented behaviour of KEDA 2 and the HPA (autoscaling/v2):

- KEDA polls its scaler every `pollingInterval` (30 s) for activation only: from 0 it sets
  1 replica as soon as the metric exceeds `activationTargetQueryValue` (0); after
  `cooldownPeriod` (300 s) without activity it sets 0. In between the HPA scales.
- The HPA syncs every 15 s and reads the external metric through KEDA's metrics server,
  which queries the database on each request (so the value is fresh). With an `AverageValue`
  target the recommendation is ceil(metric / target); no change while
  |metric / (target x replicas) - 1| <= 10% (the tolerance).
- Scale-up: no stabilization, at most max(100%, 4 pods) more per 15 s (the default
  policies, selectPolicy Max). Scale-down: the highest recommendation of the last 300 s
  (the stabilization window), then at most 100% per 15 s.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from bench.autoscale.world import PUBLISH_SECONDS, World
from outbox.controller.scaling import ScalingPolicy


class Ours:
    """The operator's loop: every `pollIntervalSeconds`, stats in, a replica count out."""

    def __init__(self, scaling: dict[str, Any], name: str = "outbox-dispatcher") -> None:
        self.name = name
        self.policy = ScalingPolicy(scaling)
        self.poll = int(self.policy.settings.poll_interval_seconds)

    def step(self, t: int, world: World) -> int | None:
        if t % self.poll:
            return None
        return self.policy.decide(
            world.stats(), replicas=world.replicas, ready_replicas=world.ready_replicas
        )


@dataclass
class KedaHpa:
    name: str
    metric: Callable[[World], float]
    target: float  # the HPA's AverageValue target
    max_replicas: int
    polling_interval: int = 30
    cooldown: int = 300
    hpa_sync: int = 15
    tolerance: float = 0.1
    downscale_window: int = 300
    _last_active: float = -math.inf
    _recommendations: deque[tuple[int, int]] = field(default_factory=deque)

    def step(self, t: int, world: World) -> int | None:
        replicas = world.replicas
        if t % self.polling_interval == 0:
            active = self.metric(world) > 0  # activationTargetQueryValue: 0
            if active:
                self._last_active = t
                if replicas == 0:
                    return 1
            elif replicas > 0 and t - self._last_active >= self.cooldown:
                self._recommendations.clear()
                return 0
        if t % self.hpa_sync or replicas == 0:
            return None
        value = self.metric(world)
        ratio = value / (self.target * replicas)
        recommended = (
            replicas if abs(ratio - 1) <= self.tolerance else math.ceil(value / self.target)
        )
        recommended = min(max(recommended, 1), self.max_replicas)
        self._recommendations.append((t, recommended))
        while self._recommendations[0][0] <= t - self.downscale_window:
            self._recommendations.popleft()
        if recommended > replicas:
            return min(recommended, max(2 * replicas, replicas + 4))
        return min(replicas, max(n for _, n in self._recommendations))


# The queries people give KEDA's scaler count what is not delivered yet (status pending or
# processing), so a queue whose messages are all in flight still counts as active.


def oldest_age(world: World) -> float:
    """`SELECT extract(epoch FROM now() - min(created_at)) ... WHERE status IN (...)`"""
    if world.waiting:
        return world.oldest_age()
    return PUBLISH_SECONDS / 2 if world.in_flight >= 0.5 else 0.0


def pending(world: World) -> float:
    """`SELECT count(*) ... WHERE status IN ('pending', 'processing')`"""
    return float(round(world.unfinished))


def keda_on_age(slo: float, max_replicas: int) -> KedaHpa:
    return KedaHpa("KEDA on age", oldest_age, target=slo, max_replicas=max_replicas)


def keda_on_pending(drain_rate: float, slo: float, max_replicas: int) -> KedaHpa:
    return KedaHpa("KEDA on pending", pending, target=drain_rate * slo, max_replicas=max_replicas)
