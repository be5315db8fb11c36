"""What the scaling policy learns of the workers: their drain rate and start-up delay.

Both are measured from the snapshots the policy is given, never configured
(`outbox.controller.scaling` says how); the constants are how long and how often.
"""

from __future__ import annotations

import math
import statistics
from collections import deque

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


def exceeding(rate: float, mu: float) -> int:
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
