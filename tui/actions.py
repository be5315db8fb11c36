"""What a screen hands the app to confirm and apply: an action on rows the operator saw."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from outbox.operations.pausing import HandChange, Verb
from outbox.operations.repair import Action, ActionResult, Seen
from outbox.stats import DestinationState


@dataclass
class ActionRequest:
    """An action a screen asks for; the app confirms it with the exact count, then applies.

    `seen` are the rows as the operator saw them, or `load` fetches them when the dialog
    opens (requeue everything matching a filter): either way exactly those rows, fenced on
    their status and lease_version, are what may change.
    """

    action: Action
    what: str  # "matching type:OrderPaid", "message 42 (order/o-1, OrderPaid)"
    recorded: dict[str, Any]  # what the audit log keeps besides the ids
    seen: Sequence[Seen] | None = None
    load: Callable[[], Awaitable[list[Seen]]] | None = None
    notes: list[str] = field(default_factory=list)
    explain: Callable[[], Awaitable[list[str]]] | None = None  # more notes, read on opening
    done: Callable[[ActionResult], None] | None = None
    typed: bool = False  # the operator types the count to confirm (everything, no filter)


@dataclass
class DestinationRequest:
    """Pause or resume a destination as the operator saw it; the app confirms (a pause asks
    for its reason), then applies it under the destination's row lock
    (outbox.operations.pausing)."""

    action: Verb
    seen: DestinationState  # the row as shown: the dialog says what it is now
    done: Callable[[HandChange], None] | None = None
