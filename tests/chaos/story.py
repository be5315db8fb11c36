"""Hand-written histories for the checker's unit tests: a tiny model of the protocol that
writes the three witnesses (row changes, sink requests and the effects its inbox applied,
worker logs) consistently, so a test can tell a story step by step and then break exactly one
thing."""

from __future__ import annotations

from dataclasses import dataclass, replace

from chaos.history import (
    Committed,
    Config,
    Delivery,
    Fault,
    Final,
    History,
    LogEvent,
    Transition,
)
from outbox.queries import REAPED_ERROR

LEASE = 2.0


@dataclass
class _Row:
    status: str = "pending"
    version: int = 0
    attempts: int = 0
    owner: str | None = None
    lease_until: float | None = None
    error: str | None = None
    available_at: float = 0.0


class Story:
    def __init__(
        self,
        ids: int = 3,
        *,
        max_attempts: int = 3,
        ordered: bool = False,
        aggregates: int = 1,
        operators: frozenset[str] = frozenset(),
    ) -> None:
        self.now = 1000.0
        self.rows = {i: _Row() for i in range(1, ids + 1)}
        self.history = History(
            Config(max_attempts, publish_timeout=1.0, ordered=ordered, operators=operators),
            committed=[Committed(i, f"agg-{i % aggregates}") for i in self.rows],
        )
        self._seq = 0
        self._line = 0

    # -- the database ---------------------------------------------------------------------

    def _change(self, message_id: int, actor: str, **new: object) -> None:
        old = self.rows[message_id]
        row = replace(old, **new)  # type: ignore[arg-type]
        self._seq += 1
        self.history.transitions.append(
            Transition(
                seq=self._seq, id=message_id, actor=actor, tx_now=self.now,
                old_status=old.status, new_status=row.status, old_version=old.version,
                new_version=row.version, old_attempts=old.attempts, new_attempts=row.attempts,
                old_owner=old.owner, new_owner=row.owner, old_lease_until=old.lease_until,
                new_lease_until=row.lease_until, new_available_at=row.available_at,
                new_error=row.error,
            )
        )  # fmt: skip
        self.rows[message_id] = row

    def _log(self, worker: str, kind: str, **fields: object) -> None:
        self._line += 1
        self.history.logs.append(LogEvent(worker, self._line, kind, **fields))  # type: ignore[arg-type]

    def tick(self, seconds: float = 0.01) -> Story:
        self.now += seconds
        return self

    def claim(self, message_id: int, worker: str, *, log: bool = True) -> Story:
        old = self.rows[message_id]
        self.tick()
        self._change(
            message_id, worker, status="processing", version=old.version + 1,
            attempts=old.attempts + 1, owner=worker, lease_until=self.now + LEASE,
        )  # fmt: skip
        if log:
            self._log(worker, "claimed", ids=(message_id,), versions=(old.version + 1,))
        return self

    def deliver(self, message_id: int, worker: str, status: int = 200, took: float = 0.01) -> Story:
        """A request; a 2xx goes through the downstream's inbox, which applies the first."""
        self.tick()
        applied = None
        if 200 <= status < 300:
            applied = message_id not in self.history.effects
            if applied:
                self.history.effects[message_id] = 1
        self.history.deliveries.append(
            Delivery(
                key=message_id, body_id=message_id, worker=worker,
                attempt=self._attempt_of(message_id, worker), status=status,
                received=self.now, answered=self.now + took, applied=applied,
            )
        )  # fmt: skip
        self.tick(took)
        return self

    def _attempt_of(self, message_id: int, worker: str) -> int:
        # The attempt number of this worker's latest lease on the row.
        for t in reversed(self.history.transitions):
            if t.id == message_id and t.new_owner == worker and t.new_status == "processing":
                return t.new_attempts
        return 0

    def _version_of(self, message_id: int, worker: str) -> int:
        for t in reversed(self.history.transitions):
            if t.id == message_id and t.new_owner == worker and t.new_status == "processing":
                return t.new_version
        return 0

    def finish(
        self, message_id: int, worker: str, outcome: str = "done", *, applied: bool | None = None
    ) -> Story:
        """The worker's finalize, fenced like the real one unless `applied` overrides it."""
        self.tick()
        version = self._version_of(message_id, worker)
        row = self.rows[message_id]
        holds = row.status == "processing" and row.version == version
        applied = holds if applied is None else applied
        if applied:
            new: dict[str, object] = {"owner": None, "lease_until": None}
            if outcome == "done":
                new |= {"status": "done", "error": None}
            elif outcome == "retried":
                new |= {"status": "pending", "error": "retryable: HTTP 503"}
            elif outcome == "timed out":
                new |= {"status": "pending", "error": "retryable: publish timed out after 1s"}
                outcome = "retried"
            elif outcome == "dead":
                new |= {"status": "dead", "error": "retries exhausted"}
            self._change(message_id, worker, **new)
        self._log(
            worker, "finalized", ids=(message_id,), versions=(version,), outcomes=(outcome,),
            applied=(applied,),
        )  # fmt: skip
        return self

    def expire(self) -> Story:
        return self.tick(LEASE + 0.5)

    def reap(self, message_id: int, worker: str) -> Story:
        self.tick()
        self._change(
            message_id, worker, status="dead", owner=None, lease_until=None, error=REAPED_ERROR
        )
        return self

    def requeue(self, message_id: int, operator: str) -> Story:
        self.tick()
        self._change(message_id, operator, status="pending", attempts=0, available_at=self.now)
        return self

    def fault(self, kind: str, worker: str | None = None) -> Story:
        self.history.faults.append(Fault(kind, worker, self.now))
        if kind in ("SIGKILL", "crash") and worker:
            self.history.died = self.history.died | {worker}
        return self

    def end(self) -> History:
        self.history.final = {
            i: Final(i, r.status, r.attempts, r.version, r.error) for i, r in self.rows.items()
        }
        return self.history

    def deliver_all(self, worker: str = "w1") -> Story:
        """Claim, deliver and finish every row still pending, in id order."""
        for message_id, row in self.rows.items():
            if row.status == "pending":
                self.claim(message_id, worker).deliver(message_id, worker).finish(
                    message_id, worker
                )
        return self
