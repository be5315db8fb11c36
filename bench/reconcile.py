"""What `outbox reconcile` holds in memory: flat however many ids the window has.

Two PostgreSQL servers (the outbox's and the receiver's, as in production), each size seeded
with that many done rows and an inbox that recorded all of them but 37. Each run is its own
process, whose peak resident memory (ru_maxrss) is read when it ends:

- `outbox reconcile --json` (chunks of `outbox.operations.reconcile.CHUNK` ids on each side);
- the peer: the obvious comparison, every done id and every inbox key read into a Python set
  and subtracted (run at the smaller sizes only: its memory grows with the ids).

The ratios are taken within the run: the reconcile's peak at each size over its peak at the
smallest (1 means bounded), and the peer's peak over the reconcile's at the same size.

    python -m bench.reconcile [--sizes 1000000,10000000] [--out bench/results]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psycopg

from bench.env import Bench
from outbox import inbox
from outbox.demo.embedded import EmbeddedPostgres

LOST = 37
PEER_MAX = 2_000_000  # the set-based peer is run up to this size
_T0 = "2026-03-01 14:00:00+00"

# The measured process: runs `code` with `argv`, then writes its peak RSS (KiB) and the time.
_MEASURED = """
import json, resource, sys, time
started = time.perf_counter()
exec(compile(sys.argv[2], "measured", "exec"))
print(json.dumps({"peak_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
                  "seconds": time.perf_counter() - started}), file=open(sys.argv[1], "w"))
"""
_RECONCILE = """
from outbox.cli import main
try:
    main(sys.argv[3:])
except SystemExit as exit:
    assert not exit.code, exit.code
"""
_PEER = """
import psycopg
outbox_dsn, inbox_dsn = sys.argv[3], sys.argv[4]
with psycopg.connect(outbox_dsn) as conn:
    done = {str(r[0]) for r in conn.execute("SELECT id FROM outbox WHERE status = 'done'")}
with psycopg.connect(inbox_dsn) as conn:
    keys = {r[0] for r in conn.execute("SELECT message_id FROM outbox_inbox")}
missing = done - keys
assert len(missing) == int(sys.argv[5]), len(missing)
"""


def _log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def _seed(outbox_dsn: str, inbox_dsn: str, size: int) -> None:
    with psycopg.connect(outbox_dsn, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, status, "
            "attempts, created_at, done_at) SELECT 'order', (i %% 1000)::text, "
            "'Order' || (i %% 4), '{}', 'done', 1, %s::timestamptz + i * interval '1 ms', now() "
            "FROM generate_series(1, %s) AS i",
            (_T0, size),
        )
        conn.execute("VACUUM ANALYZE outbox")
    with psycopg.connect(inbox_dsn, autocommit=True) as conn:
        inbox.migrate(conn)
        conn.execute(
            "INSERT INTO outbox_inbox (consumer, message_id) SELECT 'billing', i::text "
            "FROM generate_series(1, %s) AS i WHERE i %% %s <> 0 OR i / %s > %s",
            (size, size // LOST, size // LOST, LOST),
        )
        conn.execute("VACUUM ANALYZE outbox_inbox")


def _measure(code: str, *args: str) -> dict[str, Any]:
    out = Path(os.environ.get("TMPDIR", "/tmp")) / f"reconcile-bench-{os.getpid()}.json"
    subprocess.run([sys.executable, "-c", _MEASURED, str(out), code, *args], check=True)
    result: dict[str, Any] = json.loads(out.read_text())
    out.unlink()
    return result


def run(sizes: list[int]) -> dict[str, Any]:
    results: dict[str, Any] = {"sizes": {}}
    with Bench() as bench, EmbeddedPostgres(settings={"max_connections": "50"}) as receiver:
        for size in sizes:
            with bench.database() as outbox_dsn:
                with psycopg.connect(receiver.dsn(), autocommit=True) as admin:
                    admin.execute("DROP DATABASE IF EXISTS shop")
                    admin.execute("CREATE DATABASE shop")
                inbox_dsn = receiver.dsn("shop")
                _log(f"seeding {size:,} done rows and inbox keys")
                _seed(outbox_dsn, inbox_dsn, size)
                _log(f"reconcile over {size:,} ids")
                reconcile = _measure(
                    _RECONCILE, "reconcile", "--dsn", outbox_dsn, "--inbox-dsn", inbox_dsn,
                    "--inbox-table", "outbox_inbox", "--since", "2026-03-01T00:00:00Z",
                    "--until", "2026-04-01T00:00:00Z", "--json",
                )  # fmt: skip
                entry: dict[str, Any] = {"reconcile": reconcile}
                if size <= PEER_MAX:
                    _log(f"the set-based peer over {size:,} ids")
                    entry["peer"] = _measure(_PEER, outbox_dsn, inbox_dsn, str(LOST))
                results["sizes"][str(size)] = entry
    smallest = results["sizes"][str(sizes[0])]["reconcile"]["peak_kib"]
    for entry in results["sizes"].values():
        entry["reconcile_vs_smallest"] = entry["reconcile"]["peak_kib"] / smallest
        if "peer" in entry:
            entry["peer_vs_reconcile"] = entry["peer"]["peak_kib"] / entry["reconcile"]["peak_kib"]
    results["cores"] = os.cpu_count()
    results["load_before"] = os.getloadavg()
    return results


def render(results: dict[str, Any], note: str) -> str:
    lines = [
        "# `outbox reconcile`: memory over 10M ids",
        "",
        "`python -m bench.reconcile` (outbox and inbox on two PostgreSQL servers; each "
        f"inbox lacks {LOST} of the ids). Peak resident memory of the process "
        "(ru_maxrss), and its wall time.",
        "",
        "| ids | reconcile peak | reconcile time | vs smallest | set-based peer peak | "
        "peer / reconcile |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    for size, entry in results["sizes"].items():
        r, peer = entry["reconcile"], entry.get("peer")
        lines.append(
            f"| {int(size):,} | {r['peak_kib'] / 1024:.0f} MiB | {r['seconds']:.0f} s | "
            f"{entry['reconcile_vs_smallest']:.2f} | "
            + (f"{peer['peak_kib'] / 1024:.0f} MiB | {entry['peer_vs_reconcile']:.1f} |"
               if peer else "not run | |")
        )  # fmt: skip
    lines += ["", note, ""]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="1000000,10000000")
    parser.add_argument("--out", default=str(Path(__file__).parent / "results"))
    parser.add_argument("--note", default="", help="what else loaded the machine")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    results = run(sizes)
    out = Path(args.out)
    (out / "reconcile.json").write_text(json.dumps(results, indent=2) + "\n")
    (out / "reconcile.md").write_text(render(results, args.note))
    print(render(results, args.note))


if __name__ == "__main__":
    main()
