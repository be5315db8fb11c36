"""The scaling policy: how many workers a table needs, from its stats alone.

    from outbox.controller.scaling import ScalingPolicy

    policy = ScalingPolicy(spec.get("scaling", {}))   # camelCase keys, as in the CRD
    n = policy.decide(stats, replicas=spec_replicas, ready_replicas=ready, paused=False)
    decision = policy.last_decision                   # replicas, reason (CamelCase), message

`decide_explained` returns the same `Decision` directly. Keep one policy per resource for
the resource's lifetime: it learns from the snapshots it is given (arrival rates, the
workers' drain rate, how long the queue has been idle). `paused` is an argument of each call,
not a key of `scaling`, because it is `spec.paused` and may flip at any time without the
history being lost: while paused the policy learns and sizes nothing.

`wish` is the policy's own answer, which the operator's decide step (`decision.decide`)
keeps within the resource's limits (paused, pinned, `minReplicas..maxReplicas`) and then
reports back with `decided`, so that start-up delays are learned from the count that will
really run. `decide_explained` does both with the policy's own limits, so that alone (tests,
the simulation) it says what the operator would run.

The package: `policy` (ScalingPolicy), `learning` (the drain rate and the start-up delay);
the settings are `spec.ScalingSettings`, `spec.scaling` parsed.

The policy is a pure function of the snapshots it has seen: no clock (time is
`stats.sampled_at`, the database's), no I/O, deterministic. In words (docs/autoscaling.md
has the formulas and the simulation that measures them):

- The work: arrivals (differences of `max_id`), the claimable backlog and the age of the
  oldest claimable message. In ordered mode these are the claimable heads' figures
  (`stats.oldest_claimable_age`, `stats.claimable_heads`): rows behind an unfinished or dead
  head cannot be claimed, and sizing on them would add workers that have nothing to do.
- The capacity: a worker's drain rate is measured, never configured. A span of polls in
  which the workers had no room throughout gives completions per ready replica; any other
  span gives only a lower bound. No room is shown by a message, not by a count: the oldest
  claimable message waited through the whole span, longer than a worker with room leaves
  one (`waited_throughout`). Claimable messages at every poll prove nothing: rows arriving
  faster than a claim's round trip are claimable at every instant while every worker has
  room. While the rate has not been seen under saturation, the estimate is probed upwards
  after each calm minute (no message waited), so that an over-provisioned deployment sheds
  workers until they saturate, which measures it; a probe after which a message waits is
  taken back at once, before it is measured (`DrainRate.overshot`). An
  interval in which a destination a worker serves was open or paused (`stats.unreachable`)
  measures nothing: the destination set the pace. An idle destination's row (no worker
  serves it any more) sets no pace and interrupts nothing. The start-up delay of new
  workers is measured too (`StartupDelay`).
- The size: enough capacity that (1) arrivals are served (the fewest workers whose
  capacity exceeds them; the noise on top is a backlog, the backlog part's), and (2) every
  message already waiting, or arriving before a pod started now becomes productive
  (measured; `STARTUP_DELAY_SECONDS` until then), is delivered before its age reaches the
  target.
- Up at once; the rate part comes down only after `scaleDownStabilizationSeconds`, the
  backlog part as soon as the backlog it was for has drained; to zero only after nothing was
  claimable or in flight for that window; from zero as soon as anything is claimable.
  Bounds: `minReplicas`..`maxReplicas`; ordered mode never more workers than aggregates with
  work (claimable heads plus heads in flight); paused: 0.
"""

from outbox.controller.scaling.learning import (
    ARRIVAL_WINDOW_SECONDS,
    CLAIM_WAIT_SECONDS,
    DRAIN_SAMPLES,
    FASTER,
    MAX_CURVE_POINTS,
    PRIOR_DRAIN_RATE,
    PROBE_AFTER_SECONDS,
    PROBE_FACTOR,
    SAMPLE_SECONDS,
    STALE_AFTER_SECONDS,
    STARTUP_DELAY_SECONDS,
    STARTUP_SAMPLES,
    DrainRate,
    StartupDelay,
    waited_throughout,
)
from outbox.controller.scaling.policy import ScalingPolicy
from outbox.controller.spec import SCALING_RANGES, ScalingSettings

__all__ = [
    "ARRIVAL_WINDOW_SECONDS",
    "CLAIM_WAIT_SECONDS",
    "DRAIN_SAMPLES",
    "FASTER",
    "MAX_CURVE_POINTS",
    "PRIOR_DRAIN_RATE",
    "PROBE_AFTER_SECONDS",
    "PROBE_FACTOR",
    "SAMPLE_SECONDS",
    "SCALING_RANGES",
    "STALE_AFTER_SECONDS",
    "STARTUP_DELAY_SECONDS",
    "STARTUP_SAMPLES",
    "DrainRate",
    "ScalingPolicy",
    "ScalingSettings",
    "StartupDelay",
    "waited_throughout",
]
