"""The scaling policy: how many workers a table needs, from its stats alone.

    from outbox.controller.scaling import ScalingPolicy

    policy = ScalingPolicy(spec.get("scaling", {}))   # camelCase keys, as in the CRD
    n = policy.decide(stats, replicas=spec_replicas, ready_replicas=ready, paused=False)
    decision = policy.last_decision                   # replicas, reason (CamelCase), message

`decide_explained` returns the same `Decision` directly. Keep one policy per resource for
the resource's lifetime: it learns from the snapshots it is given (arrival rates, the
workers' drain rate, how long the queue has been idle). `paused` is an argument of each call,
not a key of `scaling`, because it is `spec.paused` and may flip at any time without the
history being lost: while paused the policy learns and sizes nothing.

The policy's answer keeps the same limits the operator's decide step applies
(`decision.Limits`: paused, then `minReplicas..maxReplicas`), so that alone (tests, the
simulation) it says what the operator would run, and it learns start-up delays from the
count it will really get.

The policy is a pure function of the snapshots it has seen: no clock (time is
`stats.sampled_at`, the database's), no I/O, deterministic. In words (docs/autoscaling.md
has the formulas and the simulation that measures them):

- The work: arrivals (differences of `max_id`), the claimable backlog and the age of the
  oldest claimable message. In ordered mode these are the claimable heads' figures
  (`stats.oldest_claimable_age`, `stats.claimable_heads`): rows behind an unfinished or dead
  head cannot be claimed, and sizing on them would add workers that have nothing to do.
- The capacity: a worker's drain rate is measured, never configured. A span of polls in
  which the workers had no room throughout gives completions per ready replica; any other
  span gives only a lower bound. No room is shown by a message, not by a count: the oldest
  claimable message waited through the whole span, longer than a worker with room leaves
  one (`waited_throughout`). Claimable messages at every poll prove nothing: rows arriving
  faster than a claim's round trip are claimable at every instant while every worker has
  room. While the rate has not been seen under saturation, the estimate is probed upwards
  after each calm minute (no message waited), so that an over-provisioned deployment sheds
  workers until they saturate, which measures it; a probe after which a message waits is
  taken back at once, before it is measured (`DrainRate.overshot`). An
  interval in which a destination a worker serves was open or paused (`stats.unreachable`)
  measures nothing: the destination set the pace. An idle destination's row (no worker
  serves it any more) sets no pace and interrupts nothing. The start-up delay of new
  workers is measured too (`StartupDelay`).
- The size: enough capacity that (1) arrivals are served (the fewest workers whose
  capacity exceeds them; the noise on top is a backlog, the backlog part's), and (2) every
  message already waiting, or arriving before a pod started now becomes productive
  (measured; `STARTUP_DELAY_SECONDS` until then), is delivered before its age reaches the
  target.
- Up at once; the rate part comes down only after `scaleDownStabilizationSeconds`, the
  backlog part as soon as the backlog it was for has drained; to zero only after nothing was
  claimable or in flight for that window; from zero as soon as anything is claimable.
  Bounds: `minReplicas`..`maxReplicas`; ordered mode never more workers than aggregates with
  work (claimable heads plus heads in flight); paused: 0.
"""

from __future__ import annotations

import itertools
import math
import statistics
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from outbox.controller.decision import Decision, Limits
from outbox.stats import QueueStats, rates

# How long a new pod takes from being asked for to claiming messages (image pull, start,
# readiness), assumed until measured: sizing looks this far ahead, since capacity asked for
# now arrives that late. The policy measures it from when the ready replicas reach what it
# asked for (`StartupDelay`).
STARTUP_DELAY_SECONDS = 20.0

# Start-up delay: the median of this many recent measurements.
STARTUP_SAMPLES = 5

# Arrival rate: the median of the per-interval rates over this window, so that a spike (which
# the backlog part serves) does not inflate the rate part.
ARRIVAL_WINDOW_SECONDS = 60.0

# Drain rate: the median of this many recent saturated measurements, each over at least
# SAMPLE_SECONDS (several polls when polls are shorter).
DRAIN_SAMPLES = 5
SAMPLE_SECONDS = 5.0

# The drain rate assumed before anything was measured (messages/s per worker): a cautious
# guess, low for the worker's usual publishers, so that the first wake-up asks for more
# workers rather than fewer. The first saturated interval replaces it; probing raises it.
PRIOR_DRAIN_RATE = 100.0

# While the drain rate was never seen under saturation, raise the estimate by this factor
# after each PROBE_AFTER_SECONDS in which the workers kept up with room to spare. Removing a
# worker takes effect at once and a message left waiting is seen at the next poll, so a
# probe that overshoots costs a few seconds of age: it is taken back, and not tried again
# for STALE_AFTER_SECONDS (or it lasts until a message waits a whole interval, which
# measures the rate).
PROBE_FACTOR = 1.5
PROBE_AFTER_SECONDS = 60.0

# The longest a claimable message waits for a worker that has room: a claim's round trip, or
# the worker's idle poll (`OUTBOX_POLL_INTERVAL`, 1 s by default) where no NOTIFY woke it,
# with margin. A message that waited longer, and through a whole poll interval, shows that
# no worker had room (`waited_throughout`).
CLAIM_WAIT_SECONDS = 2.0

# A lower bound this much above the measured drain rate says the workers got faster (less
# than that is how unevenly completions are finalized).
FASTER = 1.1

# A measurement this old, taken when the downstream may have been slower, is probed again.
STALE_AFTER_SECONDS = 900.0

# The arrival curve keeps at most this many points. It reaches back to the oldest claimable
# message, which after a long outage (a destination down for a day) is a day of polls: past
# this size the older half is thinned (every other point dropped), so the points grow
# sparser with age and a decision costs the same after a day as after a minute. Between
# points the curve is interpolated, which moves a deadline by at most their spacing, a small
# part of the age there.
MAX_CURVE_POINTS = 256


# The range of each field of `spec.scaling`: the CRD's minimum and maximum (a test compares),
# so that the policy run outside a cluster (the autoscaling bench) takes what the API takes.
SCALING_RANGES: dict[str, tuple[float, float]] = {
    "min_replicas": (0, 1000),
    "max_replicas": (1, 1000),
    "target_oldest_ready_age_seconds": (0.1, 86400),
    "poll_interval_seconds": (1, 3600),
    "scale_down_stabilization_seconds": (0, 86400),
}


@dataclass(frozen=True)
class ScalingSettings:
    """`spec.scaling` of an `OutboxDispatcher`; the field defaults are the CRD's defaults (the
    API server fills them in; a test compares)."""

    min_replicas: int = 0
    """Never fewer workers than this (0 lets an idle table scale to zero)."""

    max_replicas: int = 10
    """Never more workers than this."""

    target_oldest_ready_age_seconds: float = 30.0
    """The age the oldest claimable message should stay under (the delivery SLO)."""

    poll_interval_seconds: float = 5.0
    """How often the operator reads the stats and asks the policy (it reads no clock)."""

    scale_down_stabilization_seconds: float = 300.0
    """How long a lower arrival rate must last before workers are removed, and how long the
    queue must stay idle before scaling to zero."""

    @classmethod
    def from_spec(cls, scaling: Mapping[str, Any] | None) -> ScalingSettings:
        """Read the CRD's camelCase keys; missing keys take the defaults above."""
        known = {_camel(f.name): f.name for f in fields(cls)}
        given = dict(scaling or {})
        unknown = sorted(set(given) - set(known))
        if unknown:
            raise ValueError(f"scaling: unknown key {unknown[0]!r}")
        values = {known[key]: value for key, value in given.items()}
        settings = cls(**values)
        settings._check()
        return settings

    def to_spec(self) -> dict[str, float]:
        """The settings as `spec.scaling` (camelCase keys)."""
        return {_camel(f.name): getattr(self, f.name) for f in fields(self)}

    def limits(self, *, paused: bool) -> Limits:
        return Limits(int(self.min_replicas), int(self.max_replicas), paused=paused)

    def _check(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            low, high = SCALING_RANGES[f.name]
            number = not isinstance(value, bool) and isinstance(value, int | float)
            if not number or not low <= value <= high:
                raise ValueError(
                    f"scaling.{_camel(f.name)} must be a number from {low:g} to {high:g}, "
                    f"not {value!r}"
                )
        if self.min_replicas > self.max_replicas:
            raise ValueError("scaling.minReplicas must not exceed scaling.maxReplicas")


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part.title() for part in rest)


class DrainRate:
    """What one ready worker delivers per second, as the policy has come to know it.

    Saturated spans (a message waited through the whole span, `waited_throughout`, the same
    workers ready throughout) measure it: the median of the last few. Other spans bound it
    from below. A span covers at least `SAMPLE_SECONDS`, so that completions finalized in
    batches do not read as bursts of speed at short poll intervals. Until it is measured the
    value is a guess: `PRIOR_DRAIN_RATE`, raised by `probe()` (taken back by `overshot()`),
    never below the lower bound; a measurement replaces it. A lower bound above the
    measurement (the workers got faster) makes it a guess again, from there.
    """

    def __init__(self) -> None:
        self._saturated: deque[float] = deque(maxlen=DRAIN_SAMPLES)
        self._floor = 0.0
        self._guess = PRIOR_DRAIN_RATE
        self._span: tuple[bool, float, float, float] | None = None  # kind, done, worker-s, s
        self._measured_at = -math.inf
        self._before_probe: float | None = None  # the guess before the last probe
        self._overshot_at = -math.inf

    @property
    def value(self) -> float:
        if self.measured:
            return statistics.median(self._saturated)
        return max(self._guess, self._floor)

    @property
    def measured(self) -> bool:
        """Seen under saturation, and no span has delivered more per worker since."""
        return bool(self._saturated) and statistics.median(self._saturated) * FASTER >= self._floor

    def observe(
        self, *, at: float, saturated: bool, completed: float, workers: int, seconds: float
    ) -> None:
        """One poll interval: `completed` messages by `workers` ready workers."""
        if workers <= 0 or seconds <= 0:
            self._span = None
            return
        kind, done, worker_seconds, covered = self._span or (saturated, 0.0, 0.0, 0.0)
        if kind != saturated:
            kind, done, worker_seconds, covered = saturated, 0.0, 0.0, 0.0
        done, worker_seconds, covered = (
            done + completed, worker_seconds + workers * seconds, covered + seconds
        )  # fmt: skip
        if covered < SAMPLE_SECONDS:
            self._span = (kind, done, worker_seconds, covered)
            return
        self._span = None
        if done <= 0:
            return  # nothing finished at all: a stalled downstream, not a worker's speed
        per_worker = done / worker_seconds
        if saturated:
            self._saturated.append(per_worker)
            self._measured_at = at
            # The newest measurement is the truth now: older bounds and guesses yield to it.
            self._floor = 0.0
            self._guess = statistics.median(self._saturated)
        else:
            self._floor = max(self._floor, per_worker)

    def interrupt(self) -> None:
        """Nothing of the span so far measures the workers (a destination was down)."""
        self._span = None

    def probe(self, at: float, stale_after: float) -> None:
        """Raise the guess; a measurement older than `stale_after` becomes a guess first."""
        if self.measured and at - self._measured_at >= stale_after:
            self._guess = statistics.median(self._saturated)
            self._saturated.clear()
        if not self.measured and at - self._overshot_at >= stale_after:
            self._before_probe = self.value
            self._guess = self.value * PROBE_FACTOR

    def overshot(self, at: float) -> None:
        """The workers ran out of room since the last probe: take it back, and probe no
        more for a while (the guess it returns to kept up with room to spare)."""
        if self._before_probe is not None and not self.measured:
            self._guess = self._before_probe
            self._overshot_at = at
        self._before_probe = None


class StartupDelay:
    """How long asked-for workers take to become ready, measured from the replica counts.

    A scale-up is timed from the decision that asked for it to the first snapshot whose ready
    replicas reach it (so it reads up to one poll interval long: the safe side). A request
    that is withdrawn before it is met is forgotten.
    """

    def __init__(self) -> None:
        self._samples: deque[float] = deque(maxlen=STARTUP_SAMPLES)
        self._asked: list[tuple[float, int]] = []  # (when, replicas asked for)

    @property
    def value(self) -> float:
        return statistics.median(self._samples) if self._samples else STARTUP_DELAY_SECONDS

    def observe(self, at: float, replicas: int, ready_replicas: int) -> None:
        waiting = []
        for when, asked in self._asked:
            if ready_replicas >= asked:
                self._samples.append(at - when)
            elif replicas >= asked:
                waiting.append((when, asked))
        self._asked = waiting

    def asked(self, at: float, replicas: int, ready_replicas: int) -> None:
        if replicas > ready_replicas:
            self._asked.append((at, replicas))


def waited_throughout(age: float, seconds: float) -> bool:
    """Whether the workers had no room during the whole interval of `seconds` that ends with
    a snapshot whose oldest claimable message has waited `age` seconds.

    That message was claimable at the start of the interval already, and no worker took it:
    a worker with room claims what is claimable within a claim's round trip (at once when a
    NOTIFY announces a row, within its own poll interval otherwise, `CLAIM_WAIT_SECONDS` at
    most), so every worker was full throughout. Claimable messages alone prove nothing:
    rows that arrive faster than a claim's round trip (a few thousand a second) are
    claimable at every instant while every worker has room, and reading that as saturation
    measures arrivals per worker as a worker's speed, which falls as workers are added.
    """
    return age >= max(seconds, CLAIM_WAIT_SECONDS)


def _exceeding(rate: float, mu: float) -> int:
    """The fewest workers whose capacity exceeds `rate` (none for no arrivals).

    Strictly more than the arrivals, not a share of the capacity: a queue served exactly as
    fast as rows arrive grows without bound (its noise is never paid back), and one served
    faster is stable. How much faster is not the rate part's business. Rounding up to a
    whole worker leaves half a worker on average; what the noise builds on top of that
    (for arrivals of variance λ a second at spare capacity δ, a backlog of about λ / 2δ
    messages, which at thousands a second is well under a second of age), and a drain rate
    measured a little high, are backlogs with deadlines: the backlog part meets them at the
    next poll and holds the worker until they have drained. A fixed share (95% was tried)
    paid a whole worker wherever the arrivals came within 5% under a multiple of a
    worker's rate, which is far more than the noise at those rates and most of a worker's
    cost when a few fast workers suffice (the simulation: replica-seconds 1.12x KEDA on
    pending's at 400 msg/s per worker with 95%, 1.09x without, no second over the target
    in either).
    """
    return math.floor(rate / mu) + 1 if rate > 0 else 0


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

    def __init__(self, scaling: Mapping[str, Any] | None = None) -> None:
        self.settings = ScalingSettings.from_spec(scaling)
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

    def reconfigure(self, scaling: Mapping[str, Any] | None) -> None:
        """New settings (spec.scaling edited), keeping what was learned: the drain rate per
        worker, the start-up delay and the arrival history describe the workers and the
        traffic, not the settings, and relearning them would cost minutes of poor sizing."""
        self.settings = ScalingSettings.from_spec(scaling)

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
        """The replica count to set now, with a CamelCase reason and a message for an Event."""
        work = _Work.of(stats)
        self._learn(work, ready_replicas)
        self.startup_delay.observe(work.at, replicas, ready_replicas)
        limits = self.settings.limits(paused=paused)
        decision = limits.fixed()  # paused: no sizing, so no rates held, no burst, no probe
        if decision is None:
            decision = limits.bound(self._size(work, replicas, ready_replicas))
        if decision.replicas > replicas:
            self.startup_delay.asked(work.at, decision.replicas, ready_replicas)
        self.last_decision = decision
        return decision

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
        held_rate = max(r for _, r in self._rates)
        rate_need = _exceeding(rate, mu)
        held = _exceeding(held_rate, mu)
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
            reason, message = "IdleStabilizing", f"idle for {work.at - self._idle_since:.0f}s"
        elif n == 0:
            reason, message = "Idle", f"nothing claimable or in flight for {window:.0f}s"
        return Decision(n, reason, message)
