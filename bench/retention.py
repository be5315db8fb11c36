"""Retention: done rows retired by dropping partitions (`outbox maintain`) beside the plain
table's batched DELETE (`outbox purge`), on the same rows in the same run.

Each side starts from a fresh table holding `--rows` done rows (~200-byte payloads), and
retires them all (a retention of 0). Reported: the retirement's database time (the wall time
of its statements on one connection), the WAL it wrote, and the table's size with its indexes
afterwards (a DELETE leaves the space to vacuum; a DROP gives it back). The goal (issue 35):
under 1 s of database time for the drop path.

    python -m bench.retention [--rows 10000000] [--partition-size 1000000]

writes bench/results/retention.json and retention.md.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import psycopg

from bench.env import Bench, seed_outbox
from outbox.operations.maintenance import purge_done
from outbox.operations.partition_maintenance import maintain
from outbox.partitions import Layout
from outbox.schema import migrate
from outbox.table import Table

TABLE = Table.parse("outbox")


def _measure(dsn: str, retire: Any) -> dict[str, float]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CHECKPOINT")
        wal_before = conn.execute("SELECT pg_current_wal_lsn()").fetchone()[0]  # type: ignore[index]
        started = time.perf_counter()
        rows = retire(conn)
        seconds = time.perf_counter() - started
        wal = conn.execute(
            "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), %s)", (wal_before,)
        ).fetchone()[0]  # type: ignore[index]
        size = conn.execute(
            "SELECT pg_total_relation_size('outbox') + coalesce((SELECT "
            "sum(pg_total_relation_size(relid)) FROM pg_partition_tree('outbox') "
            "WHERE relid <> 'outbox'::regclass), 0)"
        ).fetchone()[0]  # type: ignore[index]
    return {"rows": rows, "seconds": seconds, "wal_bytes": float(wal), "size_after": float(size)}


def run(rows: int, partition_size: int) -> dict[str, Any]:
    report: dict[str, Any] = {"rows": rows, "partition_size": partition_size}
    with Bench() as bench:
        report["environment"] = bench.environment()
        report["load_before"] = os.getloadavg()
        with bench.database() as dsn:
            seed_outbox(dsn, rows, status="done")
            report["plain"] = _measure(
                dsn, lambda conn: purge_done(conn, TABLE, older_than=timedelta(0))
            )
        with bench.database(outbox=False) as dsn:
            with psycopg.connect(dsn, autocommit=True) as conn:
                ahead = rows // partition_size + 1
                migrate(conn, TABLE, layout=Layout(partition_size, ahead))
            # The partition holding the newest id is never retired: the last row stays.
            seed_outbox(dsn, rows, status="done")
            report["partitioned"] = _measure(
                dsn,
                lambda conn: maintain(conn, TABLE, retention=timedelta(0)).rows_retired,
            )
        report["load_after"] = os.getloadavg()
    return report


def _mib(value: float) -> str:
    return f"{value / 1048576:,.1f} MiB"


def render(report: dict[str, Any]) -> str:
    env, plain, parted = report["environment"], report["plain"], report["partitioned"]
    lines = [
        "# Retention: DROP of partitions vs batched DELETE",
        "",
        f"`python -m bench.retention --rows {report['rows']} --partition-size "
        f"{report['partition_size']}` at {env['commit']}, PostgreSQL {env['postgresql']}, "
        f"{env['cores']} cores; started {env['started']}.",
        "",
        f"{report['rows']:,} done rows (~200-byte payloads) retired with a retention of 0: "
        "`outbox purge` (DELETE in batches of 5,000) on a plain table, `outbox maintain` "
        f"(DETACH ... CONCURRENTLY, DROP) on a table of {report['partition_size']:,}-id "
        "partitions. Database time is the wall time of the retirement's statements on one "
        "connection; WAL from pg_current_wal_lsn(); size is the table with its indexes after.",
        "",
        "| | rows retired | database time | WAL written | size after |",
        "|---|---|---|---|---|",
    ]
    for name, r in (("plain, batched DELETE", plain), ("partitioned, DROP", parted)):
        lines.append(
            f"| {name} | {int(r['rows']):,} | {r['seconds']:.2f} s | {_mib(r['wal_bytes'])} | "
            f"{_mib(r['size_after'])} |"
        )
    verdict = "met" if parted["seconds"] < 1 else "not met"
    times = plain["seconds"] / max(parted["seconds"], 1e-9)
    before, after = report["load_before"], report["load_after"]
    lines += [
        "",
        f"Goal, under 1 s of database time for the drop path: {verdict} "
        f"({parted['seconds']:.2f} s; the DELETE took {times:,.0f}x as long).",
        "",
        f"Load average before: {before[0]:.2f}, after: {after[0]:.2f} (2 cores shared with other "
        "work).",
        "",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.retention", description=__doc__)
    parser.add_argument("--rows", type=int, default=10_000_000, help="done rows (10000000)")
    parser.add_argument(
        "--partition-size", type=int, default=1_000_000, help="ids a partition (1000000)"
    )
    parser.add_argument("--out", default="bench/results", help="where the results go")
    args = parser.parse_args()
    report = run(args.rows, args.partition_size)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "retention.json").write_text(json.dumps(report, indent=2))
    (out / "retention.md").write_text(render(report))
    print(render(report))


if __name__ == "__main__":
    main()
