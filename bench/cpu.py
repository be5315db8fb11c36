"""CPU time of processes: the steadier measure on shared machines, where wall time is noisy.

A worker process's CPU time per delivered message, beside a plain client's CPU time per
request measured the same way, compares what each costs rather than how the machine was
loaded at that moment.
"""

from __future__ import annotations

import os
from pathlib import Path

_TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """User plus system CPU seconds the live process `pid` has used so far (Linux)."""
    # Fields after the command name, which is in parentheses and may itself hold spaces.
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    utime, stime = int(fields[11]), int(fields[12])
    return (utime + stime) / _TICKS


def own_cpu_seconds() -> float:
    """This process's CPU seconds, all threads (librdkafka's and nats' included)."""
    times = os.times()
    return times.user + times.system
