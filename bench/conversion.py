"""The online conversion of a plain outbox table to the partitioned layout, on a big table,
with a producer inserting throughout: what it locks, and for how long.

A plain table holding `--rows` done rows (~200-byte payloads) is converted by what `outbox
migrate --partition-size` runs (outbox.operations.conversion), while a producer inserts one
message a transaction, as an application does, from before the conversion to after it.
Reported:

- the VALIDATE of the first partition's CHECK: its time (a scan of the whole table under
  SHARE UPDATE EXCLUSIVE, which does not block writes), and the producer's inserts meanwhile;
- the moments of ACCESS EXCLUSIVE lock: adding the CHECK NOT VALID, and the swap (rename,
  the parent made, ATTACH without a scan, indexes attached, the next partition made), each
  timed from the lock's grant to the commit;
- the producer's longest stall (one insert's time) in each phase, beside its own inserts
  before the conversion in the same run (the baseline: what the machine does anyway).

    python -m bench.conversion [--rows 10000000] [--partition-size 1000000]

writes bench/results/conversion.json and conversion.md.
"""

from __future__ import annotations

import argparse
import os
import threading
import time
from typing import Any

import psycopg

from bench.env import Bench, seed_outbox, write_results
from outbox import enqueue
from outbox.operations.conversion import convert
from outbox.partitions import DEFAULT_PARTITIONS_AHEAD, Layout
from outbox.schema import migrate
from outbox.table import Table

TABLE = Table.parse("outbox")
BASELINE_SECONDS = 10.0  # the producer alone before the conversion
AFTER_SECONDS = 5.0  # and after it
PRODUCER_PAUSE = 0.002  # between its inserts: a steady few hundred a second


class Producer(threading.Thread):
    """One insert a transaction until stopped; (start, seconds) of each insert."""

    def __init__(self, dsn: str) -> None:
        super().__init__(daemon=True)
        self.dsn = dsn
        self.inserts: list[tuple[float, float]] = []
        self.stopping = threading.Event()

    def run(self) -> None:
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            n = 0
            while not self.stopping.wait(PRODUCER_PAUSE):
                started = time.monotonic()
                enqueue(conn, aggregate_type="order", aggregate_id=str(n % 100),
                        event_type="Placed", payload={"n": n})  # fmt: skip
                self.inserts.append((started, time.monotonic() - started))
                n += 1

    def between(self, start: float, end: float) -> dict[str, float]:
        took = sorted(s for t, s in self.inserts if start <= t < end)
        if not took:
            return {"inserts": 0, "p50_ms": 0.0, "p99_ms": 0.0, "max_ms": 0.0}
        return {
            "inserts": len(took),
            "p50_ms": took[len(took) // 2] * 1000,
            "p99_ms": took[min(len(took) - 1, len(took) * 99 // 100)] * 1000,
            "max_ms": took[-1] * 1000,
        }


def run(rows: int, partition_size: int) -> dict[str, Any]:
    report: dict[str, Any] = {"rows": rows, "partition_size": partition_size}
    with Bench() as bench:
        report["environment"] = bench.environment()
        with bench.database() as dsn:
            started = time.monotonic()
            seed_outbox(dsn, rows, status="done")
            report["seed_seconds"] = time.monotonic() - started
            with psycopg.connect(dsn, autocommit=True) as conn:
                report["table_bytes"] = conn.execute(
                    "SELECT pg_total_relation_size('outbox')"
                ).fetchone()[0]  # type: ignore[index]
                report["load_before"] = os.getloadavg()
                producer = Producer(dsn)
                producer.start()
                time.sleep(BASELINE_SECONDS)  # the baseline: the producer alone, measured
                marks: dict[str, float] = {"start": time.monotonic()}
                done = convert(
                    conn,
                    TABLE,
                    Layout(partition_size, DEFAULT_PARTITIONS_AHEAD),
                    before_swap=lambda: marks.__setitem__("swap", time.monotonic()),
                )
                marks["swapped"] = time.monotonic()
                migrate(conn, TABLE, layout=Layout(partition_size, DEFAULT_PARTITIONS_AHEAD))
                marks["ahead"] = time.monotonic()
                time.sleep(AFTER_SECONDS)
                producer.stopping.set()
                producer.join()
                report["load_after"] = os.getloadavg()
        assert done is not None
        report["conversion"] = {
            "bound_lock_ms": done.bound_lock_seconds * 1000,
            "validate_seconds": done.validate_seconds,
            "swap_lock_ms": done.swap_lock_seconds * 1000,
            "swap_attempts": done.swap_attempts,
            "attached_without_scan": not done.scanned,
            "first_partition_ids": [0, done.first_high - 1],
            "total_seconds": marks["swapped"] - marks["start"],
            "partitions_ahead_seconds": marks["ahead"] - marks["swapped"],
        }
        report["producer"] = {
            "baseline": producer.between(marks["start"] - BASELINE_SECONDS, marks["start"]),
            "bound_and_validate": producer.between(marks["start"], marks["swap"]),
            "swap": producer.between(marks["swap"], marks["swapped"] + 1.0),
            "after": producer.between(marks["ahead"], marks["ahead"] + AFTER_SECONDS),
        }
    return report


def render(report: dict[str, Any]) -> str:
    env, c, p = report["environment"], report["conversion"], report["producer"]
    base = p["baseline"]
    lines = [
        "# Converting a plain table to partitions, online",
        "",
        f"`python -m bench.conversion --rows {report['rows']} --partition-size "
        f"{report['partition_size']}` at {env['commit']}, PostgreSQL {env['postgresql']} "
        f"(stock settings: fsync and synchronous_commit on), {env['cores']} cores; started "
        f"{env['started']}.",
        "",
        f"A plain table of {report['rows']:,} done rows ({report['table_bytes'] / 2**30:.1f} GiB "
        "with its indexes) converted by `outbox migrate --partition-size` "
        "(outbox.operations.conversion) while a producer inserts one message a transaction, "
        "from 10 s before to 5 s after.",
        "",
        "| step | lock | time |",
        "|---|---|---|",
        f"| add the CHECK NOT VALID | ACCESS EXCLUSIVE | {c['bound_lock_ms']:.1f} ms |",
        f"| VALIDATE it (a scan of every row) | SHARE UPDATE EXCLUSIVE: writes go on | "
        f"{c['validate_seconds']:.2f} s |",
        f"| swap: rename, parent, ATTACH (without a scan: {c['attached_without_scan']}), "
        f"indexes attached, next partition (attempt {c['swap_attempts']}) | ACCESS EXCLUSIVE | "
        f"{c['swap_lock_ms']:.1f} ms |",
        f"| {DEFAULT_PARTITIONS_AHEAD} partitions made ahead, each on its own | SHARE UPDATE "
        f"EXCLUSIVE on the parent | {c['partitions_ahead_seconds']:.2f} s |",
        "",
        "The producer's inserts (one insert's time, a transaction each):",
        "",
        "| while | inserts | median | p99 | longest | longest vs the baseline's |",
        "|---|---|---|---|---|---|",
    ]
    for name, key in (
        ("before: the baseline", "baseline"),
        ("the CHECK added and validated", "bound_and_validate"),
        ("the swap (and 1 s after)", "swap"),
        ("after, partitioned", "after"),
    ):
        r = p[key]
        ratio = r["max_ms"] / base["max_ms"] if base["max_ms"] else 0.0
        lines.append(
            f"| {name} | {r['inserts']:,} | {r['p50_ms']:.2f} ms | {r['p99_ms']:.2f} ms | "
            f"{r['max_ms']:.1f} ms | {ratio:.1f}x |"
        )
    stall = max(p["bound_and_validate"]["max_ms"], p["swap"]["max_ms"])
    before, after = report["load_before"], report["load_after"]
    lines += [
        "",
        f"The producer's longest stall during the conversion: {stall:.1f} ms (its longest "
        f"before it: {base['max_ms']:.1f} ms). The first partition holds ids 0 to "
        f"{c['first_partition_ids'][1]:,}; the conversion took {c['total_seconds']:.2f} s in "
        "all, almost all of it the VALIDATE, during which the producer went on.",
        "",
        f"Load average before: {before[0]:.2f}, after: {after[0]:.2f} (2 cores shared with "
        "other work).",
        "",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.conversion", description=__doc__)
    parser.add_argument("--rows", type=int, default=10_000_000, help="rows (10000000)")
    parser.add_argument(
        "--partition-size", type=int, default=1_000_000, help="ids a partition (1000000)"
    )
    parser.add_argument("--out", default="bench/results", help="where the results go")
    args = parser.parse_args()
    report = run(args.rows, args.partition_size)
    write_results(args.out, "conversion", report, render(report))


if __name__ == "__main__":
    main()
