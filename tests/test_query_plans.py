"""Guards on the hot statements' plans (in the manner of pgqueuer's query-plan regression test).

The claim must walk the pending index in order instead of scanning the primary key past done
rows, and the batched statements must probe an index on id per row, also under a generic plan
(which is what a prepared statement may switch to after five executions).
"""

from __future__ import annotations

import re
from typing import Any

import psycopg
import pytest
from helpers import explain_prepared, seed, serve_ordering

from outbox.operations import pausing
from outbox.queries import queries
from outbox.stats import _query as stats_query
from outbox.stats import destination_states
from outbox.stats import stats_query as bounded_stats_query

DONE_ROWS = 10_000
IN_FLIGHT = 2_000


def _plan(
    conn: psycopg.Connection[Any], statement: Any, args: dict[str, str], *, generic: bool
) -> str:
    return explain_prepared(conn, statement, args, generic=generic)


@pytest.fixture
def half_drained(conn):
    seed(conn, DONE_ROWS + IN_FLIGHT + 50, aggregates=500)
    conn.execute("UPDATE outbox SET status = 'done', done_at = now() WHERE id <= %s", (DONE_ROWS,))
    # What many busy workers hold at once.
    conn.execute(
        "UPDATE outbox SET status = 'processing', lease_until = now() + interval '1 minute', "
        "attempts = 1, lease_version = 1 WHERE id > %s AND id <= %s",
        (DONE_ROWS, DONE_ROWS + IN_FLIGHT),
    )
    conn.execute("VACUUM ANALYZE outbox")
    return conn


CLAIM_ARGS = {
    "max_attempts": "12",
    "batch": "100",
    "owner": "w",
    "lease": "60 seconds",
    "max_payload_bytes": "2097152",
    "claim_bytes": "16777216",
}


@pytest.mark.parametrize("generic", [False, True], ids=["custom", "generic"])
def test_ordered_claim_by_aggregate_skip_scans_the_aggregate_index(half_drained, table, generic):
    serve_ordering(half_drained)
    plan = _plan(half_drained, queries(table).claim_heads, CLAIM_ARGS, generic=generic)
    assert "outbox_aggregate" in plan, plan
    assert "Seq Scan on outbox" not in plan, plan


@pytest.mark.parametrize("generic", [False, True], ids=["custom", "generic"])
@pytest.mark.parametrize("ordered", [False, True], ids=["unordered", "ordered"])
def test_claim_walks_the_pending_index(half_drained, table, generic, ordered):
    if ordered:
        serve_ordering(half_drained)
    q = queries(table)
    plan = _plan(half_drained, q.claim_ordered if ordered else q.claim, CLAIM_ARGS, generic=generic)
    assert "outbox_ready" in plan, plan
    assert "Seq Scan on outbox" not in plan, plan
    if ordered:
        assert "outbox_aggregate" in plan, plan  # the head check is one index probe


FINALIZE_ARGS = {
    "ids": "{1,2,3}",
    "versions": "{1,1,1}",
    "statuses": "{done,dead,pending}",
    "delays": "{0,0,5}",
    "errors": "{NULL,x,y}",
    "refunds": "{f,f,f}",
    "deferreds": "{f,f,f}",
    "max_defer_age": "1 day",
    "n": "3",
    "lease": "60 seconds",
}


@pytest.mark.parametrize("generic", [False, True], ids=["custom", "generic"])
@pytest.mark.parametrize("statement", ["finalize_done", "finalize", "extend"])
def test_batched_statements_probe_the_primary_key(half_drained, table, generic, statement):
    plan = _plan(half_drained, getattr(queries(table), statement), FINALIZE_ARGS, generic=generic)
    # One index probe per array element (primary key or a smaller partial index on id).
    assert "Index Cond: (id = f.id)" in plan, plan
    assert "Seq Scan on outbox" not in plan and "Hash" not in plan, plan
    # Probed, and so locked, in the arrays' order, which the worker sorts by id
    # (outbox.lease): a Nested Loop over the arrays, never an order of the table's own.
    # The arrays are the Nested Loop's outer side: its first node.
    assert re.search(r"Nested Loop[^\n]*\n\s*->\s+Function Scan on (unnest )?f\b", plan), plan


def test_stats_never_scan_the_table(half_drained, table):
    plan = "\n".join(
        r[0]
        for r in half_drained.execute(
            "EXPLAIN " + stats_query(table, False).as_string(half_drained)
        )
    )
    assert "Seq Scan on outbox" not in plan, plan


@pytest.mark.parametrize("generic", [False, True], ids=["custom", "generic"])
def test_stats_walk_the_waiting_rows_from_now_on_in_the_ready_index(half_drained, table, generic):
    """`waiting` and `retrying` read the pending rows available later, at most the limit of
    them, from the ready index: never the done rows, never the table."""
    half_drained.execute(
        "UPDATE outbox SET available_at = now() + interval '1 minute', attempts = 1 WHERE id > %s",
        (DONE_ROWS + IN_FLIGHT,),
    )
    half_drained.execute("ANALYZE outbox")
    query = bounded_stats_query(table)
    plan = _plan(half_drained, query.statement, dict(query.params or {}), generic=generic)
    above, scan = (
        plan[: plan.index("Index Cond: (available_at > now())")].rstrip().splitlines()[-2:]
    )
    assert "Index Scan using outbox_ready" in scan and "Limit" in above, plan
    assert "Seq Scan on outbox" not in plan, plan


# A scan of the outbox table itself (not of its `_destinations` or `_actions` siblings).
_OUTBOX_SCAN = re.compile(r" on outbox(?![_\w])")


def test_destination_states_read_only_the_destinations_table(half_drained, table):
    plan = _plan(half_drained, destination_states(table).statement, {}, generic=False)
    assert "outbox_destinations" in plan, plan
    assert not _OUTBOX_SCAN.search(plan), plan


@pytest.mark.parametrize(
    "query",
    [
        lambda t: pausing._who(t, "https://api.test", None),
        lambda t: pausing._record(t, "pause", "ops", {"destination": "https://api.test"}),
    ],
    ids=["who and whether known", "audit record"],
)
def test_pause_and_resume_never_read_the_outbox_table(half_drained, table, query):
    statement = query(table)
    plan = _plan(half_drained, statement.statement, dict(statement.params), generic=True)
    assert "outbox_destinations" in plan or "outbox_actions" in plan, plan
    assert not _OUTBOX_SCAN.search(plan), plan
