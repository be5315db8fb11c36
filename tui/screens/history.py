"""The audit log: every requeue and skip, by whom and how many, newest first. It lives in
the database (`<table>_actions`), so it shows what other operators and scripts did too."""

from __future__ import annotations

import json

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.widgets import DataTable

from outbox.tui import format as fmt
from outbox.tui.poller import Poller
from outbox.tui.screens.base import BaseScreen
from outbox.tui.widgets import RowTable


class HistoryScreen(BaseScreen):
    DEFAULT_CSS = "HistoryScreen DataTable { height: 1fr; }"
    BINDINGS = [Binding("escape", "back", "back")]

    def compose(self) -> ComposeResult:
        yield from self.compose_top()
        yield RowTable(id="actions")
        yield from self.compose_bottom()
        yield Poller(self.fetch, interval=self.outbox.poll_interval, name="history")

    def on_mount(self) -> None:
        super().on_mount()
        table = self.query_one(DataTable)
        for label in ("#", "at", "actor", "action", "changed", "of", "what"):
            table.add_column(label, key=label)
        table.focus()

    async def fetch(self) -> None:
        actions = await self.outbox.source.recent_actions()
        table = self.query_one(DataTable)
        row = table.cursor_row
        table.clear()
        now = self.outbox.clock()
        for a in actions:
            what = dict(a.filter or {})
            what.pop("via", None)
            table.add_row(
                Text(str(a.id), justify="right"),
                f"{fmt.timestamp(a.at)} ({fmt.since(a.at, now)} ago)",
                Text(a.actor),
                Text(a.action, "bold"),
                Text(fmt.count(a.count), justify="right"),
                Text(fmt.count(a.requested), justify="right"),
                Text(fmt.one_line(json.dumps(what, ensure_ascii=False) if what else "", 60)),
                key=str(a.id),
            )
        if not actions:
            table.add_row("", "", Text("no action recorded yet", "dim"), "", "", "", "")
        if actions:
            table.move_cursor(row=min(row, len(actions) - 1), animate=False)

    def action_back(self) -> None:
        self.app.pop_screen()
