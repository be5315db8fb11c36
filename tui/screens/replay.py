"""Done messages of a time window, and their replay: the screen behind `o`.

The window (`since`, `until`: a duration before now such as `2h`, or an ISO 8601 time with
its offset) and a filter (`type:OrderPaid aggtype:order agg:o-1`) choose the messages, as
`outbox replay` does; enter in any field (`/` goes there) shows what they match (the count,
by type, the first and last ids) and the first of them. `R` replays them after the typed
count, as the dead letters' bulk requeue asks for it, and each batch is recorded in the audit
log (outbox.operations.replay)."""

from __future__ import annotations

from datetime import datetime

from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal
from textual.widgets import Input, Static

from outbox.commands.replay import parse_time
from outbox.operations.replay import DoneRow, Preview, ReplayFilter
from outbox.plumbing.errors import SchemaError
from outbox.plumbing.text import first_line, printable
from outbox.tui import format as fmt
from outbox.tui.errors import DATABASE_ERRORS
from outbox.tui.screens.base import BaseScreen
from outbox.tui.screens.confirm import ConfirmScreen
from outbox.tui.source import ReadOnlyError
from outbox.tui.widgets import RowTable
from outbox.views.filters import FilterError, parse_filter

# What reading the window may meet besides the database's errors: a partition an interrupted
# `outbox maintain` left half detached (outbox.operations.replay.HalfDetached).
_READ_ERRORS: tuple[type[BaseException], ...] = (*DATABASE_ERRORS, SchemaError)

FILTER_HELP = "type:OrderPaid aggtype:order agg:o-1 (enter to show)"


def window_filter(since: str, until: str, text: str, now: datetime) -> ReplayFilter:
    """The screen's fields as a filter; ValueError saying which field is wrong."""
    try:
        start, end = (parse_time(value).resolve(now) for value in (since, until))
    except ValueError as exc:
        raise ValueError(f"time: {exc}") from None
    try:
        f = parse_filter(text)
    except FilterError as exc:
        raise ValueError(f"filter: {exc}") from None
    if any(v is not None for v in (f.error, f.error_group, f.payload, f.payload_path)):
        raise ValueError("filter: done messages are chosen by type:, aggtype: and agg: only")
    return ReplayFilter(
        since=start,
        until=end,
        event_types=(f.event_type,) if f.event_type is not None else (),
        aggregate_type=f.aggregate_type,
        aggregate_id=f.aggregate_id,
    )


class ReplayScreen(BaseScreen):
    DEFAULT_CSS = """
    ReplayScreen #window { height: auto; }
    ReplayScreen #window Input { width: 1fr; }
    ReplayScreen #replay-filter { width: 3fr; }
    ReplayScreen #replay-summary { height: auto; padding: 0 1; background: $boost; }
    ReplayScreen RowTable { height: 1fr; }
    """
    BINDINGS = [
        Binding("R", "replay", "replay these"),
        Binding("slash", "edit", "window and filter"),
        Binding("escape", "back", "back"),
    ]

    def __init__(self) -> None:
        super().__init__()
        self.preview: Preview | None = None
        self.rows: list[DoneRow] = []

    def compose(self) -> ComposeResult:
        yield from self.compose_top()
        with Horizontal(id="window"):
            yield Input(value="1h", placeholder="since: 2h or an ISO time", id="since")
            yield Input(value="0s", placeholder="until", id="until")
            yield Input(placeholder=FILTER_HELP, id="replay-filter")
        yield Static(id="replay-summary")
        yield RowTable(id="done-rows")
        yield from self.compose_bottom()

    def on_mount(self) -> None:
        super().on_mount()
        table = self.query_one(RowTable)
        for label in ("id", "created", "type", "aggregate", "replayed"):
            table.add_column(label, key=label)
        table.focus()
        self.load()

    def action_edit(self) -> None:
        self.query_one("#replay-filter", Input).focus()

    @on(Input.Submitted)
    def _submitted(self) -> None:
        self.query_one(RowTable).focus()  # the keys (R) are the screen's again
        self.load()

    def _filter(self) -> ReplayFilter:
        since, until, text = (
            self.query_one(f"#{name}", Input).value for name in ("since", "until", "replay-filter")
        )
        return window_filter(since, until, text, self.outbox.clock())

    @work(group="done", exclusive=True)
    async def load(self) -> None:
        summary = self.query_one("#replay-summary", Static)
        try:
            f = self._filter()
        except ValueError as exc:
            self.preview = None
            summary.update(Text(str(exc), "bold red"))
            return
        try:
            preview, rows = await self.outbox.source.done_messages(f)
        except _READ_ERRORS as exc:
            self.preview = None
            # The error's first line, escaped (an ESC in it would drive the terminal); Text
            # shows markup in it as written.
            summary.update(Text(f"cannot read: {printable(first_line(exc))}", "bold red"))
            return
        self.preview, self.rows = preview, rows
        summary.update(Text("\n".join(preview.lines())))
        table = self.query_one(RowTable)
        table.clear()
        for r in rows:
            table.add_row(
                Text(str(r.id), justify="right"),
                fmt.timestamp(r.created_at),
                Text(r.event_type),
                Text(f"{r.aggregate_type}/{r.aggregate_id}"),
                Text("" if r.replay is None else f"replay {r.replay}"),
                key=str(r.id),
            )
        if len(rows) < preview.count:
            table.add_row(Text(f"… and {fmt.count(preview.count - len(rows))} more", "dim"))

    def action_replay(self) -> None:
        if self.outbox.config.read_only:
            self.outbox.tell("read-only: replay is disabled")
            return
        preview = self.preview
        if preview is None or not preview.count:
            self.outbox.tell("nothing to replay: no done message matches")
            return
        self._replay(preview)

    @work(group="action", exclusive=True)
    async def _replay(self, preview: Preview) -> None:
        lines = preview.lines()
        confirmed = await self.app.push_screen_wait(
            ConfirmScreen("replay", preview.count, lines[0], lines[1:], typed=True)
        )
        if not confirmed:
            self.outbox.tell("replay cancelled, nothing sent")
            return
        try:
            progress = await self.outbox.source.replay(preview)
        except ReadOnlyError:
            self.outbox.tell("read-only: replay is disabled")
            return
        except DATABASE_ERRORS as exc:
            self.outbox.tell(f"replay failed: {exc}")
            return
        except (SchemaError, ValueError) as exc:
            # Refused by what changed since the preview (a partition an interrupted `outbox
            # maintain` left half detached: HalfDetached): its line where the preview was,
            # which no longer holds.
            self.preview = None
            self.query_one("#replay-summary", Static).update(Text(str(exc), "bold red"))
            self.outbox.tell(f"replay refused: {exc}")
            return
        self.outbox.tell(
            f"replay {progress.number}: sent {fmt.count(progress.sent)} messages again"
            + progress.shortfall()  # fewer than confirmed: how many, and why
        )
        self.load()
