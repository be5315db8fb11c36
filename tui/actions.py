"""What a screen hands the app to confirm and apply: an action on rows the operator saw."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from outbox.repair import Action, ActionResult, Seen


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
