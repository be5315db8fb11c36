"""CPU time of processes: the steadier measure on shared machines, where wall time is noisy.

A worker process's CPU time per delivered message, beside a plain client's CPU time per
request measured the same way, compares what each costs rather than how the machine was
loaded at that moment.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

_TICKS = os.sysconf("SC_CLK_TCK")
_SCHEDSTAT = Path("/proc/self/schedstat").exists()


def cpu_seconds(pid: int) -> float:
    """CPU seconds the live process `pid` has used so far, all its live threads (Linux).

    From the scheduler's own accounting in nanoseconds (/proc/PID/task/*/schedstat): the
    user plus system times of /proc/PID/stat count in clock ticks of 10 ms, too coarse for
    a drain of a few thousand messages. Where schedstat is missing, those ticks."""
    if _SCHEDSTAT:
        return sum(seconds for _, seconds in _threads(pid))
    return _stat_seconds(Path(f"/proc/{pid}/stat"))


THREAD_GROUPS = ("main", "librdkafka", "other")


def cpu_seconds_by_thread(pid: int) -> dict[str, float]:
    """`cpu_seconds` in THREAD_GROUPS: the main thread (where an asyncio process runs its
    event loop), librdkafka's own threads (named `rdk:...` by librdkafka), and every other
    thread (Python's: executors). A thread that ended
    meanwhile is not counted: compare groups of threads that live through a measurement."""
    groups = dict.fromkeys(THREAD_GROUPS, 0.0)
    for task, seconds in _threads(pid):
        if task == str(pid):
            groups["main"] += seconds
            continue
        with contextlib.suppress(OSError):  # a thread that ended meanwhile
            name = Path(f"/proc/{pid}/task/{task}/comm").read_text()
            groups["librdkafka" if name.startswith("rdk:") else "other"] += seconds
    return groups


def _threads(pid: int) -> list[tuple[str, float]]:
    """(thread id, CPU seconds) of each live thread of `pid`."""
    found = []
    for task in os.listdir(f"/proc/{pid}/task"):  # raises if the process is gone
        with contextlib.suppress(OSError):  # a thread that ended meanwhile
            path = Path(f"/proc/{pid}/task/{task}")
            seconds = (
                int((path / "schedstat").read_text().split()[0]) / 1e9
                if _SCHEDSTAT
                else _stat_seconds(path / "stat")
            )
            found.append((task, seconds))
    return found


def _stat_seconds(stat: Path) -> float:
    """User + system time of a /proc stat file, in clock ticks."""
    # Fields after the command name, which is in parentheses and may itself hold spaces.
    fields = stat.read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / _TICKS


def own_cpu_seconds() -> float:
    """This process's CPU seconds, all threads (librdkafka's and nats' included)."""
    times = os.times()
    return times.user + times.system


def descendants(pid: int) -> list[int]:
    """Every live descendant of `pid` (PostgreSQL's backends and background processes). Any of
    them may exit while this runs, or right after: callers must expect a pid to be gone."""
    found, queue = [], [pid]
    while queue:
        parent = queue.pop()
        try:
            tasks = list(Path(f"/proc/{parent}/task").iterdir())
        except OSError:  # exited since its parent listed it
            continue
        for task in tasks:
            with contextlib.suppress(OSError):
                kids = [int(k) for k in (task / "children").read_text().split()]
                found += kids
                queue += kids
    return found


def tree_cpu_seconds(pid: int, leave_out: int | None = None) -> float:
    """CPU seconds of `pid`'s live descendants but `leave_out` (a benchmark's own poll): a
    backend that ends meanwhile drops out, but the ones serving a drain live as long as the
    worker's pool does."""
    total = 0.0
    for child in descendants(pid):
        if child != leave_out:
            with contextlib.suppress(OSError):
                total += cpu_seconds(child)
    return total


def pin(pid: int, cpus: set[int], *, tree: bool = False) -> None:
    """Every thread of `pid` (with `tree`, of its descendants too) on `cpus`; what they fork
    later inherits it. A thread or process that has exited meanwhile needs no core."""
    for pid_ in (pid, *(descendants(pid) if tree else ())):
        try:
            threads = [int(tid) for tid in os.listdir(f"/proc/{pid_}/task")]
        except OSError:
            continue
        for tid in threads:
            with contextlib.suppress(ProcessLookupError):
                os.sched_setaffinity(tid, cpus)
