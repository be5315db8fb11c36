"""The confirmation every action goes through: it names the exact number of rows that
will change before anything happens. Cancel has the focus; `y` confirms, or, for an action
on every dead message, typing the count does. A destination's pause is confirmed by typing
its reason, its resume by `y`."""

from __future__ import annotations

from typing import Literal

from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Static

from outbox.operations.pausing import Verb, check_reason
from outbox.operations.repair import Action
from outbox.tui.format import count

EXPLAIN = {
    "requeue": "Back to pending, available now, attempts reset to 0.",
    "skip": "Marked done on purpose: never delivered.",
    "replay": "Sent again under their own ids, as a numbered replay (the Outbox-Replay header, "
    "the body's replay field): back to pending, available now, attempts reset to 0.",
}
# What is left alone: a dead row that changed since it was shown; a replay stops at the
# messages the preview counted.
LEFT_ALONE = {
    "requeue": "Only rows still dead exactly as shown change; any that changed meanwhile "
    "are left alone and counted. The action is recorded with your name.",
    "replay": "At most the messages counted here, none newer than the last shown; each batch "
    "is recorded in the audit log with your name.",
}
LEFT_ALONE["skip"] = LEFT_ALONE["requeue"]


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

    def __init__(
        self,
        action: Action | Literal["replay"],
        rows: int,
        what: str,
        notes: list[str],
        *,
        typed: bool = False,
    ) -> None:
        super().__init__()
        self.action = action
        self.rows = rows
        self.what = what
        self.notes = notes
        self.typed = typed

    @property
    def question(self) -> str:
        noun = "message" if self.action == "replay" else "dead message"
        noun += "" if self.rows == 1 else "s"
        return f"{self.action.capitalize()} {count(self.rows)} {noun}?"

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Static(self.question, id="question")
            # Text, not markup: `what` and the notes carry the producer's names and ids.
            yield Static(Text(self.what), id="what")
            yield Static(EXPLAIN[self.action], classes="note")
            for note in self.notes:
                yield Static(Text(note), classes="note")
            yield Static(LEFT_ALONE[self.action], classes="note")
            if self.typed:
                yield Static(
                    Text(f"Type {self.rows} and press enter to {self.action} them all."),
                    id="type-prompt",
                )
                yield Input(placeholder=str(self.rows), id="typed-count")
            with Horizontal():
                yield Button(
                    f"{self.action.capitalize()} {count(self.rows)}"
                    + ("" if self.typed else " (y)"),
                    variant="error" if self.action == "skip" else "warning",
                    id="confirm",
                    disabled=self.typed,
                )
                yield Button("Cancel (n)", id="cancel")

    def on_mount(self) -> None:
        self.query_one("#typed-count" if self.typed else "#cancel").focus()

    def _count_typed(self) -> bool:
        if not self.typed:
            return True
        typed = self.query_one("#typed-count", Input).value
        return typed.replace(",", "").replace(" ", "") == str(self.rows)

    @on(Input.Changed, "#typed-count")
    def _typing(self) -> None:
        self.query_one("#confirm", Button).disabled = not self._count_typed()

    @on(Input.Submitted, "#typed-count")
    def _typed(self) -> None:
        if self._count_typed():
            self.dismiss(True)
        else:
            self.query_one("#type-prompt", Static).update(
                Text(f"That is not {self.rows}: type exactly {self.rows}, or esc to cancel.")
            )

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        return self._count_typed() if action == "confirm" else True

    def on_button_pressed(self, event: Button.Pressed) -> None:
        self.dismiss(event.button.id == "confirm" and self._count_typed())

    def action_confirm(self) -> None:
        if self._count_typed():
            self.dismiss(True)

    def action_cancel(self) -> None:
        self.dismiss(False)


DESTINATION_EXPLAIN = {
    "pause": "Nothing is sent to it until someone resumes it, by every worker: its messages "
    "wait in pending and spend no attempt.",
    "resume": "Its messages are sent again at once, the backlog that piled up included (within "
    "the rate limit, if one is set). An open breaker closes for every worker without waiting "
    "for a probe; if the destination still fails, it opens again.",
}


class DestinationConfirmScreen(ModalScreen[str | None]):
    """Pause or resume one destination: the dialog says what it is now and what the action
    does. A pause is confirmed by typing its reason (required, recorded with your name) and
    enter; a resume by `y`. Dismissed with the reason (a resume: ""), None when cancelled."""

    DEFAULT_CSS = """
    DestinationConfirmScreen { align: center middle; }
    DestinationConfirmScreen > Vertical {
        width: 76; max-width: 95%; height: auto; max-height: 90%;
        border: thick $warning; background: $panel; padding: 1 2;
    }
    DestinationConfirmScreen #question { text-style: bold; margin-bottom: 1; }
    DestinationConfirmScreen .note { color: $text-muted; }
    DestinationConfirmScreen Horizontal { height: auto; margin-top: 1; align-horizontal: right; }
    DestinationConfirmScreen Button { margin-left: 2; }
    """
    BINDINGS = [
        Binding("y", "confirm", "confirm", show=False),
        Binding("n", "cancel", "cancel", show=False),
        Binding("escape", "cancel_any", "cancel"),
    ]

    def __init__(self, action: Verb, destination: str, now: str) -> None:
        """`now`: what the destination is as shown (state, since, who and why)."""
        super().__init__()
        self.action = action
        self.destination = destination
        self.now = now

    @property
    def pausing(self) -> bool:
        return self.action == "pause"

    def compose(self) -> ComposeResult:
        with Vertical():
            # Text, not markup: a destination's name or a reason may hold brackets.
            yield Static(Text(f"{self.action.capitalize()} {self.destination}?"), id="question")
            yield Static(Text(self.now), id="now")
            yield Static(DESTINATION_EXPLAIN[self.action], classes="note")
            yield Static("The action is recorded with your name.", classes="note")
            if self.pausing:
                yield Static(Text("Why? Type the reason and press enter to pause."), id="prompt")
                yield Input(placeholder="reason (required)", id="reason")
            with Horizontal():
                yield Button(
                    "Pause (enter)" if self.pausing else "Resume (y)",
                    variant="warning",
                    id="confirm",
                    disabled=self.pausing,
                )
                yield Button("Cancel (esc)" if self.pausing else "Cancel (n)", id="cancel")

    def on_mount(self) -> None:
        self.query_one("#reason" if self.pausing else "#cancel").focus()

    def _reason(self) -> str | None:
        """What confirming returns: the typed reason (None while blank), or "" (a resume)."""
        if not self.pausing:
            return ""
        reason = self.query_one("#reason", Input).value.strip()
        return reason or None

    @on(Input.Changed, "#reason")
    def _typing(self) -> None:
        self.query_one("#confirm", Button).disabled = self._reason() is None

    @on(Input.Submitted, "#reason")
    def _submitted(self) -> None:
        reason = self._reason()
        try:
            # The CLI's rules (`outbox pause --reason`): a pasted tab or escape sequence would
            # be stored and shown under the destination.
            check_reason(reason or "")
        except ValueError as exc:
            self.query_one("#prompt", Static).update(
                Text(f"Not paused: {exc}. Edit it, or esc to cancel.")
            )
        else:
            self.dismiss(reason)

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        # `y` and `n` are letters of a reason while it is typed.
        return not self.pausing if action in ("confirm", "cancel") else True

    def on_button_pressed(self, event: Button.Pressed) -> None:
        if event.button.id == "confirm":
            self._submitted() if self.pausing else self.dismiss("")
        else:
            self.dismiss(None)

    def action_confirm(self) -> None:
        self.dismiss("")

    def action_cancel(self) -> None:
        self.dismiss(None)

    def action_cancel_any(self) -> None:
        self.dismiss(None)
