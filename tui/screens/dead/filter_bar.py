"""The filter line (`/`): type a filter, enter applies it, a filter that cannot be read is
said above the line."""

from __future__ import annotations

from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.message import Message
from textual.reactive import var
from textual.widgets import Input, Static

from outbox.plumbing.text import printable
from outbox.views.filters import DeadFilter, FilterError, parse_filter

PLACEHOLDER = 'type:X agg:Y error:text {"k": "v"} $.path > 1  (enter applies, esc)'


class FilterBar(Vertical):
    DEFAULT_CSS = """
    FilterBar { height: auto; display: none; }
    FilterBar.-open { display: block; }
    FilterBar > #filter { border: tall $accent; }
    FilterBar > #filter-error { height: auto; display: none; color: $error; padding: 0 1; }
    FilterBar.-error > #filter-error { display: block; }
    """

    filter: var[DeadFilter] = var(DeadFilter)  # in force: what the line starts from
    open: var[bool] = var(False, toggle_class="-open")
    problem: var[str | None] = var(None, toggle_class="-error")

    class Entered(Message):
        """A filter that reads; the screen decides whether it applies."""

        def __init__(self, new: DeadFilter) -> None:
            super().__init__()
            self.filter = new

    class Unreadable(Message):
        def __init__(self, problem: str) -> None:
            super().__init__()
            self.problem = problem

    def compose(self) -> ComposeResult:
        yield Static(id="filter-error")
        yield Input(placeholder=PLACEHOLDER, id="filter")

    def watch_open(self, is_open: bool) -> None:
        if is_open and self.is_mounted:
            box = self.query_one("#filter", Input)
            box.value = self.filter.describe()
            box.focus()

    def watch_problem(self, problem: str | None) -> None:
        if self.is_mounted:
            # The database's refusal quotes the path, pasted text may hold ESC: escaped.
            message = Text(f"filter: {printable(problem)}") if problem is not None else ""
            self.query_one("#filter-error", Static).update(message)

    @on(Input.Submitted, "#filter")
    def _submitted(self, event: Input.Submitted) -> None:
        event.stop()
        try:
            new = parse_filter(event.value)
        except FilterError as exc:
            self.post_message(self.Unreadable(str(exc)))
            return
        self.post_message(self.Entered(new))
