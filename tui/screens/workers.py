"""Who is connected: the database's client sessions by application_name (a worker's is
its owner name), what each name holds, and when it last claimed; a name that holds leases
without a session is a worker that is gone."""

from __future__ import annotations

from rich.cells import cell_len
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.widgets import Static

from outbox.tui import format as fmt
from outbox.tui.poller import Poller
from outbox.tui.screens.base import BaseScreen
from outbox.tui.widgets import RowTable
from outbox.views.dashboard import Session


class WorkersScreen(BaseScreen):
    DEFAULT_CSS = """
    WorkersScreen #workers-header { height: 1; padding: 0 1; background: $boost; }
    WorkersScreen DataTable { height: 1fr; }
    WorkersScreen.stale DataTable { text-opacity: 60%; }
    """
    BINDINGS = [Binding("escape", "back", "back")]

    def __init__(self) -> None:
        super().__init__()
        self.sessions: list[Session] = []
        self._columns: dict[str, int] = {}  # the widths the table's columns were built with

    def compose(self) -> ComposeResult:
        yield from self.compose_top()
        yield Static(id="workers-header")
        yield RowTable(id="sessions")
        yield from self.compose_bottom()
        yield Poller(self.fetch, interval=self.outbox.poll_interval, name="workers")

    def on_mount(self) -> None:
        super().on_mount()
        self._fill()
        self.query_one(RowTable).focus()

    def on_resize(self) -> None:
        super().on_resize()
        if self.is_mounted:
            self._fill()

    def _widths(self) -> dict[str, int]:
        """The name as wide as the longest one shown where the screen has the room (at least
        32 cells, scrolling sideways on a narrow screen); the others fixed."""
        others = {"sessions": 8, "states": 24, "held": 8, "expired": 8, "last claim": 11,
                  "connected": 9}  # fmt: skip
        room = self.size.width - sum(others.values()) - 2 * (len(others) + 1) - 2
        longest = max((cell_len(_name(s)) for s in self.sessions), default=0)
        return {"application_name": max(min(longest, room), 32), **others}

    async def fetch(self) -> None:
        self.sessions = await self.outbox.source.sessions()
        self._fill()
        self._show_header()

    def _fill(self) -> None:
        table = self.query_one(RowTable)
        widths = self._widths()
        if widths != self._columns:
            self._columns = widths
            table.clear(columns=True)
            for label, width in widths.items():
                table.add_column(label, key=label, width=width)
        row = table.cursor_row
        table.clear()
        now = self.outbox.clock()
        for s in self.sessions:
            gone = s.connections == 0
            table.add_row(
                Text(
                    fmt.one_line(_name(s), widths["application_name"]),
                    "bold red" if gone else "bold",
                ),
                Text(
                    "gone" if gone else str(s.connections), "red" if gone else "", justify="right"
                ),
                Text(s.states, "dim"),
                Text(fmt.count(s.held), justify="right"),
                Text(fmt.count(s.expired), "bold red" if s.expired else "dim", justify="right"),
                Text(
                    f"{fmt.since(s.last_claim, now)} ago" if s.last_claim else "-", justify="right"
                ),
                Text(fmt.since(s.connected_since, now), justify="right"),
            )
        if self.sessions:
            table.move_cursor(row=min(row, len(self.sessions) - 1), animate=False)

    def show_staleness(self) -> None:
        self._show_header()

    def _show_header(self) -> None:
        gone = sum(1 for s in self.sessions if s.connections == 0)
        claiming = sum(1 for s in self.sessions if s.last_claim is not None)
        text = Text.assemble(
            ("sessions ", "bold"),
            (fmt.count(len(self.sessions) - gone), "bold"),
            (f"  {claiming} claiming", "dim"),
        )
        if gone:
            text.append(f"  {gone} gone with leases held", "bold red")
        if self.stale_since is not None:
            text.append(f"  {self.stale_note()}", "bold yellow")
        self.query_one("#workers-header", Static).update(text)


def _name(s: Session) -> str:
    return fmt.one_line(s.name, 10_000) if s.name else "(no name)"
