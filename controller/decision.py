"""The decide step: how many workers a resource runs now, and why.

Pure: no Kubernetes, no database, no clock. A pass reads (`reconcile.py`), decides here,
applies the decision to the Deployment and reports it. The rules, first match wins:

0. A problem that stops the workers (`Problem.stops_workers`: the resource is outside the
   cluster admin's policy, or uses a Secret not shared with it) → 0, with its reason: what
   the resource may not have, it does not keep by running on.
1. `spec.paused` → 0 (`Paused`).
2. `spec.replicas` → that count, never past `maxReplicas` (`ReplicasPinned`).
3. No usable reading of the table → the current size (`HoldingSize`): workers are neither
   added nor removed blind; nor does a pinned count add workers while a problem stands (a
   new pod would read inputs this pass could not validate, such as a bad DSN in the Secret).
4. Otherwise the sizing policy's answer, within `minReplicas..maxReplicas` (`MinReplicas`,
   `MaxReplicas` say when a bound changed it); but while a destination the workers serve is
   open or paused (`Observed.open_destinations`) no more workers than run now
   (`DestinationUnreachable`): what holds the messages back is the destination, not
   capacity, and more workers would only wait beside the others. One worker at least, when
   the policy wants one, so that someone probes the destination; fewer are allowed. A
   destination no worker serves any more (idle: its URL changed, its workers are gone) holds
   nothing: no worker will ever probe it, and what the workers send goes elsewhere.

The policy is asked on every pass that has a reading, paused or pinned too: it learns from
each one. It answers with its wish alone; the limits (rules 1, 2 and 4's bounds) are applied
here and nowhere else, and the policy is told what was decided. A rule that needs another
input (e.g. a destination's health) takes it from `Observed` and goes into `decide` between
the policy's answer and the bounds.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from outbox.controller.problem import Problem
from outbox.controller.spec import ScalingSettings
from outbox.plumbing.redact import redact_text
from outbox.stats import DestinationState, QueueStats


@dataclass(frozen=True)
class Decision:
    """A replica count and why, in the shape of a Kubernetes Event (reason, message); the
    reason and message are the Scaling condition's."""

    replicas: int
    reason: str  # CamelCase, e.g. Backlog, ArrivalRate, Idle, Paused
    message: str


PAUSED_DECISION = Decision(0, "Paused", "spec.paused is true: no workers run")


class SizingPolicy(Protocol):
    """What the decide step asks of a policy on every pass that has a reading
    (`scaling.ScalingPolicy` is the one the operator ships; the benchmark plugs KEDA's models
    in through the same door).

    `wish` is the count the policy would run, from the reading alone: the bounds, a pinned
    count and the destinations are this module's to apply (once, in `decide`). `paused` says
    the spec holds the workers at zero: the policy learns from the reading and sizes nothing
    (`PAUSED_DECISION`). `decided` tells it the count the pass settled on, which is the one
    that will run (a policy learns how long asked-for workers take to start from it)."""

    def wish(
        self, stats: QueueStats, *, replicas: int, ready_replicas: int, paused: bool = False
    ) -> Decision: ...

    def decided(self, decision: Decision, *, replicas: int, ready_replicas: int) -> None: ...

    def reconfigure(self, scaling: ScalingSettings) -> None: ...


@dataclass(frozen=True)
class Limits:
    """What the spec says of the count whatever the policy wants: paused, pinned, bounds."""

    min_replicas: int
    max_replicas: int
    paused: bool = False
    pinned: int | None = None  # spec.replicas

    @classmethod
    def of(
        cls, scaling: ScalingSettings, *, paused: bool = False, pinned: int | None = None
    ) -> Limits:
        return cls(int(scaling.min_replicas), int(scaling.max_replicas), paused, pinned)

    def fixed(self) -> Decision | None:
        """The count when the policy has no say: paused (which wins), or pinned."""
        if self.paused:
            return PAUSED_DECISION
        if self.pinned is not None:
            pinned = min(self.pinned, self.max_replicas)
            message = f"spec.replicas pins {pinned} workers; remove it to autoscale"
            return Decision(pinned, "ReplicasPinned", message)
        return None

    def bound(self, wanted: Decision) -> Decision:
        """Never past maxReplicas, never under minReplicas, whatever asked for the count."""
        n, reason, message = wanted.replicas, wanted.reason, wanted.message
        if n > self.max_replicas:
            n, reason, message = self.max_replicas, "MaxReplicas", f"wanted more: {message}"
        if n < self.min_replicas:
            # Say what the floor raised, not only why fewer were wanted ("idle for 0s" alone
            # reads oddly on a wake-up to the minimum).
            message = f"minReplicas is {self.min_replicas}; wanted {n}: {message}"
            n, reason = self.min_replicas, "MinReplicas"
        return Decision(n, reason, message)


@dataclass(frozen=True)
class Observed:
    """What the read step found that the count depends on."""

    stats: QueueStats | None  # None: the table could not be read
    problem: Problem | None  # why the resource cannot be served, if it cannot
    replicas: int  # the Deployment's spec.replicas (0 without one of ours)
    ready_replicas: int
    # The destinations the workers serve and nothing is sent to (open or paused), from the
    # same reading (`QueueStats.unreachable`: idle ones left out).
    open_destinations: tuple[DestinationState, ...] = ()

    @property
    def reading(self) -> QueueStats | None:
        """The stats the policy may size on: none while a problem stands."""
        return self.stats if self.problem is None else None


def decide(observed: Observed, limits: Limits, policy: Callable[[], SizingPolicy]) -> Decision:
    """The count to run now (the module's rules). `policy` gives the resource's policy; it
    is called only when there is a reading to learn from, and told what was decided."""
    if observed.problem is not None and observed.problem.stops_workers:
        return Decision(0, observed.problem.reason, observed.problem.message)
    sizer = policy() if observed.reading is not None else None
    wanted = None
    if sizer is not None and observed.reading is not None:
        wanted = sizer.wish(
            observed.reading,
            replicas=observed.replicas,
            ready_replicas=observed.ready_replicas,
            paused=limits.paused,
        )
    decision = _within_limits(observed, limits, wanted)
    if sizer is not None:
        sizer.decided(decision, replicas=observed.replicas, ready_replicas=observed.ready_replicas)
    return decision


def _within_limits(observed: Observed, limits: Limits, wanted: Decision | None) -> Decision:
    """Rules 1 to 4: the spec's limits, the held size, the destinations, the bounds."""
    fixed = limits.fixed()
    if fixed is not None:
        if observed.problem is not None and fixed.replicas > observed.replicas:
            # A new pod reads its Secrets as they are now, and this pass could not validate
            # them (an InvalidDsn written to the Secret): it would crash where the running
            # workers, started on validated inputs, go on delivering.
            message = (
                f"size held at {observed.replicas} ({fixed.message}): new workers would start "
                f"on inputs that failed the check: {observed.problem.message}"
            )
            return Decision(observed.replicas, "HoldingSize", message)
        return fixed
    if wanted is None:
        why = observed.problem.message if observed.problem else "no backlog reading"
        return Decision(observed.replicas, "HoldingSize", f"size held: {why}")
    bounded = limits.bound(hold_for_destinations(wanted, observed))
    if bounded.reason == "MinReplicas" and bounded.replicas > observed.replicas:
        # Raised to the floor (a new resource, a resume): the floor is the reason, and what
        # the policy alone would run ("wanted 0: idle for 0s") only confuses the scale-up.
        message = f"minReplicas is {bounded.replicas}; {describe_reading(observed.stats)}"
        return Decision(bounded.replicas, bounded.reason, message)
    return bounded


def describe_reading(stats: QueueStats | None) -> str:
    """What the backlog looked like, for a scale Event: `12 messages ready, oldest 4s`,
    `3 in flight`, `nothing waiting`."""
    if stats is None:
        return "no backlog reading"
    parts = []
    if stats.ready:
        at_least = "" if stats.counts_exact else "at least "
        age = stats.oldest_ready_age or 0.0
        parts.append(f"{at_least}{stats.ready} messages ready, oldest {age:.0f}s")
    if stats.processing:
        parts.append(f"{stats.processing} in flight")
    return ", ".join(parts) or "nothing waiting"


def describe_unreachable(destinations: tuple[DestinationState, ...]) -> str:
    """`https://api.example.com:443 is open`, `2 destinations are open or paused` (a
    plugin's destination key may be anything: shown through outbox.plumbing.redact)."""
    if len(destinations) == 1:
        return redact_text(f"{destinations[0].destination} is {destinations[0].state}")
    states = " or ".join(sorted({d.state for d in destinations}))
    return f"{len(destinations)} destinations are {states}"


def hold_for_destinations(wanted: Decision, observed: Observed) -> Decision:
    """No more workers than run now while a destination is open or paused (rule 4; the
    bounds apply after it).

    After it closes the policy's answer stands again: the backlog that piled up is what the
    policy sizes for (its ready age and claimable count are high), so the workers catch up.
    """
    down = observed.open_destinations
    keep = max(observed.replicas, 1)  # someone must be there to probe it
    if not down or wanted.replicas < keep:
        return wanted
    held = f"holding {keep} workers"
    if keep > observed.replicas:  # none ran: one starts, which holds nothing
        held = "one worker to probe the destination"
    message = (
        f"{held} while {describe_unreachable(down)}: more workers do not "
        f"help a destination that does not answer (the policy wanted {wanted.replicas}: "
        f"{wanted.message})"
    )
    return Decision(keep, "DestinationUnreachable", message)
