"""Dead letters: a keyset-paged list (newest first) or the same rows grouped by error, a
k9s-style filter line, marks, and the requeue/skip actions.

The list refreshes live like everything else. Paging is by id (`before` the last id shown),
so a page costs the same however deep it is and however many done rows the table holds.
Marks remember each row as it was last shown (its lease_version): that is what an action
is fenced on.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Literal, NamedTuple

from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.widgets import DataTable, Input, Static

from outbox.dead_letters import DeadMessage, DeadPage, ErrorGroup
from outbox.filters import DeadFilter, FilterError, parse_filter
from outbox.repair import ActionResult, Seen
from outbox.text import first_line
from outbox.tui import format as fmt
from outbox.tui.actions import ActionRequest
from outbox.tui.errors import DATABASE_ERRORS
from outbox.tui.poller import Poller
from outbox.tui.screens.base import BaseScreen
from outbox.tui.screens.detail import DetailScreen, skip_notes
from outbox.tui.widgets import RowTable

View = Literal["list", "groups"]


class Page(NamedTuple):
    before: int | None  # the page below this id (None: the newest)
    after: int | None  # or the page just above this id
    number: int


CELL_PADDING = 2  # DataTable pads each cell by one column on either side
SCROLLBAR = 2


def list_columns(width: int, id_digits: int) -> dict[str, int]:
    """Column widths for the list: the error takes what the others leave. Aggregate and
    event names get more room on wide terminals."""
    wide = width >= 120
    columns = {
        "mark": 1,
        "id": max(id_digits, 2),
        "aggregate": 24 if wide else 12,
        "event": 20 if wide else 12,
        "att": 3,
        "age": 7,
    }
    used = sum(columns.values()) + CELL_PADDING * (len(columns) + 1) + SCROLLBAR
    return {**columns, "error": max(width - used, 12)}


def group_columns(width: int) -> dict[str, int]:
    columns = {"count": 7, "newest": 7}
    used = sum(columns.values()) + CELL_PADDING * 3 + SCROLLBAR
    return {"count": 7, "key": max(width - used, 20), "newest": 7}


class DeadScreen(BaseScreen):
    SHOWS_FILTER_HELP = True
    DEFAULT_CSS = """
    DeadScreen #dead-header { height: 1; padding: 0 1; background: $boost; }
    DeadScreen DataTable { height: 1fr; }
    DeadScreen #groups-table { display: none; }
    DeadScreen.groups #groups-table { display: block; }
    DeadScreen.groups #dead-table { display: none; }
    DeadScreen #filter-bar { height: auto; display: none; }
    DeadScreen.filtering #filter-bar { display: block; }
    DeadScreen #filter { border: tall $accent; }
    DeadScreen #filter-error { height: auto; display: none; color: $error; padding: 0 1; }
    DeadScreen #dead-empty { height: 1; display: none; padding: 0 1; color: $text-muted; }
    DeadScreen.empty #dead-empty { display: block; }
    DeadScreen.groups #dead-empty { display: none; }
    DeadScreen.stale DataTable { text-opacity: 60%; }
    DeadScreen.filter-error #filter-error { display: block; }
    """
    BINDINGS = [
        Binding("enter", "open", "detail", show=False),
        Binding("slash", "filter", "filter"),
        Binding("g", "toggle_groups", "groups"),
        Binding("space", "mark", "mark", key_display="␣"),
        Binding("r", "requeue", "requeue"),
        Binding("R", "requeue_all", "requeue all", key_display="R"),
        Binding("s", "skip", "skip"),
        Binding("u", "unmark_all", "unmark all", show=False),
        Binding("right_square_bracket", "older", "older page", show=False),
        Binding("left_square_bracket", "newer", "newer page", show=False),
        Binding("t", "newest", "newest page (live)", show=False),
        Binding("x", "clear_filter", "clear filter", show=False),
        Binding("escape", "back", "back"),
    ]

    def __init__(self) -> None:
        super().__init__()
        self.filter = DeadFilter()
        self.view: View = "list"
        self.before: int | None = None  # page cursor: None is the newest page (live)
        self.page_number = 1  # of the page shown
        # A page asked for and not shown yet: (before, after, its number). Paging keys wait
        # for it, so the label always belongs to the rows under it.
        self._going: Page | None = None
        self.page: DeadPage | None = None
        self.total: int | None = None
        self.all_dead: int | None = None
        self.groups: list[ErrorGroup] = []
        self.marks: dict[int, Seen] = {}

    def compose(self) -> ComposeResult:
        yield from self.compose_top()
        yield Static(id="dead-header")
        yield RowTable(id="dead-table")
        yield RowTable(id="groups-table")
        yield Static(id="dead-empty")
        with Vertical(id="filter-bar"):
            yield Static(id="filter-error")
            yield Input(
                placeholder='type:X agg:Y error:text {"k": "v"} $.path > 1  (enter applies, esc)',
                id="filter",
            )
        yield from self.compose_bottom()
        yield Poller(self.fetch, interval=self.outbox.poll_interval, name="dead")

    def on_mount(self) -> None:
        super().on_mount()
        self._build_columns()
        self.query_one("#dead-table", DataTable).focus()
        self._show_header()

    # -- data -------------------------------------------------------------------------------

    async def fetch(self) -> None:
        source = self.outbox.source
        size = self.outbox.config.page_size
        # One filter, view and page for every query of this poll. The operator may change
        # any of them meanwhile: then nothing of this poll is shown (it would be the old
        # rows under the new label), and the change's own poll follows.
        current, going, view = self.filter, self._going, self.view
        if view == "groups":
            groups = await source.error_groups(current)
            total = sum(g.count for g in groups)
        else:
            before, after, number = going or Page(self.before, None, self.page_number)
            page = await source.dead_page(current, before=before, after=after, limit=size)
            if after is not None:
                # Came up a page: continue from its top, or go live at the newest page.
                before = page.messages[0].id + 1 if page.has_newer and page.messages else None
            if not page.messages and before is not None:
                # Everything on this page went away (requeued): back to the newest page.
                before = None
                page = await source.dead_page(current, before=None, after=None, limit=size)
            total = await source.dead_count(current)
        all_dead = total if current.is_empty() else await source.dead_count(DeadFilter())
        if (self.filter, self._going, self.view) != (current, going, view):
            return  # the operator asked for something else meanwhile: its poll follows
        if view == "groups":
            self.groups = groups
            self._show_groups()
        else:
            self.before, self.page_number = before, 1 if before is None else number
            self._going = None
            self.page = page
            self._show_page()
        self.total, self.all_dead = total, all_dead
        self._show_header()

    def show_staleness(self) -> None:
        self._show_header()

    def refetch(self) -> None:
        for poller in self.query(Poller):
            poller.poll_now()

    # -- rendering --------------------------------------------------------------------------

    def _id_digits(self) -> int:
        return len(str(self.page.messages[0].id)) if self.page and self.page.messages else 2

    def _build_columns(self) -> None:
        """(Re)build both tables' columns for the current width and id length."""
        self._layout = (self.size.width, self._id_digits())
        self.columns = list_columns(*self._layout)
        table = self.query_one("#dead-table", DataTable)
        table.clear(columns=True)
        labels = {"mark": "", "att": "att", "error": "last error"}
        for key, width in self.columns.items():
            table.add_column(labels.get(key, key), key=key, width=width)
        groups = self.query_one("#groups-table", DataTable)
        groups.clear(columns=True)
        for key, width in group_columns(self.size.width).items():
            label = "error group (numbers, ids, quoted values as <placeholders>)"
            groups.add_column(label if key == "key" else key, key=key, width=width)

    def _columns_current(self) -> bool:
        return getattr(self, "_layout", None) == (self.size.width, self._id_digits())

    def on_resize(self) -> None:
        super().on_resize()
        if not self._columns_current():
            self._build_columns()
            self._show_page()
            self._show_groups()

    def _show_header(self) -> None:
        text = Text()
        text.append("dead letters ", "bold")
        if self.all_dead is not None:
            text.append(fmt.count(self.all_dead), "bold red" if self.all_dead else "bold")
        if not self.filter.is_empty():
            text.append("  filter ", "dim")
            text.append(fmt.one_line(self.filter.describe(), 40), "bold cyan")
            if self.total is not None:
                text.append(f" → {fmt.count(self.total)}", "bold")
        if self.view == "groups":
            text.append(f"  {len(self.groups)} error groups", "dim")
        elif self.page is not None and self.page.messages:
            size = self.outbox.config.page_size
            first = (self.page_number - 1) * size + 1
            last = first + len(self.page.messages) - 1
            text.append(f"  page {self.page_number} ({first}-{last})", "dim")
            if self.stale_since is None and self.before is None:
                text.append(" live", "dim")
        if self.stale_since is not None:
            text.append(f"  {self.stale_note()}", "bold yellow")
        if self.marks:
            text.append(f"  {len(self.marks)} marked", "bold yellow")
        self.query_one("#dead-header", Static).update(text)

    def _show_page(self) -> None:
        if not self._columns_current():
            self._build_columns()
        table = self.query_one("#dead-table", DataTable)
        current = self._cursor_id(table)
        row_index = table.cursor_row
        table.clear()
        now = self.outbox.clock()
        widths = self.columns
        messages = self.page.messages if self.page else []
        for m in messages:
            if m.id in self.marks:
                self.marks[m.id] = m.seen  # the operator now sees this version
            table.add_row(
                Text("●", "bold yellow") if m.id in self.marks else "",
                Text(str(m.id), justify="right"),
                Text(fmt.one_line(f"{m.aggregate_type}/{m.aggregate_id}", widths["aggregate"])),
                Text(fmt.one_line(m.event_type, widths["event"])),
                Text(str(m.attempts), justify="right"),
                Text(fmt.since(m.created_at, now), justify="right"),
                Text(fmt.one_line(m.last_error, widths["error"]), "red"),
                key=str(m.id),
            )
        # Said below the table's header, not in a column too narrow for it.
        self.set_class(self.page is not None and not messages, "empty")
        empty = "no dead messages" + ("" if self.filter.is_empty() else " match the filter")
        self.query_one("#dead-empty", Static).update(empty)
        ids = [str(m.id) for m in messages]
        if current in ids:
            table.move_cursor(row=ids.index(current), animate=False)
        elif messages:
            table.move_cursor(row=min(row_index, len(messages) - 1), animate=False)

    def _show_groups(self) -> None:
        table = self.query_one("#groups-table", DataTable)
        current = self._cursor_id(table)
        table.clear()
        now = self.outbox.clock()
        width = group_columns(self.size.width)["key"]
        for i, g in enumerate(self.groups):
            table.add_row(
                Text(fmt.count(g.count), "bold", justify="right"),
                Text(fmt.one_line(g.key or "(no error)", width), "red"),
                Text(fmt.since(g.newest_created_at, now), justify="right"),
                key=str(i),
            )
        if not self.groups:
            table.add_row("", Text("no dead messages", "dim"), "", key="empty")
        if current is not None and current.isdigit() and int(current) < len(self.groups):
            table.move_cursor(row=int(current), animate=False)

    @staticmethod
    def _cursor_id(table: DataTable[Any]) -> str | None:
        if table.row_count == 0:
            return None
        try:
            return table.coordinate_to_cell_key(table.cursor_coordinate).row_key.value
        except Exception:  # no valid cursor in an emptied table
            return None

    def highlighted(self) -> DeadMessage | None:
        table = self.query_one("#dead-table", DataTable)
        key = self._cursor_id(table)
        if self.page is None or key is None or not key.isdigit():
            return None
        return next((m for m in self.page.messages if m.id == int(key)), None)

    def highlighted_group(self) -> ErrorGroup | None:
        key = self._cursor_id(self.query_one("#groups-table", DataTable))
        if key is None or not key.isdigit() or int(key) >= len(self.groups):
            return None
        return self.groups[int(key)]

    # -- navigation -------------------------------------------------------------------------

    def action_open(self) -> None:
        if self.view == "groups":
            group = self.highlighted_group()
            if group is not None:
                self._set_filter(_with_group(self.filter, group.key))
                self._set_view("list")
            return
        message = self.highlighted()
        if message is not None:
            self.app.push_screen(DetailScreen(message.id))

    def action_toggle_groups(self) -> None:
        self._set_view("groups" if self.view == "list" else "list")

    def _set_view(self, view: View) -> None:
        self.view = view
        self.set_class(view == "groups", "groups")
        table = "#groups-table" if view == "groups" else "#dead-table"
        self.query_one(table, DataTable).focus()
        self._show_header()
        self.refresh_bindings()
        self.refetch()

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if self.view == "groups" and action in ("requeue", "skip", "mark", "unmark_all"):
            return False  # rows, not groups: R requeues a group
        return super().check_action(action, parameters)

    def _go(self, page: Page) -> None:
        self._going = page
        self.refetch()

    def action_older(self) -> None:
        page = self.page
        if self.view == "list" and not self._going and page and page.has_older and page.messages:
            self._go(Page(page.messages[-1].id, None, self.page_number + 1))

    def action_newer(self) -> None:
        page = self.page
        if self.view == "list" and not self._going and page and page.has_newer and page.messages:
            self._go(Page(None, page.messages[0].id, max(self.page_number - 1, 1)))

    def action_newest(self) -> None:
        self._go(Page(None, None, 1))

    def action_back(self) -> None:
        if self.has_class("filtering"):
            self._close_filter()
        elif self.view == "groups":
            self._set_view("list")
        elif not self.filter.is_empty():
            self.action_clear_filter()
        else:
            self.app.pop_screen()

    # -- filter -----------------------------------------------------------------------------

    def action_filter(self) -> None:
        box = self.query_one("#filter", Input)
        box.value = self.filter.describe()
        self.add_class("filtering")
        box.focus()

    @on(Input.Submitted, "#filter")
    def _filter_submitted(self, event: Input.Submitted) -> None:
        try:
            new = parse_filter(event.value)
        except FilterError as exc:
            self._filter_error(str(exc))
            return
        if new.payload_path is None:
            self._close_filter()
            self._set_filter(new)
        else:
            self._check_then_filter(new)

    @work(group="filter", exclusive=True, exit_on_error=False)
    async def _check_then_filter(self, new: DeadFilter) -> None:
        """A path only the database can read: ask it first, so that a typo is the filter's
        error here instead of a failing poll under the new filter."""
        try:
            problem = await self.outbox.source.check_filter(new)
        except DATABASE_ERRORS as exc:
            problem = f"cannot check it now: {first_line(exc)}"
        if problem is not None:
            self._filter_error(problem)
        elif self.has_class("filtering"):
            self._close_filter()
            self._set_filter(new)

    def _filter_error(self, problem: str) -> None:
        self.query_one("#filter-error", Static).update(Text(f"filter: {problem}"))
        self.add_class("filter-error")

    def _close_filter(self) -> None:
        self.remove_class("filtering")
        self.remove_class("filter-error")
        table = "#groups-table" if self.view == "groups" else "#dead-table"
        self.query_one(table, DataTable).focus()

    def action_clear_filter(self) -> None:
        self._set_filter(DeadFilter())

    def _set_filter(self, new: DeadFilter) -> None:
        if new != self.filter and self.marks:
            # Marks are rows the operator sees; under another filter they may not be shown.
            self.outbox.tell(f"{len(self.marks)} marks cleared: the filter changed")
            self.marks.clear()
        self.filter = new
        self.before, self._going, self.page_number = None, None, 1
        self._show_header()
        self.refetch()

    # -- marks and actions ------------------------------------------------------------------

    def action_mark(self) -> None:
        message = self.highlighted()
        if message is None or self.view != "list":
            return
        if message.id in self.marks:
            del self.marks[message.id]
        else:
            self.marks[message.id] = message.seen
        self._show_page()
        self._show_header()
        table = self.query_one("#dead-table", DataTable)
        if table.cursor_row < table.row_count - 1:
            table.move_cursor(row=table.cursor_row + 1, animate=False)

    def action_unmark_all(self) -> None:
        self.marks.clear()
        self._show_page()
        self._show_header()

    def _selected(self) -> tuple[list[Seen], str] | None:
        """The marked rows, else the highlighted one, as the operator sees them."""
        if self.marks:
            seen = sorted(self.marks.values(), key=lambda s: -s.id)
            shown = {m.id for m in self.page.messages} if self.page else set()
            elsewhere = sum(1 for s in seen if s.id not in shown)
            what = f"{len(seen)} marked: " + fmt.one_line(", ".join(str(s.id) for s in seen), 60)
            if elsewhere:
                what += f" ({elsewhere} of them on other pages)"
            return seen, what
        message = self.highlighted()
        if message is None:
            return None
        return [message.seen], (
            f"message {message.id} ({message.aggregate_type}/{message.aggregate_id}, "
            f"{message.event_type})"
        )

    def _clear_marks(self, result: ActionResult) -> None:
        for message_id in [*result.changed, *result.changed_meanwhile, *result.not_dead]:
            self.marks.pop(message_id, None)
        self._show_header()

    def action_requeue(self) -> None:
        selected = self._selected()
        if selected is None:
            return
        seen, what = selected
        self.outbox.request(
            ActionRequest(
                "requeue",
                what,
                recorded={"selection": "marked" if self.marks else "one"},
                seen=seen,
                done=self._clear_marks,
            )
        )

    def action_requeue_all(self) -> None:
        """Everything matching the filter, or the highlighted error group."""
        target = self.filter
        if self.view == "groups":
            group = self.highlighted_group()
            if group is None:
                return
            target = _with_group(self.filter, group.key)
        description = target.describe()
        source = self.outbox.source
        if target.error_group is not None:
            what = f"every dead message in the error group {target.error_group!r}"
            rest = replace(target, error_group=None).describe()
            what += f" matching {rest}" if rest else ""
        elif description:
            what = f"every dead message matching {description}"
        else:
            what = "every dead message"

        async def load() -> list[Seen]:
            return await source.targets(target)

        async def breakdown() -> list[str]:
            return _breakdown(await source.error_groups(target))

        self.outbox.request(
            ActionRequest(
                "requeue",
                what,
                recorded={"query": description, "filter": target.to_json()},
                load=load,
                done=self._clear_marks,
                # Everything, permanent failures included: show what it is, type the count.
                explain=breakdown if target.is_empty() else None,
                typed=target.is_empty(),
            )
        )

    def action_skip(self) -> None:
        if self.view != "list":
            return
        selected = self._selected()
        if selected is None:
            return
        seen, what = selected
        source = self.outbox.source

        async def explain() -> list[str]:
            return await skip_notes(source, seen)

        self.outbox.request(
            ActionRequest(
                "skip",
                what,
                recorded={"selection": "marked" if self.marks else "one"},
                seen=seen,
                explain=explain,
                done=self._clear_marks,
            )
        )


BREAKDOWN_GROUPS = 8


def _breakdown(groups: list[ErrorGroup]) -> list[str]:
    """The biggest error groups, one line each, for the requeue-everything dialog."""
    lines = ["By error group:"] + [
        f"{fmt.count(g.count):>9}  {fmt.one_line(g.key or '(no error)', 56)}"
        for g in groups[:BREAKDOWN_GROUPS]
    ]
    rest = groups[BREAKDOWN_GROUPS:]
    if rest:
        lines.append(f"{fmt.count(sum(g.count for g in rest)):>9}  in {len(rest)} more groups")
    return lines


def _with_group(f: DeadFilter, key: str) -> DeadFilter:
    return replace(f, error_group=key)
