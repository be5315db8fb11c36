"""Destination health's shared state: the breaker's rules (pure) and their statements on a
real PostgreSQL, with several writers at once."""

from __future__ import annotations

import asyncio
import random
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import psycopg

from outbox import destinations as d
from outbox.runner import fetch, fetch_async
from outbox.table import Table

T0 = datetime(2026, 1, 1, tzinfo=UTC)
POLICY = d.Policy(threshold=3, window=timedelta(seconds=60))


def _fail(row: d.Destination, message_id: int, at: float = 0.0, **kw) -> d.Destination:
    failure = d.Failure(message_id, f"HTTP 503 for {message_id}", kw.pop("retry_after", None),
                        succeeded_ago=kw.pop("succeeded_ago", None))  # fmt: skip
    return d.failed(row, failure, owner=kw.pop("owner", "a"), now=T0 + timedelta(seconds=at),
                    policy=POLICY, rng=random.Random(1))  # fmt: skip


def test_one_poison_message_never_opens_the_breaker():
    row = d.Destination("http://api")
    for attempt in range(50):
        row = _fail(row, 7, at=attempt)
    assert row.state == d.CLOSED and row.failing_ids == (7,)


def test_different_messages_failing_within_the_window_open_it():
    row = d.Destination("http://api")
    row = _fail(_fail(row, 1), 2, at=1)
    assert row.state == d.CLOSED
    row = _fail(row, 3, at=2)
    assert row.state == d.OPEN and row.since == T0 + timedelta(seconds=2)
    assert T0 + timedelta(seconds=3) <= row.next_probe_at <= T0 + timedelta(seconds=4)


def test_a_success_or_the_window_passing_starts_the_count_again():
    row = _fail(_fail(d.Destination("x"), 1), 2)
    assert _fail(row, 3, succeeded_ago=0.0).failing_ids == (3,)
    assert _fail(row, 3, at=61).failing_ids == (3,)


def test_failures_another_replica_saw_after_a_success_still_count():
    """Replica B delivered at 1 s; A saw messages 1 and 2 fail at 2 s and 3 s; B's own
    failure at 4 s drops only what failed before its success: the breaker opens."""
    row = _fail(_fail(d.Destination("x"), 1, at=2, owner="a"), 2, at=3, owner="a")
    opened = _fail(row, 3, at=4, owner="b", succeeded_ago=3.0)
    assert opened.failing_ids == (1, 2, 3) and opened.state == d.OPEN
    # Had B's success come after them, they would be the past.
    later = _fail(row, 3, at=4, owner="b", succeeded_ago=0.5)
    assert later.failing_ids == (3,) and later.state == d.CLOSED


def test_a_retry_after_opens_it_at_once_for_that_long_capped():
    row = _fail(d.Destination("x"), 1, retry_after=timedelta(seconds=20))
    assert row.state == d.OPEN and row.next_probe_at == T0 + timedelta(seconds=20)
    assert row.reason == "Retry-After"
    huge = _fail(d.Destination("x"), 1, retry_after=timedelta(days=30))
    assert huge.next_probe_at == T0 + POLICY.max_retry_after


def test_probes_one_at_a_time_a_failed_probe_waits_longer_a_success_closes():
    row = _fail(_fail(_fail(d.Destination("x"), 1), 2), 3)
    due = row.next_probe_at
    assert d.probe_taken(row, owner="a", now=due - timedelta(seconds=1), hold=timedelta(1)) is None
    taken = d.probe_taken(row, owner="a", now=due, hold=timedelta(seconds=15))
    assert taken is not None and taken.probe_owner == "a"
    assert d.probe_taken(taken, owner="b", now=due, hold=timedelta(seconds=15)) is None
    # A replica that died mid-probe: its probe lease runs out, another takes over.
    later = due + timedelta(seconds=16)
    assert d.probe_taken(taken, owner="b", now=later, hold=timedelta(1)).probe_owner == "b"
    failed = d.failed(taken, d.Failure(9, "refused"), owner="a", now=due, policy=POLICY,
                      rng=random.Random(1))  # fmt: skip
    assert failed.state == d.OPEN and failed.probe_owner is None
    assert failed.probe_delay == 2 * taken.probe_delay
    # Someone else's failure (a message sent before it opened) changes no probe.
    assert _fail(taken, 10, owner="b").probe_owner == "a"
    assert d.succeeded(taken, owner="b", now=due) == taken
    closed = d.succeeded(taken, owner="a", now=due)
    assert closed.state == d.CLOSED and closed.failing_ids == () and closed.next_probe_at is None


def test_the_probe_delay_grows_to_the_cap():
    row = _fail(_fail(_fail(d.Destination("x"), 1), 2), 3)
    for _ in range(10):
        row = d.probe_taken(row, owner="a", now=row.next_probe_at, hold=timedelta(1))
        row = d.failed(row, d.Failure(1, "e"), owner="a", now=row.probe_until,
                       policy=POLICY)  # fmt: skip
    assert row.probe_delay == POLICY.probe_cap.total_seconds()


def test_a_pause_holds_until_resumed_whatever_fails():
    row = d.paused(d.Destination("x"), by="ops", reason="maintenance", now=T0)
    for i in range(10):
        row = _fail(row, i)
    assert row.state == d.PAUSED and row.reason == "maintenance"
    assert d.probe_taken(row, owner="a", now=T0 + timedelta(days=1), hold=timedelta(1)) is None
    assert d.closed(row, T0, by="ops").state == d.CLOSED


def test_a_person_closes_an_open_breaker_or_a_pause_and_leaves_a_closed_one():
    """`outbox resume`'s rule: an open breaker closes at once, without its probe (whoever
    held one holds it no more), its count starts again, and it says who closed it."""
    opened = _fail(_fail(_fail(d.Destination("http://api"), 1), 2), 3)
    probing = d.probe_taken(opened, owner="w1", now=T0 + timedelta(minutes=1), hold=timedelta(5))
    assert probing is not None and probing.state == d.OPEN
    later = T0 + timedelta(minutes=2)
    for row in (opened, probing):
        after = d.resumed(row, by="oncall", now=later)
        assert after is not None
        assert (after.state, after.since, after.changed_by) == (d.CLOSED, later, "oncall")
        assert (after.failures, after.failing_ids, after.next_probe_at) == (0, (), None)
        assert (after.probe_owner, after.probe_until, after.reason) == (None, None, None)
        # The probe that was out answers after all: nothing to close, nothing changes.
        assert d.succeeded(after, owner="w1", now=later) == after
    paused = d.paused(d.Destination("x"), by="ops", reason="maintenance", now=T0)
    resumed = d.resumed(paused, by="ann", now=later)
    assert resumed is not None and (resumed.state, resumed.changed_by) == (d.CLOSED, "ann")
    assert d.resumed(resumed, by="bob", now=later) is None  # closed: nothing to do


def test_a_destination_no_worker_stamped_lately_is_idle():
    never = d.Destination("http://old")
    assert d.is_idle(never, T0)
    stamped = replace(never, served_at=T0)
    assert not d.is_idle(stamped, T0 + d.IDLE_AFTER)
    assert d.is_idle(stamped, T0 + d.IDLE_AFTER + timedelta(seconds=1))
    # A worker stamps several times within the window: a missed stamp or two is no idleness.
    assert d.IDLE_AFTER >= 3 * d.SERVED_INTERVAL


def test_stamps_make_rows_mark_who_serves_and_skip_fresh_ones(conn):
    table = Table.parse("outbox")
    d.change_sync(conn, table, "kafka k1", lambda row, now: d.paused(
        row, by="ops", reason="upgrade", now=now))  # fmt: skip
    # Two destinations, one with a row already (kept as it is but for the stamp).
    assert fetch(conn, d.served(table, ["http://b", "kafka k1", "http://b"], owner="w1")) == 2
    rows = {row.destination: (row, now) for row, now in fetch(conn, d.listing(table))}
    assert set(rows) == {"http://b", "kafka k1"}
    b, now = rows["http://b"]
    assert (b.state, b.served_by) == (d.CLOSED, "w1")
    assert b.served_at is not None and timedelta(0) <= now - b.served_at < timedelta(seconds=5)
    k, _ = rows["kafka k1"]
    assert (k.state, k.reason, k.changed_by, k.served_by) == (d.PAUSED, "upgrade", "ops", "w1")
    # Another replica right after: a fresh stamp is left as it is (no row rewritten).
    assert fetch(conn, d.served(table, ["http://b", "kafka k1"], owner="w2")) == 0
    # Half an interval later it is renewed, by whoever comes.
    conn.execute(
        "UPDATE outbox_destinations SET served_at = served_at - %s", (d.SERVED_INTERVAL / 2,)
    )
    assert fetch(conn, d.served(table, ["http://b"], owner="w2")) == 1
    rows = {row.destination: row for row, _ in fetch(conn, d.listing(table))}
    assert (rows["http://b"].served_by, rows["kafka k1"].served_by) == ("w2", "w1")


def test_the_rules_leave_the_stamps_alone(conn):
    """A transition reads and writes only the breaker's columns: the workers' stamp stays."""
    table = Table.parse("outbox")
    assert fetch(conn, d.served(table, ["http://api"], owner="w1")) == 1
    [(before, _)] = fetch(conn, d.listing(table))
    for rule in (
        lambda row, now: d.failed(row, d.Failure(1, "refused"), owner="w2", now=now, policy=POLICY),
        lambda row, now: d.paused(row, by="ops", reason="x", now=now),
        lambda row, now: d.resumed(row, by="ops", now=now),
    ):
        d.change_sync(conn, table, "http://api", rule)
        [(row, _)] = fetch(conn, d.listing(table))
        assert (row.served_at, row.served_by) == (before.served_at, "w1")


def test_transitions_are_serialized_on_the_row(conn, dsn):
    """Eight writers report eight different messages failing at once: each sees the others'
    failures (row lock), so exactly one of them opens the breaker."""
    table = Table.parse("outbox")

    async def report(message_id: int) -> d.Change:
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as aconn:
            failure = d.Failure(message_id, "refused")
            return await d.change(
                aconn,
                table,
                "http://api",
                lambda row, now: d.failed(
                    row, failure, owner=f"w{message_id}", now=now, policy=d.Policy(threshold=8)
                ),
            )

    async def all_at_once() -> list[d.Change]:
        return await asyncio.gather(*(report(i) for i in range(8)))

    changes = asyncio.run(all_at_once())
    opened = [c for c in changes if c.before.state == d.CLOSED and c.after.state == d.OPEN]
    assert len(opened) == 1
    [(row, now)] = fetch(conn, d.listing(table))
    assert row.state == d.OPEN and sorted(row.failing_ids) == list(range(8))
    assert row.since <= now


async def test_rate_tokens_are_shared_and_refill_at_the_rate(conn, aconn):
    table = Table.parse("outbox")
    take = d.take_tokens(table, "kafka x", rate=10.0, want=100)
    first = await fetch_async(aconn, take)
    assert first == 5  # the burst: half a second's worth
    assert await fetch_async(aconn, take) == 0  # gone, and next to nothing refilled yet
    conn.execute("UPDATE outbox_destinations SET tokens_at = tokens_at - interval '2 s'")
    assert await fetch_async(aconn, take) == 5  # refilled, but never past the burst
