"""Queue statistics: counts per status, readiness, expired leases, attempts, rates."""

from __future__ import annotations

import json
import re
from datetime import timedelta

import psycopg
import pytest
from helpers import explain_prepared, seed, serve_ordering
from psycopg import sql

from outbox import Outcome, queue_stats, queue_stats_async, rates
from outbox import destinations as dest
from outbox.cli import main as cli_main
from outbox.cli import print_stats
from outbox.lease import claim, finalize
from outbox.partitions import Layout
from outbox.runner import fetch
from outbox.schema import migrate
from outbox.stats import QueueStats, stats_query
from outbox.table import Table


def _set(conn, ids: list[int], assignments: str) -> None:
    conn.execute(f"UPDATE outbox SET {assignments} WHERE id = ANY(%s)", (ids,))


def _shape(conn) -> list[int]:
    """12 rows: 3 ready, 1 waiting for a retry, 2 leased, 1 expired lease, 2 dead, 3 done."""
    ids = seed(conn, 12)
    ready, waiting, leased, expired, dead, done = (
        ids[0:3], ids[3:4], ids[4:6], ids[6:7], ids[7:9], ids[9:12]
    )  # fmt: skip
    _set(conn, ready, "available_at = now() - interval '10 minutes'")
    _set(conn, [ready[0]], "created_at = now() - interval '1 hour'")
    _set(conn, waiting, "available_at = now() + interval '1 hour', attempts = 3")
    _set(conn, leased, "status = 'processing', lease_owner = 'w', "
                       "lease_until = now() + interval '1 minute', attempts = 1")  # fmt: skip
    _set(conn, expired, "status = 'processing', lease_owner = 'w', "
                        "lease_until = now() - interval '1 second', attempts = 2")  # fmt: skip
    _set(conn, dead, "status = 'dead', attempts = 12, last_error = 'boom'")
    _set(conn, done, "status = 'done', done_at = now(), attempts = 1")
    return ids


def test_counts_readiness_expired_leases_and_attempts(conn, table):
    ids = _shape(conn)
    stats = queue_stats(conn, table, exact=True)
    assert stats.table == "outbox"
    assert stats.pending == 4
    assert stats.ready == 3
    assert stats.processing == 3
    assert stats.expired_leases == 1
    assert stats.dead == 2
    assert stats.done == 3 and not stats.done_is_estimate
    assert stats.backlog == 7
    assert stats.max_id == max(ids)
    # Over pending and processing rows only: the dead rows' 12 attempts do not appear.
    assert stats.attempts == {0: 3, 1: 2, 2: 1, 3: 1}
    assert list(stats.attempts) == sorted(stats.attempts)
    # The oldest waiting message was created an hour ago; the longest-ready one is claimable
    # for ten minutes.
    assert stats.oldest_pending_age == pytest.approx(3600, abs=5)
    assert stats.oldest_ready_age == pytest.approx(600, abs=5)


def test_done_is_estimated_from_planner_statistics_unless_exact(conn, table):
    _shape(conn)
    conn.execute("SELECT pg_stat_force_next_flush()")  # no change left to count after ANALYZE
    conn.execute("ANALYZE outbox")
    estimate = queue_stats(conn, table)
    assert estimate.done_is_estimate
    assert estimate.done == 3  # reltuples (12) minus pending, processing and dead
    assert estimate.pending == 4  # the other counts are exact either way


def test_done_is_no_estimate_past_a_count_stopped_at_the_limit(conn, table, capsys):
    """The estimate less a count that stopped at the limit (a lower bound) was too high:
    a backlog of pending rows, none done, showed thousands done. All that is known is at
    least 0, which `outbox stats` showed as `done ≥0` beside `pending ≥100`, on a table of
    300 done rows: read as none done. It says the figure is unknown and what counts it;
    the JSON keeps the lower bound 0, flagged as one."""
    _set(conn, seed(conn, 300), "status = 'done', done_at = now(), attempts = 1")
    seed(conn, 500)
    conn.execute("SELECT pg_stat_force_next_flush()")
    conn.execute("ANALYZE outbox")
    stats = queue_stats(conn, table, count_limit=100)
    assert stats.count_text("pending") == "≥100"
    assert (stats.done, stats.done_is_estimate, stats.done_at_least) == (0, False, True)
    assert stats.count_text("done") == "unknown (--exact counts them)"
    print_stats(stats)
    out = capsys.readouterr().out
    assert re.search(r"^pending\s+≥100 \(≥100 ready\)$", out, re.MULTILINE), out
    assert re.search(r"^done\s+unknown \(--exact counts them\)$", out, re.MULTILINE), out
    assert re.search(
        r"^attempts\s+0: 100 \(the oldest 100 pending and processing only\)$", out, re.MULTILINE
    ), out
    data = stats.to_dict()
    assert (data["done"], data["done_at_least"]) == (0, True) and "done" in data["at_least"]
    exact = queue_stats(conn, table, exact=True)
    assert exact.count_text("done") == "300"


def _deliver(conn, count: int) -> None:
    """`count` messages enqueued and delivered, and the cumulative statistics flushed, so
    that what the table's statistics say (or lack) is what the test decides."""
    ids = seed(conn, count)
    _set(conn, ids, "status = 'done', done_at = now(), attempts = 1")
    conn.execute("SELECT pg_stat_force_next_flush()")  # flushed before the answer comes


@pytest.fixture
def no_autovacuum(conn):
    """Nothing analyzes the table behind the test's back."""
    conn.execute("ALTER TABLE outbox SET (autovacuum_enabled = off)")


def test_done_is_counted_when_the_table_was_never_analyzed(conn, table, no_autovacuum, capsys):
    # What the demo leaves: every message delivered before autoanalyze ran; reltuples says
    # -1 (never analyzed), which read as "done ~0".
    _deliver(conn, 2994)
    assert conn.execute("SELECT reltuples FROM pg_class WHERE relname = 'outbox'").fetchone() == (
        -1,
    )
    stats = queue_stats(conn, table, count_limit=10_000)
    assert (stats.done, stats.done_is_estimate, stats.at_least("done")) == (2994, False, False)
    dsn = conn.info.dsn
    cli_main(["stats", "--dsn", dsn])
    assert re.search(r"^done\s+2994$", capsys.readouterr().out, re.MULTILINE)


def test_partitions_made_ahead_and_never_analyzed_leave_the_estimate_trusted(empty_dsn):
    """Partitions made ahead are neither analyzed nor written to until their ids come: an
    empty one counts as the zero rows it holds, where it had the done rows counted in the
    unfinished rows' window only (`done ≥0` for a table of millions of done rows)."""
    table = Table.parse("outbox")
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        migrate(conn, table, layout=Layout(100, 3))  # p0..p3, p3 empty
        _set(conn, seed(conn, 250), "status = 'done', done_at = now(), attempts = 1")
        conn.execute("SELECT pg_stat_force_next_flush()")  # no change left after ANALYZE
        for leaf in ("outbox_p0", "outbox_p1", "outbox_p2"):
            conn.execute(sql.SQL("ANALYZE {}").format(sql.Identifier(leaf)))
        never = "SELECT reltuples FROM pg_class WHERE relname = 'outbox_p3'"
        assert conn.execute(never).fetchone() == (-1,)
        stats = queue_stats(conn, table)
        assert (stats.done, stats.done_is_estimate, stats.at_least("done")) == (250, True, False)
        seed(conn, 1)  # id 251, in p2: analyzed, changed little since
        conn.execute(
            "INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, payload)"
            " VALUES (350, 'a', 'x', 'E', '{}')"
        )  # a row of its own id in p3, never analyzed: counted, no longer trusted
        assert not queue_stats(conn, table).done_is_estimate


def test_done_is_counted_when_the_statistics_are_stale(conn, table, no_autovacuum):
    _deliver(conn, 10)
    conn.execute("ANALYZE outbox")
    assert queue_stats(conn, table).done_is_estimate  # fresh statistics: the estimate
    _deliver(conn, 3000)  # many times the rows the statistics know of
    stats = queue_stats(conn, table)
    assert (stats.done, stats.done_is_estimate) == (3010, False)
    conn.execute("ANALYZE outbox")
    fresh = queue_stats(conn, table)
    assert fresh.done_is_estimate and fresh.done == 3010


def test_done_counted_past_the_limit_is_a_lower_bound(conn, table, no_autovacuum):
    _deliver(conn, 300)
    seed(conn, 5)
    stats = queue_stats(conn, table, count_limit=100)
    assert not stats.done_is_estimate and stats.at_least("done"), stats
    assert 0 < stats.done <= 100
    assert stats.count_text("done") == f"≥{stats.done}"
    assert "done" in stats.to_dict()["at_least"]


def test_oldest_ages_skip_rows_that_are_not_waiting(conn, table):
    ids = seed(conn, 3)
    _set(conn, [ids[0]], "status = 'done', done_at = now(), created_at = now() - interval '1 day'")
    _set(conn, [ids[1]], "created_at = now() - interval '2 minutes', "
                         "available_at = now() + interval '5 minutes'")  # fmt: skip
    stats = queue_stats(conn, table, exact=True)
    # The done row is a day old but finished; the next waiting row is two minutes old.
    assert stats.oldest_pending_age == pytest.approx(120, abs=5)
    # Only ids[2] is ready, since its creation (moments ago).
    assert stats.ready == 1
    assert stats.oldest_ready_age is not None and 0 <= stats.oldest_ready_age < 5


def test_empty_table(conn, table):
    stats = queue_stats(conn, table, exact=True)
    assert (stats.pending, stats.ready, stats.processing, stats.dead, stats.done) == (0,) * 5
    assert stats.expired_leases == 0
    assert stats.oldest_pending_age is None
    assert stats.oldest_ready_age is None
    assert stats.max_id == 0
    assert stats.attempts == {}
    data = stats.to_dict()
    assert data["backlog"] == 0 and data["attempts"] == {}


def test_to_dict_is_json_ready(conn, table):
    _shape(conn)
    data = queue_stats(conn, table, exact=True).to_dict()
    assert data["attempts"] == {"0": 3, "1": 2, "2": 1, "3": 1}
    assert isinstance(data["sampled_at"], str) and "T" in data["sampled_at"]
    assert data["backlog"] == 7


def test_max_id_survives_purging_done_rows(conn, table):
    ids = seed(conn, 5)
    conn.execute("DELETE FROM outbox WHERE id = %s", (ids[-1],))
    # max() of what remains; the rates below rely on it only growing while rows arrive.
    assert queue_stats(conn, table).max_id == ids[-2]


async def test_async_stats_match_sync(conn, aconn, table):
    _shape(conn)
    sync = queue_stats(conn, table, exact=True)
    async_ = await queue_stats_async(aconn, table, exact=True)
    moving = {"sampled_at": None, "oldest_pending_age": None, "oldest_ready_age": None,
              "oldest_unfinished_age": None}  # fmt: skip
    assert async_.to_dict() | moving == sync.to_dict() | moving
    assert async_.oldest_pending_age == pytest.approx(sync.oldest_pending_age, abs=5)


def test_stats_on_a_schema_qualified_table(conn):
    table = Table.parse('"my.schema".events')
    migrate(conn, table)
    conn.execute(
        """INSERT INTO "my.schema".events (aggregate_type, aggregate_id, event_type, payload)
           SELECT 'a', 'x', 'E', '{}' FROM generate_series(1, 4)"""
    )
    stats = queue_stats(conn, table, exact=True)
    assert stats.table == "my.schema.events"
    assert stats.pending == 4 and stats.max_id == 4


async def test_rates_between_two_snapshots(conn, aconn, table):
    seed(conn, 5)
    before = queue_stats(conn, table)
    # Between the snapshots: 6 arrive, 4 leave the backlog (3 done, 1 dead), 1 stays leased.
    seed(conn, 6)
    claimed = await claim(
        aconn, table, owner="t", batch=5, lease=timedelta(minutes=1), max_attempts=5
    )
    assert len(claimed) == 5
    applied = await finalize(
        aconn,
        table,
        [Outcome.done(m) for m in claimed[:3]] + [Outcome.dead(claimed[3], "bad")],
    )
    assert len(applied) == 4
    after = queue_stats(conn, table)
    assert after.max_id - before.max_id == 6
    assert after.backlog - before.backlog == 6 - 4

    result = rates(before, after)
    assert result is not None
    seconds = (after.sampled_at - before.sampled_at).total_seconds()
    assert seconds > 0
    assert result.arrivals_per_second == pytest.approx(6 / seconds)
    assert result.completions_per_second == pytest.approx(4 / seconds)


def test_rates_need_time_to_pass(conn, table):
    seed(conn, 2)
    snapshot = queue_stats(conn, table)
    assert rates(snapshot, snapshot) is None


def test_rates_are_unknown_when_the_newest_rows_went_away(conn, table):
    seed(conn, 4)
    before = queue_stats(conn, table)
    with conn.transaction():
        conn.execute(sql.SQL("DELETE FROM {t}").format(t=table.ident))
    after = queue_stats(conn, table)
    assert after.max_id < before.max_id
    assert rates(before, after) is None  # not a negative arrival rate


def test_rates_never_report_negative_completions(conn, table):
    before = queue_stats(conn, table)
    after = queue_stats(conn, table)
    # Rows coming back (an operator re-queues dead ones) grow the backlog without arrivals.
    revived = QueueStats(**{**after.__dict__, "pending": after.pending + 3})
    result = rates(before, revived)
    assert result is not None
    assert result.arrivals_per_second == 0
    assert result.completions_per_second == 0


# -- bounded counts: a snapshot's cost does not grow with the backlog ------------------------


def test_counts_stop_at_the_limit_and_say_so(conn, table):
    ids = _shape(conn)  # 4 pending (3 ready), 3 processing, 2 dead
    stats = queue_stats(conn, table, count_limit=3)
    assert stats.count_limit == 3
    assert (stats.pending, stats.ready, stats.processing, stats.dead) == (3, 3, 3, 2)
    assert stats.at_least("pending") and stats.at_least("ready") and stats.at_least("processing")
    assert not stats.at_least("dead") and not stats.at_least("expired_leases")
    assert not stats.counts_exact
    assert stats.count_text("pending") == "≥3" and stats.count_text("dead") == "2"
    # The attempts distribution covers the oldest 3 waiting messages only.
    assert sum(stats.attempts.values()) == 3
    # Ages and the arrival counter never depend on the limit.
    exact = queue_stats(conn, table, exact=True)
    assert exact.count_limit is None and exact.counts_exact
    assert stats.max_id == exact.max_id == max(ids)
    assert stats.oldest_pending_age == pytest.approx(exact.oldest_pending_age, abs=5)
    # Done rows too: never analyzed, the table's statistics say nothing, so they are counted
    # among its first 3 rows.
    assert stats.to_dict()["at_least"] == ["pending", "ready", "processing", "done"]


def test_below_the_limit_every_count_is_exact(conn, table):
    _shape(conn)
    bounded, exact = queue_stats(conn, table), queue_stats(conn, table, exact=True)
    assert bounded.counts_exact and bounded.count_limit is not None
    counts = ("pending", "ready", "processing", "dead", "expired_leases", "attempts")
    assert [getattr(bounded, n) for n in counts] == [getattr(exact, n) for n in counts]


def test_a_deep_backlog_is_estimated_from_the_head_of_the_claim_order(conn, table):
    ids = seed(conn, 500)
    stats = queue_stats(conn, table, count_limit=100)
    assert stats.ready == 100 and stats.at_least("ready")
    assert stats.oldest_ready_id == ids[0]
    assert stats.ready_estimate == 500
    # Below the limit the estimate is the count.
    assert queue_stats(conn, table).ready_estimate == 500


async def test_rates_past_the_limit_follow_the_head_of_the_claim_order(conn, aconn, table):
    seed(conn, 500)
    before = queue_stats(conn, table, count_limit=100)
    seed(conn, 50)
    claimed = await claim(
        aconn, table, owner="t", batch=120, lease=timedelta(minutes=1), max_attempts=5
    )
    assert len(claimed) == 120
    assert len(await finalize(aconn, table, [Outcome.done(m) for m in claimed])) == 120
    after = queue_stats(conn, table, count_limit=100)
    assert after.backlog == before.backlog == 100  # both counts stopped at the limit
    result = rates(before, after)
    assert result is not None
    seconds = (after.sampled_at - before.sampled_at).total_seconds()
    assert result.arrivals_per_second == pytest.approx(50 / seconds)
    assert result.completions_per_second == pytest.approx(120 / seconds)


def test_count_limit_must_be_positive(table):
    with pytest.raises(ValueError, match="count_limit"):
        stats_query(table, count_limit=0)


# -- ordered tables: what can be claimed at all -------------------------------------------


def _ordered_shape(conn) -> dict[str, list[int]]:
    """Five aggregates: a dead head with 3 behind it, a head in flight with 2 behind, a ready
    head with 2 behind, a head waiting for its retry with 1 behind, a ready head alone that
    has waited 10 minutes. The oldest ready row (an hour) is stuck behind the dead head."""
    rows: dict[str, list[int]] = {}
    for name, count in (("dead", 4), ("flight", 3), ("ready", 3), ("retry", 2), ("alone", 1)):
        rows[name] = seed(conn, count, aggregates=1, event_type=name)
        conn.execute("UPDATE outbox SET aggregate_id = %s WHERE id = ANY(%s)", (name, rows[name]))
    _set(conn, rows["dead"][:1], "status = 'dead', attempts = 12")
    _set(conn, rows["dead"][1:2], "available_at = now() - interval '1 hour'")
    _set(conn, rows["flight"][:1], "status = 'processing', lease_owner = 'w', "
                                   "lease_until = now() + interval '1 minute'")  # fmt: skip
    _set(conn, rows["retry"][:1], "available_at = now() + interval '1 hour', attempts = 2")
    _set(conn, rows["alone"], "available_at = now() - interval '10 minutes'")
    return rows


def test_ordered_stats_count_only_claimable_heads(conn, table):
    _ordered_shape(conn)
    stats = queue_stats(conn, table, ordered=True)
    # The unordered figures see the hour-old row stuck behind the dead head...
    assert stats.oldest_ready_age == pytest.approx(3600, abs=5)
    # ...the claimable ones do not: the oldest claimable head has waited ten minutes.
    assert stats.claimable_heads == 2  # "ready" and "alone"
    assert stats.oldest_claimable_age == pytest.approx(600, abs=5)
    assert stats.blocked_by_dead == 3
    assert queue_stats(conn, table).claimable_heads is None  # unordered: not computed


def test_an_expired_lease_is_a_claimable_head(conn, table):
    rows = _ordered_shape(conn)
    _set(conn, rows["flight"][:1], "lease_until = now() - interval '1 second'")
    assert queue_stats(conn, table, ordered=True).claimable_heads == 3


def test_ordered_figures_stop_at_the_limit(conn, table):
    _ordered_shape(conn)
    stats = queue_stats(conn, table, ordered=True, count_limit=2)
    assert stats.blocked_by_dead == 2 and stats.at_least("blocked_by_dead")
    # The skip scan visits 2 aggregates ("alone", "dead": in aggregate order); the claim
    # order's walk still finds the oldest claimable head among the oldest ready rows.
    assert stats.claimable_heads is not None and stats.claimable_heads <= 2
    assert stats.oldest_claimable_age == pytest.approx(600, abs=5)


async def test_ordered_async_stats_match_sync(conn, aconn, table):
    _ordered_shape(conn)
    sync = queue_stats(conn, table, ordered=True)
    async_ = await queue_stats_async(aconn, table, ordered=True)
    assert (async_.claimable_heads, async_.blocked_by_dead) == (2, 3)
    assert (sync.claimable_heads, sync.blocked_by_dead) == (2, 3)


def test_an_empty_ordered_table(conn, table):
    stats = queue_stats(conn, table, ordered=True)
    assert (stats.claimable_heads, stats.oldest_claimable_age, stats.blocked_by_dead) == (
        0,
        None,
        0,
    )


async def test_a_head_freed_by_its_predecessor_counts_from_when_it_was_freed(conn, aconn, table):
    """A chain on one aggregate whose rows all became available an hour ago: its head, freed
    when the worker finished the row before it, has waited since that finish, not for an
    hour. Counted from `available_at` it would read as a backlog an hour old (saturation)
    while the one worker it allows has room."""
    serve_ordering(conn)
    chain = seed(conn, 20, aggregates=1)
    _set(conn, chain, "available_at = now() - interval '1 hour'")
    claimed = await claim(
        aconn, table, owner="t", batch=5, lease=timedelta(minutes=1), max_attempts=5,
        ordered=True,
    )  # fmt: skip
    assert [m.id for m in claimed] == chain[:1]  # only the head of the aggregate
    assert await finalize(aconn, table, [Outcome.done(claimed[0])]) == {chain[0]}
    stats = queue_stats(conn, table, ordered=True)
    assert stats.oldest_ready_age == pytest.approx(3600, abs=5)  # the rows' availability
    assert stats.claimable_heads == 1
    assert stats.oldest_claimable_age is not None and stats.oldest_claimable_age < 5

    # A lone message available ten minutes ago is older than the freed head, although the
    # head comes first in the claim order: the walk goes on past it.
    alone = seed(conn, 1, event_type="alone")
    _set(conn, alone, "aggregate_id = 'alone', available_at = now() - interval '10 minutes'")
    stats = queue_stats(conn, table, ordered=True)
    assert stats.claimable_heads == 2
    assert stats.oldest_claimable_age == pytest.approx(600, abs=5)

    # A predecessor that finished twenty minutes ago: the head has waited since then.
    _set(conn, chain[:1], "done_at = now() - interval '20 minutes'")
    stats = queue_stats(conn, table, ordered=True)
    assert stats.oldest_claimable_age == pytest.approx(1200, abs=5)
    # ...and one that finished before its successor became available (a retry's backoff):
    # from `available_at`.
    _set(conn, chain[1:2], "available_at = now() - interval '15 minutes'")
    _set(conn, chain[:1], "done_at = now() - interval '30 minutes'")
    stats = queue_stats(conn, table, ordered=True)
    assert stats.oldest_claimable_age == pytest.approx(900, abs=5)
    for exact in (False, True):  # the same figure whatever the count limit
        assert queue_stats(
            conn, table, ordered=True, exact=exact
        ).oldest_claimable_age == pytest.approx(900, abs=5)


def test_heads_freed_on_many_aggregates_count_from_their_predecessors(conn, table):
    """Rows spread over many aggregates (each head's predecessor a few ids below it, among
    other aggregates' rows): every head freed two seconds ago has waited two seconds. Where
    the predecessors lie beyond the ids the snapshot reads, the age is read long (from
    `available_at`), never short."""
    serve_ordering(conn)
    ids = seed(conn, 60, aggregates=20)  # three rows per aggregate, interleaved
    _set(conn, ids, "available_at = now() - interval '1 hour'")
    _set(conn, ids[:20], "status = 'done', done_at = now() - interval '2 seconds'")
    stats = queue_stats(conn, table, ordered=True)
    assert stats.claimable_heads == 20
    # Two seconds, and however long a loaded machine took between the two statements: not
    # the hour since `available_at`.
    assert stats.oldest_claimable_age is not None and 1 <= stats.oldest_claimable_age < 600
    assert stats.oldest_ready_age == pytest.approx(3600, abs=5)
    bounded = queue_stats(conn, table, ordered=True, count_limit=5)
    assert bounded.oldest_claimable_age == pytest.approx(3600, abs=5)


# -- plan guards: index-backed at a backlog, under custom and generic plans -----------------


@pytest.fixture
def deep_backlog(conn):
    """10,000 done, 5,000 waiting over 200 aggregates, 50 in flight, 20 dead."""
    seed(conn, 15_070, aggregates=200)
    conn.execute("UPDATE outbox SET status = 'done', done_at = now() WHERE id <= 10000")
    conn.execute(
        "UPDATE outbox SET status = 'processing', lease_until = now() + interval '1 minute' "
        "WHERE id > 15000 AND id <= 15050"
    )
    conn.execute("UPDATE outbox SET status = 'dead' WHERE id > 15050")
    conn.execute("VACUUM ANALYZE outbox")
    return conn


@pytest.mark.parametrize("generic", [False, True], ids=["custom", "generic"])
@pytest.mark.parametrize("ordered", [False, True], ids=["unordered", "ordered"])
def test_stats_are_index_backed_and_bounded(deep_backlog, table, generic, ordered):
    if ordered:
        serve_ordering(deep_backlog)
    query = stats_query(table, ordered=ordered, count_limit=1000)
    plan = explain_prepared(deep_backlog, query.statement, dict(query.params), generic=generic)
    assert "Seq Scan on outbox" not in plan, plan
    # Every count and the attempts distribution read at most the limit: a Limit node above
    # each scan of the backlog, none of them a full aggregate over it.
    assert plan.count("Limit") >= 6, plan
    if ordered:
        assert "outbox_aggregate" in plan, plan  # the skip scan and the head checks


# -- what an outage looks like: backoff, the oldest unfinished age, destinations ------------


def test_an_outage_in_backoff_shows_in_retrying_and_the_oldest_unfinished_age(conn, table):
    """Every message waiting out a backoff: nothing is ready, so the ready age says nothing
    is wrong; the oldest unfinished age and `retrying` say it."""
    ids = seed(conn, 5)
    _set(conn, ids, "created_at = now() - interval '20 minutes', "
                    "available_at = now() + interval '2 minutes', attempts = 4")  # fmt: skip
    # A deferred message (its attempt refunded) waits too, but is not retrying.
    _set(conn, ids[4:], "attempts = 0")
    stats = queue_stats(conn, table)
    assert stats.ready == 0 and stats.oldest_ready_age is None
    assert stats.oldest_unfinished_age == pytest.approx(1200, abs=5)
    assert stats.oldest_unfinished_age == stats.oldest_pending_age
    assert (stats.waiting, stats.retrying) == (5, 4)
    assert not stats.at_least("retrying") and stats.counts_exact
    data = stats.to_dict()
    assert (data["waiting"], data["retrying"]) == (5, 4)
    assert data["oldest_unfinished_age"] == pytest.approx(1200, abs=5)


def test_retrying_counts_only_pending_rows_available_later_with_an_attempt(conn, table):
    _shape(conn)  # one waiting for a retry (3 attempts); ready, leased, dead and done rows too
    for stats in (queue_stats(conn, table), queue_stats(conn, table, exact=True)):
        assert (stats.waiting, stats.retrying) == (1, 1)


def test_retrying_is_a_lower_bound_when_the_walk_stops_at_the_limit(conn, table):
    ids = seed(conn, 6)
    _set(conn, ids, "available_at = now() + interval '1 minute', attempts = 1")
    _set(conn, ids[:2], "available_at = now() + interval '1 second', attempts = 0")
    stats = queue_stats(conn, table, count_limit=3)
    # The walk reads the 3 soonest: 2 deferred, 1 retrying; 4 retry in truth.
    assert (stats.waiting, stats.retrying) == (3, 1)
    assert stats.at_least("waiting") and stats.at_least("retrying")
    assert stats.count_text("retrying") == "≥1"
    assert {"waiting", "retrying"} <= set(stats.to_dict()["at_least"])
    exact = queue_stats(conn, table, exact=True)
    assert (exact.waiting, exact.retrying) == (6, 4) and not exact.at_least("retrying")


def test_retrying_none_among_the_rows_walked_is_unknown(conn, table):
    """The walk of the waiting rows stopped at the limit among deferred rows only: none of
    them in backoff, 3 retrying past them. `retrying ≥0` read as none retrying."""
    ids = seed(conn, 6)
    _set(conn, ids, "available_at = now() + interval '1 minute', attempts = 1")
    _set(conn, ids[:3], "available_at = now() + interval '1 second', attempts = 0")
    stats = queue_stats(conn, table, count_limit=3)
    assert (stats.waiting, stats.retrying) == (3, 0) and stats.at_least("retrying")
    assert stats.count_text("retrying") == "unknown"
    exact = queue_stats(conn, table, exact=True)
    assert exact.retrying == 3 and exact.count_text("retrying") == "3"


def test_each_destinations_state_with_its_error_redacted(conn, table):
    def pause(row: dest.Destination, now) -> dest.Destination:
        return dest.paused(row, by="maria", reason="deploy", now=now)

    def fail(row: dest.Destination, now) -> dest.Destination:
        failure = dest.Failure(1, "HTTP 503 from https://bot:s3cret@api.test/x?token=t0k",
                               retry_after=timedelta(seconds=30))  # fmt: skip
        return dest.failed(row, failure, owner="w1", now=now, policy=dest.Policy())

    dest.change_sync(conn, table, "https://hooks.test", pause)
    dest.change_sync(conn, table, "https://api.test", fail)
    # Served by a running worker: their states hold messages back (`unreachable`).
    fetch(conn, dest.served(table, ["https://api.test", "https://hooks.test"], owner="w1"))
    stats = queue_stats(conn, table)
    api, hooks = stats.destinations
    assert (api.destination, api.state, api.reason) == ("https://api.test", "open", "Retry-After")
    assert api.next_probe_in == pytest.approx(30, abs=5)
    assert api.for_seconds is not None and 0 <= api.for_seconds < 5
    assert api.last_error is not None and "api.test" in api.last_error
    assert "s3cret" not in api.last_error and "t0k" not in api.last_error
    assert (hooks.state, hooks.reason, hooks.changed_by) == ("paused", "deploy", "maria")
    assert hooks.next_probe_at is None and hooks.next_probe_in is None
    assert stats.unreachable == (api, hooks)
    data = json.loads(json.dumps(stats.to_dict()))
    assert [d["state"] for d in data["destinations"]] == ["open", "paused"]
    assert data["destinations"][1]["changed_by"] == "maria"
    assert "s3cret" not in json.dumps(data)
    # Without them, one statement: the snapshot alone.
    assert queue_stats(conn, table, destinations=False).destinations == ()


async def test_async_stats_read_the_destinations_too(conn, aconn, table):
    def pause(row: dest.Destination, now) -> dest.Destination:
        return dest.paused(row, by="ops", reason="broker upgrade", now=now)

    dest.change_sync(conn, table, "kafka k1:9092", pause)
    [found] = (await queue_stats_async(aconn, table)).destinations
    assert (found.destination, found.state, found.reason) == (
        "kafka k1:9092", "paused", "broker upgrade"
    )  # fmt: skip
