"""The worker's batch path in bulk: a claim's rows as Messages, a finalize that applied every
row, the ledger dropping a batch, and the pool's sessions in a name of UTC."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import psycopg
import pytest
from helpers import seed

from outbox.lease import claim, finalize_applied
from outbox.models import Message, Outcome
from outbox.session import utc_by_name
from outbox.worker.ledger import Ledger


async def _claim(aconn, table, batch: int) -> list[Message]:
    return await claim(
        aconn, table, owner="w", batch=batch, lease=timedelta(seconds=60), max_attempts=5
    )


async def test_claimed_rows_are_messages_in_id_order(conn, aconn, table):
    ids = seed(conn, 30, aggregates=7)
    messages = await _claim(aconn, table, 30)
    assert [m.id for m in messages] == sorted(ids)
    assert all(type(m) is Message for m in messages)
    first = messages[0]
    assert (first.lease_version, first.attempts, first.aggregate_type) == (1, 1, "order")
    assert first.event_type == "Tested" and first.headers is None
    assert first.payload_json == '{"n": 0, "text": "xxxxxxxxxxxxxxxxxxxx"}'


async def test_an_all_applied_finalize_answers_as_the_map_it_stands_for(conn, aconn, table):
    seed(conn, 5)
    messages = await _claim(aconn, table, 5)
    outcomes = Outcome.all_done(messages)
    assert outcomes == [Outcome.done(m) for m in messages]
    applied = await finalize_applied(aconn, table, outcomes)
    expected = {(m.id, m.lease_version): "done" for m in messages}
    assert len(applied) == 5
    assert dict(applied) == expected and applied == expected
    assert applied.get((messages[0].id, messages[0].lease_version)) == "done"
    assert applied.get((messages[0].id, messages[0].lease_version + 1)) is None
    # Finalized again: every lease is gone, nothing applied.
    assert dict(await finalize_applied(aconn, table, outcomes)) == {}


def _held(first: int, count: int, version: int = 1, payload: str = "{}") -> list[Message]:
    now = datetime.now(UTC)
    return [
        Message(i, version, 1, "order", str(i), "created", payload, now)
        for i in range(first, first + count)
    ]


def test_dropping_a_batch_forgets_exactly_the_leases_its_outcomes_end():
    ledger = Ledger(batch=10, concurrency=4)
    ledger.hold(_held(1, 3, payload="abcd"), now=0.0, claim_seconds=0.0)
    ledger.hold(_held(4, 3, version=2, payload="abcd"), now=0.0, claim_seconds=0.0)
    assert ledger.held_bytes == 24
    ledger.drop_all([Outcome.done(m) for m in _held(1, 3)])  # all held under these leases
    assert sorted(ledger.held) == [4, 5, 6] and sorted(ledger.renewed_at) == [4, 5, 6]
    assert ledger.held_bytes == 12
    # Outcomes of an older lease than the one held (a takeover of our own): those stay.
    ledger.drop_all([Outcome.done(m) for m in _held(4, 1) + _held(5, 2, version=2)])
    assert sorted(ledger.held) == [4] and ledger.held[4].lease_version == 2
    assert sorted(ledger.renewed_at) == [4] and ledger.held_bytes == 4
    # An outcome given twice drops its message once.
    twice = Outcome.done(_held(4, 1, version=2)[0])
    ledger.drop_all([twice, twice])
    assert ledger.held == {} and ledger.renewed_at == {} and ledger.held_bytes == 0


def test_taking_everything_waiting_and_taking_part_of_it():
    ledger = Ledger(batch=10, concurrency=4)
    ledger.hold(_held(1, 5), now=0.0, claim_seconds=0.0)
    assert [m.id for m in ledger.take(2, now=0.0)] == [1, 2]
    assert [m.id for m in ledger.take(10, now=0.0)] == [3, 4, 5]
    assert not ledger.waiting and ledger.publishing == 5
    ledger.put_outcomes(Outcome.all_done(_held(1, 5)))
    assert [o.message_id for o in ledger.take_outcomes(2)] == [1, 2]
    assert [o.message_id for o in ledger.take_outcomes(1000)] == [3, 4, 5]
    assert not ledger.outcomes


@pytest.mark.parametrize(
    ("zone", "after"), [("Etc/UTC", "UTC"), ("GMT", "UTC"), ("Europe/Berlin", "Europe/Berlin")]
)
async def test_a_pool_session_in_another_name_of_utc_is_set_to_utc(dsn, zone, after):
    async with await psycopg.AsyncConnection.connect(
        dsn, autocommit=True, options=f"-c TimeZone={zone}"
    ) as aconn:
        at = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
        await utc_by_name(aconn)
        assert aconn.info.parameter_status("TimeZone") == after
        cur = await aconn.execute("SELECT %s::timestamptz", [at])
        (back,) = await cur.fetchone()  # type: ignore[misc]
        assert back == at  # the same instant whatever the zone
        if after == "UTC":
            assert back.tzinfo is UTC and back.isoformat() == "2026-01-02T03:04:05+00:00"
        else:
            assert back.utcoffset() == timedelta(hours=1)
