"""Dead letters: a keyset-paged list (newest first) or the same rows grouped by error, a
k9s-style filter line, marks, and the requeue/skip actions.

One widget per concern, each drawing what it is bound to: `DeadList` (a page of rows, its
paging and the marks column), `GroupView` (the error groups), `FilterBar` (the filter line)
and `DeadSummary` (the header). `DeadScreen` keeps what they share in reactives and binds it
down to them (`data_bind`); they report up with messages. The screen fetches, switches the
views (`ContentSwitcher`) and runs the actions.
"""

from outbox.tui.screens.dead.screen import DeadScreen

__all__ = ["DeadScreen"]
