"""The scaling policy, rule by rule, on hand-made stats snapshots (no database, no clock)."""

from __future__ import annotations

import itertools
from collections import deque
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import yaml

from outbox.controller import scaling
from outbox.controller.decision import Decision, Limits, Observed, decide
from outbox.controller.scaling import (
    MAX_CURVE_POINTS,
    SCALING_RANGES,
    STALE_AFTER_SECONDS,
    STARTUP_DELAY_SECONDS,
    ScalingPolicy,
    ScalingSettings,
)
from outbox.controller.spec import camel
from outbox.stats import DestinationState, QueueStats

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def snap(
    t: float,
    *,
    max_id: int,
    ready: int = 0,
    age: float | None = None,
    processing: int = 0,
    heads: int | None = None,
    head_age: float | None = None,
) -> QueueStats:
    return QueueStats(
        table="outbox",
        sampled_at=T0 + timedelta(seconds=t),
        pending=ready,
        ready=ready,
        processing=processing,
        dead=0,
        done=0,
        done_is_estimate=False,
        expired_leases=0,
        oldest_pending_age=age,
        oldest_ready_age=age if ready else None,
        max_id=max_id,
        attempts={},
        claimable_heads=heads,
        oldest_claimable_age=head_age,
    )


class Queue:
    """A FIFO queue with a known per-worker drain rate, sampled like the operator samples.

    With `in_flight` a second's arrivals are claimed only in the next second, so every
    snapshot sees them claimable (up to a second old) although the workers have room: rows
    that arrive faster than a claim's round trip.
    """

    def __init__(
        self,
        policy: ScalingPolicy,
        *,
        mu: float,
        replicas: int = 0,
        startup: float = STARTUP_DELAY_SECONDS,
        in_flight: bool = False,
    ) -> None:
        self.policy, self.mu, self.startup, self.in_flight = policy, mu, startup, in_flight
        self.t, self.arrived = 0.0, 0
        self.cohorts: deque[list[float]] = deque()  # [arrived at, messages], oldest first
        self.replicas = self.ready = replicas
        self.starting: list[tuple[float, int]] = []  # (productive at, replicas asked for)
        self.decisions: list[Decision] = []
        self.max_age = 0.0

    @property
    def waiting(self) -> float:
        return sum(n for _, n in self.cohorts)

    @property
    def age(self) -> float:
        return self.t - self.cohorts[0][0] if self.cohorts else 0.0

    def _serve(self, capacity: float) -> None:
        while capacity > 0 and self.cohorts:
            take = min(capacity, self.cohorts[0][1])
            self.cohorts[0][1] -= take
            capacity -= take
            if self.cohorts[0][1] <= 1e-9:
                self.cohorts.popleft()

    def run(
        self,
        seconds: float,
        rate: float,
        *,
        every: float = 5.0,
        down: tuple[DestinationState, ...] = (),
    ) -> list[Decision]:
        """Arrivals at `rate` for `seconds` in 1 s steps; a poll every `every` seconds.
        With `down` (destinations open or paused) nothing is delivered, and the count is
        the operator's decide step's (the policy, the destination rule, the bounds)."""
        out: list[Decision] = []
        for _ in range(round(seconds)):
            self.t += 1
            self.ready = max(
                [self.ready] + [min(n, self.replicas) for at, n in self.starting if at <= self.t]
            )
            self.starting = [(at, n) for at, n in self.starting if at > self.t]
            if rate > 0 and not self.in_flight:
                self.cohorts.append([self.t, rate])
                self.arrived += round(rate)
            self._serve(0.0 if down else self.mu * self.ready)
            if rate > 0 and self.in_flight:  # arrived over the last second, not claimed yet
                self.cohorts.append([self.t - 1, rate])
                self.arrived += round(rate)
            self.max_age = max(self.max_age, self.age)
            if self.t % every:
                continue
            stats = snap(self.t, max_id=self.arrived, ready=round(self.waiting), age=self.age)
            if down:
                stats = replace(stats, destinations=down)  # the reading shows them
                observed = Observed(stats, None, self.replicas, self.ready, down)
                limits = Limits.of(self.policy.settings)
                d = decide(observed, limits, lambda: self.policy)
            else:
                d = self.policy.decide_explained(
                    stats, replicas=self.replicas, ready_replicas=self.ready
                )
            if d.replicas > self.replicas:
                self.starting.append((self.t + self.startup, d.replicas))
            self.ready = min(self.ready, d.replicas)
            self.replicas = d.replicas
            out.append(d)
        self.decisions += out
        return out


def test_missing_keys_take_the_crd_defaults():
    assert ScalingPolicy({}).settings == ScalingSettings()
    assert ScalingSettings.from_spec(None) == ScalingSettings(
        min_replicas=0,
        max_replicas=10,
        target_oldest_ready_age_seconds=30,
        poll_interval_seconds=5,
        scale_down_stabilization_seconds=300,
    )
    assert ScalingSettings.from_spec({"maxReplicas": 3}).max_replicas == 3


@pytest.mark.parametrize(
    ("scaling", "says"),
    [
        ({"maxreplicas": 3}, "unknown key 'maxreplicas'"),
        ({"minReplicas": 4, "maxReplicas": 3}, "minReplicas must not exceed"),
        ({"minReplicas": -1}, "scaling.minReplicas must be a number from 0 to 1000"),
        ({"maxReplicas": 0}, "scaling.maxReplicas must be a number from 1 to 1000"),
        ({"pollIntervalSeconds": "5s"}, "scaling.pollIntervalSeconds must be a number"),
        ({"pollIntervalSeconds": 0.5}, "scaling.pollIntervalSeconds must be a number from 1"),
        (
            {"targetOldestReadyAgeSeconds": 0},
            "targetOldestReadyAgeSeconds must be a number from 0.1",
        ),
    ],
)
def test_bad_settings_name_the_key(scaling, says):
    with pytest.raises(ValueError, match=says):
        ScalingPolicy(scaling)


def test_paused_is_zero_whatever_waits():
    policy = ScalingPolicy({"minReplicas": 2})
    d = policy.decide_explained(
        snap(0, max_id=9000, ready=9000, age=600), replicas=5, ready_replicas=5, paused=True
    )
    assert (d.replicas, d.reason) == (0, "Paused")
    assert policy.last_decision == d


def test_wakes_from_zero_on_the_first_ready_message():
    policy = ScalingPolicy({})
    assert policy.decide(snap(0, max_id=0), replicas=0, ready_replicas=0) == 0
    n = policy.decide(snap(5, max_id=1, ready=1, age=0.5), replicas=0, ready_replicas=0)
    assert n >= 1
    assert policy.last_decision is not None and policy.last_decision.reason != "Idle"


def test_learns_the_drain_rate_while_saturated():
    policy = ScalingPolicy({"maxReplicas": 50})
    queue = Queue(policy, mu=200, replicas=2)
    queue.run(60, rate=1000)  # far more than 2 workers deliver: saturated until scaled up
    assert policy.drain_rate.measured
    assert policy.drain_rate.value == pytest.approx(200, rel=0.01)


def test_arrivals_faster_than_a_claim_round_trip_are_not_saturation():
    # 500/s for workers of 200/s: 3 suffice (the fewest above 500/s), and they have room.
    # Every snapshot sees the last second's 500 arrivals claimable, at every poll: read as
    # saturation, completions per worker (500 / n) would pass for a worker's speed, and each
    # worker added would lower it and ask for more, up to maxReplicas.
    policy = ScalingPolicy({"maxReplicas": 50})
    queue = Queue(policy, mu=200, replicas=1, in_flight=True)
    queue.run(300, rate=500)  # wakes up, measures a worker's speed, settles
    assert queue.replicas == 3
    decisions = queue.run(3600, rate=500)
    assert max(d.replicas for d in decisions) == 3, decisions
    assert queue.replicas == 3 and queue.max_age < 30
    # A worker's speed is never under-read (a probe that overshoots may measure it again).
    assert policy.drain_rate.value >= 200 * 0.98


def test_real_saturation_still_scales_up_when_arrivals_are_in_flight():
    policy = ScalingPolicy({"maxReplicas": 50})
    queue = Queue(policy, mu=200, replicas=2, in_flight=True)
    queue.run(120, rate=1000)  # far more than 2 workers deliver: the oldest message waits
    assert policy.drain_rate.measured
    assert policy.drain_rate.value == pytest.approx(200, rel=0.02)
    queue.max_age = 0.0
    queue.run(600, rate=1000)
    assert queue.replicas == 6  # the fewest whose capacity exceeds 1000/s
    assert queue.max_age < 30


def test_the_rate_part_asks_for_the_fewest_workers_whose_capacity_exceeds_the_arrivals():
    # 1,150/s for workers of 200/s: 6 serve it (1,200/s); a share of the capacity kept
    # spare (95% gives 7) pays a whole worker for noise the backlog part meets. At exactly
    # a multiple (1,000/s, above) the count is one more: a queue served only as fast as rows
    # arrive grows without bound.
    policy = ScalingPolicy({"maxReplicas": 50})
    queue = Queue(policy, mu=200, replicas=2)
    queue.run(300, rate=1150)
    assert policy.drain_rate.measured
    queue.max_age = 0.0
    decisions = queue.run(1800, rate=1150)
    assert queue.replicas == 6 and {d.replicas for d in decisions[-60:]} == {6}, decisions[-5:]
    assert queue.max_age < 30


@pytest.mark.parametrize(
    ("age", "seconds", "saturated"),
    [
        (1.0, 5.0, False),  # the last second's arrivals: claimed within a round trip
        (4.9, 5.0, False),  # arrived within the interval: the workers may have had room
        (5.0, 5.0, True),  # claimable at both snapshots and never taken
        (1.5, 1.0, False),  # short intervals: not longer than a worker may take to claim
        (2.0, 1.0, True),
    ],
)
def test_saturation_is_a_message_that_waited_through_the_interval(age, seconds, saturated):
    assert scaling.waited_throughout(age, seconds) is saturated


def test_scales_up_at_once_and_keeps_the_age_under_the_target():
    policy = ScalingPolicy({"maxReplicas": 50})
    queue = Queue(policy, mu=200, replicas=1)
    queue.run(300, rate=150)
    steady = queue.replicas
    first = queue.run(5, rate=2000)[0]
    assert first.replicas > steady, first  # one poll after the step
    queue.run(300, rate=2000)
    assert queue.max_age < 30
    assert queue.replicas >= 10  # 2,000/s needs at least 10 workers of 200/s


def test_scales_down_only_after_the_window_but_releases_a_burst_at_once():
    policy = ScalingPolicy({"maxReplicas": 50, "scaleDownStabilizationSeconds": 300})
    queue = Queue(policy, mu=200, replicas=1)
    queue.run(600, rate=1000)
    busy = queue.replicas
    assert busy >= 5
    # The rate drops: the size holds through the window, then comes down.
    held = queue.run(295, rate=200)
    assert min(d.replicas for d in held) == busy
    queue.run(60, rate=200)
    assert queue.replicas < busy
    assert queue.replicas >= 1  # 200/s still needs a worker


def test_no_stabilization_window_follows_the_rate_at_once():
    policy = ScalingPolicy({"maxReplicas": 50, "scaleDownStabilizationSeconds": 0})
    queue = Queue(policy, mu=200, replicas=1)
    queue.run(600, rate=1000)
    busy = queue.replicas
    assert busy >= 5
    queue.run(30, rate=200)
    assert 1 <= queue.replicas < busy


def test_burst_capacity_is_released_once_the_burst_drained():
    policy = ScalingPolicy({"maxReplicas": 50})
    queue = Queue(policy, mu=200, replicas=1)
    queue.run(600, rate=100)
    calm = queue.replicas
    queue.run(5, rate=6000)  # 30,000 messages in one interval
    burst = queue.run(60, rate=100)
    assert max(d.replicas for d in burst) > calm
    assert any(d.reason == "Backlog" for d in burst)
    assert queue.replicas <= calm  # well before the 300 s window is over


def test_to_zero_only_after_idle_for_the_window_and_back_at_once():
    policy = ScalingPolicy({"scaleDownStabilizationSeconds": 300})
    queue = Queue(policy, mu=200, replicas=1)
    queue.run(120, rate=50)
    idle = queue.run(295, rate=0)
    assert min(d.replicas for d in idle) >= 1
    queue.run(65, rate=0)  # the arrival rate's median reaches zero within a minute
    assert queue.replicas == 0
    assert queue.decisions[-1].reason == "Idle"
    woken = queue.run(5, rate=10)
    assert woken[0].replicas >= 1


def test_never_outside_the_bounds():
    policy = ScalingPolicy({"minReplicas": 2, "maxReplicas": 4})
    queue = Queue(policy, mu=200, replicas=2)
    decisions = queue.run(30, rate=3000) + queue.run(900, rate=0)
    assert max(d.replicas for d in decisions) == 4
    assert min(d.replicas for d in decisions) == 2
    assert decisions[-1].reason == "MinReplicas"


def test_ordered_mode_sizes_on_claimable_heads_and_caps_at_aggregates_with_work():
    policy = ScalingPolicy({"maxReplicas": 50})
    # 50,000 rows arrive in 5 s and wait (a deep backlog, an hour old), but they belong to
    # 3 aggregates: 3 claimable heads, so 3 workers at most, however high the arrival rate.
    policy.decide(snap(0, max_id=0), replicas=1, ready_replicas=1)
    stats = snap(5, max_id=50_000, ready=50_000, age=3600, heads=3, head_age=2.0)
    d = policy.decide_explained(stats, replicas=1, ready_replicas=1)
    assert d.replicas == 3 and d.reason == "AggregatesWithWork"
    # Nothing claimable and nothing in flight: rows behind dead heads need no workers, and
    # their age (an hour) is not the claimable age.
    later = snap(10, max_id=50_000, ready=50_000, age=3605, heads=0, head_age=None)
    d = policy.decide_explained(later, replicas=3, ready_replicas=3)
    assert (d.replicas, d.reason) == (1, "IdleStabilizing")


def test_same_snapshots_same_decisions():
    def run() -> list[Decision]:
        queue = Queue(ScalingPolicy({"maxReplicas": 30}), mu=150, replicas=0)
        return queue.run(200, rate=20) + queue.run(200, rate=1500) + queue.run(600, rate=40)

    assert run() == run()


def test_learns_how_long_new_workers_take_to_start():
    policy = ScalingPolicy({"maxReplicas": 50})
    assert policy.startup_delay.value == STARTUP_DELAY_SECONDS  # assumed until measured
    queue = Queue(policy, mu=200, replicas=1, startup=45)
    queue.run(60, rate=100)
    queue.run(120, rate=3000)  # scale-ups, each timed until the ready replicas reach it
    assert policy.startup_delay.value == pytest.approx(45, abs=5)  # to within a poll


def test_a_slow_start_asks_for_more_workers_sooner():
    def first_scale_up(startup: float) -> int:
        policy = ScalingPolicy({"maxReplicas": 100})
        queue = Queue(policy, mu=200, replicas=1, startup=startup)
        queue.run(60, rate=100)
        queue.run(120, rate=3000)  # the policy measures the start-up delay here
        queue.run(900, rate=100)
        return next(d.replicas for d in queue.run(30, rate=1500) if d.reason == "Backlog")

    # The same step asks for more when pods take 60 s: more backlog builds before they help.
    assert first_scale_up(60) > first_scale_up(10)


def test_an_over_provisioned_deployment_finds_its_real_capacity():
    # 20 workers for 500/s at 400/s each: never saturated, so the drain rate is only ever
    # bounded from below; probing removes workers until they saturate, which measures it.
    policy = ScalingPolicy({"maxReplicas": 50})
    queue = Queue(policy, mu=400, replicas=20)
    queue.run(1800, rate=500)
    assert policy.drain_rate.measured
    assert policy.drain_rate.value == pytest.approx(400, rel=0.02)
    assert queue.replicas == 2  # the fewest whose capacity exceeds 500/s
    assert queue.max_age < 30  # probing cost a few seconds of age, never the target


def test_the_defaults_are_the_crds():
    crd = yaml.safe_load((Path(__file__).parent.parent / "crds/outboxdispatchers.yaml").read_text())
    spec = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    schema = spec["properties"]["scaling"]["properties"]
    defaults = {key: value["default"] for key, value in schema.items()}
    assert ScalingSettings.from_spec(defaults) == ScalingSettings()
    assert set(defaults) == set(ScalingSettings().to_spec())
    ranges = {key: (value["minimum"], value["maximum"]) for key, value in schema.items()}
    assert ranges == {camel(name): bounds for name, bounds in SCALING_RANGES.items()}


def test_a_probe_that_overshoots_is_taken_back_before_the_target_at_long_polls():
    # Polled every 30 s (the target): the workers' speed is measured only by a message that
    # waited a whole interval, which is already the target. A probe that removes a worker
    # too many shows sooner, as a message waiting longer than a worker with room leaves
    # one: the probe is taken back, and not tried again for a while.
    policy = ScalingPolicy({"maxReplicas": 50, "pollIntervalSeconds": 30})
    queue = Queue(policy, mu=200, replicas=3)
    queue.run(600, rate=500, every=30)
    queue.max_age = 0.0
    decisions = queue.run(3600, rate=500, every=30)
    assert queue.max_age < 30
    assert {d.replicas for d in decisions} <= {2, 3} and queue.replicas == 3
    # At most one probe per STALE_AFTER_SECONDS after one overshot.
    probes = sum(1 for a, b in itertools.pairwise(decisions) if a.replicas > b.replicas)
    assert probes <= 3600 / STALE_AFTER_SECONDS + 1


def test_a_measurement_that_grew_stale_is_probed_again():
    # Measured while the downstream was slow (100/s per worker); then it gets three times
    # faster. The workers are never saturated again, so only probing can find it out.
    policy = ScalingPolicy({"maxReplicas": 50})
    queue = Queue(policy, mu=100, replicas=1)
    queue.run(600, rate=500)
    assert policy.drain_rate.measured and policy.drain_rate.value == pytest.approx(100, rel=0.02)
    slow = queue.replicas
    assert slow == 6  # the fewest whose capacity exceeds 500/s
    queue.mu = 300
    queue.run(STALE_AFTER_SECONDS / 3, rate=500)
    assert queue.replicas == slow  # a fresh measurement is trusted
    queue.run(1200, rate=500)
    assert policy.drain_rate.value == pytest.approx(300, rel=0.02)
    assert queue.replicas == 2  # the fewest whose capacity exceeds 500/s


def test_a_decision_raised_to_min_replicas_says_so():
    policy = ScalingPolicy({"minReplicas": 2, "maxReplicas": 4})
    queue = Queue(policy, mu=200, replicas=2)
    decision = queue.run(900, rate=0)[-1]
    assert decision.reason == "MinReplicas"
    assert decision.message.startswith("minReplicas is 2; wanted 0: "), decision.message


def test_an_edited_spec_scaling_keeps_what_the_policy_learned():
    from outbox.controller.reconcile import DispatcherLoop

    # The loop's policy reads no context: the resource's own policy, across spec edits.
    loop = DispatcherLoop(context=None, body={})  # type: ignore[arg-type]
    policy = loop.policy(ScalingSettings.from_spec({"maxReplicas": 50}))
    Queue(policy, mu=200, replicas=2).run(60, rate=1000)
    assert policy.drain_rate.measured

    edited = loop.policy(
        ScalingSettings.from_spec({"maxReplicas": 20, "targetOldestReadyAgeSeconds": 5})
    )
    assert edited is policy
    assert edited.settings.max_replicas == 20
    assert edited.settings.target_oldest_ready_age_seconds == 5
    assert edited.drain_rate.value == pytest.approx(200, rel=0.01)


OUTAGE = (
    DestinationState(
        destination="http://api.test:80",
        state="open",
        since=T0,
        for_seconds=0.0,
        failures=5,
        last_error="HTTP 503",
        last_failure=T0,
        next_probe_at=None,
        next_probe_in=None,
        probing=None,
        reason=None,
        changed_by=None,
    ),
)


def test_an_outage_holds_the_workers_and_the_backlog_it_left_is_caught_up_after():
    policy = ScalingPolicy({"maxReplicas": 20})
    queue = Queue(policy, mu=200, replicas=1)
    queue.run(600, rate=300)
    steady, mu = queue.replicas, policy.drain_rate.value
    assert steady == 2 and mu == pytest.approx(200, rel=0.02)  # 2 x 200/s exceed 300/s
    # Ten minutes of a destination that answers nothing: arrivals pile up, the ready age
    # grows to 600 s, and the count holds: more workers would not deliver one more message.
    held = queue.run(600, rate=300, down=OUTAGE)
    assert {(d.replicas, d.reason) for d in held} == {(steady, "DestinationUnreachable")}
    assert queue.waiting == pytest.approx(180_000, rel=0.01) and queue.age >= 595
    # What a worker delivers is unchanged by the outage (nothing was measured in it).
    assert policy.drain_rate.value == pytest.approx(mu, rel=0.02)
    # It closes: the next poll sizes for the backlog that piled up.
    after = queue.run(5, rate=300)[0]
    assert after.reason == "Backlog" and after.replicas == 20, after
    # 20 x 200/s against 300/s of arrivals, after the start-up delay (20 s): the oldest
    # ready age is back under the target (30 s) about a minute after the first poll.
    recovered = queue.t
    while queue.age >= 30 and queue.t - recovered < 300:
        queue.run(1, rate=300, every=1)
    assert queue.t - recovered < 90, queue.age
    # Then the arrivals' size again, and the rest drains under the target.
    queue.max_age = 0.0
    queue.run(300, rate=300)
    assert queue.replicas == steady and queue.max_age < 30
    assert queue.waiting < 300 * 5  # no more than one poll's arrivals wait


def outage_of(seconds: float) -> tuple[ScalingPolicy, Decision]:
    """The policy after `seconds` of a destination down at 50 messages/s, and its first
    decision once the destination is back."""
    policy = ScalingPolicy({"maxReplicas": 1000})
    queue = Queue(policy, mu=200, replicas=2)
    queue.run(300, rate=50)
    queue.run(seconds, rate=50, down=OUTAGE)
    return policy, queue.run(5, rate=50)[0]


def test_a_long_outage_keeps_the_arrival_curve_small_and_decides_the_same(monkeypatch):
    # The arrival curve reaches back to the oldest claimable message: after two hours of
    # 5 s polls that is 1,440 points, each looked at by every decision, unless thinned.
    policy, decision = outage_of(7200)
    assert len(policy._history) <= MAX_CURVE_POINTS
    assert decision.reason == "Backlog" and decision.replicas > 100, decision
    monkeypatch.setattr(scaling.policy, "MAX_CURVE_POINTS", 10**9)  # where the policy reads it
    whole, same = outage_of(7200)
    assert len(whole._history) > 1400
    assert same == decision


def test_what_was_delivered_around_an_outage_measures_no_workers_speed():
    # One worker of 40/s for 20/s: never saturated, so its speed is a guess (the prior).
    # Then the destination fails: arrivals wait claimable (saturated) and nothing is
    # delivered; it comes back between two polls. The poll interval that spans the
    # recovery delivered a little in a whole interval: read as a worker's speed, that
    # would be a fraction of it, and the rate part would ask for every worker allowed.
    policy = ScalingPolicy({"maxReplicas": 10, "pollIntervalSeconds": 5})
    queue = Queue(policy, mu=40, replicas=1, startup=5)
    queue.run(300, rate=20)
    guess = policy.drain_rate.value
    assert not policy.drain_rate.measured
    queue.run(62, rate=20, down=OUTAGE)  # back 2 s after a poll
    queue.run(3, rate=20)  # the interval that spans the recovery
    assert policy.drain_rate.value >= guess  # nothing learned from it
    queue.run(600, rate=20)
    assert policy.drain_rate.value >= 40 * 0.9  # measured in the catch-up, or still guessed
    assert queue.replicas == 1
