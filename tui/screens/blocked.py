"""Ordered mode's stopped aggregates: every dead head, with how many messages wait behind
it, newest trouble first among equals. Requeue or skip the highlighted head from here, or
open it."""

from __future__ import annotations

from rich.cells import cell_len
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.widgets import Static

from outbox.tui import format as fmt
from outbox.tui.actions import ActionRequest
from outbox.tui.poller import Poller
from outbox.tui.screens.base import BaseScreen
from outbox.tui.screens.detail import DetailScreen, skip_notes
from outbox.tui.widgets import RowTable, fit_columns
from outbox.views.dashboard import BlockingHead


class BlockedScreen(BaseScreen):
    DEFAULT_CSS = """
    BlockedScreen #blocked-header { height: 1; padding: 0 1; background: $boost; }
    BlockedScreen DataTable { height: 1fr; }
    BlockedScreen.stale DataTable { text-opacity: 60%; }
    """
    BINDINGS = [
        Binding("enter", "open", "detail", show=False),
        Binding("r", "requeue", "requeue head"),
        Binding("s", "skip", "skip head"),
        Binding("escape", "back", "back"),
    ]

    def __init__(self) -> None:
        super().__init__()
        self.heads: list[BlockingHead] = []
        self.indexed = True  # False: the table lacks ordered mode's index, nothing was read
        self._columns: dict[str, int] = {}  # the widths the table's columns were built with

    def compose(self) -> ComposeResult:
        yield from self.compose_top()
        yield Static(id="blocked-header")
        yield RowTable(id="heads")
        yield from self.compose_bottom()
        yield Poller(self.fetch, interval=self.outbox.poll_interval, name="blocked")

    def on_mount(self) -> None:
        super().on_mount()
        self._fill()
        self.query_one(RowTable).focus()
        self._show_header()

    def on_resize(self) -> None:
        super().on_resize()
        if self.is_mounted:
            self._fill()

    def _widths(self) -> dict[str, int]:
        """Aggregate and event as wide as their longest value while the last error keeps a
        third of the room; the last error takes the rest."""
        fixed = {"head": 10, "waiting": 8, "dead for": 8}
        room = self.size.width - sum(fixed.values()) - 2 * 6 - 2  # cell padding, scrollbar
        names = fit_columns(
            {
                "aggregate": max(
                    (cell_len(_aggregate(h)) for h in self.heads), default=len("aggregate")
                ),
                "event": max((cell_len(_event(h)) for h in self.heads), default=len("event")),
            },
            room,
            keep=max(room // 3, 20),
        )
        error = max(room - sum(names.values()), 20)
        return {"head": 10, **names, "waiting": 8, "dead for": 8, "last error": error}

    async def fetch(self) -> None:
        # Unordered workers claim past a dead message: nothing is blocked, nothing to read.
        heads = await self.outbox.source.blocking_heads() if self.outbox.config.ordered else []
        self.indexed = heads is not None
        self.heads = heads or []
        self._fill()
        self._show_header()

    def _fill(self) -> None:
        table = self.query_one(RowTable)
        widths = self._widths()
        if widths != self._columns:  # fitted to the width and the values shown
            self._columns = widths
            table.clear(columns=True)
            for label, width in widths.items():
                table.add_column(label, key=label, width=width)
        row = table.cursor_row
        table.clear()
        now = self.outbox.clock()
        for h in self.heads:
            table.add_row(
                Text(str(h.id), justify="right"),
                Text(fmt.one_line(_aggregate(h), widths["aggregate"])),
                Text(fmt.one_line(_event(h), widths["event"])),
                Text(fmt.count(h.waiting), "bold" if h.waiting else "dim", justify="right"),
                Text(fmt.since(h.created_at, now), justify="right"),
                Text(fmt.one_line(h.last_error, widths["last error"]), "red"),
                key=str(h.id),
            )
        if self.heads:
            table.move_cursor(row=min(row, len(self.heads) - 1), animate=False)

    def show_staleness(self) -> None:
        self._show_header()

    def _show_header(self) -> None:
        text = Text()
        text.append("blocked aggregates", "bold")
        if not self.outbox.config.ordered:
            # A count of 0 here would read as "nothing is blocked" in a mode with no blocking.
            text.append(" ordered mode only", "bold")
            text.append(
                ": unordered, a dead message blocks nothing (start with --ordering aggregate "
                "if the workers run so)",
                "dim",
            )
        elif not self.indexed:
            text.append(" unknown", "bold yellow")
            text.append(
                ": the table lacks ordered mode's index (outbox migrate --ordering aggregate)",
                "dim",
            )
        else:
            text.append(f" {fmt.count(len(self.heads))}", "bold red" if self.heads else "bold")
            waiting = sum(h.waiting for h in self.heads)
            text.append(f"  {fmt.count(waiting)} messages wait behind their dead heads", "dim")
        if self.stale_since is not None:
            text.append(f"  {self.stale_note()}", "bold yellow")
        self.query_one("#blocked-header", Static).update(text)

    def highlighted(self) -> BlockingHead | None:
        table = self.query_one(RowTable)
        if not self.heads or table.cursor_row >= len(self.heads):
            return None
        return self.heads[table.cursor_row]

    def action_open(self) -> None:
        head = self.highlighted()
        if head is not None:
            self.app.push_screen(DetailScreen(head.id))

    def _request(self, action: str) -> None:
        head = self.highlighted()
        if head is None:
            return
        source, seen = self.outbox.source, [head.seen]

        async def explain() -> list[str]:
            return await skip_notes(source, seen)

        self.outbox.request(
            ActionRequest(
                "skip" if action == "skip" else "requeue",
                f"message {head.id} ({head.aggregate_type}/{head.aggregate_id}, "
                f"{head.event_type}), the dead head of its aggregate",
                recorded={"selection": "blocking head"},
                seen=seen,
                explain=explain if action == "skip" else None,
                done=lambda _: self.query_one(Poller).poll_now(),
            )
        )

    def action_requeue(self) -> None:
        self._request("requeue")

    def action_skip(self) -> None:
        self._request("skip")


def _aggregate(h: BlockingHead) -> str:
    return fmt.one_line(f"{h.aggregate_type}/{h.aggregate_id}", 10_000)


def _event(h: BlockingHead) -> str:
    return fmt.one_line(h.event_type, 10_000)
