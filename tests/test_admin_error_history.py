"""Schema v3: every failed attempt's error, with its time, bounded, written by the fenced
statement that records the failure; a delivered message's history stays NULL."""

from __future__ import annotations

from datetime import timedelta

from helpers import row, seed

from outbox.lease import claim, finalize
from outbox.models import Outcome
from outbox.queries import ERROR_HISTORY, REAPED_ERROR

LEASE = timedelta(minutes=5)


async def _claim_all(aconn, table, max_attempts: int = 50):
    return await claim(aconn, table, owner="w", batch=100, lease=LEASE, max_attempts=max_attempts)


async def test_failures_are_recorded_each_with_its_attempt_and_time(aconn, conn, table):
    ok, failing, deferred = seed(conn, 3)
    for attempt in range(1, ERROR_HISTORY + 3):
        messages = {m.id: m for m in await _claim_all(aconn, table)}
        outcomes = [Outcome.retry(messages[failing], timedelta(0), f"HTTP 503 #{attempt}")]
        if deferred in messages:
            outcomes.append(Outcome.defer(messages[deferred], timedelta(0), "not yet"))
        if ok in messages:
            outcomes.append(Outcome.done(messages[ok]))
        assert await finalize(aconn, table, outcomes) == {o.message_id for o in outcomes}
    assert row(conn, ok)["errors"] is None  # delivered first time: nothing written
    assert row(conn, deferred)["errors"] is None  # a defer is not a failure
    errors = row(conn, failing)["errors"]
    assert len(errors) == ERROR_HISTORY  # bounded: the newest ones
    assert [e["error"] for e in errors] == [f"HTTP 503 #{n}" for n in range(3, ERROR_HISTORY + 3)]
    assert [e["attempt"] for e in errors] == list(range(3, ERROR_HISTORY + 3))
    assert all(e["at"] for e in errors)
    assert row(conn, failing)["last_error"] == f"HTTP 503 #{ERROR_HISTORY + 2}"


async def test_a_lost_lease_writes_no_history_and_death_and_reaping_are_recorded(
    aconn, conn, table
):
    stale, dies, reaped = seed(conn, 3)
    messages = {m.id: m for m in await _claim_all(aconn, table, max_attempts=1)}
    conn.execute("UPDATE outbox SET lease_version = lease_version + 1 WHERE id = %s", (stale,))
    outcomes = [
        Outcome.retry(messages[stale], timedelta(0), "too late"),
        Outcome.dead(messages[dies], "HTTP 422: rejected"),
    ]
    assert await finalize(aconn, table, outcomes) == {dies}
    assert row(conn, stale)["errors"] is None  # fenced: the lost lease wrote nothing
    [entry] = row(conn, dies)["errors"]
    assert (entry["error"], entry["attempt"]) == ("HTTP 422: rejected", 1)
    # The last attempt's lease runs out: the next claim reaps it, and says so in its history.
    conn.execute("UPDATE outbox SET lease_until = now() - interval '1 second' WHERE id = %s",
                 (reaped,))  # fmt: skip
    await _claim_all(aconn, table, max_attempts=1)
    assert row(conn, reaped)["status"] == "dead"
    [entry] = row(conn, reaped)["errors"]
    assert entry["error"] == REAPED_ERROR
