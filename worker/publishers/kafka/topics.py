"""The topic a message goes to: the template with Kafka's legal characters."""

from __future__ import annotations

import re

from outbox.models import Message
from outbox.worker.publishers.base import (
    PermanentError,
)
from outbox.worker.publishers.template import Template

MAX_TOPIC_LENGTH = 249
_ILLEGAL_TOPIC_CHARS = re.compile(r"[^a-zA-Z0-9._-]")
TOPIC_CACHE_SIZE = 4096  # rendered topics kept; emptied when full


def topic_name(value: str) -> str:
    """A value as it may stand in a topic name: characters Kafka does not allow become `_`."""
    return _ILLEGAL_TOPIC_CHARS.sub("_", value)


def topic_template(text: str) -> str:
    """Validate a topic template: known placeholders only, legal characters around them."""
    if not text:
        raise ValueError("empty topic template")
    template = Template(text, topic_name)
    if any(_ILLEGAL_TOPIC_CHARS.search(literal) for literal in template.literals):
        raise ValueError(
            f"{text!r} contains characters Kafka does not allow in topic names "
            "(allowed: a-z A-Z 0-9 . _ -)"
        )
    if len(template.sample()) > MAX_TOPIC_LENGTH:
        raise ValueError(f"longer than the {MAX_TOPIC_LENGTH} characters of a Kafka topic name")
    return text


def render_topic(template: str | Template, message: Message) -> str:
    """The topic for a message: placeholders filled with sanitized values.

    Characters Kafka does not allow become `_`; a name that is still not legal is permanent,
    and so is one longer than 249 characters: it is never cut, since a cut name can be
    another topic (two names that differ past the cut would share one).
    """
    if isinstance(template, str):
        template = Template(template, topic_name)
    topic = template.render(message)
    if len(topic) > MAX_TOPIC_LENGTH:
        raise PermanentError(
            f"topic template {template.text!r} renders {len(topic)} characters for this message, "
            f"more than the {MAX_TOPIC_LENGTH} of a Kafka topic name; not sent"
        )
    if topic in ("", ".", ".."):
        raise PermanentError(
            f"topic template {template.text!r} renders {topic!r}, not a legal topic"
        )
    return topic
