"""Marks: the rows the operator picked for an action."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping

from outbox.operations.repair import Seen
from outbox.views.dead_letters import DeadMessage


class Marks(Mapping[int, Seen]):
    """Marked rows by id, each as it was last shown (its lease_version): that is what an
    action on them is fenced on.

    A value, never changed in place: every change is a new `Marks`, so the reactives that
    hold it see the change."""

    __slots__ = ("_seen",)

    def __init__(self, seen: Iterable[Seen] = ()) -> None:
        self._seen = {s.id: s for s in seen}

    def __getitem__(self, message_id: int) -> Seen:
        return self._seen[message_id]

    def __iter__(self) -> Iterator[int]:
        return iter(self._seen)

    def __len__(self) -> int:
        return len(self._seen)

    def __repr__(self) -> str:
        return f"Marks({list(self._seen.values())!r})"

    def toggled(self, seen: Seen) -> Marks:
        if seen.id in self._seen:
            return self.without([seen.id])
        return Marks([*self._seen.values(), seen])

    def without(self, message_ids: Iterable[int]) -> Marks:
        gone = set(message_ids)
        return Marks(s for s in self._seen.values() if s.id not in gone)

    def as_shown(self, messages: Iterable[DeadMessage]) -> Marks:
        """The marked rows among `messages` as shown now: the operator sees this version."""
        shown = {m.id: m.seen for m in messages if m.id in self._seen}
        return Marks(shown.get(s.id, s) for s in self._seen.values())
