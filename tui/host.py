"""What the screens use from the app, as a protocol: screens depend on this, not on the
app module (which imports the screens)."""

from __future__ import annotations

from datetime import datetime
from typing import Protocol

from outbox.tui.actions import ActionRequest, DestinationRequest
from outbox.tui.config import Config
from outbox.tui.source import Source
from outbox.tui.widgets import BarState


class Host(Protocol):
    @property
    def config(self) -> Config: ...

    @property
    def source(self) -> Source:
        """Where data comes from and actions go."""
        ...

    @property
    def state(self) -> BarState:
        """What the top bar and the status line show."""
        ...

    def clock(self) -> datetime:
        """Now (injected: snapshots freeze it)."""
        ...

    def poll_interval(self) -> float | None:
        """Seconds until a poller's next poll; None when paused."""
        ...

    def tell(self, message: str) -> None:
        """A toast now, and the status line until the next one."""
        ...

    def request(self, request: ActionRequest) -> None:
        """Confirm an action with the operator, then apply it."""
        ...

    def request_destination(self, request: DestinationRequest) -> None:
        """Confirm a destination's pause or resume with the operator, then apply it."""
        ...
