"""One message: every column, the payload laid out, the full last error, its place in its
aggregate, and what people did to it (the audit log).

The payload is shown as text, bounded: its first characters (outbox.views.dead_letters'
PAYLOAD_PREVIEW), laid out by outbox.plumbing.jsontext without decoding it, deep levels kept on one
line. PostgreSQL takes values nested far deeper than Python decodes; none crashes this
screen."""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from rich.console import Group, RenderableType
from rich.highlighter import JSONHighlighter
from rich.table import Table as RichTable
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.widgets import Static

from outbox.operations.repair import ActionRecord, Seen
from outbox.plumbing.jsontext import MAX_LAYOUT_DEPTH, layout, nesting_depth
from outbox.plumbing.text import printable
from outbox.tui import format as fmt
from outbox.tui.actions import ActionRequest
from outbox.tui.poller import Poller
from outbox.tui.screens.base import BaseScreen
from outbox.tui.source import Source
from outbox.views.dead_letters import MessageDetail

WIDE = 140  # columns from which the payload goes beside the fields
# Shown in the fields table; payload and last_error get their own sections.
_OWN_SECTIONS = {"payload", "last_error", "errors"}
_STATUS_STYLE = {"dead": "bold red", "pending": "yellow", "processing": "cyan", "done": "green"}


class DetailScreen(BaseScreen):
    DEFAULT_CSS = """
    DetailScreen VerticalScroll { padding: 0 1; }
    DetailScreen.stale #columns { text-opacity: 60%; }
    DetailScreen .section { text-style: bold; color: $accent; margin-top: 1; }
    DetailScreen #columns { height: auto; layout: vertical; }
    DetailScreen #columns > Vertical { height: auto; }
    /* Wide terminals: the payload beside the fields instead of below them. */
    DetailScreen.wide #columns { layout: horizontal; }
    DetailScreen.wide #columns > Vertical { width: 1fr; }
    DetailScreen.wide #right { padding-left: 2; }
    """
    BINDINGS = [
        Binding("r", "requeue", "requeue"),
        Binding("s", "skip", "skip"),
        Binding("escape,backspace", "back", "back"),
    ]

    def __init__(self, message_id: int) -> None:
        super().__init__()
        self.message_id = message_id
        self.detail: MessageDetail | None = None
        self.actions: list[ActionRecord] = []

    def compose(self) -> ComposeResult:
        yield from self.compose_top()
        with VerticalScroll():
            yield Static(id="title")
            with Horizontal(id="columns"):
                with Vertical(id="left"):
                    yield Static(id="fields")
                    yield Static("last error", classes="section")
                    yield Static(id="error")
                    yield Static("every failed attempt (newest last)", classes="section")
                    yield Static(id="attempts")
                    yield Static(
                        "history (requeue and skip, from the audit log)", classes="section"
                    )
                    yield Static(id="history")
                with Vertical(id="right"):
                    yield Static("payload", classes="section")
                    yield Static(id="payload")
        yield from self.compose_bottom()
        yield Poller(self.fetch, interval=self.outbox.poll_interval, name="detail")

    def on_mount(self) -> None:
        super().on_mount()
        self.query_one(VerticalScroll).focus()
        self.set_class(self.size.width >= WIDE, "wide")

    def on_resize(self) -> None:
        super().on_resize()
        self.set_class(self.size.width >= WIDE, "wide")

    async def fetch(self) -> None:
        source = self.outbox.source
        self.detail = await source.message(self.message_id)
        self.actions = await source.history(self.message_id) if self.detail else []
        self._show()
        self.refresh_bindings()  # requeue/skip only for a dead message

    def show_staleness(self) -> None:
        self._show()

    def _show(self) -> None:
        detail = self.detail
        title = self.query_one("#title", Static)
        if detail is None:
            title.update(Text(f"message {self.message_id} no longer exists (purged?)", "bold"))
            return
        c = detail.columns
        status = str(c.get("status"))
        title.update(
            Text.assemble(
                (f"message {detail.id} ", "bold"),
                (f" {status} ", f"reverse {_STATUS_STYLE.get(status, '')}"),
                _bounded(
                    f"  {c.get('aggregate_type')}/{c.get('aggregate_id')} · {c.get('event_type')}",
                    SHOWN_TEXT,
                ),
                (f"  {self.stale_note()}" if self.stale_since else "", "bold yellow"),
            )
        )
        self.query_one("#fields", Static).update(self._fields(detail))
        error = c.get("last_error")
        self.query_one("#error", Static).update(
            Group(
                Text(printable(_bounded(str(error), SHOWN_ERROR), keep="\n"), "red")
                if error
                else Text("(none)", "dim"),
                Text(f"error group: {detail.error_group or '(no error)'}", "dim"),
            )
        )
        self.query_one("#attempts", Static).update(_attempts(c.get("errors"), self.outbox.clock()))
        self.query_one("#payload", Static).update(_payload(detail))
        self.query_one("#history", Static).update(_history(self.actions, self.outbox.clock()))

    def _fields(self, detail: MessageDetail) -> RenderableType:
        now = self.outbox.clock()
        grid = RichTable.grid(padding=(0, 2))
        grid.add_column(style="bold", no_wrap=True)
        grid.add_column()
        for name, value in detail.columns.items():
            if name in _OWN_SECTIONS:
                continue
            grid.add_row(Text(name), _value(name, value, now))
        went_dead = _went_dead(detail)
        if went_dead is not None:
            grid.add_row(Text("went dead"), _value("went dead", went_dead, now))
        if detail.status != "done" and detail.is_head is not None:
            place = (
                "head of its aggregate (claimable first in ordered mode)"
                if detail.is_head
                else "behind earlier unfinished messages of its aggregate"
            )
            grid.add_row(
                "ordering", f"{place}; {fmt.count(detail.waiting_behind or 0)} unfinished after it"
            )
        return grid

    # -- actions ----------------------------------------------------------------------------

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action in ("requeue", "skip"):
            if self.outbox.config.read_only:
                return False
            return self.detail is not None and self.detail.status == "dead"
        return super().check_action(action, parameters)

    def _request(self, action: str) -> None:
        detail = self.detail
        if detail is None or detail.status != "dead":
            return
        c = detail.columns
        what = f"message {detail.id} ({c['aggregate_type']}/{c['aggregate_id']}, {c['event_type']})"
        notes = _head_notes(detail) if action == "skip" else []
        self.outbox.request(
            ActionRequest(
                "skip" if action == "skip" else "requeue",
                what,
                recorded={"selection": "detail"},
                seen=[detail.seen],
                notes=notes,
            )
        )

    def action_requeue(self) -> None:
        self._request("requeue")

    def action_skip(self) -> None:
        self._request("skip")


def _value(name: str, value: Any, now: datetime) -> RenderableType:
    if value is None:
        return Text("null", "dim")
    if isinstance(value, datetime):
        return Text.assemble(fmt.timestamp(value), (f"  ({fmt.relative(value, now)})", "dim"))
    if name == "status":
        return Text(str(value), _STATUS_STYLE.get(str(value), ""))
    if isinstance(value, dict | list):
        return Text(_bounded(json.dumps(value, ensure_ascii=False)))
    return Text(printable(_bounded(str(value))))


def _bounded(text: str, limit: int | None = None) -> str:
    """`text`, or its first `limit` characters (SHOWN_TEXT) and how long it is: laying out
    a value of megabytes (an error holding a whole response body, written by any tool)
    would hold the screen for seconds on every refresh."""
    limit = SHOWN_TEXT if limit is None else limit
    if len(text) <= limit:
        return text
    return f"{text[:limit]}… ({fmt.count(len(text))} characters)"


# Other json columns (`headers`, the application's own), the other columns, each failed
# attempt's error and an `errors` too deep to decode are shown as their text, this much of
# it: the payload gets the room.
SHOWN_TEXT = 1_000
# The last error, in full up to this many characters.
SHOWN_ERROR = 16_000


def _payload(detail: MessageDetail) -> RenderableType:
    """Indented, coloured, in the key order PostgreSQL keeps; long strings wrap at the pane's
    edge instead of being cut there. Never decoded: laid out from its text."""
    text = detail.payload_text
    if text is None:  # a source that hands the payload over decoded
        value = detail.columns.get("payload")
        text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    notes = []
    size = detail.payload_bytes
    if size is not None and size > len(text.encode()):
        notes.append(f"the first {fmt.count(len(text))} characters of {fmt.count(size)} bytes")
    depth = nesting_depth(text)
    if depth > MAX_LAYOUT_DEPTH:
        notes.append(f"nested {fmt.count(depth)} deep: levels past {MAX_LAYOUT_DEPTH} on one line")
    pretty = JSONHighlighter()(Text(layout(text), no_wrap=False, overflow="fold"))
    if not notes:
        return pretty
    return Group(Text("; ".join(notes), "dim italic"), pretty)


def _attempts(errors: Any, now: datetime) -> RenderableType:
    """The `errors` column (schema v3): one line per failed attempt, with its time."""
    if isinstance(errors, str):  # not the project's shape, or nested too deep to decode
        return Text(_bounded(errors), "red")
    if not isinstance(errors, list) or not errors:
        return Text("no failed attempt recorded", "dim")
    grid = RichTable.grid(padding=(0, 2))
    grid.add_column(no_wrap=True)
    grid.add_column(no_wrap=True, justify="right")
    grid.add_column()
    for entry in errors:
        entry = entry if isinstance(entry, dict) else {}
        at = _moment(entry.get("at"))
        grid.add_row(
            Text(fmt.timestamp(at) if at else "?"),
            Text(f"#{entry.get('attempt', '?')}", "dim"),
            Text.assemble(
                (_bounded(str(entry.get("error", ""))), "red"),
                (f"  {fmt.since(at, now)} ago" if at else "", "dim"),
            ),
        )
    return grid


def _went_dead(detail: MessageDetail) -> datetime | None:
    """A dead message's last failure is when it went dead (schema v3's `errors`)."""
    errors = detail.columns.get("errors")
    if detail.status != "dead" or not isinstance(errors, list) or not errors:
        return None
    last = errors[-1]
    return _moment(last.get("at")) if isinstance(last, dict) else None


def _moment(value: Any) -> datetime | None:
    """A timestamp as jsonb stores it (ISO 8601 text)."""
    try:
        return datetime.fromisoformat(str(value))
    except ValueError:
        return None


def _history(actions: list[ActionRecord], now: datetime) -> RenderableType:
    if not actions:
        return Text("no action recorded for this message", "dim")
    grid = RichTable.grid(padding=(0, 2))
    grid.add_column(no_wrap=True)
    grid.add_column(no_wrap=True)
    grid.add_column()  # who, from where, with what: wraps on a narrow pane
    for a in actions:
        others = len(a.message_ids) - 1
        grid.add_row(
            Text(fmt.timestamp(a.at)),
            Text(a.action, "bold"),
            Text.assemble(
                f"by {a.by} via {a.via}",
                (f" · {fmt.since(a.at, now)} ago · #{a.id}", "dim"),
                (f", with {others} other{'s' if others != 1 else ''}", "dim"),
            ),
        )
    return grid


def _head_notes(detail: MessageDetail) -> list[str]:
    """What skipping it does to its aggregate in ordered mode, no more than that."""
    c = detail.columns
    aggregate = f"{c['aggregate_type']}/{c['aggregate_id']}"
    if detail.is_head is None:
        return []  # an unordered table: a skip blocks or unblocks nothing
    if not detail.is_head:
        return [
            f"It is not the head of {aggregate}: earlier messages are unfinished, so skipping "
            "it does not unblock the aggregate."
        ]
    if not detail.waiting_behind:
        return [f"It is the head of {aggregate}; nothing waits behind it."]
    behind = f"{fmt.count(detail.waiting_behind)} unfinished messages wait behind it"
    if detail.next_status == "dead":
        return [
            f"It is the head of {aggregate} ({behind}), but the next one, {detail.next_id}, is "
            f"also dead: {aggregate} stays blocked until that one is repaired too."
        ]
    return [f"It is the head of {aggregate}: skipping it unblocks it; {behind} in ordered mode."]


async def skip_notes(source: Source, seen: Sequence[Seen]) -> list[str]:
    """For the skip dialog: does the message block its aggregate (one message only)."""
    if len(seen) != 1:
        return []
    detail = await source.message(seen[0].id)
    return _head_notes(detail) if detail is not None else []
