"""The history checker, in the spirit of Jepsen's `total-queue`: after the queue drained,
every committed message was delivered at least once or is dead with a reason, nothing
unexpected arrived, every duplicate has a cause, the receiver's inbox turned the deliveries
into exactly one effect per message, and the lease protocol's invariants held on every single
row change.

Plain functions over a `History`; `check` runs them all and returns a `Verdict` whose
`violations` must be empty. Each invariant is a separate function so that its unit test
can feed it a history that breaks exactly that invariant.
"""

from __future__ import annotations

import itertools
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field

from chaos.history import Delivery, History, LogEvent, Transition
from outbox.queries import REAPED_ERROR

# Kinds of row change, told apart by what changed (see docs/protocol.md, "States").
CLAIM = "claim"  # pending -> processing, version + 1, attempts + 1
TAKEOVER = "takeover"  # processing (expired) -> processing, version + 1, attempts + 1
EXTEND = "extend"  # processing -> processing, same version: the lease keeper pushed lease_until
DONE = "done"  # finalize: processing -> done
RETRY = "retry"  # finalize: processing -> pending, attempt kept
RELEASE = "release"  # finalize: processing -> pending, attempt refunded (shutdown)
DEFER = "defer"  # finalize: processing -> pending, attempt refunded, "deferred: ..."
DEAD = "dead"  # finalize: processing -> dead
REAP = "reap"  # claim: processing (expired, last attempt) -> dead
REQUEUE = "requeue"  # a person: dead -> pending, attempts 0
SKIP = "skip"  # a person: dead -> done
ILLEGAL = "illegal"

FINALIZES = frozenset({DONE, RETRY, RELEASE, DEFER, DEAD})
LEASES = frozenset({CLAIM, TAKEOVER})
# What a worker's `finalized` log line calls each finalize.
LOG_OUTCOME = {"done": DONE, "retried": RETRY, "released": RELEASE, "deferred": DEFER, "dead": DEAD}

# Faults that keep workers from the database (the proxy's and the server's).
DATABASE_FAULTS = frozenset({"restart", "terminate", "drop", "stall"})
# The database and the sink read the same host clock; this absorbs float rounding only.
CLOCK_SLACK = 0.002


def kind(t: Transition) -> str:
    """Which protocol step a row change is; ILLEGAL when it matches none."""
    step = t.new_version - t.old_version
    if step == 1 and t.new_status == "processing" and t.new_attempts == t.old_attempts + 1:
        if t.old_status == "pending":
            return CLAIM
        if t.old_status == "processing":
            return TAKEOVER
        return ILLEGAL
    if step != 0:
        return ILLEGAL
    if t.old_status == "processing":
        if t.new_status == "processing":
            same = t.new_attempts == t.old_attempts and t.new_owner == t.old_owner
            return EXTEND if same else ILLEGAL
        if t.new_status == "done":
            return DONE
        if t.new_status == "dead":
            if t.new_error == REAPED_ERROR and t.new_attempts == t.old_attempts:
                return REAP
            return DEAD
        if t.new_status == "pending":
            if t.new_attempts == t.old_attempts:
                return RETRY
            if t.new_attempts == t.old_attempts - 1:
                return DEFER if (t.new_error or "").startswith("deferred") else RELEASE
        return ILLEGAL
    if t.old_status == "dead" and t.new_status == "pending" and t.new_attempts == 0:
        return REQUEUE
    if t.old_status == "dead" and t.new_status == "done":
        return SKIP
    return ILLEGAL


@dataclass
class Verdict:
    messages: int = 0
    delivered: int = 0  # distinct committed ids the sink answered 2xx
    deliveries: int = 0  # 2xx answers in all
    explained: int = 0
    unexplained: int = 0
    dead: int = 0
    lost: int = 0
    reasons: Counter[str] = field(default_factory=Counter)  # why duplicates happened
    lost_leases: int = 0  # stale finalizes the fence refused (worker logs)
    effects: int = 0  # effects the downstream applied through its inbox
    absorbed: int = 0  # 2xx deliveries its inbox found applied already
    double_effects: int = 0  # effects beyond the first of a message
    violations: list[str] = field(default_factory=list)

    @property
    def duplicates(self) -> int:
        return self.deliveries - self.delivered


def _by_id(transitions: Iterable[Transition]) -> dict[int, list[Transition]]:
    rows: dict[int, list[Transition]] = defaultdict(list)
    for t in sorted(transitions, key=lambda t: t.seq):
        rows[t.id].append(t)
    return rows


# -- the row-level invariants ----------------------------------------------------------------


def check_transitions(history: History) -> list[str]:
    """Legal steps only, each by whom it may be made, with lease_version only growing and
    the rows' histories complete (each change starts where the previous one ended)."""
    problems: list[str] = []
    limit = history.config.max_attempts
    committed = {c.id for c in history.committed}
    for message_id, changes in _by_id(history.transitions).items():
        if message_id not in committed:
            problems.append(f"row {message_id} changed but was never committed")
        previous: Transition | None = None
        for t in changes:
            where = f"row {message_id} seq {t.seq}"
            if previous is None:
                if (t.old_status, t.old_version) != ("pending", 0):
                    problems.append(
                        f"{where}: first change starts from {t.old_status} v{t.old_version}"
                    )
            elif (t.old_status, t.old_version, t.old_attempts) != (
                previous.new_status, previous.new_version, previous.new_attempts,
            ):  # fmt: skip
                problems.append(f"{where}: history gap (starts where no change ended)")
            previous = t
            if t.new_version < t.old_version:
                problems.append(
                    f"{where}: lease_version went down {t.old_version} -> {t.new_version}"
                )
            if t.new_attempts > limit:
                problems.append(f"{where}: attempts {t.new_attempts} over the limit {limit}")
            step = kind(t)
            if step == ILLEGAL:
                problems.append(
                    f"{where}: illegal change {t.old_status} v{t.old_version} a{t.old_attempts} -> "
                    f"{t.new_status} v{t.new_version} a{t.new_attempts} by {t.actor}"
                )
            elif step in LEASES:
                if t.new_owner != t.actor:
                    problems.append(f"{where}: {t.actor} claimed in the name of {t.new_owner}")
                if (
                    step == CLAIM
                    and t.new_available_at is not None
                    and (t.new_available_at > t.tx_now)
                ):
                    problems.append(f"{where}: claimed before its available_at (backoff ignored)")
                if step == TAKEOVER and not _expired(t):
                    problems.append(f"{where}: {t.actor} took over a lease that had not expired")
                if step == TAKEOVER and t.old_attempts >= limit:
                    problems.append(f"{where}: taken over at the last attempt instead of reaped")
            elif step == REAP:
                if not _expired(t):
                    problems.append(f"{where}: reaped a lease that had not expired")
                if t.old_attempts < limit:
                    problems.append(f"{where}: reaped with attempts left ({t.old_attempts})")
            elif step in FINALIZES or step == EXTEND:
                # The fence: only the holder of this lease_version may change the row.
                if t.actor != t.old_owner:
                    problems.append(
                        f"{where}: stale {step} by {t.actor} changed a row leased to "
                        f"{t.old_owner} (v{t.old_version})"
                    )
            elif step in (REQUEUE, SKIP) and t.actor not in history.config.operators:
                problems.append(f"{where}: {step} by {t.actor}, who is no operator")
        final = history.final.get(message_id)
        if (
            previous is not None
            and final is not None
            and ((final.status, final.lease_version) != (previous.new_status, previous.new_version))
        ):
            problems.append(f"row {message_id}: final state is not where its history ended")
    return problems


def _expired(t: Transition) -> bool:
    return t.old_lease_until is not None and t.old_lease_until < t.tx_now


def check_attempts(history: History) -> list[str]:
    limit = history.config.max_attempts
    return [
        f"row {f.id}: attempts {f.attempts} over the limit {limit}"
        for f in history.final.values()
        if f.attempts > limit
    ]


def check_drained(history: History) -> list[str]:
    """Once the faults stop, the backlog drains: every row ends done or dead."""
    waiting = Counter(f.status for f in history.final.values() if f.status not in ("done", "dead"))
    return [f"not drained: {n} rows still {status}" for status, n in sorted(waiting.items())]


# -- deliveries ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Lease:
    """One claim of one row: the unit a publish happens under."""

    id: int
    version: int
    owner: str
    attempts: int
    at: float  # database now() of the claim
    ended: str  # how the lease ended: a finalize kind, TAKEOVER, REAP, or "open"
    error: str | None = None  # last_error written when it ended


def leases(history: History) -> dict[int, list[Lease]]:
    """Every lease of every row, with how it ended."""
    found: dict[int, list[Lease]] = defaultdict(list)
    for message_id, changes in _by_id(history.transitions).items():
        for i, t in enumerate(changes):
            if kind(t) not in LEASES:
                continue
            ended, error = "open", None
            for later in changes[i + 1 :]:
                step = kind(later)
                if later.old_version == t.new_version and step != EXTEND:
                    ended, error = step, later.new_error
                    break
            found[message_id].append(
                Lease(message_id, t.new_version, t.actor, t.new_attempts, t.tx_now, ended, error)
            )
    return found


def lease_of(delivery: Delivery, candidates: list[Lease]) -> Lease | None:
    """The lease a request was sent under: the same worker's latest claim of that id at that
    attempt number made before the request arrived (refunds can repeat an attempt number)."""
    matching = [
        lease
        for lease in candidates
        if lease.owner == delivery.worker
        and lease.attempts == delivery.attempt
        and lease.at <= delivery.received + CLOCK_SLACK
    ]
    return max(matching, key=lambda lease: lease.at) if matching else None


def check_unexpected(history: History) -> list[str]:
    """The sink never saw an id that was never committed, nor a key that is not the id."""
    committed = {c.id for c in history.committed}
    problems = []
    for d in history.deliveries:
        if d.key is None or d.key not in committed:
            problems.append(f"the sink saw id {d.key!r} (status {d.status}), never committed")
        elif d.body_id is not None and d.body_id != d.key:
            problems.append(f"Idempotency-Key {d.key} carried the body of id {d.body_id}")
    return problems


def _why_again(lease: Lease, delivery: Delivery, history: History) -> str | None:
    """Why a message was delivered under `lease` and still sent again; None: no good reason."""
    faults = {(f.kind, f.worker) for f in history.faults}
    if lease.ended in (TAKEOVER, REAP):
        if ("SIGKILL", lease.owner) in faults:
            return "worker SIGKILLed after publishing, before finalizing; lease expired"
        if ("crash", lease.owner) in faults:
            return "worker crashed after publishing, before finalizing; lease expired"
        if ("SIGSTOP", lease.owner) in faults:
            return "worker paused past its lease; taken over, its finalize fenced"
        if any(f.kind in DATABASE_FAULTS for f in history.faults):
            return "lease expired while the database was out of reach; taken over"
        return "lease expired before the worker renewed it; taken over"
    if lease.ended in (RETRY, DEAD):
        if delivery.answered - delivery.received >= history.config.publish_timeout * 0.9:
            return "the downstream answered after the publish timeout; retried"
        if "publish timed out" in (lease.error or ""):
            # The answer was in time by the sink's clock, not by the time the worker got to
            # read it (a starved or paused worker): its timeout fired first.
            return "the worker timed out before it read the answer; retried"
        if ("SIGSTOP", lease.owner) in faults:
            return "worker paused during the publish; timed out and retried"
        return None  # a 2xx in time, and yet not done: the worker misread the answer
    if lease.ended == RELEASE:
        return "publish abandoned at shutdown after the grace period; released"
    return None


def check_deliveries(history: History, verdict: Verdict) -> list[str]:
    """Nothing lost, every delivery sent under a lease its worker held, every duplicate
    explained; fills in the verdict's counts."""
    problems: list[str] = []
    all_leases = leases(history)
    ok: dict[int, list[Delivery]] = defaultdict(list)
    for d in history.deliveries:
        if d.ok and d.key is not None:
            ok[d.key].append(d)
    for d in history.deliveries:
        if d.key is not None and d.key in history.final and lease_of(d, all_leases[d.key]) is None:
            problems.append(
                f"id {d.key}: sent by {d.worker} (attempt {d.attempt}) without a lease it held"
            )
    for c in history.committed:
        final = history.final.get(c.id)
        sent = sorted(ok.get(c.id, []), key=lambda d: d.received)
        verdict.deliveries += len(sent)
        if sent:
            verdict.delivered += 1
        if final is not None and final.status == "dead":
            verdict.dead += 1
            if not (final.last_error or "").strip():
                problems.append(f"id {c.id}: dead without a reason")
                verdict.lost += 1
        elif not sent:
            problems.append(
                f"id {c.id}: lost (status {final.status if final else '?'}, never delivered)"
            )
            verdict.lost += 1
        if not sent:
            continue
        by_lease: dict[Lease | None, list[Delivery]] = defaultdict(list)
        for d in sent:
            by_lease[lease_of(d, all_leases[c.id])].append(d)
        done_leases = [lease for lease in all_leases[c.id] if lease.ended == DONE]
        if len(done_leases) > 1:
            problems.append(f"id {c.id}: finalized done {len(done_leases)} times")
        done = done_leases[0] if done_leases else None
        if done is not None and done not in by_lease:
            problems.append(f"id {c.id}: done under v{done.version} without a 2xx delivery")
        base = by_lease[done][0] if done in by_lease else sent[0]
        for lease, group in by_lease.items():
            for n, d in enumerate(group):
                if d is base:
                    continue
                reason = None
                if lease is not None and n == 0 and lease is not done:
                    reason = _why_again(lease, d, history)
                if reason is None:
                    verdict.unexplained += 1
                    where = f"v{lease.version} ({lease.ended})" if lease else "no lease"
                    problems.append(
                        f"id {c.id}: unexplained duplicate from {d.worker} under {where}"
                    )
                else:
                    verdict.explained += 1
                    verdict.reasons[reason] += 1
    return problems


def check_effects(history: History, verdict: Verdict) -> list[str]:
    """Through the inbox, at-least-once delivery became one effect: each delivered message
    applied exactly once, every other 2xx delivery of it absorbed, no effect without a
    delivery; fills in the verdict's counts."""
    problems: list[str] = []
    ok: dict[int, list[Delivery]] = defaultdict(list)
    for d in history.deliveries:
        if d.ok and d.key is not None:
            ok[d.key].append(d)
    committed = {c.id for c in history.committed}
    for message_id, n in sorted(history.effects.items()):
        verdict.effects += n
        verdict.double_effects += max(n - 1, 0)
        if n > 1:
            problems.append(f"id {message_id}: {n} effects (double effect)")
        if message_id not in committed:
            problems.append(f"id {message_id}: an effect for an id never committed")
        elif not ok.get(message_id):
            problems.append(f"id {message_id}: an effect without a 2xx delivery")
    for message_id, sent in sorted(ok.items()):
        applied = sum(d.applied is True for d in sent)
        verdict.absorbed += sum(d.applied is False for d in sent)
        if message_id in committed and message_id not in history.effects:
            problems.append(f"id {message_id}: delivered (2xx) but no effect applied")
        if applied > 1:
            problems.append(f"id {message_id}: the inbox let {applied} deliveries apply it")
        unapplied = sum(d.applied is None for d in sent)
        if unapplied:
            problems.append(
                f"id {message_id}: {unapplied} 2xx deliveries neither applied nor absorbed"
            )
    return problems


def check_order(history: History) -> list[str]:
    """Ordered mode: within an aggregate, first deliveries arrive in id order."""
    if not history.config.ordered:
        return []
    first: dict[int, float] = {}
    for d in history.deliveries:
        if d.ok and d.key is not None:
            first[d.key] = min(first.get(d.key, d.received), d.received)
    by_aggregate: dict[str, list[int]] = defaultdict(list)
    for c in history.committed:
        if c.id in first:
            by_aggregate[c.aggregate_id].append(c.id)
    problems = []
    for aggregate, ids in by_aggregate.items():
        ids.sort()
        for earlier, later in itertools.pairwise(ids):
            if first[later] < first[earlier]:
                problems.append(
                    f"aggregate {aggregate}: id {later} first delivered before id {earlier}"
                )
    return problems


# -- the workers' own account ----------------------------------------------------------------


def check_logs(history: History, verdict: Verdict) -> list[str]:
    """What the workers logged agrees with what the database recorded.

    A claim or finalize the database made for a worker but the worker never logged is
    allowed only if the worker died, or its connection failed during that statement (the
    change committed, the reply was lost: it then logs a database error). A finalize the
    worker logged as refused (lost lease) must not have changed the row, with the same
    exception: a finalize whose reply was lost is retried and then finds its own change.
    """
    problems: list[str] = []
    made: dict[tuple[str, int, int], str] = {}  # (actor, id, version) -> kind
    granted: set[tuple[str, int, int]] = set()
    for t in history.transitions:
        step = kind(t)
        if step in LEASES:
            granted.add((t.actor, t.id, t.new_version))
        elif step in FINALIZES:
            made[(t.actor, t.id, t.old_version)] = step
    by_worker: dict[str, list[LogEvent]] = defaultdict(list)
    for event in history.logs:
        by_worker[event.worker].append(event)
    logged_claims: set[tuple[str, int, int]] = set()
    logged_finalizes: set[tuple[str, int, int]] = set()
    for worker, events in by_worker.items():
        failed = {e.operation for e in events if e.kind == "db_error"}
        for e in sorted(events, key=lambda e: e.line):
            if e.kind == "claimed":
                for message_id, version in zip(e.ids, e.versions, strict=True):
                    logged_claims.add((worker, message_id, version))
                    if (worker, message_id, version) not in granted:
                        problems.append(
                            f"{worker} logged a lease on id {message_id} v{version} "
                            "the database never granted"
                        )
            elif e.kind == "finalized":
                rows = zip(e.ids, e.versions, e.outcomes, e.applied, strict=True)
                for message_id, version, outcome, applied in rows:
                    key = (worker, message_id, version)
                    logged_finalizes.add(key)
                    if applied and not _same_outcome(made.get(key), outcome):
                        problems.append(
                            f"{worker} logged {outcome} of id {message_id} v{version} as "
                            f"written; the database recorded {made.get(key)}"
                        )
                    elif not applied:
                        verdict.lost_leases += 1
                        if key in made and "finalize" not in failed:
                            problems.append(
                                f"{worker}'s refused finalize of id {message_id} v{version} "
                                "changed the row (fencing broken)"
                            )
    for actor, message_id, version in granted:
        key = (actor, message_id, version)
        if actor in history.died or key in logged_claims or actor not in by_worker:
            continue
        if "claim" not in {e.operation for e in by_worker[actor] if e.kind == "db_error"}:
            problems.append(f"the database leased id {message_id} v{version} to {actor}, "
                            "who never logged it")  # fmt: skip
    for (actor, message_id, version), _step in made.items():
        if (
            actor in history.died
            or actor not in by_worker
            or (actor, message_id, version) in (logged_finalizes)
        ):
            continue
        problems.append(
            f"the database recorded {actor}'s finalize of id {message_id} v{version}, "
            "which it never logged"
        )
    return problems


def _same_outcome(recorded: str | None, logged: str) -> bool:
    if recorded is None:
        return False
    if logged == "deferred" and recorded == DEAD:
        return True  # deferred past the maximum defer age: the database made it dead
    refunds = {RELEASE, DEFER}
    expected = LOG_OUTCOME.get(logged)
    return recorded == expected or (recorded in refunds and expected in refunds)


def check(history: History) -> Verdict:
    verdict = Verdict(messages=len(history.committed))
    verdict.violations = [
        *check_unexpected(history),
        *check_deliveries(history, verdict),
        *check_effects(history, verdict),
        *check_transitions(history),
        *check_attempts(history),
        *check_order(history),
        *check_drained(history),
        *check_logs(history, verdict),
    ]
    return verdict
