"""The header line of the dead letters: how many, what the filter leaves, which page or how
many groups, whether it is stale, and how many rows are marked."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from rich.text import Text
from textual.reactive import reactive
from textual.widget import Widget

from outbox.tui import format as fmt
from outbox.tui.screens.dead.listing import Listing
from outbox.tui.screens.dead.marks import Marks
from outbox.views.dead_letters import ErrorGroup
from outbox.views.filters import DeadFilter

View = Literal["list", "groups"]


@dataclass(frozen=True)
class Counts:
    """Exact counts, read in the same poll as the rows shown."""

    matching: int  # under the filter
    dead: int  # all dead messages


class DeadSummary(Widget):
    DEFAULT_CSS = """
    DeadSummary { height: 1; padding: 0 1; background: $boost; }
    """

    filter: reactive[DeadFilter] = reactive(DeadFilter)
    view: reactive[View] = reactive[View]("list")
    counts: reactive[Counts | None] = reactive(None)
    listing: reactive[Listing | None] = reactive(None)
    groups: reactive[tuple[ErrorGroup, ...] | None] = reactive(None)
    staleness: reactive[str] = reactive("")  # "stale since …", or "" while fresh
    marks: reactive[Marks] = reactive(Marks)

    def render(self) -> Text:
        counts, listing = self.counts, self.listing
        text = Text()
        text.append("dead letters ", "bold")
        if counts is not None:
            text.append(fmt.count(counts.dead), "bold red" if counts.dead else "bold")
        if not self.filter.is_empty():
            text.append("  filter ", "dim")
            text.append(fmt.one_line(self.filter.describe(), 40), "bold cyan")
            if counts is not None:
                text.append(f" → {fmt.count(counts.matching)}", "bold")
        if self.view == "groups":
            text.append(f"  {len(self.groups or ())} error groups", "dim")
        elif listing is not None and listing.page.messages:
            first, last = listing.span
            text.append(f"  page {listing.number} ({first}-{last})", "dim")
            if not self.staleness and listing.before is None:
                text.append(" live", "dim")
        if self.staleness:
            text.append(f"  {self.staleness}", "bold yellow")
        if self.marks:
            text.append(f"  {len(self.marks)} marked", "bold yellow")
        return text
