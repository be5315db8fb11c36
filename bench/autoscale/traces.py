"""Arrival traces: messages arriving in each second, deterministic for a given seed.

Every trace is Poisson noise around a rate curve λ(t) (msg/s), so that no second is a
clean multiple of a worker's drain rate.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

HOUR = 3600


@dataclass(frozen=True)
class Trace:
    name: str
    description: str
    rate: Callable[[int], float]  # second -> mean arrivals in that second

    def arrivals(self, seconds: int, seed: int) -> list[int]:
        rng = np.random.default_rng(seed)
        means = np.array([self.rate(t) for t in range(seconds)], dtype=float)
        return [int(n) for n in rng.poisson(means)]


def _steady(t: int) -> float:
    return 500.0


def _step(t: int) -> float:
    # 100/s, then 2,000/s for the middle hour, then 100/s again.
    return 2000.0 if HOUR // 2 <= t < HOUR // 2 * 3 else 100.0


SPIKE_EVERY = 20 * 60
SPIKE_MESSAGES = 50_000
SPIKE_SECONDS = 10


def _spikes(t: int) -> float:
    # A baseline of 200/s; every 20 minutes 50,000 more within 10 seconds (a batch job, a
    # replay), the first one 7 minutes in.
    phase = (t - 7 * 60) % SPIKE_EVERY
    return 200.0 + (SPIKE_MESSAGES / SPIKE_SECONDS if t >= 7 * 60 and phase < SPIKE_SECONDS else 0)


def _wave(t: int) -> float:
    # A day compressed into an hour, twice: a night at 100/s, a peak at 2,100/s, with a
    # lunchtime dip on the way.
    day = (t % HOUR) / HOUR
    base = 1100.0 - 1000.0 * math.cos(2 * math.pi * day)
    dip = 300.0 * math.exp(-(((day - 0.5) / 0.04) ** 2))
    return max(base - dip, 0.0)


# Mostly nothing; a small burst (3,000 messages within 10 s) at these minutes.
IDLE_BURSTS = (3, 31, 38, 66, 97, 112)


def _idle(t: int) -> float:
    return 300.0 if any(0 <= t - m * 60 < 10 for m in IDLE_BURSTS) else 0.0


TRACES = (
    Trace("steady", "500 msg/s", _steady),
    Trace("step", "100 msg/s, 2,000 msg/s from 30 to 90 min", _step),
    Trace("spikes", "200 msg/s + 50,000 messages in 10 s every 20 min", _spikes),
    Trace("wave", "a day compressed into an hour, twice: 100 to 2,100 msg/s", _wave),
    Trace("idle", "nothing but six bursts of 3,000 messages", _idle),
)
