"""`ScalingPolicy`: replica counts for one resource from successive stats snapshots.

The rule is described in `outbox.controller.scaling`; what it learns of the workers is in
`learning`.
"""

from __future__ import annotations

import itertools
import statistics
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from outbox.controller.decision import PAUSED_DECISION, Decision, Limits
from outbox.controller.scaling.learning import (
    ARRIVAL_WINDOW_SECONDS,
    CLAIM_WAIT_SECONDS,
    MAX_CURVE_POINTS,
    PROBE_AFTER_SECONDS,
    STALE_AFTER_SECONDS,
    DrainRate,
    StartupDelay,
    exceeding,
    waited_throughout,
)
from outbox.controller.spec import ScalingSettings
from outbox.stats import QueueStats, rates


@dataclass(frozen=True)
class _Work:
    """The figures the policy sizes on, whatever the ordering mode."""

    at: float  # seconds (sampled_at as a POSIX timestamp)
    claimable: int
    age: float  # age of the oldest claimable message, 0 when none
    in_flight: int
    stats: QueueStats
    arrived: int  # max_id
    cap: int | None  # ordered mode: aggregates with work

    @classmethod
    def of(cls, stats: QueueStats) -> _Work:
        if stats.claimable_heads is not None:
            in_flight = max(stats.processing - stats.expired_leases, 0)
            return cls(
                at=stats.sampled_at.timestamp(),
                claimable=stats.claimable_heads,
                age=stats.oldest_claimable_age or 0.0,
                in_flight=in_flight,
                stats=stats,
                arrived=stats.max_id,
                cap=stats.claimable_heads + in_flight,
            )
        return cls(
            at=stats.sampled_at.timestamp(),
            claimable=stats.ready_estimate + stats.expired_leases,
            age=stats.oldest_ready_age or 0.0,
            in_flight=max(stats.processing - stats.expired_leases, 0),
            stats=stats,
            arrived=stats.max_id,
            cap=None,
        )

    @property
    def idle(self) -> bool:
        return self.claimable == 0 and self.in_flight == 0


class ScalingPolicy:
    """Replica counts for one resource, from successive stats snapshots (see the module)."""

    def __init__(self, scaling: ScalingSettings | Mapping[str, Any] | None = None) -> None:
        self.settings = _settings(scaling)
        self.drain_rate = DrainRate()
        self.startup_delay = StartupDelay()
        self.last_decision: Decision | None = None
        self._previous: tuple[_Work, int] | None = None  # (work, ready replicas) last time
        self._history: deque[tuple[float, int]] = deque()  # (when, max_id): the arrival curve
        self._arrivals: deque[tuple[float, float]] = deque()  # (end of interval, msg/s)
        self._rates: deque[tuple[float, float]] = deque()  # (when, sustained arrival rate)
        self._burst_hold = 0
        self._idle_since: float | None = None
        self._calm_since: float | None = None

    def reconfigure(self, scaling: ScalingSettings | Mapping[str, Any] | None) -> None:
        """New settings (spec.scaling edited), keeping what was learned: the drain rate per
        worker, the start-up delay and the arrival history describe the workers and the
        traffic, not the settings, and relearning them would cost minutes of poor sizing."""
        self.settings = _settings(scaling)

    def decide(
        self, stats: QueueStats, *, replicas: int, ready_replicas: int, paused: bool = False
    ) -> int:
        """The replica count to set now; `last_decision` says why."""
        return self.decide_explained(
            stats, replicas=replicas, ready_replicas=ready_replicas, paused=paused
        ).replicas

    def decide_explained(
        self, stats: QueueStats, *, replicas: int, ready_replicas: int, paused: bool = False
    ) -> Decision:
        """The replica count to set now, with a CamelCase reason and a message for an Event:
        the wish within this policy's own bounds, what the operator would run were no
        destination down (the operator applies its limits in `decision.decide`)."""
        wanted = self.wish(stats, replicas=replicas, ready_replicas=ready_replicas, paused=paused)
        limits = Limits.of(self.settings, paused=paused)
        decision = limits.fixed() or limits.bound(wanted)
        self.decided(decision, replicas=replicas, ready_replicas=ready_replicas)
        self.last_decision = decision
        return decision

    def wish(
        self, stats: QueueStats, *, replicas: int, ready_replicas: int, paused: bool = False
    ) -> Decision:
        """Learn from the snapshot and say how many workers it needs, bounds not applied
        (`last_decision` keeps it); paused: learn, size nothing (no rates held, no burst,
        no probe)."""
        work = _Work.of(stats)
        self._learn(work, ready_replicas)
        self.startup_delay.observe(work.at, replicas, ready_replicas)
        wanted = PAUSED_DECISION if paused else self._size(work, replicas, ready_replicas)
        self.last_decision = wanted
        return wanted

    def decided(self, decision: Decision, *, replicas: int, ready_replicas: int) -> None:
        """The count that will run: start-up delays are timed from it."""
        if decision.replicas > replicas and self._previous is not None:
            self.startup_delay.asked(self._previous[0].at, decision.replicas, ready_replicas)

    # -- learning ---------------------------------------------------------------------------

    def _learn(self, work: _Work, ready_replicas: int) -> None:
        previous = self._previous
        self._previous = (work, ready_replicas)
        if not work.idle:
            self._idle_since = None
        elif self._idle_since is None:
            self._idle_since = work.at
        if previous is not None and work.at <= previous[0].at:
            return
        self._history.append((work.at, work.arrived))
        # Keep the arrival curve back to the oldest claimable message (and a minute at least).
        horizon = work.at - max(work.age, ARRIVAL_WINDOW_SECONDS) - 2 * self._poll
        while len(self._history) > 2 and self._history[1][0] <= horizon:
            self._history.popleft()
        if len(self._history) > MAX_CURVE_POINTS:
            points = list(self._history)
            half = len(points) // 2
            self._history = deque(points[:half:2] + points[half:])
        if previous is None:
            return
        before, ready_before = previous
        seconds = work.at - before.at
        arrived = max(work.arrived - before.arrived, 0)
        self._arrivals.append((work.at, arrived / seconds))
        while self._arrivals and self._arrivals[0][0] <= work.at - ARRIVAL_WINDOW_SECONDS:
            self._arrivals.popleft()
        if before.stats.unreachable or work.stats.unreachable:
            # A destination open or paused in this interval (or until some moment in it):
            # what was delivered says how the destination answered, not how fast a worker
            # is. An interval that spans the recovery delivered a little in a whole
            # interval; read as a worker's speed it would ask for every worker allowed.
            self.drain_rate.interrupt()
            return
        # Messages that left the backlog were delivered (or given up on).
        measured = rates(before.stats, work.stats)
        saturated = (
            before.claimable > 0 and waited_throughout(work.age, seconds)
        ) and ready_before == ready_replicas
        if before.claimable > 0 and work.age >= CLAIM_WAIT_SECONDS:
            # The workers ran out of room (not for a whole interval, so it measures nothing):
            # a probe since undershot. Seen a poll after it, long before the age that
            # `waited_throughout` needs at long poll intervals.
            self.drain_rate.overshot(work.at)
        self.drain_rate.observe(
            at=work.at,
            saturated=saturated,
            completed=measured.completions_per_second * seconds if measured else 0.0,
            workers=ready_replicas if saturated else max(ready_before, ready_replicas),
            seconds=seconds,
        )

    @property
    def _poll(self) -> float:
        return self.settings.poll_interval_seconds

    def _arrival_rate(self) -> float:
        """Sustained arrivals: the median interval rate over the arrival window."""
        return statistics.median(rate for _, rate in self._arrivals) if self._arrivals else 0.0

    def _latest_rate(self) -> float:
        return self._arrivals[-1][1] if self._arrivals else 0.0

    def _arrived_by(self, when: float) -> float:
        """max_id at a past moment, interpolated on the arrival curve."""
        points = self._history
        if when >= points[-1][0]:
            return float(points[-1][1])
        if when <= points[0][0]:
            return float(points[0][1])
        for (t0, a0), (t1, a1) in itertools.pairwise(points):
            if t0 <= when <= t1:
                return a0 + (a1 - a0) * (when - t0) / (t1 - t0)
        raise AssertionError("unreachable")

    # -- sizing -----------------------------------------------------------------------------

    def _deadlines(self, work: _Work) -> list[tuple[float, float]]:
        """(position in the queue, deadline) of the waiting and soon-arriving messages.

        Unordered tables are delivered oldest first, so the arrival curve says how many of
        the claimable messages arrived by each moment: the message at position q arrived at
        the moment s where arrivals since s make up the rest of the backlog. Ordered tables
        are not delivered in arrival order: there every claimable head counts as old as the
        oldest one.
        """
        target = self.settings.target_oldest_ready_age_seconds
        now, backlog = work.at, float(work.claimable)
        points: list[tuple[float, float]] = []
        if backlog > 0:
            head = now - work.age
            if work.cap is not None:
                points.append((backlog, head + target))
            else:
                points.append(
                    (max(backlog - (work.arrived - self._arrived_by(head)), 0), head + target)
                )
                for when, arrived in self._history:
                    if head < when < now:
                        points.append((max(backlog - (work.arrived - arrived), 0), when + target))
                points.append((backlog, now + target))
        # What arrives until a pod asked for now is productive.
        delay = self.startup_delay.value
        points.append((backlog + self._latest_rate() * delay, now + delay + target))
        return points

    def _backlog_need(self, work: _Work, mu: float, ready_replicas: int) -> int:
        """Fewest replicas that deliver every waiting message before its deadline.

        Until a pod asked for now is productive only the ready ones serve; after that, all.
        A message whose deadline passes before new pods can help is to be delivered within a
        poll interval of their start, so that it is as little late as can be.
        """
        s = self.settings
        delay = self.startup_delay.value
        deadlines = self._deadlines(work)
        if all(q <= 0 for q, _ in deadlines):
            return 0

        def enough(n: int) -> bool:
            early = mu * min(n, ready_replicas) * delay  # served before new pods help
            for position, deadline in deadlines:
                if position < early:
                    continue
                # A deadline that passes before new pods can help: deliver within a poll.
                left = max(deadline - (work.at + delay), self._poll)
                if n == 0 or mu * n * left < position - early:
                    return False
            return True

        # Enough for n is enough for more (each serves earlier, and faster): the fewest by
        # bisection, a few passes over the deadlines whatever maxReplicas is.
        low, high = 0, s.max_replicas
        if not enough(high):
            return high
        while low < high:
            middle = (low + high) // 2
            if enough(middle):
                high = middle
            else:
                low = middle + 1
        return low

    def _size(self, work: _Work, replicas: int, ready_replicas: int) -> Decision:
        s = self.settings
        window = s.scale_down_stabilization_seconds
        mu = self.drain_rate.value
        rate = self._arrival_rate()

        # (1) The rate part: the highest sustained arrival rate of the stabilization window,
        # so a fall in arrivals lowers it only after the window; a better-known drain rate
        # lowers it at once.
        self._rates.append((work.at, rate))
        while self._rates and self._rates[0][0] <= work.at - window:
            self._rates.popleft()
        held_rate = max((r for _, r in self._rates), default=rate)  # a window of 0: now only
        rate_need = exceeding(rate, mu)
        held = exceeding(held_rate, mu)
        if not self.drain_rate.measured:
            # A rate never seen under saturation is only a lower bound, so this is more than
            # is needed: it may hold workers, but adding them is the backlog part's job.
            held = min(held, replicas)

        # (2) The backlog part, held until the backlog it was for has drained.
        backlog_need = self._backlog_need(work, mu, ready_replicas)
        if backlog_need <= held:
            self._burst_hold = 0
        else:
            self._burst_hold = max(self._burst_hold, backlog_need)

        # Probing: workers that keep up with room to spare (no message waited longer than a
        # worker with room leaves one), for a while, without a saturated measurement of the
        # drain rate; only where one worker fewer is possible.
        calm = (
            work.age < CLAIM_WAIT_SECONDS  # no message waited: the workers had room
            and not self._burst_hold
            and rate > 0
            and min(replicas, ready_replicas) >= 2
        )
        self._calm_since = (self._calm_since or work.at) if calm else None
        if self._calm_since is not None and work.at - self._calm_since >= PROBE_AFTER_SECONDS:
            self.drain_rate.probe(work.at, stale_after=STALE_AFTER_SECONDS)
            self._calm_since = work.at

        if self._burst_hold:
            n, reason = self._burst_hold, "Backlog"
            message = (
                f"{work.claimable} claimable, oldest {work.age:.0f}s; "
                f"{mu:.0f}/s per worker, arrivals {self._latest_rate():.0f}/s"
            )
        else:
            n, reason = held, "ArrivalRate"
            message = f"arrivals {rate:.0f}/s, {mu:.0f}/s per worker"
            if rate_need < held <= replicas:
                reason = "ScaleDownStabilizing"
                message += f" (needs {rate_need}, holding for {window:.0f}s)"
            elif held > rate_need:  # more than run now (a resume): the window's peak, no hold
                message += f"; up to {held_rate:.0f}/s in the last {window:.0f}s"

        if work.cap is not None and n > work.cap:
            n, reason = work.cap, "AggregatesWithWork"
            message = f"{work.cap} aggregates with work (ordered mode)"

        # Zero only after a whole window with nothing claimable or in flight.
        if n == 0 and not work.idle:
            n, reason, message = 1, "Backlog", "work waiting or in flight"
        if n == 0 and self._idle_since is not None and work.at - self._idle_since < window:
            n = min(replicas, 1)
            # No running count of seconds: a message that changes every pass would make every
            # pass write the status (the operator writes it only when it changed).
            reason = "IdleStabilizing"
            message = f"nothing claimable or in flight; zero once it stays so for {window:.0f}s"
        elif n == 0:
            reason, message = "Idle", f"nothing claimable or in flight for {window:.0f}s"
        return Decision(n, reason, message)


def _settings(scaling: ScalingSettings | Mapping[str, Any] | None) -> ScalingSettings:
    """Settings as given, or read from `spec.scaling`'s camelCase keys."""
    if isinstance(scaling, ScalingSettings):
        return scaling
    return ScalingSettings.from_spec(scaling)
