"""The list view: one page of dead messages, newest first, with its paging and the marks
column.

Paging is by id (`before` the last id shown), so a page costs the same however deep it is
and however many done rows the table holds. A page asked for and not shown yet (`going`)
holds the paging keys back until it arrives, so the page label always belongs to the rows
under it.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import NamedTuple

from rich.cells import cell_len
from rich.text import Text
from textual.app import ComposeResult
from textual.reactive import var
from textual.widgets import Static

from outbox.tui import format as fmt
from outbox.tui.screens.dead.marks import Marks
from outbox.tui.screens.dead.rows import RowsView
from outbox.tui.source import Source
from outbox.tui.widgets import RowTable, fit_columns
from outbox.views.dead_letters import DeadMessage, DeadPage
from outbox.views.filters import DeadFilter

CELL_PADDING = 2  # DataTable pads each cell by one column on either side
SCROLLBAR = 2


class Page(NamedTuple):
    """A page to read."""

    before: int | None  # the page below this id (None: the newest)
    after: int | None  # or the page just above this id
    number: int


NEWEST = Page(None, None, 1)


@dataclass(frozen=True)
class Listing:
    """A page as read: its rows, where it stands, and the filter it was read under."""

    filter: DeadFilter
    page: DeadPage
    before: int | None  # where it continues from: None is the newest page (live)
    number: int
    size: int  # the page size it was read with

    @property
    def span(self) -> tuple[int, int]:
        """The positions of its first and last row, counted from the newest."""
        first = (self.number - 1) * self.size + 1
        return first, first + len(self.page.messages) - 1

    def again(self) -> Page:
        return Page(self.before, None, self.number)

    def older(self) -> Page | None:
        messages = self.page.messages
        if not (self.page.has_older and messages):
            return None
        return Page(messages[-1].id, None, self.number + 1)

    def newer(self) -> Page | None:
        messages = self.page.messages
        if not (self.page.has_newer and messages):
            return None
        return Page(None, messages[0].id, max(self.number - 1, 1))


async def read_listing(source: Source, f: DeadFilter, wanted: Page, size: int) -> Listing:
    before, after, number = wanted
    page = await source.dead_page(f, before=before, after=after, limit=size)
    if after is not None:
        # Came up a page: continue from its top, or go live at the newest page.
        before = page.messages[0].id + 1 if page.has_newer and page.messages else None
    if not page.messages and before is not None:
        # Everything on this page went away (requeued): back to the newest page.
        before = None
        page = await source.dead_page(f, before=None, after=None, limit=size)
    return Listing(f, page, before, 1 if before is None else number, size)


def list_columns(width: int, id_digits: int, aggregate: int = 0, event: int = 0) -> dict[str, int]:
    """Column widths for the list: aggregate and event as wide as their longest value shown
    (`aggregate`, `event`: cells) while the error keeps a third of the room, and the error
    takes what they leave."""
    fixed = {"mark": 1, "id": max(id_digits, 2), "att": 3, "age": 7}
    used = sum(fixed.values()) + CELL_PADDING * (len(fixed) + 3) + SCROLLBAR
    room = width - used
    names = fit_columns(
        {"aggregate": max(aggregate, len("aggregate")), "event": max(event, len("event"))},
        room,
        keep=max(room // 3, 12),
    )
    error = max(room - sum(names.values()), 12)
    return {"mark": 1, "id": fixed["id"], **names, "att": 3, "age": 7, "error": error}


def _cells(text: str) -> int:
    """The cells a value takes on one line, as `fmt.one_line` writes it."""
    return cell_len(fmt.one_line(text, len(text) * 4 + 1))


LABELS = {"mark": "", "att": "att", "error": "last error"}


class DeadList(RowsView):
    DEFAULT_CSS = """
    DeadList > RowTable { height: 1fr; }
    DeadList > #dead-empty { height: 1; display: none; padding: 0 1; color: $text-muted; }
    DeadList.-empty > #dead-empty { display: block; }
    """

    listing: var[Listing | None] = var(None)
    marks: var[Marks] = var(Marks)
    going: var[Page | None] = var(None)  # a page asked for and not shown yet

    def compose(self) -> ComposeResult:
        yield RowTable(id="dead-table")
        # Said below the table's header, not in a column too narrow for it.
        yield Static(id="dead-empty")

    # -- paging -----------------------------------------------------------------------------

    @property
    def wanted(self) -> Page:
        """The page the next poll reads: the one asked for, else the one shown again."""
        if self.going is not None:
            return self.going
        return self.listing.again() if self.listing is not None else NEWEST

    def older(self) -> bool:
        """Ask for the next older page; False when there is none or one is on its way."""
        return self._go(self.listing.older() if self.listing is not None else None)

    def newer(self) -> bool:
        return self._go(self.listing.newer() if self.listing is not None else None)

    def newest(self) -> None:
        """Back to the newest page (live), whatever is on its way."""
        self.going = NEWEST

    def _go(self, page: Page | None) -> bool:
        if page is None or self.going is not None:
            return False
        self.going = page
        return True

    def watch_listing(self) -> None:
        self.going = None  # the screen shows only the page that was wanted
        self.fill()

    def watch_marks(self) -> None:
        self.fill()

    # -- rows -------------------------------------------------------------------------------

    def fitted_to(self) -> tuple[int, int, int, int]:
        messages = self.listing.page.messages if self.listing is not None else []
        return (
            self.size.width,
            len(str(messages[0].id)) if messages else 2,
            max((_cells(f"{m.aggregate_type}/{m.aggregate_id}") for m in messages), default=0),
            max((_cells(m.event_type) for m in messages), default=0),
        )

    def build_columns(self, table: RowTable) -> None:
        self._widths = list_columns(*self.fitted_to())
        for key, width in self._widths.items():
            table.add_column(LABELS.get(key, key), key=key, width=width)

    def add_rows(self, table: RowTable, now: datetime) -> list[str]:
        listing, widths = self.listing, self._widths
        messages = listing.page.messages if listing is not None else []
        for m in messages:
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
        self.set_class(listing is not None and not messages, "-empty")
        if listing is not None:
            match = "" if listing.filter.is_empty() else " match the filter"
            self.query_one("#dead-empty", Static).update(f"no dead messages{match}")
        return [str(m.id) for m in messages]

    def highlighted(self) -> DeadMessage | None:
        key = self.cursor_key()
        if self.listing is None or key is None or not key.isdigit():
            return None
        return next((m for m in self.listing.page.messages if m.id == int(key)), None)

    def advance(self) -> None:
        """The cursor to the next row (after marking one)."""
        table = self.table
        if table.cursor_row < table.row_count - 1:
            table.move_cursor(row=table.cursor_row + 1, animate=False)
