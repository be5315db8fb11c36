"""What every full screen has: the top bar, the status line, the footer, and a typed way
to reach the app's shared state (`Host`)."""

from __future__ import annotations

from typing import cast

from textual.app import ComposeResult
from textual.screen import Screen
from textual.widgets import Footer

from outbox.tui.host import Host
from outbox.tui.poller import Poller
from outbox.tui.widgets import StatusLine, TopBar

# Actions that change rows: hidden from the footer and help, and refused, in read-only mode.
MUTATING = frozenset({"requeue", "requeue_all", "skip", "mark", "unmark_all"})


class BaseScreen(Screen[None]):
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

    def show_bars(self) -> None:
        state = self.outbox.state
        for bar in self.query(TopBar):
            bar.show(state)
        for line in self.query(StatusLine):
            line.show(state)

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        return not (action in MUTATING and self.outbox.config.read_only)
