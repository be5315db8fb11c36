"""What one message costs the database: the claim and the batched finalize, statement by
statement, with EXPLAIN (ANALYZE, BUFFERS, WAL), on both seeds: as shipped (a table migrated
for unordered workers), with ordered mode's index, and without `waiting`, the other partial
index an unordered drain writes but never reads (what each index costs a drain).

Every claim and finalize is a non-HOT update (status is in the partial indexes' predicates):
each writes a new row version and an entry in every index whose predicate that version
matches. A claimed row matches the primary key, `leased` and `waiting` (and `aggregate` on an
ordered table); a done row the primary key only.
"""

from __future__ import annotations

import statistics
from datetime import timedelta
from typing import Any

import psycopg
from psycopg import sql

from bench.env import Bench, seed_outbox
from outbox.limits import CLAIM_BYTES, WORKER_MAX_PAYLOAD_BYTES
from outbox.queries import queries
from outbox.table import Table

TABLE = Table.parse("outbox")
SHIPPED = "as shipped"
WITH_ORDERING = "with outbox_aggregate (--ordering aggregate)"
WITHOUT_WAITING = "without outbox_waiting (the stats')"
# name: (the table's `outbox migrate --ordering`, an index dropped before seeding or None)
VARIANTS = {
    SHIPPED: (None, None),
    WITH_ORDERING: ("aggregate", None),
    WITHOUT_WAITING: (None, "outbox_waiting"),
}
# What one index costs: (index, the variant with it, the variant without it).
INDEX_COSTS = (
    ("outbox_aggregate", WITH_ORDERING, SHIPPED),
    ("outbox_waiting", SHIPPED, WITHOUT_WAITING),
)
_EXPLAIN = sql.SQL("EXPLAIN (ANALYZE, BUFFERS, WAL, FORMAT JSON) ")


def _costs_of(plan: dict[str, Any]) -> tuple[float, int, int]:
    """(server milliseconds, shared buffers touched, WAL bytes) of one executed statement."""
    top = plan["Plan"]
    buffers = top.get("Shared Hit Blocks", 0) + top.get("Shared Read Blocks", 0)
    return plan["Execution Time"], buffers, top.get("WAL Bytes", 0)


def drain_costs(
    bench: Bench,
    messages: int,
    aggregates: int,
    ordering: str | None,
    drop: str | None,
    batch: int = 500,
) -> dict[str, Any]:
    """One drain with the worker's statements, each executed under EXPLAIN ANALYZE."""
    q = queries(TABLE)
    params = {
        "batch": batch,
        "owner": "costs",
        "lease": timedelta(seconds=60),
        "max_attempts": 12,
        "max_payload_bytes": WORKER_MAX_PAYLOAD_BYTES,
        "claim_bytes": CLAIM_BYTES,
    }
    with (
        bench.database(ordering=ordering) as dsn,
        psycopg.connect(dsn, autocommit=True) as conn,
    ):
        if drop:
            conn.execute(sql.SQL("DROP INDEX {}").format(sql.Identifier(drop)))
        seed_outbox(dsn, messages, aggregates=aggregates)
        conn.execute("CHECKPOINT")  # every drain starts with the same full-page-image debt
        lsn = conn.execute("SELECT pg_current_wal_lsn()").fetchone()[0]  # type: ignore[index]
        totals = {"claim": [0.0, 0, 0], "finalize": [0.0, 0, 0]}
        while True:
            claim_plan = conn.execute(_EXPLAIN + q.claim, params).fetchone()[0][0]  # type: ignore[index]
            rows = conn.execute(
                "SELECT id, lease_version FROM outbox WHERE status = 'processing' "
                "AND lease_owner = 'costs'"
            ).fetchall()
            if not rows:
                break
            done = {
                "ids": "{" + ",".join(str(r[0]) for r in rows) + "}",
                "versions": "{" + ",".join(str(r[1]) for r in rows) + "}",
                "n": len(rows),
            }
            finalize_plan = conn.execute(_EXPLAIN + q.finalize_done, done).fetchone()[0][0]  # type: ignore[index]
            for name, plan in (("claim", claim_plan), ("finalize", finalize_plan)):
                for i, value in enumerate(_costs_of(plan)):
                    totals[name][i] += value
        wal = conn.execute("SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), %s)", (lsn,)).fetchone()[0]  # type: ignore[index]
        indexes = dict(
            conn.execute(
                "SELECT indexrelid::regclass::text, pg_relation_size(indexrelid) / 8192 "
                "FROM pg_index WHERE indrelid = 'outbox'::regclass ORDER BY 1"
            ).fetchall()
        )
    per = {
        f"{name}_{field}": value / messages * scale
        for name, values in totals.items()
        for field, value, scale in zip(
            ("us", "buffers", "wal_bytes"), values, (1000, 1, 1), strict=True
        )
    }
    return {**per, "wal_bytes_total": float(wal) / messages, "index_pages": indexes}


def statement_costs(bench: Bench, messages: int, seeds: dict[str, int | None], repeat: int) -> Any:
    """Per seed and variant: the median of each figure over `repeat` alternating rounds."""
    runs: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for _ in range(repeat):
        for seed, aggregates in seeds.items():
            for variant, (ordering, drop) in VARIANTS.items():
                cost = drain_costs(bench, messages, aggregates or messages, ordering, drop)
                runs.setdefault((seed, variant), []).append(cost)
    result = []
    for (seed, variant), costs in runs.items():
        numbers = {
            key: statistics.median(c[key] for c in costs)
            for key in costs[0]
            if key != "index_pages"
        }
        result.append(
            {"seed": seed, "variant": variant, **numbers, "index_pages": costs[-1]["index_pages"]}
        )
    return result
