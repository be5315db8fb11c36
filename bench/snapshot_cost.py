"""`python -m bench.snapshot_cost`: what one stats snapshot costs as the backlog grows.

The operator reads a snapshot every few seconds per resource, so its cost must not grow with
the backlog. Measured beside a named peer in the same run and on the same tables: the exact
snapshot (`exact=True`, every row counted: what every snapshot cost before counts were
bounded).

python -m bench.snapshot_cost                 # 10,000 to 5,000,000 pending rows
python -m bench.snapshot_cost --smoke         # 1,000 and 10,000: checks the harness only
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from bench.env import Bench
from outbox.stats import COUNT_LIMIT, stats_query
from outbox.table import Table

SIZES = (10_000, 100_000, 1_000_000, 5_000_000)
SMOKE_SIZES = (1_000, 10_000)
AGGREGATES = 1_000
REPEAT = 7
TABLE = Table.parse("outbox")
VARIANTS = {
    "bounded": {"exact": False, "ordered": False},
    "bounded, ordered": {"exact": False, "ordered": True},
    "exact (peer)": {"exact": True, "ordered": False},
}


def _log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def _grow(conn: psycopg.Connection[Any], pending: int, have: int) -> None:
    """Add pending rows up to `pending`, over AGGREGATES aggregates, oldest first."""
    conn.execute(
        """INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, created_at,
                               available_at)
           SELECT 'order', 'agg-' || (g %% %(aggregates)s), 'Placed',
                  jsonb_build_object('n', g, 'text', repeat('x', 150)),
                  now() - interval '1 hour' + g * interval '1 ms',
                  now() - interval '1 hour' + g * interval '1 ms'
             FROM generate_series(%(start)s::bigint, %(end)s::bigint) AS g""",
        {"aggregates": AGGREGATES, "start": have + 1, "end": pending},
    )


def _measure(conn: psycopg.Connection[Any], variant: dict[str, bool]) -> dict[str, float]:
    """Median milliseconds of one snapshot at the client over a local socket, and the
    buffers (8 kB pages) it touches: the machine-independent half of the figure."""
    query = stats_query(TABLE, **variant)
    query.parse(conn.execute(query.statement, query.params).fetchall())  # warm the cache
    runs = []
    for _ in range(REPEAT):
        started = time.perf_counter()
        query.parse(conn.execute(query.statement, query.params).fetchall())
        runs.append((time.perf_counter() - started) * 1000)
    explain = sql.SQL("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) {}").format(query.statement)
    row = conn.execute(explain, query.params).fetchone()
    assert row is not None
    plan = row[0][0]["Plan"]
    return {
        "ms": statistics.median(runs),
        "buffers": plan["Shared Hit Blocks"] + plan["Shared Read Blocks"],
    }


def run(sizes: tuple[int, ...]) -> dict[str, Any]:
    rows: list[dict[str, Any]] = []
    # An ordered table: the bounded, ordered snapshot probes ordered mode's index.
    with (
        Bench() as bench,
        bench.database(ordering="aggregate") as dsn,
        psycopg.connect(dsn, autocommit=True) as conn,
    ):
        environment = bench.environment()
        have = 0
        for size in sizes:
            _log(f"snapshot cost: growing to {size:,} pending rows")
            _grow(conn, size, have)
            if not have:  # a few rows in flight, as a busy table has
                conn.execute(
                    "UPDATE outbox SET status = 'processing', "
                    "lease_until = now() + interval '1 hour' WHERE id <= 50"
                )
            have = size
            conn.execute("VACUUM ANALYZE outbox")
            measured = {name: _measure(conn, variant) for name, variant in VARIANTS.items()}
            stats = stats_query(TABLE).parse(
                conn.execute(stats_query(TABLE).statement, {"limit": COUNT_LIMIT}).fetchall()
            )
            rows.append(
                {
                    "pending": size,
                    "ms": {name: m["ms"] for name, m in measured.items()},
                    "buffers": {name: m["buffers"] for name, m in measured.items()},
                    "ready_estimate": stats.ready_estimate,
                    "counted_ready": stats.ready,
                }
            )
            _log(
                f"  {size:,}: "
                + ", ".join(
                    f"{k} {m['ms']:.2f} ms, {m['buffers']} buffers" for k, m in measured.items()
                )
            )
    first, last = rows[0]["ms"], rows[-1]["ms"]
    return {
        "environment": environment,
        "count_limit": COUNT_LIMIT,
        "aggregates": AGGREGATES,
        "repeat": REPEAT,
        "rows": rows,
        "growth": {name: last[name] / first[name] for name in VARIANTS},
        "buffer_growth": {
            name: rows[-1]["buffers"][name] / rows[0]["buffers"][name] for name in VARIANTS
        },
    }


def render(report: dict[str, Any]) -> str:
    env = report["environment"]
    names = list(VARIANTS)
    lines = [
        "# What one stats snapshot costs as the backlog grows",
        "",
        f"`python -m bench.snapshot_cost`: PostgreSQL {env['postgresql']} (embedded, stock "
        f"settings), {env['cores']} cores, commit {env['commit']}. Median of {report['repeat']} "
        f"snapshots at the client over a local socket; pending rows over "
        f"{report['aggregates']:,} aggregates, 50 in flight, after VACUUM ANALYZE. Counts stop "
        f"at {report['count_limit']:,}; the peer counts every row.",
        "",
        "| pending rows | "
        + " | ".join(f"{n}: ms (buffers)" for n in names)
        + " | peer / bounded | ready estimate |",
        "|---:|" + "---:|" * (len(names) + 2),
    ]
    for row in report["rows"]:
        ms, buffers = row["ms"], row["buffers"]
        ratio = ms["exact (peer)"] / ms["bounded"]
        cells = " | ".join(f"{ms[n]:,.1f} ({buffers[n]:,})" for n in names)
        lines.append(
            f"| {row['pending']:,} | {cells} | {ratio:,.1f}x | {row['ready_estimate']:,} |"
        )
    growth = ", ".join(f"{n}: {g:.2f}x" for n, g in report["growth"].items())
    first, last = report["rows"][0]["pending"], report["rows"][-1]["pending"]
    pages = ", ".join(f"{n}: {g:.2f}x" for n, g in report["buffer_growth"].items())
    lines += [
        "",
        f"At {last:,} against {first:,} pending rows, time: {growth}; buffers touched: "
        f"{pages}. Times are of a shared 2-core machine (noisy); the buffers are not.",
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.snapshot_cost", description=__doc__)
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--out", type=Path, default=Path("bench/results"))
    args = parser.parse_args(argv)
    report = run(SMOKE_SIZES if args.smoke else SIZES)
    report["smoke"] = args.smoke
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "autoscaling_snapshot_cost.json").write_text(json.dumps(report, indent=2) + "\n")
    text = render(report)
    (args.out / "autoscaling_snapshot_cost.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
