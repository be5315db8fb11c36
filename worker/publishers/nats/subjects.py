"""Subjects: the template a message's subject is rendered from, each value one valid token."""

from __future__ import annotations

import re

from outbox.models import Message
from outbox.worker.publishers.base import PermanentError
from outbox.worker.publishers.template import Template

DEFAULT_SUBJECT = "outbox.{aggregate_type}.{event_type}"
SUBJECT_CACHE_SIZE = 4096  # rendered subjects a publisher keeps; emptied when full
# A server reads `HPUB <subject> <reply> <header size> <total size>` as one control line of
# at most 4096 bytes (its default `max_control_line`), and closes the connection on a longer
# one. The reply subject (the client's inbox and a counter) and the sizes take under 100 of
# them: the rest is room for the subject.
MAX_CONTROL_LINE = 4096
MAX_SUBJECT_BYTES = MAX_CONTROL_LINE - 128

# Anything that cannot stand inside one subject token: whitespace and control characters
# break the protocol line, `.` separates tokens, `*` and `>` are wildcards.
_NOT_IN_TOKEN = re.compile(r"[\s\x00-\x1f\x7f.*>]")


def subject_token(value: str) -> str:
    """`value` as one valid subject token: forbidden characters become `_`, never empty."""
    return _NOT_IN_TOKEN.sub("_", value) or "_"


def render_subject(template: str | Template, message: Message) -> str:
    """The subject of a message; PermanentError when it is too long for a server to take."""
    if isinstance(template, str):
        template = Template(template, subject_token)
    subject = template.render(message)
    size = len(subject.encode())
    if size > MAX_SUBJECT_BYTES:
        raise PermanentError(
            f"subject {template.text!r} renders {size} bytes for this message, more than the "
            f"{MAX_SUBJECT_BYTES} a NATS server's control line leaves for a subject; not sent"
        )
    return subject


def subject_template(text: str) -> str:
    """Check a subject template: known placeholders only, and a valid subject around them."""
    sample = Template(text, subject_token).sample()
    if len(sample.encode()) > MAX_SUBJECT_BYTES:
        raise ValueError(f"longer than the {MAX_SUBJECT_BYTES} bytes a subject may take")
    for token in sample.split("."):
        if not token:
            raise ValueError(f"{text!r}: empty subject token (leading, trailing or double dot)")
        if token != subject_token(token):
            raise ValueError(f"{text!r}: no whitespace, control characters, * or > allowed")
    return text
