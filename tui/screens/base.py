"""What every full screen has: the top bar, the status line, the footer, and a typed way
to reach the app's shared state (`Host`)."""

from __future__ import annotations

from datetime import datetime
from typing import cast

from textual import on
from textual.app import ComposeResult
from textual.screen import Screen
from textual.widgets import DataTable, Footer

from outbox.tui import format as fmt
from outbox.tui.host import Host
from outbox.tui.poller import Poller
from outbox.tui.widgets import StatusLine, TopBar

# Actions that change rows: hidden from the footer and help, and refused, in read-only mode.
MUTATING = frozenset({
    "requeue", "requeue_all", "skip", "mark", "unmark_all", "pause_destination",
    "resume_destination", "replay",
})  # fmt: skip


class BaseScreen(Screen[None]):
    # While polls fail: when what the screen shows was last fresh (None: it is fresh).
    stale_since: datetime | None = None
    _fresh_at: datetime | None = None

    @property
    def outbox(self) -> Host:
        return cast(Host, self.app)

    def compose_top(self) -> ComposeResult:
        yield TopBar()

    def compose_bottom(self) -> ComposeResult:
        yield StatusLine()
        yield Footer(compact=True, show_command_palette=False)

    def on_mount(self) -> None:
        self.show_bars()

    def on_screen_resume(self) -> None:
        self.show_bars()
        for poller in self.query(Poller):
            poller.resume()

    def on_resize(self) -> None:
        self.show_bars()  # the top bar right-aligns to the width

    def on_poller_polled(self, message: Poller.Polled) -> None:
        """Keep track of staleness (the app's status line hears of the poll too)."""
        if message.error is None:
            self._fresh_at = self.outbox.clock()
        stale = None if message.error is None else self._fresh_at
        if stale != self.stale_since:
            self.stale_since = stale
            self.set_class(stale is not None, "stale")
            self.show_staleness()

    def show_staleness(self) -> None:
        """Say on the screen, where the numbers are, that they are old (`stale_since`)."""

    def stale_note(self) -> str:
        if self.stale_since is None:
            return ""
        return f"stale since {fmt.clock_time(self.stale_since)}"

    def show_bars(self) -> None:
        state = self.outbox.state
        for bar in self.query(TopBar):
            bar.show(state)
        for line in self.query(StatusLine):
            line.show(state)

    def action_back(self) -> None:
        self.app.pop_screen()

    @on(DataTable.RowSelected)
    def _row_selected(self, event: DataTable.RowSelected) -> None:
        """⏎ on a row runs the screen's `open` action, on screens whose rows open."""
        open_row = getattr(self, "action_open", None)
        if open_row is not None:
            event.stop()
            open_row()

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        return not (action in MUTATING and self.outbox.config.read_only)
