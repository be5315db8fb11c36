"""What the error history (schema v3) costs a message delivered at its first attempt.

The SQL ceiling's cycle (pgbench: claim a batch, finalize it done) on a v3 table, beside the
same cycle on a v2 table with the claim as it was before v3 (its reaper did not write
`errors`), alternating in the same run on the same server. Only failures write the history
(the finalize of retries and deaths, and the reaper), so the happy path should not pay: the
ratio should be 1 within the run-to-run noise printed beside it.

    python -m bench.error_history [--messages 100000] [--clients 2] [--repeat 3]
"""

from __future__ import annotations

import argparse
import statistics

import psycopg

from bench.ceiling import pgbench_cycles, pgbench_script
from bench.env import Bench, seed_outbox
from outbox.queries import REAPED_ERROR, with_error
from outbox.schema import MIGRATIONS, migration_statements
from outbox.table import Table

BATCH = 500


def _before_v3(script: str) -> str:
    """The ceiling's script with the claim's reaper as it was at schema v2."""
    assignment = f", errors = {with_error(psycopg.sql.Literal(REAPED_ERROR)).as_string(None)}"
    assert assignment in script, "the claim's reaper no longer writes errors as expected"
    return script.replace(assignment, "")


def _v2_table(dsn: str) -> None:
    table = Table.parse("outbox")
    v2 = len(MIGRATIONS[0](table)) + len(MIGRATIONS[1](table)) + 2  # and their comments
    with psycopg.connect(dsn, autocommit=True) as conn:
        for statement in migration_statements(table)[:v2]:
            conn.execute(statement)


def measure(messages: int, clients: int, repeat: int) -> dict[str, list[float]]:
    script = pgbench_script(BATCH)
    runs: dict[str, list[float]] = {"v3": [], "v2": []}
    with Bench() as bench:
        for _ in range(repeat):
            with bench.database() as dsn:
                seed_outbox(dsn, messages)
                runs["v3"].append(pgbench_cycles(bench, dsn, script, messages, clients, BATCH))
            with bench.database(outbox=False) as dsn:
                _v2_table(dsn)
                seed_outbox(dsn, messages)
                runs["v2"].append(
                    pgbench_cycles(bench, dsn, _before_v3(script), messages, clients, BATCH)
                )
    return runs


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.error_history")
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--clients", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    runs = measure(args.messages, args.clients, args.repeat)
    v3, v2 = statistics.median(runs["v3"]), statistics.median(runs["v2"])
    spread = max(runs["v2"]) / min(runs["v2"]) if min(runs["v2"]) else float("nan")
    print(f"happy path, {args.messages:,} messages, {args.clients} pgbench clients, "
          f"{args.repeat} runs each")  # fmt: skip
    print(f"  v3 (error history):  {v3:,.0f} messages/s  runs {[round(r) for r in runs['v3']]}")
    print(f"  v2 (before it):      {v2:,.0f} messages/s  runs {[round(r) for r in runs['v2']]}")
    print(f"  v3 / v2 = {v3 / v2:.3f}  (v2's own max/min spread: {spread:.3f})")


if __name__ == "__main__":
    main()
