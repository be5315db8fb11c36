"""`?`: every key binding active on the screen below, and the filter syntax."""

from __future__ import annotations

from rich.table import Table as RichTable
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import ModalScreen, Screen
from textual.widgets import DataTable, Static

FILTER_SYNTAX = [
    ("type:OrderPaid", "event type (exact)"),
    ("agg:order-42", "aggregate id (exact); aggtype:order for the aggregate type"),
    ("error:timeout", "the error text contains it (any case); words without a key too"),
    ('group:"..."', "one error group (exact), as g shows them"),
    ('{"customer": "c-1"}', "the payload contains this JSON"),
    (
        "$.amount > 100",
        "an SQL/JSON path on the payload: a predicate, or a path that must "
        "exist; takes the rest of the line",
    ),
    ('error:"two words"', "quote values with spaces; terms combine with AND"),
]


def _keys_table() -> RichTable:
    table = RichTable.grid(padding=(0, 2))
    table.add_column(style="bold", no_wrap=True, min_width=6)
    table.add_column()
    return table


# Bindings that exist for the read-only fallback, not for people to look up.
_HIDDEN = {"refused"}


def _own_bindings(node: object) -> set[tuple[str, str]]:
    """(key, action) of the bindings this project declares on the node's classes: the
    framework's own (focus next, copy, its quit key) are not this app's keys to explain."""
    own: set[tuple[str, str]] = set()
    for cls in type(node).__mro__:
        if not cls.__module__.startswith("outbox."):
            continue
        for binding in cls.__dict__.get("BINDINGS", []):
            if isinstance(binding, Binding):
                own.update((key.strip(), binding.action) for key in binding.key.split(","))
    return own


class HelpScreen(ModalScreen[None]):
    DEFAULT_CSS = """
    HelpScreen { align: center middle; }
    HelpScreen > VerticalScroll {
        width: 92; max-width: 98%; height: auto; max-height: 95%;
        border: thick $primary; background: $panel; padding: 0 1;
    }
    HelpScreen .heading { text-style: bold; color: $accent; margin-top: 1; }
    HelpScreen Horizontal { height: auto; }
    HelpScreen Horizontal > Vertical { width: 1fr; height: auto; }
    """
    BINDINGS = [Binding("escape,question_mark,q", "close", "close")]

    def __init__(self, below: Screen[object]) -> None:
        super().__init__()
        self.below = below

    def compose(self) -> ComposeResult:
        screen_keys, app_keys = _keys_table(), _keys_table()
        # One line per action, all its keys together (q and ctrl+q both quit).
        entries: dict[tuple[str, int], tuple[list[str], Binding, RichTable]] = {}
        own = _own_bindings(self.app) | _own_bindings(self.below)
        for key, active in self.below.active_bindings.items():
            binding = active.binding
            if binding.action in _HIDDEN or (key, binding.action) not in own:
                continue
            if active.node is self.app:
                target = app_keys
            elif active.node is self.below:
                target = screen_keys
            else:
                continue  # the focused table's cursor keys: summarised below
            display = self.app.get_key_display(Binding(key, binding.action))
            entry = entries.setdefault((binding.action, id(active.node)), ([], binding, target))
            if display not in entry[0]:
                entry[0].append(display)
        for keys, binding, target in entries.values():
            description = binding.description or binding.action.replace("_", " ")
            target.add_row(", ".join(keys), description)
        if self.below.query(DataTable):
            app_keys.add_row("↑ ↓ pgup pgdn", "move the cursor (home, end: first, last row)")
        if hasattr(self.below, "action_open"):
            app_keys.add_row("⏎", "open the highlighted row")
        with VerticalScroll():
            with Horizontal():
                with Vertical():
                    yield Static(Text("This screen", style="bold"), classes="heading")
                    yield Static(screen_keys)
                with Vertical():
                    yield Static(Text("Everywhere", style="bold"), classes="heading")
                    yield Static(app_keys)
            if getattr(self.below, "SHOWS_FILTER_HELP", False):
                yield Static(Text("Filter (/)", style="bold"), classes="heading")
                syntax = _keys_table()
                for example, meaning in FILTER_SYNTAX:
                    syntax.add_row(example, meaning)
                yield Static(syntax)
            yield Static(Text("esc closes", style="dim"), classes="heading")

    def action_close(self) -> None:
        self.dismiss(None)
