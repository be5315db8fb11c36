"""The benchmarks' process-tree helpers on real processes: a tree whose members exit while it
is pinned or measured is the normal case (PostgreSQL's backends come and go)."""

import os
import subprocess
import sys
import time

from bench.cpu import cpu_seconds, descendants, pin, tree_cpu_seconds

# A parent with one child that exits at once and one that spends some CPU, says its pid and
# waits for stdin to close.
_WAITING = "import os, sys; sum(range(10**7)); print(os.getpid(), flush=True); sys.stdin.read()"
_TREE = f"""
import subprocess, sys
subprocess.run([sys.executable, "-c", "pass"])
subprocess.run([sys.executable, "-c", {_WAITING!r}])
"""


def test_a_tree_with_exited_members_is_pinned_and_measured():
    parent = subprocess.Popen(
        [sys.executable, "-c", _TREE], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        child = int(parent.stdout.readline())
        assert descendants(parent.pid) == [child]
        core = min(os.sched_getaffinity(0))
        pin(parent.pid, {core}, tree=True)
        assert os.sched_getaffinity(child) == {core}
        assert os.sched_getaffinity(parent.pid) == {core}
        assert tree_cpu_seconds(parent.pid) > 0
        assert tree_cpu_seconds(parent.pid, leave_out=child) == 0
    finally:
        parent.stdin.close()
        parent.wait(timeout=30)
    # Gone: nothing to list, pin or measure, and no error for it.
    assert descendants(parent.pid) == []
    pin(parent.pid, {core}, tree=True)
    assert tree_cpu_seconds(parent.pid) == 0


def test_cpu_time_resolves_less_than_a_clock_tick():
    """A few milliseconds of CPU (under the 10 ms tick of /proc/PID/stat) still read as
    spent: a smoke-sized drain costs about that much."""
    before = cpu_seconds(os.getpid())
    spent_at_least = 0.0
    while spent_at_least < 0.002:  # about 2 ms of this process's own CPU
        started = time.process_time()
        sum(range(10_000))
        spent_at_least += time.process_time() - started
    assert 0 < cpu_seconds(os.getpid()) - before < 0.5
