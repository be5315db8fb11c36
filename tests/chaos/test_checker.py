"""The checker must pass good histories and fail each kind of bad one: every invariant is
fed a history that breaks it, and must say so."""

from __future__ import annotations

from dataclasses import replace

import pytest

from chaos.checker import check
from chaos.history import Delivery, LogEvent
from chaos.story import Story

pytestmark = pytest.mark.chaos


def _violations(story_or_history) -> list[str]:
    history = story_or_history.end() if isinstance(story_or_history, Story) else story_or_history
    return check(history).violations


def _one(violations: list[str], text: str) -> None:
    assert any(text in v for v in violations), violations


def test_a_clean_run_passes():
    verdict = check(Story(3).deliver_all().end())
    assert verdict.violations == []
    assert (verdict.messages, verdict.delivered, verdict.duplicates, verdict.lost) == (3, 3, 0, 0)


def test_a_sigkilled_worker_and_a_paused_one_give_explained_duplicates():
    s = Story(2)
    # Message 1: w1 publishes, is SIGKILLed before finalizing; w2 takes over after expiry.
    s.claim(1, "w1").deliver(1, "w1").fault("SIGKILL", "w1").expire()
    s.claim(1, "w2").deliver(1, "w2").finish(1, "w2")
    # Message 2: w3 publishes and pauses; w2 takes over; w3 wakes up and is fenced.
    s.claim(2, "w3").deliver(2, "w3").fault("SIGSTOP", "w3").expire()
    s.claim(2, "w2").deliver(2, "w2").finish(2, "w2").finish(2, "w3")
    verdict = check(s.end())
    assert verdict.violations == []
    assert (verdict.duplicates, verdict.explained, verdict.unexplained) == (2, 2, 0)
    assert verdict.lost_leases == 1
    assert sorted(verdict.reasons) == [
        "worker SIGKILLed after publishing, before finalizing; lease expired",
        "worker paused past its lease; taken over, its finalize fenced",
    ]


def test_a_late_answer_explains_its_duplicate():
    s = Story(1)
    s.claim(1, "w1").deliver(1, "w1", took=1.5).finish(1, "w1", "retried")
    s.claim(1, "w1").deliver(1, "w1").finish(1, "w1")
    verdict = check(s.end())
    assert verdict.violations == [] and verdict.explained == 1


def test_a_worker_side_timeout_explains_its_duplicate_even_if_the_sink_answered_in_time():
    s = Story(1)
    s.claim(1, "w1").deliver(1, "w1").finish(1, "w1", "timed out")
    s.claim(1, "w1").deliver(1, "w1").finish(1, "w1")
    verdict = check(s.end())
    assert verdict.violations == []
    assert list(verdict.reasons) == ["the worker timed out before it read the answer; retried"]


def test_a_dead_message_with_a_reason_is_not_lost_and_a_requeue_by_an_operator_is_legal():
    s = Story(2, max_attempts=1, operators=frozenset({"operator"}))
    s.claim(1, "w1").deliver(1, "w1", status=503).finish(1, "w1", "dead")
    s.claim(2, "w1").deliver(2, "w1", status=503).finish(2, "w1", "dead")
    s.requeue(2, "operator").claim(2, "w1").deliver(2, "w1").finish(2, "w1")
    verdict = check(s.end())
    assert verdict.violations == []
    assert (verdict.dead, verdict.delivered, verdict.lost) == (1, 1, 0)


def test_the_inbox_applies_each_message_once_and_absorbs_its_duplicates():
    s = Story(2)
    s.claim(1, "w1").deliver(1, "w1").fault("SIGKILL", "w1").expire()
    s.claim(1, "w2").deliver(1, "w2").finish(1, "w2")
    s.claim(2, "w2").deliver(2, "w2", took=1.5).finish(2, "w2", "retried")
    s.claim(2, "w2").deliver(2, "w2").finish(2, "w2")
    verdict = check(s.end())
    assert verdict.violations == []
    assert (verdict.delivered, verdict.duplicates) == (2, 2)
    assert (verdict.effects, verdict.absorbed, verdict.double_effects) == (2, 2, 0)


# -- each invariant, broken --------------------------------------------------------------------


def test_a_message_never_delivered_is_lost_and_the_queue_not_drained():
    s = Story(2)
    s.claim(1, "w1").deliver(1, "w1").finish(1, "w1")
    violations = _violations(s)
    _one(violations, "id 2: lost")
    _one(violations, "not drained: 1 rows still pending")


def test_dead_without_a_reason_counts_as_lost():
    s = Story(1, max_attempts=1)
    s.claim(1, "w1").deliver(1, "w1", status=503).finish(1, "w1", "dead")
    history = s.end()
    history.final[1] = replace(history.final[1], last_error="")
    _one(_violations(history), "dead without a reason")


def test_done_without_a_delivery_is_lost():
    s = Story(1)
    s.claim(1, "w1").finish(1, "w1")
    _one(_violations(s), "id 1: lost (status done")


def test_an_id_never_committed_at_the_sink_is_unexpected():
    history = Story(1).deliver_all().end()
    history.deliveries.append(Delivery(99, 99, "w1", 1, 200, 2000.0, 2000.1))
    _one(_violations(history), "the sink saw id 99")


def test_a_key_that_is_not_the_body_id_is_unexpected():
    history = Story(2).deliver_all().end()
    history.deliveries[0] = replace(history.deliveries[0], body_id=2)
    _one(_violations(history), "carried the body of id 2")


def test_a_duplicate_after_a_timely_2xx_is_unexplained():
    s = Story(1)
    # w1 got its 200 in time and still retried: nothing explains the second delivery.
    s.claim(1, "w1").deliver(1, "w1").finish(1, "w1", "retried")
    s.claim(1, "w1").deliver(1, "w1").finish(1, "w1")
    verdict = check(s.end())
    assert (verdict.duplicates, verdict.unexplained) == (1, 1)
    _one(verdict.violations, "unexplained duplicate")


def test_two_deliveries_under_one_lease_are_unexplained():
    s = Story(1)
    s.claim(1, "w1").deliver(1, "w1").deliver(1, "w1").finish(1, "w1")
    _one(_violations(s), "unexplained duplicate from w1 under v1 (done)")


def test_a_delivery_without_a_lease_is_caught():
    s = Story(1).deliver_all()
    s.deliver(1, "w9")  # w9 never claimed it
    violations = _violations(s)
    _one(violations, "sent by w9 (attempt 0) without a lease it held")


def test_a_stale_finalize_that_changed_the_row_breaks_fencing():
    s = Story(1)
    s.claim(1, "w1").deliver(1, "w1").expire()
    s.claim(1, "w2").deliver(1, "w2")
    s.finish(1, "w1", applied=True)  # the fence failed: w1's v1 outcome overwrote w2's lease
    violations = _violations(s)
    _one(violations, "stale done by w1 changed a row leased to w2 (v2)")


def test_a_refused_finalize_that_still_changed_the_row_is_caught_from_the_logs():
    s = Story(1).deliver_all()
    history = s.end()
    history.logs = [
        replace(e, applied=(False,)) if e.kind == "finalized" else e for e in history.logs
    ]
    _one(_violations(history), "refused finalize of id 1 v1 changed the row")


def test_a_finalize_logged_as_written_that_the_database_never_saw_is_caught():
    history = Story(1).deliver_all().end()
    history.logs.append(LogEvent("w1", 99, "finalized", (1,), (7,), ("done",), (True,)))
    _one(_violations(history), "logged done of id 1 v7 as written")


def test_a_lease_the_worker_never_logged_is_caught_unless_it_died():
    s = Story(1)
    s.claim(1, "w1", log=False).deliver(1, "w1").finish(1, "w1")
    _one(_violations(s), "leased id 1 v1 to w1, who never logged it")
    s = Story(1)
    s.claim(1, "w1", log=False).fault("SIGKILL", "w1").expire().claim(1, "w2")
    s.deliver(1, "w2").finish(1, "w2")
    assert _violations(s) == []


def test_lease_version_going_down_is_caught():
    history = Story(1).deliver_all().end()
    history.transitions[1] = replace(history.transitions[1], new_version=0)
    violations = _violations(history)
    _one(violations, "lease_version went down 1 -> 0")


def test_a_gap_in_a_row_history_is_caught():
    s = Story(1)
    s.claim(1, "w1").deliver(1, "w1", status=503).finish(1, "w1", "retried")
    s.claim(1, "w1").deliver(1, "w1").finish(1, "w1")
    history = s.end()
    del history.transitions[1]  # the retry vanished
    _one(_violations(history), "history gap")


def test_an_illegal_transition_is_caught():
    s = Story(1).deliver_all()
    s._change(1, "w1", status="pending")  # done -> pending: no step of the protocol does that
    _one(_violations(s), "illegal change done v1 a1 -> pending")


def test_a_takeover_of_a_live_lease_is_caught():
    s = Story(1)
    s.claim(1, "w1").claim(1, "w2").deliver(1, "w2").finish(1, "w2")  # no expiry in between
    _one(_violations(s), "w2 took over a lease that had not expired")


def test_attempts_over_the_limit_are_caught():
    s = Story(1, max_attempts=2)
    s.claim(1, "w1").expire().claim(1, "w2").expire().claim(1, "w3")
    s.deliver(1, "w3").finish(1, "w3")
    violations = _violations(s)
    _one(violations, "attempts 3 over the limit 2")
    _one(violations, "taken over at the last attempt instead of reaped")


def test_reaping_at_the_last_attempt_is_legal_and_reaping_early_is_not():
    s = Story(1, max_attempts=1)
    s.claim(1, "w1").fault("crash", "w1").expire().reap(1, "w2")
    verdict = check(s.end())
    assert verdict.violations == [] and verdict.dead == 1
    s = Story(1, max_attempts=2)
    s.claim(1, "w1").reap(1, "w2")
    violations = _violations(s)
    _one(violations, "reaped a lease that had not expired")
    _one(violations, "reaped with attempts left")


def test_a_requeue_by_a_worker_is_caught():
    s = Story(1, max_attempts=1)
    s.claim(1, "w1").deliver(1, "w1", status=503).finish(1, "w1", "dead").requeue(1, "w1")
    s.claim(1, "w1").deliver(1, "w1").finish(1, "w1")
    _one(_violations(s), "requeue by w1, who is no operator")


def test_ordered_mode_catches_a_later_id_delivered_first():
    s = Story(2, ordered=True, aggregates=1)
    s.claim(2, "w1").deliver(2, "w1").finish(2, "w1")
    s.claim(1, "w1").deliver(1, "w1").finish(1, "w1")
    _one(_violations(s), "id 2 first delivered before id 1")
    in_order = Story(2, ordered=True, aggregates=1).deliver_all()
    assert _violations(in_order) == []


def test_a_double_effect_is_caught():
    s = Story(1)
    s.claim(1, "w1").deliver(1, "w1").fault("SIGKILL", "w1").expire()
    s.claim(1, "w2").deliver(1, "w2").finish(1, "w2")
    history = s.end()
    # The inbox let the takeover's delivery through: it applied the message a second time.
    history.effects[1] = 2
    history.deliveries[-1] = replace(history.deliveries[-1], applied=True)
    verdict = check(history)
    _one(verdict.violations, "id 1: 2 effects (double effect)")
    _one(verdict.violations, "the inbox let 2 deliveries apply it")
    assert (verdict.effects, verdict.absorbed, verdict.double_effects) == (2, 0, 1)


def test_an_effect_must_match_a_delivery_and_a_delivery_an_effect():
    s = Story(2, max_attempts=1)
    s.claim(1, "w1").deliver(1, "w1").finish(1, "w1")
    s.claim(2, "w1").deliver(2, "w1", status=503).finish(2, "w1", "dead")
    history = s.end()
    del history.effects[1]  # answered 2xx, its effect rolled back
    history.effects[2] = 1  # applied, and yet answered 503
    violations = _violations(history)
    _one(violations, "id 1: delivered (2xx) but no effect applied")
    _one(violations, "id 2: an effect without a 2xx delivery")


def test_a_2xx_the_inbox_never_saw_is_caught():
    history = Story(1).deliver_all().end()
    history.deliveries[0] = replace(history.deliveries[0], applied=None)
    _one(_violations(history), "id 1: 1 2xx deliveries neither applied nor absorbed")
