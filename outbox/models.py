"""The values that cross the table protocol's boundary."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum
from typing import NamedTuple


class Status(StrEnum):
    PENDING = "pending"
    PROCESSING = "processing"
    DONE = "done"
    DEAD = "dead"


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


@dataclass(frozen=True, slots=True)
class Event:
    """What an application enqueues."""

    aggregate_type: str
    aggregate_id: str
    event_type: str
    payload: object


class Outcome(NamedTuple):
    """How one claimed message ends its lease; built with the constructors below."""

    message_id: int
    lease_version: int
    status: Status  # DONE, DEAD or PENDING
    delay: float = 0.0  # seconds until available again, for PENDING
    error: str | None = None
    refund_attempt: bool = False  # defer and release: the claim did not count as an attempt
    deferred: bool = False  # subject to the maximum defer age

    @classmethod
    def done(cls, msg: Message) -> Outcome:
        return cls(msg.id, msg.lease_version, Status.DONE)  # the hot path: positional

    @classmethod
    def dead(cls, msg: Message, error: str) -> Outcome:
        return cls(msg.id, msg.lease_version, Status.DEAD, error=error)

    @classmethod
    def retry(cls, msg: Message, delay: timedelta, error: str) -> Outcome:
        return cls(msg.id, msg.lease_version, Status.PENDING, delay.total_seconds(), error)

    @classmethod
    def defer(cls, msg: Message, delay: timedelta, reason: str) -> Outcome:
        return cls(
            msg.id,
            msg.lease_version,
            Status.PENDING,
            delay.total_seconds(),
            f"deferred: {reason}",
            refund_attempt=True,
            deferred=True,
        )

    @classmethod
    def release(cls, msg: Message) -> Outcome:
        """Give an unstarted (or abandoned) message back: available now, attempt refunded."""
        return cls(msg.id, msg.lease_version, Status.PENDING, refund_attempt=True)
