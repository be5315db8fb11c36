"""Sparkline series from successive queue snapshots.

Nothing is scanned for rates: `outbox.stats.rates` turns two snapshots into arrivals per
second (`max_id` is an arrival counter) and completions per second (messages leaving the
backlog). Throughput is shown as *done* per second, so messages that went dead between the
two snapshots are taken out of the completions.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from outbox.stats import QueueStats, rates

HISTORY = 300  # samples kept: enough for the widest terminal, one per column


@dataclass(frozen=True)
class Sample:
    arrivals: float  # per second
    done: float  # per second


class RateHistory:
    def __init__(self, size: int = HISTORY) -> None:
        self.samples: deque[Sample] = deque(maxlen=size)
        self._last: QueueStats | None = None

    def add(self, stats: QueueStats) -> Sample | None:
        """Record a snapshot; returns the sample it made with the previous one, if any."""
        before, self._last = self._last, stats
        if before is None or before.table != stats.table:
            return None
        r = rates(before, stats)
        if r is None:
            return None
        seconds = (stats.sampled_at - before.sampled_at).total_seconds()
        went_dead = max(stats.dead - before.dead, 0) / seconds
        sample = Sample(r.arrivals_per_second, max(r.completions_per_second - went_dead, 0.0))
        self.samples.append(sample)
        return sample

    @property
    def latest(self) -> Sample | None:
        return self.samples[-1] if self.samples else None

    def arrivals(self) -> list[float]:
        return [s.arrivals for s in self.samples]

    def done(self) -> list[float]:
        return [s.done for s in self.samples]
