"""Sparkline series from successive queue snapshots.

Nothing is scanned for rates: two snapshots give arrivals per second (`max_id` is an
arrival counter) and completions per second (messages leaving the backlog), as
`outbox.stats.rates` computes them. Throughput is shown as *done* per second, so messages
that went dead between the two snapshots are taken out of the completions. A purge can make
`max(id)` go down, and an emptied table's next id is far above 0: those pairs give no
sample, or one bounded by the rows present, never a negative or invented rate.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from outbox.stats import QueueStats

HISTORY = 300  # samples kept: enough for the widest terminal, one per column


@dataclass(frozen=True)
class Sample:
    arrivals: float  # per second
    done: float  # per second
    dead: float = 0.0  # per second: are failures still happening (net of requeues)


class RateHistory:
    def __init__(self, size: int = HISTORY) -> None:
        self.samples: deque[Sample] = deque(maxlen=size)
        self._last: QueueStats | None = None

    def add(self, stats: QueueStats) -> Sample | None:
        """Record a snapshot; returns the sample it made with the previous one, if any."""
        before, self._last = self._last, stats
        if before is None or before.table != stats.table:
            return None
        seconds = (stats.sampled_at - before.sampled_at).total_seconds()
        if seconds <= 0 or stats.max_id < before.max_id:
            return None  # max(id) went down (rows purged): no arrival count for this pair
        arrived = stats.max_id - before.max_id
        if before.max_id == 0:
            # An emptied table: ids go on from the sequence, far above 0. What arrived is
            # at most what is there now (done rows only when counted exactly).
            present = stats.backlog + stats.dead + (0 if stats.done_is_estimate else stats.done)
            arrived = min(arrived, present)
        left_backlog = arrived - (stats.backlog - before.backlog)
        went_dead = max(stats.dead - before.dead, 0)
        sample = Sample(
            arrived / seconds, max(left_backlog - went_dead, 0) / seconds, went_dead / seconds
        )
        self.samples.append(sample)
        return sample

    @property
    def latest(self) -> Sample | None:
        return self.samples[-1] if self.samples else None

    def arrivals(self) -> list[float]:
        return [s.arrivals for s in self.samples]

    def done(self) -> list[float]:
        return [s.done for s in self.samples]
