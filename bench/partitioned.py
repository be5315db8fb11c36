"""A partitioned outbox beside a plain one: one `outbox-worker --publisher null --batch 500`
drains the same rows from each, unordered and ordered, in the same run.

The partitioned table is what `outbox migrate --partition-size 1000 --partitions-ahead 200`
makes: 30,000 rows fill about 30 partitions and 200 more wait empty ahead. The goal (issue
35): each mode drains at 0.9x or more of the plain table. Each round runs plain and
partitioned back to back, the first of the two alternating from round to round, so each
ratio compares runs the machine's load drifted little between, and neither side always
goes first.

A drain is timed on the database's clock, from the last moment its oldest row (the first
any claim takes) was seen pending to the last row's `done_at`, watched with primary-key
probes. Counting the unfinished rows every few milliseconds, as a drain of a plain table
can be watched, would itself cost the partitioned side most: a count over the parent plans
and probes all 230 partitions, tens of milliseconds each time, on the cores the worker and
the database share. The count runs only to confirm the end. A probe names the partition
that holds its row, as the worker's statements do: through the parent, each planned about
0.2 ms more than on the plain table, paid on the partitioned side alone (hundreds of them).

    python -m bench.partitioned [--messages 30000] [--repeat 3]

writes bench/results/partitioned.json and partitioned.md.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import time
from collections.abc import Callable
from typing import Any

import psycopg
from psycopg import sql

from bench.env import Bench, python_module, seed_outbox, write_results
from outbox.partitions import TOP_UP_BELOW, Layout, partition_table
from outbox.schema import migrate
from outbox.table import Table

PARTITION_SIZE, PARTITIONS_AHEAD = 1000, 200
# A few busy aggregates make every ordered claim short (a head each): --aggregates 7.
AGGREGATES = 1000
WORKER_FLAGS = ("--publisher", "null", "--batch", "500", "--log-level", "WARNING")
MODES = ("unordered", "ordered")
DRAIN_TIMEOUT = 600.0
# Confirms the end: the rows seeded are ids 1 to `last`, so the count looks in their
# partitions only.
UNFINISHED = (
    "SELECT count(*) FROM outbox WHERE status IN ('pending', 'processing') AND id <= %(id)s"
)


def _drain(
    bench: Bench, messages: int, ahead: int, aggregates: int, *, partitioned: bool, ordered: bool
) -> float:
    """Messages per second of one worker (a fresh process) draining `messages` fresh rows."""
    with bench.database(outbox=False) as dsn:
        with psycopg.connect(dsn, autocommit=True) as conn:
            layout = Layout(PARTITION_SIZE, ahead) if partitioned else None
            migrate(conn, Table.parse("outbox"), "aggregate" if ordered else None, layout=layout)
        seed_outbox(dsn, messages, aggregates=aggregates)
        ordering = ("--ordering", "aggregate") if ordered else ()
        table = Table.parse("outbox")

        def holding(row_id: int) -> sql.Composable:
            """The table a probe of a row names: its partition, or the plain table."""
            if layout is None:
                return table.ident
            return partition_table(table, layout.partition_of(row_id)).ident

        with psycopg.connect(dsn, autocommit=True) as watch:
            first, last = watch.execute("SELECT min(id), max(id) FROM outbox").fetchone()  # type: ignore[misc]
            worker = python_module(
                "outbox.worker", "--dsn", dsn, *WORKER_FLAGS, *ordering, stdout=subprocess.DEVNULL
            )
            try:
                return messages / _timed_drain(watch, worker, (first, last), holding)
            finally:
                worker.terminate()
                worker.wait(30)


def _timed_drain(
    watch: psycopg.Connection[Any],
    worker: subprocess.Popen[bytes],
    ids: tuple[int, int],
    holding: Callable[[int], sql.Composable],
) -> float:
    """Seconds, on the database's clock, from the last moment row `first` was seen pending
    to the last `done_at` once no row is unfinished (see the module's docstring)."""
    deadline = time.monotonic() + DRAIN_TIMEOUT
    first, last = ids

    def probe(statement: str, row_id: int) -> tuple[Any, ...]:
        if time.monotonic() > deadline:
            raise TimeoutError("the drain did not finish")
        if worker.poll() is not None:
            raise RuntimeError("the worker process ended during the drain")
        query = sql.SQL(statement).format(t=holding(row_id))
        row = watch.execute(query, {"id": row_id}).fetchone()
        assert row is not None
        return row

    started = None
    while True:  # until the first claim
        at, pending = probe(
            "SELECT clock_timestamp(), EXISTS (SELECT FROM {t} WHERE id = %(id)s "
            "AND status = 'pending')",
            first,
        )
        if not pending:
            break
        started = at
        time.sleep(0.002)
    if started is None:
        raise RuntimeError("a row was claimed before the drain was watched")
    done = "SELECT EXISTS (SELECT FROM {t} WHERE id = %(id)s AND status = 'done')"
    while not probe(done, last)[0]:
        time.sleep(0.02)
    while probe(UNFINISHED, last)[0]:
        time.sleep(0.02)
    ended = watch.execute("SELECT max(done_at) FROM outbox").fetchone()[0]  # type: ignore[index]
    return float((ended - started).total_seconds())


def run(
    messages: int, repeat: int, ahead: int = PARTITIONS_AHEAD, aggregates: int = AGGREGATES
) -> dict[str, Any]:
    report: dict[str, Any] = {
        "messages": messages,
        "repeat": repeat,
        "partitions_ahead": ahead,
        "aggregates": aggregates,
        "modes": {},
    }
    with Bench() as bench:
        report["environment"] = bench.environment()
        report["load_before"] = os.getloadavg()
        for mode in MODES:
            rounds = []
            for i in range(repeat):
                ordered = mode == "ordered"
                first, second = (False, True) if i % 2 == 0 else (True, False)
                rates = {
                    layout: _drain(
                        bench, messages, ahead, aggregates, partitioned=layout, ordered=ordered
                    )
                    for layout in (first, second)
                }
                plain, parted = rates[False], rates[True]
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
    ahead = report.get("partitions_ahead", PARTITIONS_AHEAD)
    aggregates = report.get("aggregates", AGGREGATES)
    left = (ahead + 1) * PARTITION_SIZE - 1 - report["messages"]
    top_up = (
        ": fewer than three quarters of the target, so the worker's partition keeper makes "
        f"{report['messages'] // PARTITION_SIZE} more as the drain runs"
        if left < TOP_UP_BELOW * ahead * PARTITION_SIZE
        else ""
    )
    flag = "" if ahead == PARTITIONS_AHEAD else f" --partitions-ahead {ahead}"
    flag += "" if aggregates == AGGREGATES else f" --aggregates {aggregates}"
    lines = [
        "# Partitioned outbox vs plain table (drain, one worker)",
        "",
        f"`python -m bench.partitioned --messages {report['messages']} --repeat "
        f"{report['repeat']}{flag}` at {env['commit']}, PostgreSQL {env['postgresql']}, "
        f"{env['cores']} cores, {env['event_loop']}; started {env['started']}.",
        "",
        f"One `outbox-worker {' '.join(WORKER_FLAGS[:4])}` drains {report['messages']:,} "
        f"rows (~200-byte payloads, {aggregates:,} aggregates) from a fresh table: plain, or "
        f"made by `outbox migrate --partition-size {PARTITION_SIZE} --partitions-ahead {ahead}` "
        # Ids 1 to `messages`, partition k holding k x size to (k + 1) x size - 1.
        f"(about {report['messages'] // PARTITION_SIZE + 1} partitions hold rows, "
        f"{ahead - report['messages'] // PARTITION_SIZE} are empty ahead{top_up}), "
        "a fresh worker process each. "
        "Each round runs the two back to back, which goes first alternating; a drain is "
        "timed on the database's clock from the last moment its oldest row was pending to "
        "its last `done_at`, watched by primary-key probes (a count over the partitioned "
        "parent every few milliseconds would load the cores the worker and the database "
        "share). The goal is a median ratio of 0.9 or more in each mode.",
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
    parser.add_argument(
        "--partitions-ahead",
        type=int,
        default=PARTITIONS_AHEAD,
        help=f"partitions made ahead by the migration ({PARTITIONS_AHEAD}); fewer than "
        "the rows fill makes the worker's partition keeper top up during the drain",
    )
    parser.add_argument(
        "--aggregates",
        type=int,
        default=AGGREGATES,
        help=f"aggregates the rows spread over ({AGGREGATES})",
    )
    parser.add_argument("--out", default="bench/results", help="where the results go")
    args = parser.parse_args()
    started = time.monotonic()
    report = run(args.messages, args.repeat, args.partitions_ahead, args.aggregates)
    report["seconds"] = time.monotonic() - started
    # The drain the goal names keeps its name; others are reported beside it.
    default = (args.messages, args.partitions_ahead, args.aggregates) == (
        30_000,
        PARTITIONS_AHEAD,
        AGGREGATES,
    )
    extra = f"{args.messages}-{args.partitions_ahead}-{args.aggregates}"
    name = "partitioned" if default else f"partitioned-{extra}"
    write_results(args.out, name, report, render(report))


if __name__ == "__main__":
    main()
