"""The dashboard's panels and the bars every screen shares. Widgets only render what they
are given; screens fetch, the app keeps the shared state."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from rich.table import Table as RichTable
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.widgets import DataTable, Sparkline, Static

from outbox.plumbing.text import printable, printable_name
from outbox.stats import QueueStats
from outbox.tui import format as fmt
from outbox.tui.rates import RateHistory
from outbox.views.dashboard import Blocked, LeaseHolder


def _grid() -> RichTable:
    table = RichTable.grid(padding=(0, 2), expand=True)
    table.add_column(style="bold", no_wrap=True)
    table.add_column(justify="right", no_wrap=True)
    table.add_column(style="dim", no_wrap=True, ratio=1)
    return table


def fit_columns(wanted: dict[str, int], room: int, keep: int) -> dict[str, int]:
    """Widths for columns that want `wanted` cells each (their longest value, or their
    label), sharing `room` with a last column that keeps at least `keep`: every column gets
    what it wants when that fits; else the narrow ones get theirs and the wide ones share the
    rest evenly (a long event type does not squeeze a short aggregate)."""
    left = max(room - keep, len(wanted))
    widths: dict[str, int] = {}
    pending = sorted(wanted.items(), key=lambda kv: kv[1])
    while pending:
        share = left // len(pending)
        name, want = pending.pop(0)
        widths[name] = max(min(want, share), 1)
        left -= widths[name]
    return {name: widths[name] for name in wanted}


class RowTable(DataTable[object]):
    """A table of rows with a row cursor: Home and End go to the first and last row (the
    framework's scroll sideways)."""

    BINDINGS = [
        Binding("home", "first_row", "first row", show=False),
        Binding("end", "last_row", "last row", show=False),
    ]

    def __init__(self, *, id: str) -> None:
        super().__init__(id=id, cursor_type="row", zebra_stripes=True)

    def action_first_row(self) -> None:
        if self.row_count:
            self.move_cursor(row=0)

    def action_last_row(self) -> None:
        if self.row_count:
            self.move_cursor(row=self.row_count - 1)


@dataclass(frozen=True)
class BarState:
    """What the top bar and the status line show, kept by the app."""

    source: str
    table: str
    read_only: bool
    ordered: bool
    interval: float
    paused: bool
    connected: bool | None = None  # None until the first poll answered
    error: str | None = None
    refreshed_at: datetime | None = None
    schema_problem: str | None = None
    last_action: str | None = None


class TopBar(Static):
    DEFAULT_CSS = """
    TopBar { height: 1; background: $primary-background; color: $text; padding: 0 1; }
    """

    def show(self, state: BarState) -> None:
        table, source = printable_name(state.table), printable(state.source)
        left = Text.assemble(("outbox-tui ", "bold"), (table, "bold"), f" @ {source}")
        right = Text()
        if state.ordered:
            right.append(" ordered ", "black on cyan")
            right.append(" ")
        if state.read_only:
            right.append(" READ-ONLY ", "bold white on dark_red")
            right.append(" ")
        if state.paused:
            right.append("⏸ paused", "bold yellow")
        else:
            right.append(f"⟳ {fmt.duration(state.interval)}")
        width = max(self.size.width - 2, 0)
        room = max(width - right.cell_len - 1, 0)
        left.truncate(room, overflow="ellipsis")
        left.pad_right(room - left.cell_len + 1)
        self.update(left + right)


class StatusLine(Static):
    DEFAULT_CSS = """
    StatusLine { height: 1; padding: 0 1; background: $panel; }
    """

    def show(self, state: BarState) -> None:
        text = Text()
        if state.error is not None:
            text.append("✖ ", "bold red")
            text.append(fmt.one_line(state.error, max(self.size.width - 40, 30)), "red")
            text.append(" · reconnecting" if not state.paused else " · paused", "red")
        elif state.connected:
            text.append("● ", "bold green")
            text.append("connected")
        else:
            text.append("○ connecting…", "dim")
        if state.refreshed_at is not None:
            text.append(f" · refreshed {fmt.clock_time(state.refreshed_at)}", "dim")
        if state.schema_problem:
            text.append(" · ")
            text.append(fmt.one_line(state.schema_problem, 90), "bold yellow")
        elif state.last_action:
            text.append(" · ")
            text.append(state.last_action, "bold")
        self.update(text)


def count_cell(stats: QueueStats, name: str) -> tuple[str, str]:
    """The count `name` as `outbox stats` shows it (`QueueStats.count_text`, the one source:
    `≥N` where it stopped at the limit, `unknown` where that bound is 0, which read as none),
    its figure grouped by thousands; and a note for the panel's last column (what counts an
    unknown figure: `outbox stats --exact`, the TUI has no such switch)."""
    text = stats.count_text(name)
    value = getattr(stats, name)
    if text.startswith("unknown"):
        return "unknown", "outbox stats --exact counts them" if name == "done" else ""
    if text.startswith("≥"):
        return "≥" + fmt.count(value), "at least"
    return fmt.count(value), ""


class CountsPanel(Static):
    """Messages per status."""

    def show(self, stats: QueueStats) -> None:
        grid = _grid()
        pending, _ = count_cell(stats, "pending")
        grid.add_row("pending", pending, f"{count_cell(stats, 'ready')[0]} ready")
        expired = Text(f"{count_cell(stats, 'expired_leases')[0]} lease expired")
        if stats.expired_leases:
            expired.stylize("bold red")
        grid.add_row("processing", count_cell(stats, "processing")[0], expired)
        dead = Text(count_cell(stats, "dead")[0], style="bold red" if stats.dead else "")
        grid.add_row("dead", dead, "press d" if stats.dead else "")
        # The planner's estimate, or counted: exactly, at least where the count stopped, or
        # unknown where all that is known is at least 0 (as `outbox stats` says).
        if stats.done_is_estimate:
            done, note = "~" + fmt.short_count(stats.done), "estimate"
        else:
            done, note = count_cell(stats, "done")
            if done.startswith("≥"):
                done = "≥" + fmt.short_count(stats.done)
            elif not note:
                done = fmt.short_count(stats.done)
        grid.add_row("done", done, note)
        self.update(grid)


def slo_style(seconds: float | None, slo: float) -> str:
    """Green within half the SLO, yellow up to it, red over it."""
    if seconds is None or seconds <= slo / 2:
        return "green"
    return "yellow" if seconds <= slo else "bold red"


class AgesPanel(Static):
    """The delays people are paged for, against the SLO: the oldest unfinished message
    (backoff included: an outage shows here) beside the ready age (what more workers would
    shorten), and the messages waiting out a backoff."""

    def show(self, stats: QueueStats, slo: float, blocked: Blocked | None) -> None:
        grid = _grid()
        # Ordered: rows behind an unfinished head are not claimable, so the oldest claimable
        # head is the age that matters (the one the operator sizes on), beside how many.
        ordered = stats.claimable_heads is not None
        ready = ("oldest claimable", stats.oldest_claimable_age) if ordered else (
            "oldest ready", stats.oldest_ready_age)  # fmt: skip
        for label, value in (("oldest unfinished", stats.oldest_unfinished_age), ready):
            over = value is not None and value > slo
            note: str | Text = Text("over SLO", style="bold red") if over else ""
            if ordered and label == "oldest claimable" and not over:
                note = f"{fmt.count(stats.claimable_heads or 0)} heads"
            grid.add_row(label, Text(fmt.age(value), style=slo_style(value, slo)), note)
        # Waiting out a backoff: a message's own failures, or a downstream failing too few
        # messages to open its breaker (an open one holds its messages back unsent instead).
        retrying = count_cell(stats, "retrying")[0]
        grid.add_row("retrying", Text(retrying, "yellow" if stats.retrying else ""), "")
        grid.add_row(
            "expired leases",
            Text(fmt.count(stats.expired_leases), "bold red" if stats.expired_leases else ""),
            "",
        )
        if blocked is not None:
            grid.add_row(
                "blocked aggregates",
                Text(fmt.count(blocked.aggregates), "bold red" if blocked.aggregates else ""),
                f"{fmt.count(blocked.waiting)} behind" if blocked.aggregates else "",
            )
        else:
            # Pending and processing: at least, where either count stopped at the limit.
            capped = stats.at_least("pending") or stats.at_least("processing")
            grid.add_row("backlog", ("≥" if capped else "") + fmt.count(stats.backlog), "")
        self.update(grid)


def rates_title(stats: QueueStats) -> Text:
    """`rates`, and the destinations nothing is sent to (open or paused), if any: press e."""
    title = Text("rates")
    held = stats.unreachable
    if len(held) == 1:
        d = held[0]
        title.append(f" · ✖ {d.destination} {d.state} for {fmt.age(d.for_seconds)}", "bold red")
    elif held:
        states = ", ".join(
            f"{sum(d.state == s for d in held)} {s}" for s in sorted({d.state for d in held})
        )
        title.append(f" · ✖ {len(held)} destinations held ({states})", "bold red")
    if held:
        title.append(" · e", "bold")
    return title


class RatesPanel(Vertical):
    """Throughput and arrivals as sparklines, newest on the right."""

    DEFAULT_CSS = """
    RatesPanel > .rate-label { height: 1; }
    RatesPanel > Sparkline { height: 1fr; min-height: 1; }
    RatesPanel > #done-spark > .sparkline--max-color { color: $success; }
    RatesPanel > #done-spark > .sparkline--min-color { color: $success 30%; }
    RatesPanel > #arrivals-spark > .sparkline--max-color { color: $accent; }
    RatesPanel > #arrivals-spark > .sparkline--min-color { color: $accent 30%; }
    """

    def compose(self) -> ComposeResult:
        yield Static(id="done-label", classes="rate-label")
        yield Sparkline([], id="done-spark")
        yield Static(id="arrivals-label", classes="rate-label")
        yield Sparkline([], id="arrivals-spark")

    def show(self, history: RateHistory) -> None:
        latest = history.latest
        width = max(self.size.width - 2, 1)
        done, arrivals = history.done()[-width:], history.arrivals()[-width:]
        peak_done = max(done, default=0.0)
        peak_arrivals = max(arrivals, default=0.0)
        self.query_one("#done-label", Static).update(
            Text.assemble(
                ("throughput ", "bold"),
                (fmt.rate(latest.done if latest else None), "bold green"),
                "  ",
                (f"done per second · peak {fmt.rate(peak_done)}", "dim"),
                _dead_rate(latest.dead if latest else None),
            )
        )
        self.query_one("#arrivals-label", Static).update(
            Text.assemble(
                ("arrivals   ", "bold"),
                (fmt.rate(latest.arrivals if latest else None), "bold"),
                "  ",
                (f"new messages per second · peak {fmt.rate(peak_arrivals)}", "dim"),
            )
        )
        # Nothing moving draws the empty baseline: a single value, or all zeros, would be
        # drawn as full blocks.
        self.query_one("#done-spark", Sparkline).data = done if any(done) else []
        self.query_one("#arrivals-spark", Sparkline).data = arrivals if any(arrivals) else []


def _dead_rate(per_second: float | None) -> Text:
    """Dead messages per minute: whether failures are still happening."""
    if per_second is None:
        return Text("")
    style = "bold red" if per_second > 0 else "dim"
    return Text(f" · dead {per_second * 60:.1f}/min", style)


class AttemptsPanel(Static):
    """Waiting messages by attempts used: retries piling up show as weight on the right."""

    def show(self, stats: QueueStats) -> None:
        if not stats.attempts:
            self.update(Text("no waiting messages", style="dim"))
            return
        rows = [(str(k), k, n) for k, n in stats.attempts.items()]
        height = max(self.size.height, 1)
        if len(rows) > height:  # keep the first ones and fold the tail into one line
            head, tail = rows[: height - 1], rows[height - 1 :]
            rows = [*head, (f"{tail[0][1]}+", tail[0][1], sum(n for _, _, n in tail))]
        peak = max(n for _, _, n in rows) or 1
        label_width = max(len(label) for label, _, _ in rows)
        number_width = max(len(fmt.count(n)) for _, _, n in rows)
        bar_room = max(self.size.width - label_width - number_width - 2, 1)
        text = Text()
        for i, (label, attempts, n) in enumerate(rows):
            bar = "█" * max(round(n / peak * bar_room), 1 if n else 0)
            # First tries are healthy; a few retries are normal; many mean trouble downstream.
            style = "green" if attempts == 0 else "yellow" if attempts < 3 else "red"
            if i:
                text.append("\n")
            text.append(f"{label:>{label_width}} ", "bold")
            text.append(f"{bar:<{bar_room}}", style)
            text.append(f" {fmt.count(n):>{number_width}}")
        self.update(text)


class HoldersPanel(Static):
    """Rows held per lease owner (worker), and the lease that runs out first."""

    def show(self, holders: list[LeaseHolder], now: datetime) -> None:
        if not holders:
            self.update(Text("no leases held", style="dim"))
            return
        table = RichTable(box=None, padding=(0, 1), pad_edge=False, expand=True)
        table.add_column("owner", style="bold", no_wrap=True, overflow="ellipsis", ratio=1)
        table.add_column("held", justify="right", no_wrap=True)
        table.add_column("exp", justify="right", no_wrap=True)
        table.add_column("expiry", justify="right", no_wrap=True)
        rows = max(self.size.height - 1, 1)
        shown = holders if len(holders) <= rows else holders[: rows - 1]
        for h in shown:
            table.add_row(
                Text(h.owner) if h.owner else Text("(none)", "dim"),
                fmt.count(h.held),
                Text(fmt.count(h.expired), "bold red" if h.expired else "dim"),
                Text(fmt.relative(h.earliest_expiry, now), "red" if h.expired else ""),
            )
        if len(shown) < len(holders):
            rest = holders[len(shown) :]
            table.add_row(
                Text(f"{len(rest)} more", "dim"),
                fmt.count(sum(h.held for h in rest)),
                fmt.count(sum(h.expired for h in rest)),
                "",
            )
        self.update(table)
