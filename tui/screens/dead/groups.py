"""The group view: the same dead rows counted by error group, and the lines the
requeue-everything dialog shows of them."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from datetime import datetime

from rich.text import Text
from textual.app import ComposeResult
from textual.reactive import var

from outbox.tui import format as fmt
from outbox.tui.screens.dead.listing import CELL_PADDING, SCROLLBAR
from outbox.tui.screens.dead.rows import RowsView
from outbox.tui.widgets import RowTable
from outbox.views.dead_letters import ErrorGroup
from outbox.views.filters import DeadFilter


def group_columns(width: int) -> dict[str, int]:
    columns = {"count": 7, "newest": 7}
    used = sum(columns.values()) + CELL_PADDING * 3 + SCROLLBAR
    return {"count": 7, "key": max(width - used, 20), "newest": 7}


KEY_LABEL = "error group (numbers, ids, quoted values as <placeholders>)"


class GroupView(RowsView):
    DEFAULT_CSS = """
    GroupView > RowTable { height: 1fr; }
    """
    STAYS_NEAR = False  # the groups are ranked: when the one highlighted goes, back to the top

    groups: var[tuple[ErrorGroup, ...] | None] = var(None)  # None: not read yet

    def compose(self) -> ComposeResult:
        yield RowTable(id="groups-table")

    def watch_groups(self) -> None:
        self.fill()

    def build_columns(self, table: RowTable) -> None:
        for key, width in group_columns(self.size.width).items():
            table.add_column(KEY_LABEL if key == "key" else key, key=key, width=width)

    def add_rows(self, table: RowTable, now: datetime) -> list[str]:
        if self.groups is None:
            return []
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
            return ["empty"]
        return [str(i) for i in range(len(self.groups))]

    def highlighted(self) -> ErrorGroup | None:
        key = self.cursor_key()
        if self.groups is None or key is None or not key.isdigit():
            return None
        index = int(key)
        return self.groups[index] if index < len(self.groups) else None


def with_group(f: DeadFilter, key: str) -> DeadFilter:
    return replace(f, error_group=key)


BREAKDOWN_GROUPS = 8


def breakdown(groups: Sequence[ErrorGroup]) -> list[str]:
    """The biggest error groups, one line each, for the requeue-everything dialog."""
    lines = ["By error group:"] + [
        f"{fmt.count(g.count):>9}  {fmt.one_line(g.key or '(no error)', 56)}"
        for g in groups[:BREAKDOWN_GROUPS]
    ]
    rest = groups[BREAKDOWN_GROUPS:]
    if rest:
        lines.append(f"{fmt.count(sum(g.count for g in rest)):>9}  in {len(rest)} more groups")
    return lines
