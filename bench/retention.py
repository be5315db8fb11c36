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
import os
import threading
import time
from datetime import timedelta
from typing import Any

import psycopg

from bench.env import Bench, seed_outbox, statement_text, write_results
from outbox.operations.maintenance import purge_done
from outbox.operations.partition_maintenance import maintain
from outbox.partitions import Layout
from outbox.runner import observe
from outbox.schema import migrate
from outbox.table import Table

TABLE = Table.parse("outbox")
SAMPLE_SECONDS = 0.005
RETENTION = timedelta(days=7)


class _Timed(psycopg.Connection[Any]):
    """A connection that adds up the wall time of its statements by kind (their first
    words: DETACH, DROP, ANALYZE, SELECT, ...)."""

    spent: dict[str, float]

    def execute(self, query: Any, *args: Any, **kwargs: Any) -> Any:  # type: ignore[override]
        started = time.perf_counter()
        try:
            return super().execute(query, *args, **kwargs)
        finally:
            self.add(query, time.perf_counter() - started)

    def add(self, query: Any, seconds: float) -> None:
        """A statement's time: run here, or by outbox.runner on a cursor of its own."""
        kind = _kind(statement_text(self, query))
        self.spent[kind] = self.spent.get(kind, 0.0) + seconds


def _kind(text: str) -> str:
    words = text.split()
    if words[:2] == ["ALTER", "TABLE"]:
        rest = " ".join(words[3:])
        if "DETACH" in rest:
            return "DETACH ... FINALIZE" if "FINALIZE" in rest else "DETACH ... CONCURRENTLY"
        return "ATTACH" if "ATTACH" in rest else "ALTER TABLE"
    return " ".join(words[:2]) if words[:1] in (["DROP"], ["CREATE"], ["COMMENT"]) else words[0]


class _Waits(threading.Thread):
    """Samples what a backend waits for (pg_stat_activity, every SAMPLE_SECONDS) from a
    connection of its own: the share of a statement's time spent waiting for a lock (other
    sessions' snapshots, autovacuum on the partition) rather than working."""

    def __init__(self, dsn: str, pid: int) -> None:
        super().__init__(daemon=True)
        self.dsn, self.pid, self.stop = dsn, pid, threading.Event()
        self.samples: dict[str, int] = {}

    def run(self) -> None:
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            while not self.stop.wait(SAMPLE_SECONDS):
                row = conn.execute(
                    "SELECT state, wait_event_type, wait_event, query FROM pg_stat_activity "
                    "WHERE pid = %s",
                    (self.pid,),
                ).fetchone()
                if row is None or row[0] != "active":
                    continue
                key = _kind(row[3]) + (f": waiting ({row[1]}: {row[2]})" if row[1] else "")
                self.samples[key] = self.samples.get(key, 0) + 1


def _measure(dsn: str, retire: Any) -> dict[str, Any]:
    with _Timed.connect(dsn, autocommit=True) as conn:
        conn.spent = {}
        observe(conn, conn.add)
        conn.execute("CHECKPOINT")
        wal_before = conn.execute("SELECT pg_current_wal_lsn()").fetchone()[0]  # type: ignore[index]
        waits = _Waits(dsn, conn.info.backend_pid)
        waits.start()
        conn.spent = {}
        started = time.perf_counter()
        rows = retire(conn)
        seconds = time.perf_counter() - started
        spent = dict(conn.spent)
        waits.stop.set()
        waits.join()
        wal = conn.execute(
            "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), %s)", (wal_before,)
        ).fetchone()[0]  # type: ignore[index]
        size = conn.execute(
            "SELECT pg_total_relation_size('outbox') + coalesce((SELECT "
            "sum(pg_total_relation_size(relid)) FROM pg_partition_tree('outbox') "
            "WHERE relid <> 'outbox'::regclass), 0)"
        ).fetchone()[0]  # type: ignore[index]
    return {
        "rows": rows, "seconds": seconds, "wal_bytes": float(wal), "size_after": float(size),
        "by_statement": spent, "samples": waits.samples, "sample_seconds": SAMPLE_SECONDS,
    }  # fmt: skip


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
            # The run before, as the operator's timer or a CronJob makes it: partitions made
            # ahead of the rows just written, the finished ones noted, the parent analyzed.
            report["partitioned_before"] = _measure(
                dsn, lambda conn: len(maintain(conn, TABLE, retention=RETENTION).kept)
            )
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
        f"The server's data directory is on {env.get('data_file_system', 'unknown')} (a DROP "
        "gives its files' space back to the file system before it returns: with `discard` "
        "among the options, each freed extent is trimmed on the disk first).",
        "",
        "| | rows retired | database time | WAL written | size after |",
        "|---|---|---|---|---|",
    ]
    for name, r in (("plain, batched DELETE", plain), ("partitioned, DROP", parted)):
        lines.append(
            f"| {name} | {int(r['rows']):,} | {r['seconds']:.2f} s | {_mib(r['wal_bytes'])} | "
            f"{_mib(r['size_after'])} |"
        )
    before_run = report["partitioned_before"]
    lines += [
        "",
        f"The run before it (`outbox maintain --retention 7d` on the rows just written, as a "
        f"timer runs it: partitions made ahead, {int(before_run['rows'])} finished ones noted, "
        f"the parent analyzed) took {before_run['seconds']:.2f} s; the retirement measured is "
        "the next run, with a retention of 0.",
        "",
        *_breakdown(parted),
    ]
    verdict = "met" if parted["seconds"] < 1 else "not met"
    times = plain["seconds"] / max(parted["seconds"], 1e-9)
    working = parted["seconds"] - sum(
        seconds * _waiting_share(parted["samples"], kind)
        for kind, seconds in parted["by_statement"].items()
    )
    before, after = report["load_before"], report["load_after"]
    lines += [
        "",
        f"Goal, under 1 s of database time for the drop path: {verdict} "
        f"({parted['seconds']:.2f} s, of which {working:.2f} s working and the rest waiting "
        f"for locks; the DELETE took {times:,.0f}x as long).",
        "",
        f"Load average before: {before[0]:.2f}, after: {after[0]:.2f} (2 cores shared with other "
        "work).",
        "",
    ]
    return "\n".join(lines)


def _waiting_share(samples: dict[str, int], kind: str) -> float:
    """Of the samples that found the backend in statements of `kind`, the share waiting for a
    lock."""
    of_kind = {k: n for k, n in samples.items() if k.split(":")[0] == kind}
    waiting = sum(n for k, n in of_kind.items() if "waiting (Lock" in k)
    return waiting / max(sum(of_kind.values()), 1)


def _breakdown(side: dict[str, Any]) -> list[str]:
    """The drop path's time by statement, split into waiting for locks and the rest."""
    lines = [
        "The drop path's time by statement (wall time on its connection), and the share of "
        f"it the backend was seen waiting for a lock (pg_stat_activity sampled every "
        f"{side['sample_seconds'] * 1000:g} ms from another connection):",
        "",
        "| statement | time | waiting for locks | working |",
        "|---|---|---|---|",
    ]
    waited = 0.0
    for kind, seconds in sorted(side["by_statement"].items(), key=lambda kv: -kv[1]):
        wait = seconds * _waiting_share(side["samples"], kind)
        waited += wait
        lines.append(
            f"| {kind} | {seconds * 1000:,.1f} ms | {wait * 1000:,.1f} ms | "
            f"{(seconds - wait) * 1000:,.1f} ms |"
        )
    total = side["seconds"]
    lines += [
        f"| all | {total * 1000:,.1f} ms | {waited * 1000:,.1f} ms | "
        f"{(total - waited) * 1000:,.1f} ms |",
        "",
        "Waits seen: "
        + (
            ", ".join(f"{k} x{n}" for k, n in sorted(side["samples"].items()) if "waiting" in k)
            or "none"
        )
        + ".",
    ]
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.retention", description=__doc__)
    parser.add_argument("--rows", type=int, default=10_000_000, help="done rows (10000000)")
    parser.add_argument(
        "--partition-size", type=int, default=1_000_000, help="ids a partition (1000000)"
    )
    parser.add_argument("--out", default="bench/results", help="where the results go")
    args = parser.parse_args()
    report = run(args.rows, args.partition_size)
    write_results(args.out, "retention", report, render(report))


if __name__ == "__main__":
    main()
