"""Destinations: each one's health as every worker sees it (outbox.destinations), and the
hands on it. Closed ones are sent to; an open one (the breaker) gets one probe at a time
until a probe succeeds; a paused one gets nothing until someone resumes it; an idle one is
served by no running worker (its URL changed), and its row holds nothing back. `P` pauses
the highlighted destination (the reason is typed), `U` resumes a paused one or closes an
open breaker at once; both are confirmed and recorded in the audit log like requeue and
skip."""

from __future__ import annotations

from rich.table import Table as RichTable
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.widgets import Static

from outbox.destinations import CLOSED, IDLE, OPEN, PAUSED
from outbox.plumbing.text import printable
from outbox.stats import DestinationState
from outbox.tui import format as fmt
from outbox.tui.actions import DestinationRequest
from outbox.tui.poller import Poller
from outbox.tui.screens.base import BaseScreen
from outbox.tui.widgets import RowTable

STATE_STYLE = {CLOSED: "green", OPEN: "bold red", PAUSED: "bold yellow", IDLE: "dim"}
# Fixed columns (label, width); `why` comes last and takes the rest.
COLUMNS = (("destination", 30), ("state", 6), ("for", 7), ("failures", 8), ("next probe", 10))


def next_probe(d: DestinationState) -> str:
    """When the next probe may go out: only an open destination is probed, by the workers
    that serve it."""
    if d.state != OPEN or d.idle:
        return "-"
    if d.probing:
        return f"running ({d.probing})"
    if d.next_probe_in is None or d.next_probe_in <= 0:
        return "due"
    return f"in {fmt.age(d.next_probe_in)}"


def why(d: DestinationState) -> str:
    """Who paused it and why, or the breaker's reason and last error."""
    if d.state == PAUSED:
        return f"{d.changed_by or '?'}: {d.reason or '(no reason)'}"
    parts = [d.reason] if d.reason else []
    if d.last_error:
        parts.append(d.last_error)
    if not parts and d.changed_by:
        parts.append(f"resumed by {d.changed_by}")
    return " · ".join(parts)


def served(d: DestinationState) -> str:
    """Which worker serves it and when it last said so; idle when none does any more."""
    by = f" by {printable(d.served_by)}" if d.served_by else ""
    if d.served_ago is None:
        return "idle: no running worker serves it"
    if d.idle:
        return f"idle: last{by} {fmt.age(d.served_ago)} ago; its row holds nothing back"
    return f"{fmt.age(d.served_ago)} ago{by}"


class DestinationsScreen(BaseScreen):
    DEFAULT_CSS = """
    DestinationsScreen #destinations-header { height: 1; padding: 0 1; background: $boost; }
    DestinationsScreen DataTable { height: 1fr; }
    DestinationsScreen #destination-detail {
        height: auto; max-height: 8; padding: 0 1; background: $boost;
    }
    DestinationsScreen.stale DataTable { text-opacity: 60%; }
    """
    BINDINGS = [
        Binding("P", "pause_destination", "pause"),
        Binding("U", "resume_destination", "resume"),
        Binding("escape", "back", "back"),
    ]

    def __init__(self) -> None:
        super().__init__()
        self.destinations: list[DestinationState] = []

    def compose(self) -> ComposeResult:
        yield from self.compose_top()
        yield Static(id="destinations-header")
        yield RowTable(id="destinations")
        yield Static(id="destination-detail")
        yield from self.compose_bottom()
        yield Poller(self.fetch, interval=self.outbox.poll_interval, name="destinations")

    def on_mount(self) -> None:
        super().on_mount()
        table = self.query_one(RowTable)
        for label, width in COLUMNS:
            table.add_column(label, key=label, width=width)
        table.add_column("why", key="why")  # as wide as the screen leaves it (`_fill`)
        table.focus()

    def on_resize(self) -> None:
        super().on_resize()
        self._fill()

    async def fetch(self) -> None:
        self.destinations = await self.outbox.source.destinations()
        self._fill()
        self._show_header()
        self._show_detail()

    def _fill(self) -> None:
        # The last column takes what the others leave, so the table never scrolls sideways;
        # the detail below shows the highlighted one's reason and error in full.
        table = self.query_one(RowTable)
        padding = 2 * table.cell_padding
        room = table.scrollable_content_region.width - sum(w + padding for _, w in COLUMNS)
        room = max(room - padding, 3)
        row = table.cursor_row
        table.clear()
        for d in self.destinations:
            table.add_row(
                Text(printable(d.destination), "bold"),
                Text(d.shown_state, STATE_STYLE.get(d.shown_state, "")),
                Text(fmt.age(d.for_seconds), justify="right"),
                Text(fmt.count(d.failures), "red" if d.failures else "dim", justify="right"),
                Text(next_probe(d), justify="right"),
                Text(fmt.one_line(why(d), room)),
                key=d.destination,
            )
        if not self.destinations:
            table.add_row(Text("none recorded", "dim"), "", "", "", "", "")
        else:
            table.move_cursor(row=min(row, len(self.destinations) - 1), animate=False)

    def on_data_table_row_highlighted(self) -> None:
        self._show_detail()

    def highlighted(self) -> DestinationState | None:
        row = self.query_one(RowTable).cursor_row
        return self.destinations[row] if 0 <= row < len(self.destinations) else None

    def show_staleness(self) -> None:
        self._show_header()

    def _show_header(self) -> None:
        counts = {
            s: sum(d.shown_state == s for d in self.destinations) for s in (OPEN, PAUSED, IDLE)
        }
        text = Text.assemble(("destinations ", "bold"), (fmt.count(len(self.destinations)), "bold"))
        for state, n in counts.items():
            if n:
                text.append(f"  {n} {state}", STATE_STYLE[state])
        if self.destinations and not any(counts[s] for s in (OPEN, PAUSED)):
            text.append("  all closed", "green")
        if self.stale_since is not None:
            text.append(f"  {self.stale_note()}", "bold yellow")
        self.query_one("#destinations-header", Static).update(text)

    def _show_detail(self) -> None:
        """The highlighted destination in full: the table cuts long errors and reasons."""
        detail = self.query_one("#destination-detail", Static)
        d = self.highlighted()
        if d is None:
            detail.update(
                Text(
                    "Every destination is closed: a row appears when one fails, is paused or "
                    "rate limited. `outbox pause DESTINATION --reason TEXT` pauses one by name.",
                    "dim",
                )
            )
            return
        grid = RichTable.grid(padding=(0, 2))
        grid.add_column(style="bold", no_wrap=True)
        grid.add_column()
        since = fmt.timestamp(d.since)
        grid.add_row("destination", Text(printable(d.destination)))
        grid.add_row("state", Text(f"{d.state} since {since} ({fmt.age(d.for_seconds)})"))
        if d.state == PAUSED:
            grid.add_row("paused by", Text(printable(d.changed_by or "?")))
            grid.add_row("reason", Text(printable(d.reason or "(no reason)")))
        elif d.reason:
            grid.add_row("reason", Text(printable(d.reason)))
        if d.state == OPEN:
            grid.add_row("next probe", Text(next_probe(d)))
        if d.idle or d.served_ago is not None:
            grid.add_row("served", Text(served(d)))
        if d.last_error:
            when = f" ({fmt.timestamp(d.last_failure)})" if d.last_failure else ""
            grid.add_row("last error", Text(fmt.one_line(d.last_error, 400) + when))
        detail.update(grid)

    # -- actions ------------------------------------------------------------------------------

    def action_pause_destination(self) -> None:
        d = self.highlighted()
        if d is None:
            return
        if d.state == PAUSED:
            self.outbox.tell(f"{d.destination} is already paused by {d.changed_by or '?'}")
            return
        self.outbox.request_destination(DestinationRequest("pause", d))

    def action_resume_destination(self) -> None:
        d = self.highlighted()
        if d is None:
            return
        if d.state == CLOSED:
            self.outbox.tell(f"{d.destination} is already closed")
            return
        self.outbox.request_destination(DestinationRequest("resume", d))
