"""A `tui.source.Source` of fixed data, for snapshots (deterministic to the pixel) and for
timing tests (it can be slow on purpose and counts overlapping calls)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

from outbox.destinations import Destination
from outbox.operations.pausing import HandChange, Verb
from outbox.operations.repair import Action, ActionRecord, ActionResult, Seen
from outbox.stats import DestinationState, QueueStats
from outbox.tui.source import Overview
from outbox.views.dashboard import Blocked, BlockingHead, LeaseHolder, Session
from outbox.views.dead_letters import DeadMessage, DeadPage, ErrorGroup, MessageDetail
from outbox.views.filters import DeadFilter

NOW = datetime(2025, 3, 14, 12, 0, 0, tzinfo=UTC)


def clock() -> datetime:
    return NOW


ERRORS = [
    'HTTP 422: {"status": 422, "detail": "amount must be positive"}',
    "HTTP 503: upstream 9f86d081884c7d65 unavailable",
    "ConnectionRefusedError: [Errno 111] connect to 10.0.0.7:8080 refused",
    "lease expired on the last attempt (worker crashed, or publish outlived the lease)",
]
GROUP_KEYS = [
    'HTTP 422: {"status": <n>, "detail": <str>}',
    "HTTP 503: upstream <hex> unavailable",
    "ConnectionRefusedError: [Errno <n>] connect to <n>:<n> refused",
    "lease expired on the last attempt (worker crashed, or publish outlived the lease)",
]
EVENTS = ["OrderPaid", "OrderShipped", "OrderCancelled", "InvoiceIssued"]


def dead_messages(count: int = 60) -> list[DeadMessage]:
    return [
        DeadMessage(
            id=104_000 + i * 7,
            aggregate_type="order",
            aggregate_id=f"o-{1000 + i % 13}",
            event_type=EVENTS[i % len(EVENTS)],
            attempts=12 if i % 4 != 3 else 3,
            created_at=NOW - timedelta(minutes=5 * (count - i), seconds=i),
            last_error=ERRORS[i % len(ERRORS)],
            lease_version=12,
        )
        for i in range(count)
    ]


DESTINATIONS = [
    DestinationState(
        destination="https://api.payments.example",
        state="open",
        since=NOW - timedelta(minutes=4, seconds=12),
        for_seconds=252.0,
        failures=7,
        last_error="HTTP 503: upstream unavailable (after 10.0s)",
        last_failure=NOW - timedelta(seconds=3),
        next_probe_at=NOW + timedelta(seconds=12),
        next_probe_in=12.0,
        probing=None,
        reason=None,
        changed_by=None,
    ),
    DestinationState(
        destination="https://hooks.partner.example",
        state="paused",
        since=NOW - timedelta(hours=1, minutes=2),
        for_seconds=3720.0,
        failures=0,
        last_error=None,
        last_failure=None,
        next_probe_at=None,
        next_probe_in=None,
        probing=None,
        reason="partner maintenance until 14:00 (OPS-1234)",
        changed_by="maria",
    ),
    DestinationState(
        destination="kafka broker-1:9092,broker-2:9092",
        state="closed",
        since=NOW - timedelta(days=3, hours=2),
        for_seconds=266_400.0,
        failures=1,
        last_error="KafkaError: _MSG_TIMED_OUT: Local: Message timed out",
        last_failure=NOW - timedelta(minutes=20),
        next_probe_at=None,
        next_probe_in=None,
        probing=None,
        reason=None,
        changed_by="ops",
    ),
]


def stats(step: int) -> QueueStats:
    """A queue under steady load; `step` moves time and counters forward 2 s."""
    wave = [3, 5, 8, 12, 9, 6, 4, 7, 11, 14, 10, 6][step % 12]
    return QueueStats(
        table="outbox",
        sampled_at=NOW - timedelta(seconds=2 * (40 - step)),
        pending=1_240 + wave * 3,
        ready=1_180 + wave,
        processing=96,
        dead=60,
        done=1_204_311 + step * 200,
        done_is_estimate=True,
        expired_leases=2,
        oldest_pending_age=187.4,
        oldest_ready_age=41.2,
        max_id=1_300_000 + step * (200 + wave * 3),
        attempts={0: 1_150, 1: 120, 2: 40, 3: 18, 5: 6, 9: 2},
        waiting=72,
        retrying=66,
        destinations=tuple(DESTINATIONS),
    )


HOLDERS = [
    LeaseHolder("dispatcher-7c9f-1", 48, 0, NOW + timedelta(seconds=41)),
    LeaseHolder("dispatcher-7c9f-2", 46, 0, NOW + timedelta(seconds=37)),
    LeaseHolder("dispatcher-old-9", 2, 2, NOW - timedelta(seconds=75)),
]


class FakeSource:
    read_only = False
    label = "app@db.internal:5432/shop"

    def __init__(
        self,
        *,
        delay: float = 0.0,
        dead: int = 60,
        messages: list[DeadMessage] | None = None,
        holders: list[LeaseHolder] | None = None,
        snapshots: Callable[[int], QueueStats] | None = None,
        payload: Any = None,
    ) -> None:
        """`messages`, `holders`, `snapshots` (stats by poll number) and `payload` replace
        the fixed data; `failing` set to an exception makes every call raise it."""
        self.delay = delay
        self.step = 0
        self.dead = messages if messages is not None else dead_messages(dead)
        self.holders = holders if holders is not None else HOLDERS
        self.snapshots = snapshots or stats
        self.payload = payload
        self.failing: BaseException | None = None
        self.in_flight = 0
        self.max_in_flight = 0
        self.calls = 0
        self.applied: list[tuple[Action, list[Seen], dict[str, Any]]] = []
        self.destination_states = list(DESTINATIONS)
        self.destination_changes: list[tuple[Verb, str, str | None]] = []

    async def _call(self) -> None:
        if self.failing is not None:
            raise self.failing
        self.calls += 1
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            if self.delay:
                await asyncio.sleep(self.delay)
        finally:
            self.in_flight -= 1

    async def check(self, ordered: bool) -> str | None:
        return None

    async def overview(self, ordered: bool) -> Overview:
        await self._call()
        current = self.snapshots(self.step)
        self.step += 1
        return Overview(current, self.holders, Blocked(3, 17) if ordered else None)

    def _matching(self, f: DeadFilter) -> list[DeadMessage]:
        found = sorted(self.dead, key=lambda m: -m.id)
        if f.event_type:
            found = [m for m in found if m.event_type == f.event_type]
        if f.error:
            found = [m for m in found if f.error.lower() in (m.last_error or "").lower()]
        if f.error_group is not None:
            keys = dict(zip(ERRORS, GROUP_KEYS, strict=True))
            found = [m for m in found if keys[m.last_error or ""] == f.error_group]
        return found

    async def dead_page(
        self, f: DeadFilter, *, before: int | None, after: int | None, limit: int
    ) -> DeadPage:
        await self._call()
        rows = self._matching(f)
        if after is not None:
            newer = [m for m in rows if m.id > after][-limit:]
            return DeadPage(newer, has_newer=len(rows) > 0 and rows[0].id > newer[0].id,
                            has_older=True)  # fmt: skip
        below = [m for m in rows if before is None or m.id < before]
        page = below[:limit]
        return DeadPage(
            page,
            has_newer=bool(page) and page[0].id != rows[0].id,
            has_older=len(below) > limit,
        )

    async def dead_count(self, f: DeadFilter) -> int:
        await self._call()
        return len(self._matching(f))

    async def check_filter(self, f: DeadFilter) -> str | None:
        await self._call()
        return None

    async def error_groups(self, f: DeadFilter) -> list[ErrorGroup]:
        await self._call()
        rows = self._matching(f)
        groups = []
        for error, key in zip(ERRORS, GROUP_KEYS, strict=True):
            members = [m for m in rows if m.last_error == error]
            if members:
                groups.append(
                    ErrorGroup(
                        key,
                        len(members),
                        error,
                        max(m.id for m in members),
                        min(m.created_at for m in members),
                        max(m.created_at for m in members),
                    )
                )
        return sorted(groups, key=lambda g: (-g.count, -g.newest_id))

    async def blocking_heads(self) -> list[BlockingHead] | None:
        await self._call()
        return [
            BlockingHead(m.id, m.aggregate_type, m.aggregate_id, m.event_type, m.last_error,
                         m.lease_version, m.created_at, waiting=(m.id % 9) * 3)
            for m in self.dead[-3:]
        ]  # fmt: skip

    async def sessions(self) -> list[Session]:
        await self._call()
        return [
            Session(h.owner, 0 if h.expired else 4, NOW - timedelta(hours=2),
                    None if h.expired else NOW - timedelta(seconds=1),
                    "" if h.expired else "active 1, idle 3", h.held, h.expired)
            for h in self.holders
        ]  # fmt: skip

    async def message(self, message_id: int) -> MessageDetail | None:
        await self._call()
        m = next((m for m in self.dead if m.id == message_id), None)
        if m is None:
            return None
        columns = {
            "id": m.id,
            "aggregate_type": m.aggregate_type,
            "aggregate_id": m.aggregate_id,
            "event_type": m.event_type,
            "payload": self.payload
            or {
                "order_id": m.aggregate_id,
                "amount": {"value": -1250, "currency": "EUR"},
                "lines": [{"sku": "BK-42", "qty": 2}, {"sku": "PN-7", "qty": 1}],
                "customer": "c-77",
            },
            "created_at": m.created_at,
            "status": "dead",
            "available_at": m.created_at + timedelta(minutes=40),
            "attempts": m.attempts,
            "lease_owner": None,
            "lease_until": None,
            "lease_version": m.lease_version,
            "last_error": m.last_error,
            "done_at": None,
            "errors": [
                {"at": (NOW - timedelta(minutes=1 + 2 * (m.attempts - n))).isoformat()}
                | {"attempt": n}
                | {"error": m.last_error}
                for n in (m.attempts - 1, m.attempts)
            ],
        }
        key = GROUP_KEYS[ERRORS.index(m.last_error or "")]
        return MessageDetail(columns, key, is_head=True, waiting_behind=4)

    async def history(self, message_id: int) -> list[ActionRecord]:
        await self._call()
        return [
            ActionRecord(
                id=12,
                at=NOW - timedelta(hours=3, minutes=10),
                actor="maria",
                db_user="ops",
                action="requeue",
                message_ids=[message_id, message_id + 7],
                filter={"query": "type:OrderPaid", "via": "outbox-tui"},
                requested=2,
                count=2,
            )
        ]

    async def recent_actions(self) -> list[ActionRecord]:
        return await self.history(self.dead[-1].id)

    async def targets(
        self, f: DeadFilter | None = None, ids: Sequence[int] | None = None
    ) -> list[Seen]:
        await self._call()
        return [m.seen for m in self._matching(f or DeadFilter())]

    async def apply(
        self, action: Action, seen: Sequence[Seen], recorded: dict[str, Any]
    ) -> ActionResult:
        await self._call()
        self.applied.append((action, list(seen), recorded))
        ids = {s.id for s in seen}
        self.dead = [m for m in self.dead if m.id not in ids]
        return ActionResult(action, len(seen), sorted(ids), [], audit_id=13)

    async def destinations(self) -> list[DestinationState]:
        await self._call()
        return list(self.destination_states)

    async def change_destination(
        self, verb: Verb, destination: str, reason: str | None
    ) -> HandChange:
        await self._call()
        self.destination_changes.append((verb, destination, reason))
        found = next(d for d in self.destination_states if d.destination == destination)
        before = Destination(destination, found.state, found.since)
        if (verb == "pause") == (found.state == "paused"):
            return HandChange(verb, destination, before, None, NOW, "maria")
        state = "paused" if verb == "pause" else "closed"
        changed = replace(found, state=state, since=NOW, for_seconds=0.0, reason=reason,
                          changed_by="maria", next_probe_at=None, next_probe_in=None)  # fmt: skip
        self.destination_states = [
            changed if d.destination == destination else d for d in self.destination_states
        ]
        after = Destination(destination, state, NOW, reason=reason, changed_by="maria")
        return HandChange(verb, destination, before, after, NOW, "maria", audit_id=14)

    async def close(self) -> None:
        return None
