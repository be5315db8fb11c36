"""The audit log: every requeue, skip, pause and resume, from where (the TUI, `outbox
requeue`), by whom (the OS user and the database role) and how many, newest first; enter opens
one. It lives in the database (`<table>_actions`), so it shows what other operators and
scripts did too."""

from __future__ import annotations

import json

from rich.table import Table as RichTable
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.widgets import DataTable, Static

from outbox.operations.repair import ActionRecord
from outbox.tui import format as fmt
from outbox.tui.poller import Poller
from outbox.tui.screens.base import BaseScreen
from outbox.tui.screens.detail import DetailScreen
from outbox.tui.widgets import RowTable


class HistoryScreen(BaseScreen):
    DEFAULT_CSS = "HistoryScreen DataTable { height: 1fr; }"
    BINDINGS = [
        Binding("enter", "open", "open", show=False),
        Binding("escape", "back", "back"),
    ]

    def __init__(self) -> None:
        super().__init__()
        self.actions: list[ActionRecord] = []

    def compose(self) -> ComposeResult:
        yield from self.compose_top()
        yield RowTable(id="actions")
        yield from self.compose_bottom()
        yield Poller(self.fetch, interval=self.outbox.poll_interval, name="history")

    def on_mount(self) -> None:
        super().on_mount()
        table = self.query_one(DataTable)
        for label in ("#", "at", "action", "changed", "of", "via", "by", "what"):
            table.add_column(label, key=label)
        table.focus()

    async def fetch(self) -> None:
        actions = self.actions = await self.outbox.source.recent_actions()
        table = self.query_one(DataTable)
        row = table.cursor_row
        table.clear()
        now = self.outbox.clock()
        for a in actions:
            table.add_row(
                Text(str(a.id), justify="right"),
                f"{fmt.timestamp(a.at)} ({fmt.since(a.at, now)} ago)",
                Text(a.action, "bold"),
                Text(fmt.count(a.count), justify="right"),
                Text(fmt.count(a.requested), justify="right"),
                Text(a.via),
                Text(a.by),
                Text(fmt.one_line(what(a), 60)),
                key=str(a.id),
            )
        if not actions:
            table.add_row("", "", Text("no action recorded yet", "dim"), "", "", "", "", "")
        if actions:
            table.move_cursor(row=min(row, len(actions) - 1), animate=False)

    def highlighted(self) -> ActionRecord | None:
        row = self.query_one(RowTable).cursor_row
        return self.actions[row] if 0 <= row < len(self.actions) else None

    def action_open(self) -> None:
        record = self.highlighted()
        if record is not None:
            self.app.push_screen(ActionScreen(record))


def what(record: ActionRecord) -> str:
    """The filter or selection the rows came from, as recorded."""
    recorded = {k: v for k, v in (record.filter or {}).items() if k != "via"}
    return json.dumps(recorded, ensure_ascii=False) if recorded else ""


class ActionScreen(BaseScreen):
    """One audit record in full: every message id it changed (enter opens one)."""

    DEFAULT_CSS = """
    ActionScreen #action-fields { height: auto; padding: 0 1; background: $boost; }
    ActionScreen DataTable { height: 1fr; }
    """
    BINDINGS = [
        Binding("enter", "open", "open", show=False),
        Binding("escape", "back", "back"),
    ]

    def __init__(self, record: ActionRecord) -> None:
        super().__init__()
        self.record = record

    def compose(self) -> ComposeResult:
        yield from self.compose_top()
        yield Static(id="action-fields")
        yield RowTable(id="action-ids")
        yield from self.compose_bottom()

    def on_mount(self) -> None:
        super().on_mount()
        r = self.record
        grid = RichTable.grid(padding=(0, 2))
        grid.add_column(style="bold", no_wrap=True)
        grid.add_column()
        for name, value in (
            ("action", f"#{r.id} {r.action}"),
            ("at", fmt.timestamp(r.at)),
            ("via", r.via),
            ("by", f"{r.actor} (database role {r.db_user})"),
            ("changed", f"{fmt.count(r.count)} of {fmt.count(r.requested)} confirmed"),
            ("from", what(r) or "-"),
        ):
            grid.add_row(Text(name), Text(value))
        self.query_one("#action-fields", Static).update(grid)
        table = self.query_one(RowTable)
        table.add_column("message ids changed", key="id")
        for message_id in r.message_ids:
            table.add_row(Text(str(message_id)), key=str(message_id))
        if not r.message_ids:
            # A destination's pause or resume changes no message: its row says which one.
            none = (
                f"none: a {r.action} of a destination changes no message"
                if r.action in ("pause", "resume")
                else "none: every row had changed since it was shown"
            )
            table.add_row(Text(none, "dim"))
        table.focus()

    def action_open(self) -> None:
        row = self.query_one(RowTable).cursor_row
        if 0 <= row < len(self.record.message_ids):
            self.app.push_screen(DetailScreen(self.record.message_ids[row]))
