"""The messages one replica holds, from claim to finalize: the only state its services share.

A message is *held* from its claim until its outcome is written (or given up). While held it
is first *waiting* (claimed, not started), then *publishing*, then an *outcome* waiting for
the finalizer. The claimer adds messages, the publishers take them and turn them into
outcomes, the finalizer writes outcomes and drops what they end, the lease keeper renews
what is held. Three events carry the news: there is room to claim, outcomes are waiting,
nothing is held any more.

The ledger does no I/O, so its rules (how much may be claimed, which leases are due, what a
late outcome may drop) are tested without a database.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Iterable
from itertools import repeat
from operator import attrgetter, sub

from outbox.limits import CLAIM_BYTES
from outbox.models import Message, Outcome

# Field readers for map(): the per-batch steps below loop in C, not once per message in Python.
_id, _lease_version, _payload, _age_at_claim = (
    attrgetter("id"),
    attrgetter("lease_version"),
    attrgetter("payload_json"),
    attrgetter("age_at_claim"),
)
_outcome_id, _outcome_version = attrgetter("message_id"), attrgetter("lease_version")


class Ledger:
    def __init__(self, batch: int, concurrency: int, claim_bytes: int = CLAIM_BYTES) -> None:
        self.batch = batch
        self.concurrency = concurrency
        self.claim_bytes = claim_bytes
        self.held: dict[int, Message] = {}
        # Payload held, in characters of its text (its bytes for ASCII, which JSON mostly
        # is; the claim counts bytes). A running average per message sizes the next claim.
        self.held_bytes = 0
        self.payload_average = 0.0
        self.renewed_at: dict[int, float] = {}  # monotonic time of claim or last renewal
        # When each held message was created, as a monotonic time: its age at the claim (the
        # database's now(), at the claim's start) before the claim was sent. Its age at
        # publish follows from it.
        self.created_at: dict[int, float] = {}
        self.waiting: collections.deque[Message] = collections.deque()
        self.publishing = 0
        # A deque and an event cost less per message than an asyncio.Queue.
        self.outcomes: collections.deque[Outcome] = collections.deque()
        self.outcomes_waiting = asyncio.Event()
        self.room = asyncio.Event()  # publishing or finalizing freed room to claim
        self.drained = asyncio.Event()  # nothing is held
        self.drained.set()
        # How long the last claim that found messages took; when the last batch came in,
        # and how long after that a publishing task ran dry.
        self.claim_seconds = 0.0
        self.held_at = 0.0
        self.published_in = 0.0

    # -- claiming ---------------------------------------------------------------------------

    def room_to_claim(self, now: float) -> int:
        """How many messages the next claim may ask for.

        At most `2 * batch + concurrency` may be held: one batch's outcomes being written
        while the next is published. Of those, at most `batch + concurrency` may be waiting
        or publishing; a publisher faster than the database (the last batch was published
        in less time than a claim takes) gets one batch more. The next claim then goes out
        as soon as the last one is in, so its round trip overlaps publishing instead of
        following it. A slower publisher is not claimed ahead of: its messages would wait,
        leased, while other workers could publish them.
        """
        unpublished = len(self.waiting) + self.publishing
        limit = self.batch + self.concurrency
        if self._publishing_outpaces_claims(now):
            limit += self.batch
        held_limit = 2 * self.batch + self.concurrency
        return min(limit - unpublished, held_limit - len(self.held))

    def worth_claiming(self, room: int) -> bool:
        """Enough room for a claim worth its round trip, and some of the byte budget left
        (any claim, when nothing is held)."""
        if not self.held:
            return True
        return room >= min(self.batch, max(1, self.batch // 2)) and self.bytes_to_claim() > 0

    def bytes_to_claim(self) -> int:
        """The byte budget of the next claim: what is left of `claim_bytes` (a claim takes
        one message even past it, so when nothing is held any message comes in)."""
        return self.claim_bytes - self.held_bytes

    def rows_for(self, budget: int, room: int) -> int:
        """How many rows a claim of `budget` bytes asks for, at most `room`: as many as the
        recent payloads say fit, and one more. Rows past the budget are measured by the claim
        and left, so large payloads are asked for a few at a time."""
        average = self.payload_average
        if average * room <= budget:  # the common case: small payloads
            return room
        return max(1, min(room, int(budget // average) + 1))

    def _publishing_outpaces_claims(self, now: float) -> bool:
        """The last batch in had all started publishing sooner than a claim takes, and no
        message waiting now has waited that long."""
        waited = self.published_in
        if self.waiting:
            oldest = self.waiting[0].id
            waited = max(waited, now - self.renewed_at.get(oldest, self.held_at))
        return waited < self.claim_seconds

    def hold(
        self, messages: list[Message], now: float, claim_seconds: float, sent: float | None = None
    ) -> None:
        """Claimed messages join the ledger, waiting to be published. `claim_seconds`: how
        long the claim took, waits for a connection included; `sent`: when the claim that
        returned them was sent (by default `now - claim_seconds`), their ages count from it."""
        self.claim_seconds = claim_seconds
        self.held_at = now
        ids = list(map(_id, messages))
        self.held.update(zip(ids, messages, strict=True))
        self.renewed_at.update(zip(ids, repeat(now)))
        if sent is None:
            sent = now - claim_seconds
        created = map(sub, repeat(sent), map(_age_at_claim, messages))
        self.created_at.update(zip(ids, created, strict=True))
        claimed = sum(map(len, map(_payload, messages)))
        self.held_bytes += claimed
        if messages:
            # Half the last claim, half those before: follows a change of sizes in a few claims.
            last = claimed / len(messages)
            average = self.payload_average
            self.payload_average = (average + last) / 2 if average else last
        self.waiting.extend(messages)
        self.drained.clear()

    # -- publishing -------------------------------------------------------------------------

    def take(self, limit: int, now: float) -> list[Message]:
        """Up to `limit` waiting messages, oldest first, counted as publishing."""
        waiting = self.waiting
        if limit >= len(waiting):  # all of them: a batch publisher's usual take
            taken = list(waiting)
            waiting.clear()
        else:
            taken = [waiting.popleft() for _ in range(limit)]
        self.publishing += len(taken)
        self._after_take(now)
        return taken

    def take_one(self, now: float) -> Message | None:
        """The oldest waiting message, counted as publishing (the per-message path's
        `take`, without building a list per message)."""
        if not self.waiting:
            return None
        message = self.waiting.popleft()
        self.publishing += 1
        self._after_take(now)
        return message

    def _after_take(self, now: float) -> None:
        if len(self.waiting) == self.batch // 2:
            # Room for a worthwhile claim now, whatever the finalizer does: wake the
            # claimer, so the next batch comes in before publishing runs dry.
            self.room.set()

    def ages(self, messages: Iterable[Message], now: float) -> list[float]:
        """Seconds since each held message was created, on the database's clock (computed
        by map() in C: a batch's at once)."""
        return list(map(sub, repeat(now), map(self.created_at.__getitem__, map(_id, messages))))

    def ran_dry(self, now: float) -> None:
        """A publishing task finished its last publish and found nothing waiting: how long
        the last batch took to publish, measured at its end (a publisher stuck on its
        publishes must not look fast: it is not claimed ahead of); room to claim."""
        self.published_in = now - self.held_at
        self.room.set()

    def published(self, count: int = 1) -> None:
        """`count` publishes ended (their outcomes follow, or they were given up)."""
        self.publishing -= count

    def put_outcome(self, outcome: Outcome) -> None:
        self.outcomes.append(outcome)
        self.outcomes_waiting.set()

    def put_outcomes(self, outcomes: Iterable[Outcome]) -> None:
        self.outcomes.extend(outcomes)
        self.outcomes_waiting.set()

    def release_waiting(self) -> int:
        """Give every unstarted message back (a stop): their outcomes are releases."""
        unstarted = list(self.waiting)
        self.waiting.clear()
        self.put_outcomes(Outcome.release(message) for message in unstarted)
        return len(unstarted)

    # -- finalizing -------------------------------------------------------------------------

    def take_outcomes(self, limit: int) -> list[Outcome]:
        outcomes = self.outcomes
        if limit >= len(outcomes):
            taken = list(outcomes)
            outcomes.clear()
            return taken
        return [outcomes.popleft() for _ in range(limit)]

    def drop(self, message_id: int, lease_version: int) -> None:
        """The lease `lease_version` of the message ended: forget it, unless the message is
        held again under a newer lease (a takeover of our own after ours expired)."""
        held = self.held.get(message_id)
        if held is not None and held.lease_version == lease_version:
            del self.held[message_id]
            self.renewed_at.pop(message_id, None)
            self.created_at.pop(message_id, None)
            self.held_bytes -= len(held.payload_json)

    def drop_all(self, outcomes: Iterable[Outcome]) -> None:
        """`drop` for each outcome's message and lease, in one call. When every message is
        held under the lease its outcome ends (the common case), all are dropped together
        without a call per message; otherwise each goes through `drop`."""
        held, renewed_at = self.held, self.renewed_at
        outcomes = list(outcomes)
        ids = list(map(_outcome_id, outcomes))
        found = list(map(held.get, ids))
        if None not in found and list(map(_lease_version, found)) == list(
            map(_outcome_version, outcomes)
        ):
            # The common case: every one held under the lease its outcome ends. Dropped by
            # map() in C (a deque of no length consumes what returns nothing to keep).
            popped = list(map(held.pop, ids, repeat(None)))  # None for an id seen twice
            collections.deque(map(renewed_at.pop, ids, repeat(None)), maxlen=0)
            collections.deque(map(self.created_at.pop, ids, repeat(None)), maxlen=0)
            self.held_bytes -= sum(map(len, map(_payload, filter(None, popped))))
            return
        for outcome in outcomes:
            self.drop(outcome.message_id, outcome.lease_version)

    def freed(self) -> None:
        """After dropping (once per batch, not per message): wake the claimer, and the
        shutdown once nothing is held."""
        self.room.set()
        if not self.held:
            self.drained.set()

    def forget(self, message_id: int, lease_version: int) -> None:
        """Give a message up to its lease (a publisher bug, an outcome the database
        refuses): the lease runs out and another claim takes it."""
        self.drop(message_id, lease_version)
        self.freed()

    # -- leases -----------------------------------------------------------------------------

    def due_for_renewal(self, now: float, after: float) -> list[Message]:
        """Held messages whose lease was last renewed `after` seconds ago or more."""
        renewed_at = self.renewed_at
        return [m for i, m in self.held.items() if now - renewed_at.get(i, now) >= after]

    def renewed(self, message_ids: Iterable[int], now: float) -> None:
        for message_id in message_ids:
            if message_id in self.renewed_at:  # still held
                self.renewed_at[message_id] = now
