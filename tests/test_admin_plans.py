"""Plan guards for the dead-letter queries (like test_query_plans.py): the TUI and
`outbox requeue` must stay cheap on a table where almost every row is done, so they walk the
`outbox_dead` partial index and never scan the table, also under a generic plan."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
from helpers import explain_prepared, seed, serve_ordering

from outbox.operations import repair
from outbox.runner import Query
from outbox.views import dashboard, dead_letters
from outbox.views.filters import parse_filter

DONE_ROWS = 20_000
DEAD_ROWS = 400


@pytest.fixture
def mostly_done(conn):
    seed(conn, DONE_ROWS + DEAD_ROWS + 100, aggregates=500)
    conn.execute("UPDATE outbox SET status = 'done', done_at = now() WHERE id <= %s", (DONE_ROWS,))
    conn.execute(
        "UPDATE outbox SET status = 'dead', attempts = 12, "
        "last_error = 'HTTP 503: upstream ' || md5(id::text) WHERE id > %s AND id <= %s",
        (DONE_ROWS, DONE_ROWS + DEAD_ROWS),
    )
    conn.execute("VACUUM ANALYZE outbox")
    return conn


def _plan(conn: psycopg.Connection[Any], query: Query[Any], *, generic: bool) -> str:
    return explain_prepared(conn, query.statement, query.params, generic=generic)


QUERIES = {
    "page": lambda t: dead_letters.dead_page(t),
    "page deeper": lambda t: dead_letters.dead_page(t, before=DONE_ROWS + 200),
    "page up": lambda t: dead_letters.dead_page(t, after=DONE_ROWS + 200),
    "page filtered": lambda t: dead_letters.dead_page(
        t, parse_filter('type:Tested agg:agg-3 upstream {"n": 1} $.n > 5')
    ),
    "count": lambda t: dead_letters.dead_count(t),
    "count filtered": lambda t: dead_letters.dead_count(t, parse_filter("upstream")),
    "groups": lambda t: dead_letters.error_groups(t),
    "targets": lambda t: repair.select_targets(t, parse_filter("type:Tested")),
}


@pytest.mark.parametrize("generic", [False, True], ids=["custom", "generic"])
@pytest.mark.parametrize("name", list(QUERIES))
def test_dead_letter_queries_walk_the_dead_index(mostly_done, table, name, generic):
    plan = _plan(mostly_done, QUERIES[name](table), generic=generic)
    # outbox_dead, or (filtering on one aggregate) outbox_aggregate: both leave done rows out.
    assert "outbox_dead" in plan or "outbox_aggregate" in plan, plan
    assert "Seq Scan on outbox" not in plan, plan
    assert "outbox_pkey" not in plan or name == "groups", plan  # groups: one probe per group


def test_blocked_aggregates_touch_only_unfinished_rows(mostly_done, table):
    serve_ordering(mostly_done)  # the view is ordered mode's
    plan = _plan(mostly_done, dashboard.blocked_aggregates(table), generic=False)
    assert "outbox_dead" in plan and "outbox_aggregate" in plan, plan
    assert "Seq Scan on outbox" not in plan, plan


def test_lease_holders_use_the_leased_index(mostly_done, table):
    mostly_done.execute(
        "UPDATE outbox SET status = 'processing', lease_owner = 'w', "
        "lease_until = now() + interval '1 minute' WHERE id > %s",
        (DONE_ROWS + DEAD_ROWS + 90,),
    )
    plan = _plan(mostly_done, dashboard.lease_holders(table), generic=False)
    assert "outbox_leased" in plan, plan
    assert "Seq Scan on outbox" not in plan, plan
