"""The `outbox-tui` application: shared state (refresh, connection, read-only), the
confirm-then-apply flow of every action, and the entry point."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

from textual import work
from textual.app import App
from textual.binding import Binding
from textual.notifications import SeverityLevel
from textual.timer import Timer

from outbox.destinations import OPEN, PAUSED
from outbox.plumbing import dberrors
from outbox.plumbing.cliutil import USAGE_ERROR, fail
from outbox.plumbing.text import age, printable
from outbox.stats import DestinationState
from outbox.tui import config as cfg
from outbox.tui.actions import ActionRequest, DestinationRequest
from outbox.tui.errors import DATABASE_ERRORS
from outbox.tui.format import count
from outbox.tui.host import Host
from outbox.tui.poller import Poller
from outbox.tui.screens.confirm import ConfirmScreen, DestinationConfirmScreen
from outbox.tui.screens.dashboard import DashboardScreen
from outbox.tui.screens.help import HelpScreen
from outbox.tui.source import EscapedSource, PgSource, ReadOnlyError, Source
from outbox.tui.widgets import BarState, StatusLine, TopBar

Clock = Callable[[], datetime]


def utc_now() -> datetime:
    return datetime.now(UTC)


class OutboxApp(App[None]):
    TITLE = "outbox-tui"
    ENABLE_COMMAND_PALETTE = False
    CSS = """
    Screen { background: $surface; }
    .panel { border: round $primary 60%; border-title-color: $text; border-title-style: bold;
             padding: 0 1; }
    """
    BINDINGS = [
        Binding("q", "quit", "quit", show=False),
        Binding("question_mark", "help", "help"),
        Binding("p", "toggle_pause", "pause"),
        Binding("ctrl+r", "refresh_now", "refresh", show=False),
        Binding("plus,equals_sign", "faster", "refresh faster", show=False),
        Binding("minus", "slower", "refresh slower", show=False),
        # Only reached when a screen's action is disabled, i.e. in read-only mode: say so
        # instead of silently ignoring the key.
        Binding("r,R,s,space,P,U", "refused", "refused", show=False),
    ]

    # Seconds a notice stays in the status line (its toast goes after NOTIFICATION_TIMEOUT).
    NOTICE_SECONDS = 10.0

    def __init__(
        self,
        config: cfg.Config,
        source: Source | None = None,
        *,
        clock: Clock = utc_now,
    ) -> None:
        super().__init__()
        self.config = config
        # Every answer reaches the screens escaped: rows hold what producers wrote.
        self.source: Source = EscapedSource(
            source or PgSource(config.dsn, config.table, read_only=config.read_only)
        )
        self.clock = clock
        # A connection setting libpq refuses (sslmode=bogus): the app ends, `main` says why.
        self.refused_setting: str | None = None
        self.interval = config.interval
        self.paused = config.paused
        self._notice_timer: Timer | None = None
        self.state = BarState(
            source=self.source.label,
            table=str(config.table),
            read_only=config.read_only,
            ordered=config.ordered,
            interval=config.interval,
            paused=config.paused,
        )

    # -- life cycle -------------------------------------------------------------------------

    def on_mount(self) -> None:
        self.push_screen(DashboardScreen())
        self._check_schema()

    async def on_unmount(self) -> None:
        await self.source.close()

    @work(group="check", exclusive=True, exit_on_error=False)
    async def _check_schema(self) -> None:
        try:
            problem = await self.source.check(self.config.ordered)
        except DATABASE_ERRORS:
            return  # the pollers report the connection problem
        self.set_state(schema_problem=problem)

    # -- shared state -----------------------------------------------------------------------

    def poll_interval(self) -> float | None:
        """For pollers: seconds until the next poll, None when paused."""
        return None if self.paused else self.interval

    def set_state(self, **changes: Any) -> None:
        self.state = replace(self.state, source=self.source.label, **changes)
        for screen in self.screen_stack:
            for bar in screen.query(TopBar):
                bar.show(self.state)
            for line in screen.query(StatusLine):
                line.show(self.state)

    def on_poller_polled(self, message: Poller.Polled) -> None:
        if message.error is None:
            self.set_state(connected=True, error=None, refreshed_at=self.clock())
            if self.state.schema_problem:
                self._check_schema()  # gone once someone runs what it says, without a restart
        elif (refused := dberrors.invalid_setting(message.error)) is not None:
            # It can never work, and only a new start can change it: a usage error, not a
            # status line that would stay red for ever.
            self.refused_setting = refused
            self.exit(return_code=USAGE_ERROR)
        else:
            self.set_state(connected=False, error=describe_error(message.error))

    def pollers(self) -> list[Poller]:
        return [p for screen in self.screen_stack for p in screen.query(Poller)]

    # -- refresh controls -------------------------------------------------------------------

    def action_refresh_now(self) -> None:
        for poller in self.pollers():
            poller.poll_now()

    def action_toggle_pause(self) -> None:
        self.paused = not self.paused
        self.set_state(paused=self.paused)
        self.notify("refresh paused (ctrl+r refreshes once)" if self.paused else "refresh resumed")
        if self.paused:
            for poller in self.pollers():
                poller.reschedule()
        else:
            self.action_refresh_now()

    def _set_interval(self, seconds: float) -> None:
        self.interval = seconds
        self.set_state(interval=seconds)
        for poller in self.pollers():
            poller.reschedule()

    def action_faster(self) -> None:
        self._set_interval(cfg.neighbour_interval(self.interval, faster=True))

    def action_slower(self) -> None:
        self._set_interval(cfg.neighbour_interval(self.interval, faster=False))

    def action_help(self) -> None:
        if not isinstance(self.screen, HelpScreen):
            self.push_screen(HelpScreen(self.screen))

    # -- actions ----------------------------------------------------------------------------

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action == "refused":
            return self.config.read_only
        return True

    def action_refused(self) -> None:
        self.refuse()

    def refuse(self) -> None:
        self.tell(
            "read-only: requeue, skip, replay, pause and resume are disabled", severity="warning"
        )

    def tell(
        self, message: str, *, title: str = "", severity: SeverityLevel = "information"
    ) -> None:
        """An action's outcome: a toast now, and the status line until the next one."""
        # Database errors quote values from rows: escaped like everything the source reads.
        message, title = printable(message), printable(title)
        self.notify(message, title=title, severity=severity, markup=False)
        self.set_state(last_action=message)
        # A notice is news: kept in the status line a while after its toast, then gone, so
        # that it does not read as the state of things for the rest of the session.
        if self._notice_timer is not None:
            self._notice_timer.stop()
        self._notice_timer = self.set_timer(self.NOTICE_SECONDS, self._notice_over)

    def _notice_over(self) -> None:
        self._notice_timer = None
        self.set_state(last_action=None)

    def request(self, request: ActionRequest) -> None:
        """Confirm and apply an action (from any screen)."""
        if self.config.read_only:
            self.refuse()
            return
        if any(w.group == "action" and not w.is_finished for w in self.workers):
            return  # one dialog at a time: a second R while one is open is a stray key
        self._perform(request)

    @work(group="action", exit_on_error=True)
    async def _perform(self, request: ActionRequest) -> None:
        verb = "requeue" if request.action == "requeue" else "skip"
        try:
            seen = list(request.seen) if request.seen is not None else []
            if request.load is not None:
                seen = await request.load()
            notes = list(request.notes)
            if request.explain is not None:
                notes += await request.explain()
        except DATABASE_ERRORS as exc:
            self.tell(f"{verb}: cannot read: {describe_error(exc)}", severity="error")
            return
        if not seen:
            self.tell(f"nothing to {verb}: no dead message matches", severity="warning")
            return
        confirmed = await self.push_screen_wait(
            ConfirmScreen(request.action, len(seen), request.what, notes, typed=request.typed)
        )
        if not confirmed:
            self.tell(f"{verb} cancelled, nothing changed")
            return
        try:
            result = await self.source.apply(request.action, seen, request.recorded)
        except ReadOnlyError:
            self.refuse()
            return
        except DATABASE_ERRORS as exc:
            self.tell(f"{verb} failed, nothing changed: {describe_error(exc)}", severity="error")
            return
        self.tell(
            f"{result.summary()} (action #{result.audit_id})",
            title=f"{verb}: {count(result.count)} changed",
            severity="information" if not result.changed_meanwhile else "warning",
        )
        if request.done is not None:
            request.done(result)
        self.action_refresh_now()

    def request_destination(self, request: DestinationRequest) -> None:
        """Confirm a destination's pause or resume, then apply it (from any screen)."""
        if self.config.read_only:
            self.refuse()
            return
        if any(w.group == "action" and not w.is_finished for w in self.workers):
            return  # one dialog at a time
        self._perform_destination(request)

    @work(group="action", exit_on_error=True)
    async def _perform_destination(self, request: DestinationRequest) -> None:
        verb, seen = request.action, request.seen
        reason = await self.push_screen_wait(
            DestinationConfirmScreen(verb, seen.destination, describe_destination(seen))
        )
        if reason is None:
            self.tell(f"{verb} cancelled, nothing changed")
            return
        try:
            result = await self.source.change_destination(verb, seen.destination, reason or None)
        except ReadOnlyError:
            self.refuse()
            return
        except DATABASE_ERRORS as exc:
            self.tell(f"{verb} failed, nothing changed: {describe_error(exc)}", severity="error")
            return
        self.tell(
            result.summary(printable),  # the names as the destinations screen shows them
            title=f"{verb}: {'done' if result.changed else 'nothing changed'}",
            severity="information" if result.changed else "warning",
        )
        if request.done is not None:
            request.done(result)
        self.action_refresh_now()


def describe_destination(d: DestinationState) -> str:
    """A destination's state in one sentence, for the dialog that changes it."""
    since = f" for {age(d.for_seconds)}" if d.for_seconds is not None else ""
    # Idle: the workers that served it are gone (its URL changed); nobody will probe it.
    idle = " (Idle: no running worker serves it, so it holds nothing back.)" if d.idle else ""
    if d.state == PAUSED:
        return f"Paused{since} by {d.changed_by or '?'}: {d.reason or '(no reason)'}{idle}"
    if d.state == OPEN:
        error = f" (last error: {d.last_error})" if d.last_error else ""
        failures = f"{d.failures} failure{'' if d.failures == 1 else 's'}"
        return f"Open{since}: the breaker holds it after {failures}{error}.{idle}"
    return f"Closed{since}: messages are sent to it.{idle}"


def describe_error(exc: BaseException) -> str:
    """A database error in a few words, its reason kept (`outbox.plumbing.dberrors.describe`).

    The status line is narrow: a server's refusal (`FATAL: database "x" does not exist`)
    comes first, without the host and port libpq puts before it (the top bar shows those)."""
    text = dberrors.describe(exc)
    if "FATAL: " in text:
        text = text.split("FATAL: ", 1)[1]
    return f"{type(exc).__name__}: {text}"


def _hosts_the_screens(app: OutboxApp) -> Host:
    return app  # mypy checks here that the app offers what the screens use


def main(argv: Sequence[str] | None = None) -> None:
    config = cfg.parse_args(argv)
    app = OutboxApp(config)
    app.run()
    if app.refused_setting is not None:
        fail(cfg.PROG, f"{app.refused_setting} (set by the DSN or a PG* variable)")
