"""Queue statistics: counts per status, readiness, expired leases, attempts, rates."""

from __future__ import annotations

from datetime import timedelta

import pytest
from helpers import seed

from outbox import Outcome, queue_stats, queue_stats_async, rates
from outbox.lease import claim, finalize
from outbox.schema import migrate
from outbox.stats import QueueStats
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
    conn.execute("ANALYZE outbox")
    estimate = queue_stats(conn, table)
    assert estimate.done_is_estimate
    assert estimate.done == 3  # reltuples (12) minus pending, processing and dead
    assert estimate.pending == 4  # the other counts are exact either way


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
    moving = {"sampled_at": None, "oldest_pending_age": None, "oldest_ready_age": None}
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


def test_rates_never_report_negative_completions(conn, table):
    before = queue_stats(conn, table)
    after = queue_stats(conn, table)
    # Rows coming back (an operator re-queues dead ones) grow the backlog without arrivals.
    revived = QueueStats(**{**after.__dict__, "pending": after.pending + 3})
    result = rates(before, revived)
    assert result is not None
    assert result.arrivals_per_second == 0
    assert result.completions_per_second == 0
