"""The first screen: the queue at a glance, refreshed live."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Grid

from outbox.tui import format as fmt
from outbox.tui.poller import Poller
from outbox.tui.rates import RateHistory
from outbox.tui.screens.base import BaseScreen
from outbox.tui.screens.blocked import BlockedScreen
from outbox.tui.screens.dead import DeadScreen
from outbox.tui.screens.destinations import DestinationsScreen
from outbox.tui.screens.history import HistoryScreen
from outbox.tui.screens.replay import ReplayScreen
from outbox.tui.screens.workers import WorkersScreen
from outbox.tui.widgets import (
    AgesPanel,
    AttemptsPanel,
    CountsPanel,
    HoldersPanel,
    RatesPanel,
    rates_title,
)


class DashboardScreen(BaseScreen):
    DEFAULT_CSS = """
    DashboardScreen #dash {
        grid-size: 2 3; grid-columns: 1fr 1fr; grid-rows: 7 1fr 1fr; grid-gutter: 0 1;
    }
    DashboardScreen #dash > * { height: 100%; }
    DashboardScreen #rates { column-span: 2; min-height: 6; }
    DashboardScreen.stale .panel { text-opacity: 50%; }
    """
    BINDINGS = [
        Binding("d", "dead", "dead letters"),
        Binding("b", "blocked", "blocked"),
        Binding("w", "workers", "workers"),
        Binding("h", "history", "action log"),
        Binding("e", "destinations", "destinations"),
        Binding("o", "done", "done (replay)"),
    ]

    def __init__(self) -> None:
        super().__init__()
        # Rates need successive snapshots: kept for the life of the screen (the app's).
        self.history = RateHistory()

    def compose(self) -> ComposeResult:
        yield from self.compose_top()
        with Grid(id="dash"):
            yield CountsPanel(id="counts", classes="panel")
            yield AgesPanel(id="ages", classes="panel")
            yield RatesPanel(id="rates", classes="panel")
            yield AttemptsPanel(id="attempts", classes="panel")
            yield HoldersPanel(id="holders", classes="panel")
        yield from self.compose_bottom()
        yield Poller(self.fetch, interval=self.outbox.poll_interval, name="overview")

    def on_mount(self) -> None:
        super().on_mount()
        slo = self.outbox.config.slo
        self.query_one("#counts").border_title = "queue"
        self.query_one("#ages").border_title = f"ages · SLO {fmt.duration(slo)}"
        self.query_one("#rates").border_title = "rates"
        self.query_one("#attempts").border_title = "attempts (waiting messages)"
        self.query_one("#holders").border_title = "lease holders"

    async def fetch(self) -> None:
        app = self.outbox
        overview = await app.source.overview(app.config.ordered)
        self.history.add(overview.stats)
        self.query_one(CountsPanel).show(overview.stats)
        self.query_one(AgesPanel).show(overview.stats, app.config.slo, overview.blocked)
        self.query_one(RatesPanel).show(self.history)
        # A destination nothing is sent to explains a throughput of zero: said above it.
        self.query_one(RatesPanel).border_title = rates_title(overview.stats)
        self.query_one(AttemptsPanel).show(overview.stats)
        self.query_one(HoldersPanel).show(overview.holders, app.clock())

    def show_staleness(self) -> None:
        for panel in self.query(".panel"):
            panel.border_subtitle = self.stale_note()

    def action_dead(self) -> None:
        # Installed once: its filter, page and marks survive going back to the dashboard.
        if not self.app.is_screen_installed("dead"):
            self.app.install_screen(DeadScreen(), "dead")
        self.app.push_screen("dead")

    def action_blocked(self) -> None:
        self.app.push_screen(BlockedScreen())

    def action_workers(self) -> None:
        self.app.push_screen(WorkersScreen())

    def action_history(self) -> None:
        self.app.push_screen(HistoryScreen())

    def action_destinations(self) -> None:
        self.app.push_screen(DestinationsScreen())

    def action_done(self) -> None:
        self.app.push_screen(ReplayScreen())
