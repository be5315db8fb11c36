"""A partitioned outbox beside a plain one: one `outbox-worker --publisher null --batch 500`
drains the same rows from each, unordered and ordered, in the same run.

The partitioned table is what `outbox migrate --partition-size 1000 --partitions-ahead 200`
makes: 30,000 rows fill about 30 partitions and 200 more wait empty ahead. The goal (issue
35): each mode drains at 0.9x or more of the plain table. Rounds alternate plain and
partitioned back to back, so each ratio compares runs the machine's load drifted little
between.

    python -m bench.partitioned [--messages 30000] [--repeat 3]

writes bench/results/partitioned.json and partitioned.md.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import time
from pathlib import Path
from typing import Any

import psycopg

from bench.env import Bench, measure_drain, python_module, seed_outbox
from outbox.partitions import Layout
from outbox.schema import migrate
from outbox.table import Table

PARTITION_SIZE, PARTITIONS_AHEAD = 1000, 200
WORKER_FLAGS = ("--publisher", "null", "--batch", "500", "--log-level", "WARNING")
MODES = ("unordered", "ordered")


def _drain(bench: Bench, messages: int, *, partitioned: bool, ordered: bool) -> float:
    """Messages per second of one worker draining `messages` fresh rows."""
    with bench.database(outbox=False) as dsn:
        with psycopg.connect(dsn, autocommit=True) as conn:
            layout = Layout(PARTITION_SIZE, PARTITIONS_AHEAD) if partitioned else None
            migrate(conn, Table.parse("outbox"), "aggregate" if ordered else None, layout=layout)
        seed_outbox(dsn, messages)
        ordering = ("--ordering", "aggregate") if ordered else ()
        worker = python_module(
            "outbox.worker", "--dsn", dsn, *WORKER_FLAGS, *ordering, stdout=subprocess.DEVNULL
        )
        remaining = psycopg.connect(dsn, autocommit=True)
        count = "SELECT count(*) FROM outbox WHERE status IN ('pending', 'processing')"
        try:
            return measure_drain(
                lambda: int(remaining.execute(count).fetchone()[0]),  # type: ignore[index]
                messages,
                [worker],
                timeout=600,
            )
        finally:
            worker.terminate()
            worker.wait(30)
            remaining.close()


def run(messages: int, repeat: int) -> dict[str, Any]:
    report: dict[str, Any] = {"messages": messages, "repeat": repeat, "modes": {}}
    with Bench() as bench:
        report["environment"] = bench.environment()
        report["load_before"] = os.getloadavg()
        for mode in MODES:
            rounds = []
            for _ in range(repeat):
                plain = _drain(bench, messages, partitioned=False, ordered=mode == "ordered")
                parted = _drain(bench, messages, partitioned=True, ordered=mode == "ordered")
                rounds.append({"plain": plain, "partitioned": parted, "ratio": parted / plain})
                print(f"{mode}: plain {plain:,.0f}/s, partitioned {parted:,.0f}/s", flush=True)
            report["modes"][mode] = {
                "rounds": rounds,
                "median_ratio": statistics.median(r["ratio"] for r in rounds),
            }
        report["load_after"] = os.getloadavg()
    return report


def render(report: dict[str, Any]) -> str:
    env = report["environment"]
    lines = [
        "# Partitioned outbox vs plain table (drain, one worker)",
        "",
        f"`python -m bench.partitioned --messages {report['messages']} --repeat "
        f"{report['repeat']}` at {env['commit']}, PostgreSQL {env['postgresql']}, "
        f"{env['cores']} cores, {env['event_loop']}; started {env['started']}.",
        "",
        f"One `outbox-worker {' '.join(WORKER_FLAGS[:4])}` drains {report['messages']:,} "
        "rows (~200-byte payloads, 1,000 aggregates) from a fresh table: plain, or made by "
        f"`outbox migrate --partition-size {PARTITION_SIZE} --partitions-ahead "
        f"{PARTITIONS_AHEAD}` (about {report['messages'] // PARTITION_SIZE} partitions hold "
        f"rows, {PARTITIONS_AHEAD} more are empty ahead). Each round runs the two back to "
        "back; the goal is a ratio of 0.9 or more in each mode.",
        "",
        "| mode | round | plain msg/s | partitioned msg/s | ratio |",
        "|---|---|---|---|---|",
    ]
    for mode, result in report["modes"].items():
        for i, r in enumerate(result["rounds"], 1):
            lines.append(
                f"| {mode} | {i} | {r['plain']:,.0f} | {r['partitioned']:,.0f} | {r['ratio']:.2f} |"
            )
    lines += ["", "| mode | median ratio | goal (0.9) |", "|---|---|---|"]
    for mode, result in report["modes"].items():
        ratio = result["median_ratio"]
        lines.append(f"| {mode} | **{ratio:.2f}** | {'met' if ratio >= 0.9 else 'not met'} |")
    before, after = report["load_before"], report["load_after"]
    lines += [
        "",
        f"Load average (1, 5, 15 min) before: {before[0]:.2f} {before[1]:.2f} {before[2]:.2f}, "
        f"after: {after[0]:.2f} {after[1]:.2f} {after[2]:.2f}: other work shared the "
        "machine's cores, and both sides of a ratio met it alike.",
        "",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.partitioned", description=__doc__)
    parser.add_argument("--messages", type=int, default=30_000, help="rows per drain (30000)")
    parser.add_argument("--repeat", type=int, default=3, help="rounds per mode (3)")
    parser.add_argument("--out", default="bench/results", help="where the results go")
    args = parser.parse_args()
    started = time.monotonic()
    report = run(args.messages, args.repeat)
    report["seconds"] = time.monotonic() - started
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "partitioned.json").write_text(json.dumps(report, indent=2))
    (out / "partitioned.md").write_text(render(report))
    print(render(report))


if __name__ == "__main__":
    main()
