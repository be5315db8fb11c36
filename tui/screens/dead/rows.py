"""What both views of the dead letters are: a table of rows that keeps its columns fitted to
the width and its cursor on the same row across refreshes."""

from __future__ import annotations

from collections.abc import Callable, Hashable
from datetime import datetime
from typing import ClassVar

from textual.containers import Vertical

from outbox.tui.widgets import RowTable

Clock = Callable[[], datetime]


class RowsView(Vertical):
    """A `RowTable` (composed by the subclass) filled from the view's data by `fill`."""

    # Where the cursor goes when its row is gone: the same place (else the first row).
    STAYS_NEAR: ClassVar[bool] = True

    def __init__(self, clock: Clock, *, id: str) -> None:
        super().__init__(id=id)
        self.clock = clock  # ages are drawn against it (snapshots freeze it)
        self._fitted: Hashable = None  # what the columns were built for

    @property
    def table(self) -> RowTable:
        return self.query_one(RowTable)

    def fitted_to(self) -> Hashable:
        """What the columns depend on; they are built again when it changes."""
        return self.size.width

    def build_columns(self, table: RowTable) -> None:
        raise NotImplementedError

    def add_rows(self, table: RowTable, now: datetime) -> list[str]:
        """Add the rows; their keys, in order."""
        raise NotImplementedError

    def fill(self) -> None:
        if not self.is_mounted:
            return  # the first binding arrives before the table is there; mounting fills
        table = self.table
        if self._fitted != self.fitted_to():
            self._fitted = self.fitted_to()
            table.clear(columns=True)
            self.build_columns(table)
        current, row = self.cursor_key(), table.cursor_row
        table.clear()
        keys = self.add_rows(table, self.clock())
        if current in keys:
            table.move_cursor(row=keys.index(current), animate=False)
        elif keys and self.STAYS_NEAR:
            table.move_cursor(row=min(row, len(keys) - 1), animate=False)

    def on_mount(self) -> None:
        self.fill()

    def on_resize(self) -> None:
        if self._fitted != self.fitted_to():
            self.fill()

    def cursor_key(self) -> str | None:
        """The highlighted row's key."""
        table = self.table
        if table.row_count == 0:
            return None
        try:
            return table.coordinate_to_cell_key(table.cursor_coordinate).row_key.value
        except Exception:  # no valid cursor in an emptied table
            return None
