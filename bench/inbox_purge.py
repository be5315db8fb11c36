"""The receiving end's purge (`outbox inbox purge`, outbox.inbox.purge) on a large inbox.

The inbox stays one plain table keyed by (consumer, message_id) (partitioned by time, the key
would be unique only within a partition). A receiver keeps it small by purging, from a timer,
the keys older than the retention, which must outlast the sender's redelivery window. This
bench builds `--keys` keys received evenly over the retention and two purge intervals (as a
receiver that has run that long holds them), then, as the timer would:

1. purges the oldest interval's keys (batches of 5,000, each its own transaction);
2. purges the next interval's, before any vacuum (the first batch walks the index entries
   the last purge left dead);
3. runs the VACUUMs that autovacuum would (timed, with their WAL): one that skips the
   indexes (fewer than 2% of the pages hold dead keys), one that cleans them;
4. receives two intervals' keys again: how much the table grows, against what the keys take.

Reported: each purge's batches (count, median and slowest time), its total time and WAL, the
VACUUM's time and WAL, and the table's size with its indexes at each step. Autovacuum is off
for the table during the bench so that the steps above happen when the bench says.

    python -m bench.inbox_purge [--keys 50000000] [--retention-hours 336] [--interval-hours 1]

writes bench/results/inbox_purge.json and inbox_purge.md.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from datetime import timedelta
from typing import Any

import psycopg

from bench.env import Bench, statement_text, write_results
from outbox import inbox
from outbox.runner import observe
from outbox.table import Table

TABLE = Table.parse("billing_inbox")
CONSUMER = "billing"
# What autovacuum runs after the purges: a VACUUM, which skips the indexes while the dead
# keys are on fewer than 2% of the table's pages (PostgreSQL's bypass), then one that cleans
# them (what it does once they pass that share), after which the space is reusable.
VACUUMS = (
    ("vacuum", "VACUUM billing_inbox"),
    ("vacuum_indexes", "VACUUM (INDEX_CLEANUP ON) billing_inbox"),
)
# Rows a load statement inserts: each is one transaction, so the load can be watched.
LOAD_CHUNK = 5_000_000


class _BatchTimer(psycopg.Connection[Any]):
    """A connection that keeps the wall time of each DELETE it runs (a purge batch)."""

    batches: list[float]

    def execute(self, query: Any, *args: Any, **kwargs: Any) -> Any:  # type: ignore[override]
        started = time.perf_counter()
        try:
            return super().execute(query, *args, **kwargs)
        finally:
            self.add(query, time.perf_counter() - started)

    def add(self, query: Any, seconds: float) -> None:
        """A statement's time, kept if it is a purge batch: run here, or by outbox.runner on
        a cursor of its own."""
        if "DELETE FROM" in statement_text(self, query):
            self.batches.append(seconds)


def _size(conn: psycopg.Connection[Any]) -> dict[str, float]:
    row = conn.execute(
        "SELECT pg_relation_size(%(t)s), pg_indexes_size(%(t)s), "
        "(SELECT count(*) FROM billing_inbox)",
        {"t": str(TABLE)},
    ).fetchone()
    assert row is not None
    return {"table": float(row[0]), "indexes": float(row[1]), "keys": float(row[2])}


def _wal(conn: psycopg.Connection[Any]) -> str:
    return str(conn.execute("SELECT pg_current_wal_lsn()").fetchone()[0])  # type: ignore[index]


def _wal_since(conn: psycopg.Connection[Any], lsn: str) -> float:
    row = conn.execute("SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), %s)", (lsn,)).fetchone()
    return float(row[0])  # type: ignore[index]


def _load(conn: psycopg.Connection[Any], first: int, count: int, span: timedelta) -> None:
    """`count` keys (outbox ids as text, from `first`), received evenly over the `span` that
    ends now, oldest first."""
    for start in range(first, first + count, LOAD_CHUNK):
        end = min(start + LOAD_CHUNK, first + count)
        conn.execute(
            "INSERT INTO billing_inbox (consumer, message_id, received_at) "
            "SELECT %(consumer)s, g::text, now() - %(span)s * (1 - (g - %(first)s)::float8 "
            "/ %(count)s) FROM generate_series(%(start)s::bigint, %(end)s - 1) AS g",
            {"consumer": CONSUMER, "span": span, "first": first, "count": count,
             "start": start, "end": end},
        )  # fmt: skip


def _build(dsn: str, keys: int, span: timedelta) -> float:
    """The inbox as `outbox inbox migrate` makes it, holding `keys` keys; seconds taken."""
    started = time.perf_counter()
    with psycopg.connect(dsn, autocommit=True) as conn:
        inbox.migrate(conn, TABLE)
        conn.execute("ALTER TABLE billing_inbox SET (autovacuum_enabled = off)")
        # Loaded without its indexes, which are built after (sorted, not inserted one by one),
        # then checked to be what the migration makes.
        conn.execute("ALTER TABLE billing_inbox DROP CONSTRAINT billing_inbox_pkey")
        conn.execute("DROP INDEX billing_inbox_received")
        _load(conn, 1, keys, span)
        conn.execute("SET maintenance_work_mem = '256MB'")
        conn.execute("ALTER TABLE billing_inbox ADD PRIMARY KEY (consumer, message_id)")
        for statement in inbox.migration_statements(TABLE):  # the received_at index, as made
            conn.execute(statement)
        inbox.check(conn, TABLE)
        indexes = conn.execute(
            "SELECT count(*) FROM pg_indexes WHERE tablename = 'billing_inbox'"
        ).fetchone()
        assert indexes == (2,), f"the inbox's indexes were not all rebuilt: {indexes}"
        conn.execute("VACUUM (ANALYZE) billing_inbox")
    return time.perf_counter() - started


def _purge(dsn: str, older_than: timedelta) -> dict[str, Any]:
    with _BatchTimer.connect(dsn, autocommit=True) as conn:
        conn.batches = []
        observe(conn, conn.add)
        conn.execute("CHECKPOINT")
        lsn = _wal(conn)
        started = time.perf_counter()
        result = inbox.purge(conn, TABLE, older_than=older_than)
        seconds = time.perf_counter() - started
        wal = _wal_since(conn, lsn)
        return {
            "deleted": result.deleted, "seconds": seconds, "wal_bytes": wal,
            "batches": list(conn.batches), "size": _size(conn),
        }  # fmt: skip


def run(keys: int, retention: timedelta, interval: timedelta) -> dict[str, Any]:
    span = retention + 2 * interval
    report: dict[str, Any] = {
        "keys": keys, "retention_hours": retention / timedelta(hours=1),
        "interval_hours": interval / timedelta(hours=1),
    }  # fmt: skip
    with Bench() as bench:
        report["environment"] = bench.environment()
        report["load_before"] = os.getloadavg()
        with bench.database(outbox=False) as dsn:
            report["build_seconds"] = _build(dsn, keys, span)
            with psycopg.connect(dsn, autocommit=True) as conn:
                report["size_built"] = _size(conn)
            report["purge_first"] = _purge(dsn, retention + interval)
            report["purge_next"] = _purge(dsn, retention)
            with psycopg.connect(dsn, autocommit=True) as conn:
                for name, statement in VACUUMS:
                    lsn = _wal(conn)
                    started = time.perf_counter()
                    conn.execute(statement)
                    report[name] = {
                        "seconds": time.perf_counter() - started,
                        "wal_bytes": _wal_since(conn, lsn),
                        "size": _size(conn),
                    }
                per_interval = round(keys * (interval / span))
                _load(conn, keys + 1, 2 * per_interval, 2 * interval)
                report["size_refilled"] = _size(conn)
        report["load_after"] = os.getloadavg()
    return report


def _mib(value: float) -> str:
    return f"{value / 1048576:,.1f} MiB"


def _sizes(size: dict[str, float]) -> str:
    return f"{int(size['keys']):,} keys, {_mib(size['table'])} + {_mib(size['indexes'])} indexes"


def render(report: dict[str, Any]) -> str:
    env = report["environment"]
    lines = [
        "# The inbox's purge on a large inbox",
        "",
        f"`python -m bench.inbox_purge --keys {report['keys']} --retention-hours "
        f"{report['retention_hours']:g} --interval-hours {report['interval_hours']:g}` at "
        f"{env['commit']}, PostgreSQL {env['postgresql']}, {env['cores']} cores; started "
        f"{env['started']}.",
        "",
        f"{report['keys']:,} keys (outbox ids as text, one consumer) received evenly over the "
        f"retention ({report['retention_hours']:g} h) and two purge intervals "
        f"({report['interval_hours']:g} h each); built in {report['build_seconds']:.0f} s "
        f"({_sizes(report['size_built'])}). Each purge deletes one interval's keys in "
        "batches of 5,000 (`outbox inbox purge`); autovacuum is off for the table so that "
        "the VACUUM runs where the table says.",
        "",
        "| step | keys deleted | batches | batch median | slowest batch | time | WAL | "
        "size after |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, key in (("purge, oldest interval", "purge_first"), ("purge, next interval "
                      "(before any vacuum)", "purge_next")):  # fmt: skip
        p = report[key]
        batches = p["batches"] or [0.0]
        lines.append(
            f"| {name} | {p['deleted']:,} | {len(p['batches'])} | "
            f"{statistics.median(batches) * 1000:.1f} ms | {max(batches) * 1000:.1f} ms | "
            f"{p['seconds']:.2f} s | {_mib(p['wal_bytes'])} | {_sizes(p['size'])} |"
        )
    for name, key in (("VACUUM (indexes skipped: under 2% of pages)", "vacuum"),
                      ("VACUUM (INDEX_CLEANUP ON)", "vacuum_indexes")):  # fmt: skip
        v = report[key]
        lines.append(
            f"| {name} | | | | | {v['seconds']:.2f} s | {_mib(v['wal_bytes'])} "
            f"| {_sizes(v['size'])} |"
        )
    before, after = report["vacuum_indexes"]["size"], report["size_refilled"]
    added = after["keys"] - before["keys"]
    per_key = report["size_built"]["table"] / report["size_built"]["keys"]
    grew = after["table"] - before["table"]
    lines += [
        "",
        f"Then {int(added):,} keys received (two intervals' worth): {_sizes(after)}; the table "
        f"grew by {_mib(grew)} where those keys take about {_mib(added * per_key)} at the "
        f"table's end ({grew / max(added * per_key, 1):.0%}: the rest went into space the "
        "purges freed), the indexes by "
        f"{_mib(after['indexes'] - before['indexes'])}.",
        "",
        f"Load average before: {report['load_before'][0]:.2f}, after: "
        f"{report['load_after'][0]:.2f} (2 cores shared with other work).",
        "",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.inbox_purge", description=__doc__)
    parser.add_argument("--keys", type=int, default=50_000_000, help="keys held (50000000)")
    parser.add_argument(
        "--retention-hours", type=float, default=336, help="purge keys older than this (336)"
    )
    parser.add_argument(
        "--interval-hours", type=float, default=1, help="time between two purges (1)"
    )
    parser.add_argument("--out", default="bench/results", help="where the results go")
    args = parser.parse_args()
    report = run(
        args.keys, timedelta(hours=args.retention_hours), timedelta(hours=args.interval_hours)
    )
    write_results(args.out, "inbox_purge", report, render(report))


if __name__ == "__main__":
    main()
