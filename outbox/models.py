"""The values that cross the table protocol's boundary."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum
from typing import NamedTuple


class Status(StrEnum):
    """A row's place in its life (docs/protocol.md draws every transition)."""

    PENDING = "pending"
    """Waiting: claimable once `available_at` has passed (new, retried, deferred, released,
    requeued, or taken back from an expired lease by the next claim)."""
    PROCESSING = "processing"
    """Leased: `lease_owner` is publishing it until `lease_until`; only a write fenced on its
    `lease_version` may end it. Claimable again after the lease expires."""
    DONE = "done"
    """Delivered (or skipped on purpose by a person); purged after the retention period."""
    DEAD = "dead"
    """Given up: a permanent failure, attempts exhausted, or deferred past the maximum age.
    Stays until a person requeues or skips it; in ordered mode it blocks its aggregate."""


class OutcomeKind(StrEnum):
    """How a publish ended, as metrics and logs name it; several end the row `pending`."""

    DONE = "done"
    DEAD = "dead"
    RETRIED = "retried"  # pending after a backoff; the attempt counts
    DEFERRED = "deferred"  # pending later at the publisher's request; the attempt is refunded
    RELEASED = "released"  # given back unstarted (shutdown); available now, attempt refunded


# The header every publisher adds to a replayed message: the replay's number
# (outbox.operations.replay). Informational: a receiver acts on the body's `replay` field,
# which a signature covers.
REPLAY_HEADER = "Outbox-Replay"


class Message(NamedTuple):
    """A claimed row: what a publisher sends, plus the lease that fences its finalize.

    (Named tuples: built per message on the hot path, where frozen dataclasses cost more.)
    """

    id: int
    lease_version: int
    attempts: int
    aggregate_type: str
    aggregate_id: str
    event_type: str
    payload_json: str  # the jsonb as text: publishers forward it without decoding it
    created_at: datetime
    headers: Mapping[str, str] | None = None
    """What the producer added (schema v4's `headers`): W3C trace context, tenant ids. None
    when it added nothing. Publishers forward it after the project's own headers. A claimed
    message's are string names and values only, within MAX_HEADER_COUNT and
    MAX_HEADERS_BYTES (outbox.limits): the claim sends a row with any other to dead."""
    replay: int | None = None
    """The number of the replay that sent this message again (outbox.operations.replay), None for a
    first delivery: publishers send it as the `Outbox-Replay` header and, where the format
    has a body of its own, as a field of it. The message keeps its id."""
    age_at_claim: float = 0.0
    """Seconds from the row's created_at to the claim that leased it, both on the
    database's clock (the claim's now()): the worker adds the time it held the message, so
    its age at publish never depends on the worker's own wall clock."""


@dataclass(frozen=True, slots=True)
class Event:
    """What an application enqueues."""

    aggregate_type: str
    aggregate_id: str
    event_type: str
    payload: object
    headers: Mapping[str, str] | None = None
    """Metadata sent beside the payload (HTTP, NATS or Kafka headers): string names and
    values, bounded in size (outbox.limits.MAX_HEADERS_BYTES)."""


_new_tuple = tuple.__new__


class Outcome(NamedTuple):
    """How one claimed message ends its lease; built with the constructors below."""

    message_id: int
    lease_version: int
    kind: OutcomeKind
    delay: float = 0.0  # seconds until available again, for the kinds that end pending
    error: str | None = None

    @property
    def status(self) -> Status:
        """The row's status after this outcome."""
        return _STATUS_AFTER[self.kind]

    @property
    def refund_attempt(self) -> bool:
        """Defer and release: the claim did not count as an attempt."""
        return self.kind in (OutcomeKind.DEFERRED, OutcomeKind.RELEASED)

    @property
    def deferred(self) -> bool:
        """Subject to the maximum defer age."""
        return self.kind is OutcomeKind.DEFERRED

    @classmethod
    def done(cls, msg: Message) -> Outcome:
        # The hot path, once per message: built as the tuple it is, every field given, which
        # skips the generated constructor's keyword and default handling.
        return _new_tuple(cls, (msg.id, msg.lease_version, OutcomeKind.DONE, 0.0, None))

    @classmethod
    def all_done(cls, messages: Iterable[Message]) -> list[Outcome]:
        """`done` for each of a batch's messages, without a call per message (half the cost
        of mapping `done`)."""
        done = OutcomeKind.DONE
        return [_new_tuple(cls, (m.id, m.lease_version, done, 0.0, None)) for m in messages]

    @classmethod
    def dead(cls, msg: Message, error: str) -> Outcome:
        return cls(msg.id, msg.lease_version, OutcomeKind.DEAD, error=error)

    @classmethod
    def retry(cls, msg: Message, delay: timedelta, error: str) -> Outcome:
        return cls(msg.id, msg.lease_version, OutcomeKind.RETRIED, delay.total_seconds(), error)

    @classmethod
    def defer(cls, msg: Message, delay: timedelta, reason: str) -> Outcome:
        return cls(
            msg.id,
            msg.lease_version,
            OutcomeKind.DEFERRED,
            delay.total_seconds(),
            f"deferred: {reason}",
        )

    @classmethod
    def release(cls, msg: Message, delay: float = 0.0) -> Outcome:
        """Give a message back unsent (unstarted at a stop, abandoned, or held back from a
        destination that is down): available after `delay` seconds, attempt refunded."""
        return cls(msg.id, msg.lease_version, OutcomeKind.RELEASED, delay)


_STATUS_AFTER = {
    OutcomeKind.DONE: Status.DONE,
    OutcomeKind.DEAD: Status.DEAD,
    OutcomeKind.RETRIED: Status.PENDING,
    OutcomeKind.DEFERRED: Status.PENDING,
    OutcomeKind.RELEASED: Status.PENDING,
}
