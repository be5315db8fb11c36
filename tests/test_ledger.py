"""The ledger's rules, without a database: what may be claimed, taken, renewed and dropped."""

from __future__ import annotations

from datetime import UTC, datetime

from outbox.models import Message, Outcome, OutcomeKind
from outbox.worker.ledger import Ledger


def _messages(first: int, count: int, version: int = 1) -> list[Message]:
    now = datetime.now(UTC)
    return [
        Message(i, version, 1, "order", str(i), "created", "{}", now)
        for i in range(first, first + count)
    ]


def test_room_is_a_batch_plus_concurrency_of_unpublished_and_twice_that_held():
    ledger = Ledger(batch=10, concurrency=4)
    assert ledger.room_to_claim(0.0) == 14  # nothing held: a batch and the concurrency
    ledger.hold(_messages(1, 10), now=0.0, claim_seconds=0.0)
    assert ledger.room_to_claim(0.0) == 4
    ledger.take(10, now=1.0)
    ledger.published(10)  # all published, outcomes not written yet
    ledger.put_outcomes(Outcome.done(m) for m in _messages(1, 10))
    # Unpublished room is back, but held messages count up to 2 x batch + concurrency.
    assert ledger.room_to_claim(1.0) == 14
    ledger.hold(_messages(11, 14), now=1.0, claim_seconds=0.0)
    ledger.take(14, now=1.0)
    ledger.published(14)
    assert ledger.room_to_claim(1.0) == 0  # 24 held: the first batch's outcomes first


def test_a_publisher_faster_than_claims_gets_one_batch_more():
    ledger = Ledger(batch=10, concurrency=2)
    ledger.hold(_messages(1, 10), now=100.0, claim_seconds=0.050)
    ledger.take(10, now=100.001)
    ledger.published(10)
    ledger.ran_dry(now=100.001)  # all published 1 ms after it came: faster than a claim
    assert ledger.published_in < ledger.claim_seconds
    assert ledger.room_to_claim(100.002) == 10 + 2 + 10 - 10


def test_a_slow_publisher_is_not_claimed_ahead_of():
    ledger = Ledger(batch=10, concurrency=2)
    ledger.hold(_messages(1, 10), now=100.0, claim_seconds=0.010)
    ledger.take(2, now=100.0)
    # The oldest waiting message has waited longer than a claim takes: no extra batch.
    assert ledger.room_to_claim(100.5) == 10 + 2 - 10


def test_a_claim_is_worth_it_for_half_a_batch_or_when_nothing_is_held():
    ledger = Ledger(batch=10, concurrency=0)
    assert ledger.worth_claiming(1)  # nothing held: any claim
    ledger.hold(_messages(1, 6), now=0.0, claim_seconds=0.0)
    assert not ledger.worth_claiming(4)
    assert ledger.worth_claiming(5)


def test_the_claimer_wakes_at_half_a_batch_and_when_publishing_runs_dry():
    ledger = Ledger(batch=10, concurrency=4)
    ledger.hold(_messages(1, 10), now=0.0, claim_seconds=0.0)
    ledger.take(4, now=0.1)
    assert not ledger.room.is_set()
    ledger.take(1, now=0.1)  # five left: half a batch
    assert ledger.room.is_set()
    ledger.room.clear()
    while ledger.take_one(now=0.3) is not None:
        pass
    assert ledger.publishing == 10 and not ledger.room.is_set()
    # Measured when a publishing task finds nothing left, not when the last one started: a
    # publisher stuck on its publishes does not look fast.
    ledger.published(10)
    ledger.ran_dry(now=0.5)
    assert ledger.room.is_set() and ledger.published_in == 0.5


def test_an_outcome_of_an_older_lease_does_not_drop_a_newer_claim():
    """Our lease ran out, our own claim took the message over (version 2): the late outcome
    of version 1 must leave version 2 held."""
    ledger = Ledger(batch=10, concurrency=4)
    [old] = _messages(7, 1, version=1)
    ledger.hold([old], now=0.0, claim_seconds=0.0)
    [new] = _messages(7, 1, version=2)
    ledger.hold([new], now=1.0, claim_seconds=0.0)
    ledger.drop(7, 1)
    assert ledger.held == {7: new}
    ledger.drop(7, 2)
    ledger.freed()
    assert ledger.held == {} and ledger.drained.is_set()


def test_dropping_many_outcomes_keeps_newer_claims_as_dropping_one_does():
    ledger = Ledger(batch=10, concurrency=4)
    ledger.hold(_messages(1, 5), now=0.0, claim_seconds=0.0)
    [retaken] = _messages(3, 1, version=2)  # message 3's lease ran out and we claimed it again
    ledger.hold([retaken], now=1.0, claim_seconds=0.0)
    ledger.drop_all(Outcome.done(m) for m in _messages(1, 4))  # lease 1 of messages 1 to 4
    assert {i: m.lease_version for i, m in ledger.held.items()} == {3: 2, 5: 1}
    assert set(ledger.renewed_at) == {3, 5}


def test_drained_only_when_nothing_is_held():
    ledger = Ledger(batch=10, concurrency=4)
    assert ledger.drained.is_set()
    ledger.hold(_messages(1, 2), now=0.0, claim_seconds=0.0)
    assert not ledger.drained.is_set()
    ledger.forget(1, 1)
    assert not ledger.drained.is_set()
    ledger.forget(2, 1)
    assert ledger.drained.is_set()


def test_leases_are_due_a_period_after_their_last_renewal():
    ledger = Ledger(batch=10, concurrency=4)
    ledger.hold(_messages(1, 2), now=0.0, claim_seconds=0.0)
    ledger.hold(_messages(3, 1), now=5.0, claim_seconds=0.0)
    assert [m.id for m in ledger.due_for_renewal(now=10.0, after=10.0)] == [1, 2]
    ledger.renewed({1, 99}, now=10.0)  # 99 is no longer held: ignored
    assert [m.id for m in ledger.due_for_renewal(now=15.0, after=10.0)] == [2, 3]
    assert 99 not in ledger.renewed_at


def test_a_stop_releases_every_unstarted_message():
    ledger = Ledger(batch=10, concurrency=4)
    ledger.hold(_messages(1, 5), now=0.0, claim_seconds=0.0)
    [started] = ledger.take(1, now=0.0)
    assert ledger.release_waiting() == 4
    assert ledger.outcomes_waiting.is_set() and not ledger.waiting
    released = ledger.take_outcomes(100)
    assert [o.message_id for o in released] == [2, 3, 4, 5]
    assert {o.kind for o in released} == {OutcomeKind.RELEASED}
    assert started.id in ledger.held  # still publishing: its outcome comes later


def test_a_messages_age_is_its_age_at_the_claim_plus_the_time_held_since_the_claim_was_sent():
    """The claim's now() is between the claim being sent and its answer: the age counts from
    the sending (a claim that found the database away counts from the attempt that worked)."""
    ledger = Ledger(batch=10, concurrency=4)
    ages = (2.0, 0.25)
    messages = [m._replace(age_at_claim=a) for m, a in zip(_messages(1, 2), ages, strict=True)]
    ledger.hold(messages, now=10.0, claim_seconds=0.5)
    assert list(ledger.ages(messages, now=12.0)) == [2.0 + 2.5, 0.25 + 2.5]
    # Dropped with the message, one by one or a batch at once: nothing is kept for it.
    ledger.drop(1, 1)
    ledger.drop_all([Outcome.done(messages[1])])
    assert ledger.created_at == {} and ledger.held == {}
