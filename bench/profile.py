"""Where a worker's time goes while it drains: py-spy samples of one worker process."""

from __future__ import annotations

import collections
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bench.env import Bench, measure_drain, python_module, seed_outbox
from bench.throughput import WORKER_FLAGS, _remaining_outbox


def profile_worker(bench: Bench, messages: int) -> dict[str, Any]:
    """Attach py-spy once the worker is draining, so start-up is not what gets measured."""
    py_spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    if not Path(py_spy).exists():
        return {"skipped": "py-spy is not installed (pip install '.[bench]')"}
    with bench.database() as dsn, tempfile.TemporaryDirectory() as tmp:
        seed_outbox(dsn, messages)
        raw = Path(tmp) / "profile.txt"
        remaining = _remaining_outbox(dsn)
        # On asyncio's own loop: py-spy sees Python frames only, and uvloop's waits and
        # callbacks are C code it would count as one opaque frame.
        worker = python_module(
            "outbox.worker", "--dsn", dsn, *WORKER_FLAGS, "--event-loop", "asyncio"
        )
        spy: subprocess.Popen[bytes] | None = None
        try:
            while remaining() == messages:
                time.sleep(0.01)
            spy = subprocess.Popen(
                [py_spy, "record", "--format", "raw", "--rate", "250", "--output", str(raw),
                 "--pid", str(worker.pid)],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            )  # fmt: skip
            rate = measure_drain(remaining, messages, [worker], timeout=600)
        finally:
            stop_profiled(spy, worker)
        if not raw.exists():
            return {"skipped": "py-spy could not sample the worker (ptrace not permitted?)"}
        return {"messages_per_second": rate, **summarize(raw.read_text())}


def stop_profiled(spy: subprocess.Popen[bytes] | None, worker: subprocess.Popen[bytes]) -> None:
    """Let py-spy write its samples (it does on SIGINT), then stop the process it sampled."""
    if spy is not None:
        spy.send_signal(signal.SIGINT)
        spy.wait(timeout=60)
    worker.terminate()
    worker.wait()


def samples(raw: str) -> Iterator[tuple[str, int]]:
    """(stack, sample count) per line of py-spy's raw output."""
    for line in raw.splitlines():
        stack, _, count = line.rpartition(" ")
        if count.isdigit():
            yield stack, int(count)


def summarize(raw: str, top: int = 12) -> dict[str, Any]:
    """Share of samples per innermost frame, with waiting on sockets counted apart."""
    own: collections.Counter[str] = collections.Counter()
    total = 0
    for stack, count in samples(raw):
        total += count
        own[stack.split(";")[-1].strip()] += count
    waiting = sum(n for frame, n in own.items() if frame.startswith(("EpollSelector.select",)))
    return {
        "samples": total,
        "waiting_share": waiting / max(total, 1),
        "top_frames": [
            {"frame": frame, "share": n / max(total, 1)}
            for frame, n in own.most_common(top + 1)
            if not frame.startswith("EpollSelector.select")
        ][:top],
    }
