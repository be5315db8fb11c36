"""The SQL-only ceiling: our claim and batched finalize statements driven by pgbench, no Python.

Each pgbench transaction claims a batch and finalizes it (two statements, as the worker
does); the rate in messages per second is what the database alone can do.
"""

from __future__ import annotations

import re
import subprocess
import time
from pathlib import Path

import psycopg

from bench.env import Bench, seed_outbox
from outbox.demo.embedded import _bin_dir
from outbox.limits import CLAIM_BYTES, WORKER_MAX_PAYLOAD_BYTES
from outbox.queries import queries
from outbox.table import Table


def pgbench_script(batch: int) -> str:
    q = queries(Table.parse("outbox"))
    claim = q.claim.as_string(None)
    for name, value in {"batch": str(batch), "owner": "'pgbench'", "lease": "'60 seconds'",
                        "max_attempts": "12", "max_payload_bytes": str(WORKER_MAX_PAYLOAD_BYTES),
                        "claim_bytes": str(CLAIM_BYTES)}.items():  # fmt: skip
        claim = claim.replace(f"%({name})s", value)
    ctes, _, update = claim.rpartition("\nUPDATE ")
    update = "UPDATE " + update.split("RETURNING")[0] + "RETURNING o.id, o.lease_version"
    done = q.finalize_done.as_string(None)
    done = done.replace("%(ids)s", ":ids").replace("%(versions)s", ":versions")
    done = done.replace("%(n)s", str(batch))
    # pgbench can carry only scalars between statements: the claimed ids travel as array text.
    # Composed from our own statements only, no outside input.
    return (
        ctes + ", claimed AS (" + update + ")\n"  # noqa: S608
        "SELECT coalesce(quote_literal(array_agg(id)::text), '''{}''') AS ids,\n"
        "       coalesce(quote_literal(array_agg(lease_version)::text), '''{}''') AS versions\n"
        "  FROM claimed \\gset\n" + " ".join(done.split()) + ";\n"
    )


def run_ceiling(
    bench: Bench,
    messages: int,
    clients: int,
    batch: int = 500,
    aggregates: int = 1000,
    ordering: str | None = None,
) -> float:
    """Messages per second of the claim and finalize statements alone, on a table migrated
    with `ordering` (what ordered mode's index costs unordered claims)."""
    with bench.database(ordering=ordering) as dsn:
        seed_outbox(dsn, messages, aggregates=aggregates)
        return pgbench_cycles(bench, dsn, pgbench_script(batch), messages, clients, batch)


def pgbench_cycles(
    bench: Bench, dsn: str, text: str, messages: int, clients: int, batch: int
) -> float:
    """Messages per second of pgbench running `text` (claim and finalize) until all are done."""
    script = Path(bench.server.data_dir) / f"ceiling-{clients}.sql"
    script.write_text(text)
    per_client = -(-messages // (batch * clients))
    started = time.monotonic()
    result = subprocess.run(
        [str(_bin_dir() / "pgbench"), "-n", "-f", str(script), "-c", str(clients), "-j",
         str(clients), "-t", str(per_client), dsn],
        capture_output=True, text=True,
    )  # fmt: skip
    elapsed = time.monotonic() - started
    if result.returncode != 0:
        raise RuntimeError(f"pgbench failed: {result.stderr.strip()[-500:]}")
    with psycopg.connect(dsn) as conn:
        done = conn.execute("SELECT count(*) FROM outbox WHERE status = 'done'").fetchone()[0]  # type: ignore[index]
    if done != messages:
        raise RuntimeError(f"pgbench finalized {done} of {messages}")
    # pgbench's own clock excludes its connection time; fall back to wall time.
    tps = re.search(r"tps = ([\d.]+)", result.stdout)
    if tps:
        return float(tps.group(1)) * batch * messages / (per_client * clients * batch)
    return messages / elapsed
