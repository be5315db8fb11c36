"""Where an ordered pair's latency goes: the path of each pair, hop by hop, for the worker
beside the floor in the same minutes.

python -m bench.latency_trace                       # 1,000 msg/s, two processes, two rounds
python -m bench.latency_trace --rate 100 --rounds 1 --out /somewhere/latency_trace.md

Ordered-pairs mode (bench.latency): each producer transaction commits two events of one
aggregate, A then B; B becomes its aggregate's head only once A's finalize has committed.
Each contender runs as in the latency benchmark, with its events noted: the worker with
`--log-level DEBUG --log-format json` (its "claimed" and "finalized" records name their
ids; the record's time is when the statement had returned), the floor with its own notes
of the same (bench.latency_floor's `trace=`). With the producer's commit and the
receiver's first byte of each request, a pair's path falls into hops:

    commit -> A claimed -> A at the receiver -> A finalized -> B claimed -> B at the receiver

Beside them, how long the contender's processes waited for a core: the run-queue time the
kernel counts per task (/proc/<pid>/schedstat), per message and per time it was scheduled.
A loaded machine shows there first.

The worker's debug log costs it some CPU (a JSON line per claim and per finalize): the
figures here are for finding where time goes, not the benchmark's (bench.latency's are).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from itertools import pairwise
from pathlib import Path
from typing import Any

from bench import latency
from bench.env import ROOT, Bench, python_module

# A pair's path, from one moment to the next.
PATH = (
    ("commit_to_a_claimed", "commit → A claimed"),
    ("a_claimed_to_a_received", "A claimed → A at the receiver"),
    ("a_received_to_a_finalized", "A at the receiver → A finalized"),
    ("a_finalized_to_b_claimed", "A finalized → B claimed"),
    ("b_claimed_to_b_received", "B claimed → B at the receiver"),
)
HOPS = (
    *PATH,
    ("a_latency", "A: commit → at the receiver"),
    ("b_latency", "B: commit → at the receiver"),
)
CONTENDERS = ("worker", "floor")
# The heading of the findings written by hand below the figures (a new run keeps them).
FINDINGS = "\n## What the hops say\n"


@dataclass
class Notes:
    """When each message's claim and finalize returned (ns, CLOCK_REALTIME), and by which
    process, from a contender's notes."""

    claimed: dict[int, tuple[int, int]]  # id -> (process, time)
    finalized: dict[int, int]  # id -> time


def read_notes(lines_by_process: Iterable[Iterable[str]]) -> Notes:
    """The "claimed" and "finalized" events of each process's lines: the worker's JSON log
    (`time`, ISO 8601) or the floor's notes (`time_ns`). Other lines are passed over."""
    notes = Notes({}, {})
    for process, lines in enumerate(lines_by_process):
        for line in lines:
            try:
                record = json.loads(line)
            except ValueError:
                continue
            event = record.get("event") if isinstance(record, dict) else None
            if event not in ("claimed", "finalized"):
                continue
            at = record.get("time_ns")
            if at is None:
                at = int(datetime.fromisoformat(record["time"]).timestamp() * 1e6) * 1000
            for message_id in record["ids"]:
                if event == "claimed":
                    notes.claimed[int(message_id)] = (process, int(at))
                else:
                    notes.finalized[int(message_id)] = int(at)
    return notes


def hops(
    pairs: Iterable[tuple[int, int]],
    committed_ns: dict[int, int],
    received_ns: dict[int, int],
    notes: Notes,
) -> tuple[dict[str, list[float]], int]:
    """Each pair's hops in ms (a pair missing a note is left out), and how many pairs had
    B claimed by the process that had A."""
    out: dict[str, list[float]] = {key: [] for key, _ in HOPS}
    same = 0
    for a, b in pairs:
        if a not in notes.claimed or b not in notes.claimed or a not in notes.finalized:
            continue
        if a not in received_ns or b not in received_ns:
            continue
        commit = committed_ns[a]
        (a_process, a_claimed), (b_process, b_claimed) = notes.claimed[a], notes.claimed[b]
        a_finalized = notes.finalized[a]
        moments = (commit, a_claimed, received_ns[a], a_finalized, b_claimed, received_ns[b])
        for (key, _), (start, end) in zip(PATH, pairwise(moments), strict=True):
            out[key].append((end - start) / 1e6)
        out["a_latency"].append((received_ns[a] - commit) / 1e6)
        out["b_latency"].append((received_ns[b] - commit) / 1e6)
        same += a_process == b_process
    return out, same


def _schedstat(pid: int) -> tuple[float, float, int]:
    """Seconds on a core, seconds waiting for one, and times scheduled, of one process's
    main thread (the event loop's)."""
    with open(f"/proc/{pid}/schedstat") as stat:
        on_cpu, waiting, slices = (int(v) for v in stat.read().split()[:3])
    return on_cpu / 1e9, waiting / 1e9, slices


def _start(contender: str, dsn: str, url: str, processes: int, where: Path) -> list[Any]:
    procs = []
    for n in range(processes):
        if contender == "worker":
            args = ["--dsn", dsn, "--publisher", "http", "--http-url", url, "--ordering",
                    "aggregate", "--log-level", "DEBUG", "--log-format", "json"]  # fmt: skip
            with open(where / f"worker-{n}.log", "w") as log:
                procs.append(python_module("outbox.worker", *args, stderr=log))
        else:
            args = [dsn, url, str(latency.BATCH), str(latency.CONCURRENCY), "ordered",
                    f"trace={where / f'floor-{n}.log'}"]  # fmt: skip
            procs.append(python_module("bench.latency_floor", *args))
    return procs


def run_one(
    bench: Bench, receiver: latency.Receiver, contender: str, rate: int, processes: int,
    seconds: float, where: Path,
) -> dict[str, Any]:  # fmt: skip
    """One run: each measured pair's hops, and the processes' waits for a core."""
    warm_up = latency.warm_up_messages(rate)
    warm_up += warm_up % 2  # whole transactions: the measured ones start with an A
    count = warm_up + int(rate * seconds)
    count -= count % 2
    with bench.database(ordering="aggregate") as dsn:
        receiver.results()
        procs = _start(contender, dsn, receiver.url, processes, where)
        try:
            latency._wait_ready(dsn, contender, procs)
            before = [_schedstat(p.pid) for p in procs]
            produced = asyncio.run(
                latency.produce(dsn, rate, count, latency._enqueue_pair, per_transaction=2)
            )
            deadline = time.monotonic() + 60
            while receiver.count() < count and time.monotonic() < deadline:
                time.sleep(0.05)
            after = [_schedstat(p.pid) for p in procs]
            got = receiver.results()
        finally:
            latency._stop(procs)
    logs = sorted(where.glob(f"{contender}-*.log"))
    notes = read_notes(path.read_text().splitlines() for path in logs)
    measured = produced.order[warm_up:]
    pairs = [(int(a), int(b)) for a, b in zip(measured[::2], measured[1::2], strict=True)]
    committed = {int(k): v for k, v in produced.committed_ns.items()}
    received = {int(k): v[0] for k, v in got["arrivals"].items()}
    found, same = hops(pairs, committed, received, notes)
    on_cpu, waiting, slices = (
        sum(b[i] - a[i] for a, b in zip(before, after, strict=True)) for i in range(3)
    )
    return {
        "contender": contender, "pairs": len(found["b_latency"]), "same_process": same,
        "hops": found, "cpu_s": on_cpu, "waiting_s": waiting, "slices": slices,
        "messages": count,
    }  # fmt: skip


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def _p90(values: list[float]) -> float:
    return sorted(values)[int(len(values) * 0.9)] if values else float("nan")


def render(runs: list[dict[str, Any]], rate: int, processes: int, load: list[float]) -> str:
    lines = [
        "# An ordered pair's path, hop by hop: the worker beside the floor",
        "",
        f"`python -m bench.latency_trace --rate {rate} --processes {processes} "
        f"--rounds {max(r['round'] for r in runs)}`: ordered-pairs at {rate:,} msg/s, {processes} "
        f"process(es), the contenders taking turns; the 1-minute load average was "
        f"{min(load):.1f} to {max(load):.1f} at the runs' starts. Medians (p90) in ms "
        "of each measured pair; the worker's figures with its debug log on.",
        "",
        "| hop | " + " | ".join(f"{r['contender']} ({r['round']})" for r in runs) + " |",
        "|---|" + "---|" * len(runs),
    ]
    for key, label in HOPS:
        cells = [f"{_median(r['hops'][key]):.1f} ({_p90(r['hops'][key]):.1f})" for r in runs]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    rows = {
        "B claimed by A's process": [f"{r['same_process'] / max(r['pairs'], 1):.0%}" for r in runs],
        "waiting for a core, ms per message": [
            f"{r['waiting_s'] * 1e3 / r['messages']:.2f}" for r in runs
        ],
        "on a core, ms per message": [f"{r['cpu_s'] * 1e3 / r['messages']:.2f}" for r in runs],
        "waiting for a core, ms per time scheduled": [
            f"{r['waiting_s'] * 1e3 / max(r['slices'], 1):.2f}" for r in runs
        ],
    }
    for label, cells in rows.items():
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.latency_trace")
    parser.add_argument("--rate", type=int, default=1000, help="messages/s (default 1000)")
    parser.add_argument("--processes", type=int, default=2, help="of each (default 2)")
    parser.add_argument("--seconds", type=float, default=8.0, help="a run (default 8)")
    parser.add_argument("--rounds", type=int, default=2, help="worker and floor each (2)")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "latency_trace.md")
    args = parser.parse_args(argv)
    if args.rate < 2 or args.processes < 1 or args.seconds <= 0 or args.rounds < 1:
        parser.error("--rate must be 2 or more, --processes and --rounds 1 or more, "
                     "--seconds above 0")  # fmt: skip
    runs: list[dict[str, Any]] = []
    load: list[float] = []
    with Bench() as bench, tempfile.TemporaryDirectory(prefix="latency-trace-") as scratch:
        where = Path(scratch)
        receiver = latency.Receiver()
        try:
            for n in range(args.rounds):
                for contender in CONTENDERS if n % 2 == 0 else CONTENDERS[::-1]:
                    load.append(os.getloadavg()[0])
                    print(f"{contender}, round {n + 1} of {args.rounds}", file=sys.stderr)
                    run = run_one(bench, receiver, contender, args.rate, args.processes,
                                  args.seconds, where)  # fmt: skip
                    runs.append({**run, "round": n + 1})
        finally:
            receiver.close()
    # Each round's worker beside its floor.
    runs.sort(key=lambda r: (r["round"], CONTENDERS.index(r["contender"])))
    text = render(runs, args.rate, args.processes, load)
    print(text)
    # The findings written by hand below the figures stay.
    old = args.out.read_text() if args.out.exists() else ""
    if FINDINGS in old:
        text += FINDINGS + old.split(FINDINGS, 1)[1]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)


if __name__ == "__main__":
    main()
