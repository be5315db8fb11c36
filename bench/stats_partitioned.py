"""`outbox stats` on a partitioned table beside a plain one holding the same rows.

Both tables hold `--done` done rows and `--pending` pending ones at the newest ids (~200-byte
payloads), vacuumed and analyzed as autovacuum and `outbox maintain` keep them; the
partitioned one in partitions of `--partition-size` ids (2M done rows in 10,000-id
partitions: 200 of them, and 16 more made ahead). Measured, on the database's side of the
snapshot (the process's start-up and imports are the same for both and left out):

- *warm*: one snapshot (`outbox.stats.queue_stats`, the statement `outbox stats` and the
  TUI's poller run) on a connection that has run it before: what a poller pays each time;
- *cold*: a new connection and its first snapshot, what one `outbox stats` command pays: a
  session's first statement over a partitioned parent loads each partition's catalog
  entries.

Rounds alternate plain and partitioned so both see the same load. The goal (issue 35): the
partitioned table's snapshot within 1.3x the plain table's time.

    python -m bench.stats_partitioned [--done 2000000] [--pending 1000] [--rounds 30]

writes bench/results/stats_partitioned.json and stats_partitioned.md.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from typing import Any

import psycopg

from bench.env import PAYLOAD_BYTES, Bench, write_results
from outbox.operations.partition_maintenance import DEFAULT_RETENTION, maintain
from outbox.partitions import DEFAULT_PARTITIONS_AHEAD, Layout
from outbox.schema import migrate
from outbox.stats import queue_stats
from outbox.table import Table

TABLE = Table.parse("outbox")
GOAL = 1.3


def _fill(dsn: str, done: int, pending: int, layout: Layout | None) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        if layout is not None:
            # Partitions for every id to be inserted, then the usual ones ahead of them.
            rows = done + pending
            migrate(conn, TABLE, layout=Layout(layout.partition_size, 1))
            ahead = rows // layout.partition_size + 1
            migrate(conn, TABLE, layout=Layout(layout.partition_size, ahead))
            migrate(conn, TABLE, layout=layout)
        else:
            migrate(conn, TABLE)
        conn.execute(
            "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, status, "
            "done_at) SELECT 'order', 'order-' || (g %% 1000), 'OrderPlaced', "
            "jsonb_build_object('order', g, 'note', repeat('x', %(pad)s)), "
            "CASE WHEN g <= %(done)s THEN 'done' ELSE 'pending' END, "
            "CASE WHEN g <= %(done)s THEN now() END "
            "FROM generate_series(1, %(rows)s) AS g",
            {"done": done, "rows": done + pending, "pad": PAYLOAD_BYTES - 40},
        )
    # Analyzed once the inserting session has gone and reported its counts: an ANALYZE in
    # that session would be followed by them and read as stale at once.
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE outbox")  # the parent too (what `outbox maintain` does)


def _warm(conn: psycopg.Connection[Any]) -> float:
    started = time.perf_counter()
    queue_stats(conn, TABLE)
    return time.perf_counter() - started


def _cold(dsn: str) -> float:
    started = time.perf_counter()
    with psycopg.connect(dsn, autocommit=True) as conn:
        queue_stats(conn, TABLE)
    return time.perf_counter() - started


def _rounds(sides: dict[str, str], rounds: int) -> dict[str, dict[str, list[float]]]:
    """Warm and cold snapshots of each side, alternating which goes first."""
    times: dict[str, dict[str, list[float]]] = {side: {"warm": [], "cold": []} for side in sides}
    with (
        psycopg.connect(sides["plain"], autocommit=True) as p,
        psycopg.connect(sides["partitioned"], autocommit=True) as q,
    ):
        conns = {"plain": p, "partitioned": q}
        for side in sides:  # each connection's first snapshot is a cold one
            _warm(conns[side])
        for n in range(rounds):
            order = ("plain", "partitioned") if n % 2 == 0 else ("partitioned", "plain")
            for side in order:
                times[side]["warm"].append(_warm(conns[side]))
                times[side]["cold"].append(_cold(sides[side]))
    return times


def run(done: int, pending: int, partition_size: int, rounds: int) -> dict[str, Any]:
    layout = Layout(partition_size, DEFAULT_PARTITIONS_AHEAD)
    report: dict[str, Any] = {
        "done": done, "pending": pending, "partition_size": partition_size, "rounds": rounds,
    }  # fmt: skip
    with Bench() as bench:
        report["environment"] = bench.environment()
        report["load_before"] = os.getloadavg()
        with bench.database(outbox=False) as plain, bench.database(outbox=False) as parted:
            _fill(plain, done, pending, None)
            _fill(parted, done, pending, layout)
            with psycopg.connect(parted) as conn:
                report["partitions"] = conn.execute(
                    "SELECT count(*) FROM pg_partition_tree('outbox') WHERE isleaf"
                ).fetchone()[0]  # type: ignore[index]
            sides = {"plain": plain, "partitioned": parted}
            # Never maintained, then after the run of `outbox maintain` a timer makes (which
            # notes the finished partitions a snapshot then leaves out).
            report["times"] = {"never maintained": _rounds(sides, rounds)}
            with psycopg.connect(parted, autocommit=True) as conn:
                kept = maintain(conn, TABLE, retention=DEFAULT_RETENTION).kept
            report["noted"] = len(kept)
            report["times"]["maintained"] = _rounds(sides, rounds)
            for side in sides:
                with psycopg.connect(sides[side]) as conn:
                    stats = queue_stats(conn, TABLE)
                report.setdefault("stats", {})[side] = {
                    "done": stats.count_text("done"), "pending": stats.count_text("pending"),
                    "estimate": stats.done_is_estimate,
                }  # fmt: skip
        report["load_after"] = os.getloadavg()
    return report


def render(report: dict[str, Any]) -> str:
    env = report["environment"]
    lines = [
        "# `outbox stats` on a partitioned table",
        "",
        f"`python -m bench.stats_partitioned --done {report['done']} --pending "
        f"{report['pending']} --partition-size {report['partition_size']} --rounds "
        f"{report['rounds']}` at {env['commit']}, PostgreSQL {env['postgresql']}, "
        f"{env['cores']} cores; started {env['started']}.",
        "",
        f"{report['done']:,} done rows and {report['pending']:,} pending ones, plain and in "
        f"{report['partitions']} partitions of {report['partition_size']:,} ids (the last ones "
        "made ahead), vacuumed and analyzed. Warm: one snapshot on a connection that ran it "
        "before (a poller); cold: a new connection and its first snapshot (one `outbox stats` "
        "command, less the process's start-up). Medians of the rounds, alternating sides; "
        "first on the table as filled, then after one `outbox maintain --retention 7d` "
        f"(what the operator's timer runs), which noted {report['noted']} partitions finished.",
        "",
        "| partitioned table | snapshot | plain | partitioned | ratio |",
        "|---|---|---|---|---|",
    ]
    ratios = {}
    for phase, times in report["times"].items():
        for kind in ("warm", "cold"):
            plain = statistics.median(times["plain"][kind])
            parted = statistics.median(times["partitioned"][kind])
            ratios[phase, kind] = parted / plain
            lines.append(
                f"| {phase} | {kind} | {plain * 1000:.1f} ms | {parted * 1000:.1f} ms | "
                f"{parted / plain:.2f}x |"
            )
    worst = max(ratios["maintained", "warm"], ratios["maintained", "cold"])
    verdict = "met" if worst <= GOAL else "not met"
    stats = report["stats"]
    before, after = report["load_before"], report["load_after"]
    lines += [
        "",
        f"Goal, within {GOAL}x the plain table's time on a maintained table: {verdict} "
        f"(warm {ratios['maintained', 'warm']:.2f}x, cold {ratios['maintained', 'cold']:.2f}x).",
        "",
        f"Done rows read: {stats['plain']['done']} plain, {stats['partitioned']['done']} "
        f"partitioned (estimates: {stats['plain']['estimate']}, "
        f"{stats['partitioned']['estimate']}); pending {stats['plain']['pending']} and "
        f"{stats['partitioned']['pending']}.",
        "",
        f"Load average before: {before[0]:.2f}, after: {after[0]:.2f} (2 cores shared with "
        "other work).",
        "",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.stats_partitioned", description=__doc__)
    parser.add_argument("--done", type=int, default=2_000_000, help="done rows (2000000)")
    parser.add_argument("--pending", type=int, default=1000, help="pending rows (1000)")
    parser.add_argument(
        "--partition-size", type=int, default=10_000, help="ids a partition (10000)"
    )
    parser.add_argument("--rounds", type=int, default=30, help="snapshots each side (30)")
    parser.add_argument("--out", default="bench/results", help="where the results go")
    args = parser.parse_args()
    report = run(args.done, args.pending, args.partition_size, args.rounds)
    write_results(args.out, "stats_partitioned", report, render(report))


if __name__ == "__main__":
    main()
