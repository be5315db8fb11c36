"""The confirmation every action goes through: it names the exact number of rows that
will change before anything happens. Cancel has the focus; `y` confirms."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Static

from outbox.repair import Action
from outbox.tui.format import count

EXPLAIN = {
    "requeue": "Back to pending, available now, attempts reset to 0.",
    "skip": "Marked done on purpose: never delivered.",
}


class ConfirmScreen(ModalScreen[bool]):
    DEFAULT_CSS = """
    ConfirmScreen { align: center middle; }
    ConfirmScreen > Vertical {
        width: 72; max-width: 95%; height: auto; max-height: 90%;
        border: thick $warning; background: $panel; padding: 1 2;
    }
    ConfirmScreen #question { text-style: bold; margin-bottom: 1; }
    ConfirmScreen .note { color: $text-muted; }
    ConfirmScreen Horizontal { height: auto; margin-top: 1; align-horizontal: right; }
    ConfirmScreen Button { margin-left: 2; }
    """
    BINDINGS = [
        Binding("y", "confirm", "confirm"),
        Binding("n,escape", "cancel", "cancel"),
    ]

    def __init__(self, action: Action, rows: int, what: str, notes: list[str]) -> None:
        super().__init__()
        self.action = action
        self.rows = rows
        self.what = what
        self.notes = notes

    @property
    def question(self) -> str:
        noun = "dead message" if self.rows == 1 else "dead messages"
        return f"{self.action.capitalize()} {count(self.rows)} {noun}?"

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Static(self.question, id="question")
            # Text, not markup: `what` and the notes carry the producer's names and ids.
            yield Static(Text(self.what), id="what")
            yield Static(EXPLAIN[self.action], classes="note")
            for note in self.notes:
                yield Static(Text(note), classes="note")
            yield Static(
                "Only rows still dead exactly as shown change; any that changed meanwhile "
                "are left alone and counted. The action is recorded with your name.",
                classes="note",
            )
            with Horizontal():
                yield Button(
                    f"{self.action.capitalize()} {count(self.rows)} (y)",
                    variant="error" if self.action == "skip" else "warning",
                    id="confirm",
                )
                yield Button("Cancel (n)", id="cancel")

    def on_mount(self) -> None:
        self.query_one("#cancel", Button).focus()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        self.dismiss(event.button.id == "confirm")

    def action_confirm(self) -> None:
        self.dismiss(True)

    def action_cancel(self) -> None:
        self.dismiss(False)
