"""The floor a pipelined worker has to beat: a plain synchronous loop of the project's own
statements on one connection. Claim a batch (the claim of outbox.queries, prepared as the
worker prepares it), then finalize it in one fenced statement (finalize_done), and again until
a claim comes back empty. Nothing overlaps: each statement waits for the one before.

    python -m bench.peers.plain_loop DSN BATCH

Prints the CPU seconds it spent from its first claim on (start-up left out, as the drain's
clock leaves it out for every contender).
"""

from __future__ import annotations

import sys
import time
from datetime import timedelta

import psycopg

from outbox.limits import CLAIM_BYTES, WORKER_MAX_PAYLOAD_BYTES
from outbox.queries import queries
from outbox.table import Table


def _bigint_array(values: list[int]) -> str:
    return "{" + ",".join(map(str, values)) + "}"


def main() -> None:
    dsn, batch = sys.argv[1], int(sys.argv[2])
    q = queries(Table.parse("outbox"))
    params = {
        "batch": batch,
        "owner": "plain-loop",
        "lease": timedelta(seconds=60),
        "max_attempts": 12,
        "max_payload_bytes": WORKER_MAX_PAYLOAD_BYTES,
        "claim_bytes": CLAIM_BYTES,
    }
    with psycopg.connect(dsn, autocommit=True) as conn:
        started = time.process_time()
        while True:
            # The worker's shape: binary results, the claim prepared once.
            with conn.cursor(binary=True) as cur:
                rows = cur.execute(q.claim, params, prepare=True).fetchall()
            if not rows:
                print(time.process_time() - started)
                return
            # publish(...) is a no-op here
            done = {
                "ids": _bigint_array([row[0] for row in rows]),
                "versions": _bigint_array([row[1] for row in rows]),
                "n": len(rows),
            }
            conn.execute(q.finalize_done, done, prepare=False).fetchone()


if __name__ == "__main__":
    main()
