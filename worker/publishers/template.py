"""The placeholder language of every name a publisher renders per message: an HTTP URL's
path and query, a NATS subject, a Kafka topic.

A template holds `{event_type}`, `{aggregate_type}` and `{aggregate_id}`, written bare (no
conversion, no format spec); anything else in braces is refused at start. Each transport
escapes a value its own way (percent-encoded whole, one subject token, legal topic
characters) so that no value can change the template's shape, and checks what the rendering
must be on top (a URL's host, a subject's tokens, a topic's length).
"""

from __future__ import annotations

import string
from collections.abc import Callable
from typing import Generic, TypeVar

from outbox.models import Message

T = TypeVar("T")

PLACEHOLDERS = ("event_type", "aggregate_type", "aggregate_id")


class Template:
    """A checked template and its transport's escape. `shown` is how errors quote the text
    (a URL's credentials masked)."""

    def __init__(
        self, text: str, escape: Callable[[str], str], *, shown: str | None = None
    ) -> None:
        self.text = text
        self.escape = escape
        quoted = shown if shown is not None else repr(text)
        try:
            parts = list(string.Formatter().parse(text))
        except ValueError as exc:
            raise ValueError(f"{quoted} is not a template: {exc}") from None
        self.literals = [literal for literal, _, _, _ in parts]
        self.names: list[str] = []
        known = ", ".join(f"{{{p}}}" for p in PLACEHOLDERS)
        for _, name, spec, conversion in parts:
            if name is None:
                continue
            if name not in PLACEHOLDERS:
                raise ValueError(f"{quoted}: unknown placeholder {{{name}}} (use {known})")
            if spec or conversion:
                written = f"{'!' + conversion if conversion else ''}{':' + spec if spec else ''}"
                raise ValueError(
                    f"{quoted}: unknown placeholder {{{name}}} with {written}: write "
                    f"{{{name}}} without a conversion or format spec"
                )
            self.names.append(name)
        self.by_id = "aggregate_id" in self.names  # renderings differ per aggregate

    def sample(self, value: str = "x") -> str:
        """The template with `value` for every placeholder: a rendering of its shape."""
        return self.text.format(**dict.fromkeys(PLACEHOLDERS, value))

    def render(self, message: Message) -> str:
        """The template with the message's values, each escaped."""
        escape = self.escape
        return self.text.format(
            event_type=escape(message.event_type),
            aggregate_type=escape(message.aggregate_type),
            aggregate_id=escape(message.aggregate_id),
        )


class Renderings(Generic[T]):
    """What a publisher makes of a template per message (a URL, a subject, a topic and its
    headers), kept per aggregate type, event type and, when the template uses it, aggregate
    id: the messages of a batch mostly share theirs. A rendering that raises is not kept; at
    `size` kept, the cache starts over. `kept` is public for a hot loop that reads it itself."""

    def __init__(self, template: Template, make: Callable[[Message], T], size: int) -> None:
        self.by_id = template.by_id
        self.kept: dict[tuple[str, str, str], T] = {}
        self._make = make
        self._size = size

    def key(self, message: Message) -> tuple[str, str, str]:
        return (
            message.aggregate_type,
            message.event_type,
            message.aggregate_id if self.by_id else "",
        )

    def of(self, message: Message) -> T:
        key = self.key(message)
        found = self.kept.get(key)
        if found is None:
            found = self._make(message)  # may raise: nothing is kept then
            if len(self.kept) >= self._size:
                self.kept.clear()
            self.kept[key] = found
        return found
