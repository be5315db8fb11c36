"""What a message looks like on the wire: the project's envelope, or a CloudEvent.

`--format` chooses, for the HTTP, NATS and Kafka publishers alike:

| format                   | body                                  | attributes                  |
|--------------------------|---------------------------------------|-----------------------------|
| `envelope` (default)     | the JSON envelope (envelope.py)       | the project's headers       |
| `cloudevents-binary`     | the payload verbatim                  | one header per attribute    |
| `cloudevents-structured` | a JSON CloudEvent, the payload `data` | in the body                 |

Each CloudEvent has `specversion` 1.0, `id` = the outbox id, `source` = `--cloudevents-source`
(default `/outbox/<table>`), `type` = the event type, `subject` = the aggregate id (left out
when empty: the spec wants it non-empty when present), `time` = the row's `created_at`,
`datacontenttype` `application/json`, and two extension attributes: `aggregatetype` and
`attempt` (an integer). The payload is spliced in as PostgreSQL rendered it, never decoded.

The bindings, per the CloudEvents protocol binding specs:

- HTTP binary: `ce-<name>` headers, values percent-encoded (space, `"`, `%` and anything
  outside printable ASCII); `Content-Type` is the `datacontenttype`.
- NATS binary: the same `ce-<name>` headers, `ce-datacontenttype` included (the NATS binding
  maps every attribute to a header, and structured mode is told by its `Content-Type`).
- Kafka binary: `ce_<name>` headers, UTF-8 values (no percent-encoding); `content-type` is
  the `datacontenttype`.
- Structured, every transport: the JSON event format, with the content type
  `application/cloudevents+json; charset=utf-8` (HTTP `Content-Type`, NATS `Content-Type`,
  Kafka `content-type`).

The project's own headers (the id, the event type, the attempt) and the Kafka key stay as
they are in every format. The names and strings below are the specs'; they are not taken
from the `cloudevents` SDK, which the worker does not need: the tests parse what is sent with
it. Written out by hand like the envelope: a message is encoded once per attempt, on the
publishing path.
"""

from __future__ import annotations

import re
import urllib.parse
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from json.encoder import encode_basestring
from typing import Generic, TypeVar

from outbox.models import Message
from outbox.worker.publishers.base import PermanentError
from outbox.worker.publishers.envelope import envelope, timestamp

ENVELOPE = "envelope"
BINARY = "cloudevents-binary"
STRUCTURED = "cloudevents-structured"
FORMATS = (ENVELOPE, BINARY, STRUCTURED)
DEFAULT_FORMAT = ENVELOPE

SPECVERSION = "1.0"
DATACONTENTTYPE = "application/json"
STRUCTURED_CONTENT_TYPE = "application/cloudevents+json; charset=utf-8"
# Extension attribute names: lower-case letters and digits only (the spec's rule).
AGGREGATE_TYPE_ATTRIBUTE = "aggregatetype"
ATTEMPT_ATTRIBUTE = "attempt"
# A replay's number (outbox.operations.replay), an integer extension attribute on replays only.
REPLAY_ATTRIBUTE = "replay"
HTTP_PREFIX = "ce-"  # HTTP and NATS headers
KAFKA_PREFIX = "ce_"

# What a CloudEvents String may not hold: U+0000-U+001F and U+007F-U+009F (and surrogates,
# which text from PostgreSQL never has).
_NOT_IN_STRING = re.compile(r"[\x00-\x1f\x7f-\x9f]")
# The characters an HTTP or NATS header value keeps as they are: printable ASCII but space,
# `"` and `%` (the bindings' rule); anything else is percent-encoded, as UTF-8.
_KEPT = "".join(c for c in map(chr, range(0x21, 0x7F)) if c not in ' "%')
_TO_ENCODE = re.compile(r"[^\x21\x23\x24\x26-\x7e]")
# What a URI (RFC 3986: printable ASCII, no space; anything else percent-encoded) may not
# hold, as an explicit class: the CRD's patterns for `cloudEventsSource` and the HTTP URL
# spell out the same range, since a Go (RE2) API server's `\s` is ASCII-only where Python's is
# Unicode (NBSP, U+0085, U+2028): both refuse exactly the same characters.
NOT_IN_URI = re.compile(r"[^\x21-\x7e]")
# The source travels with every message: a bound, the CRD's maxLength too (a test compares).
MAX_SOURCE_LENGTH = 1024


def wire_format(text: str) -> str:
    """`--format`: one of FORMATS."""
    if text not in FORMATS:
        raise ValueError(f"{text!r} is not one of {', '.join(FORMATS)}")
    return text


def cloudevents_source(text: str) -> str:
    """`--cloudevents-source`: a URI-reference, e.g. `/outbox/orders` or `urn:example:orders`."""
    if not text or NOT_IN_URI.search(text):
        raise ValueError(
            f"{text!r} is not a URI-reference (not empty, no whitespace or control characters, "
            "printable ASCII only: percent-encode the rest)"
        )
    if len(text) > MAX_SOURCE_LENGTH:
        raise ValueError(f"longer than {MAX_SOURCE_LENGTH} characters ({len(text)})")
    return text


def default_source(table: str) -> str:
    """`/outbox/<table>`, the table's name percent-encoded as one path segment."""
    return "/outbox/" + urllib.parse.quote(table, safe=".")


def percent_encoded(value: str) -> str:
    """An attribute's string as an HTTP or NATS header value (percent-encoded as needed)."""
    if _TO_ENCODE.search(value) is None:
        return value
    return urllib.parse.quote(value, safe=_KEPT)


class CloudEvents:
    """A message's attributes as a CloudEvent from `source`, in each binding's shape."""

    def __init__(self, source: str) -> None:
        self.source = cloudevents_source(source)
        self._source_json = encode_basestring(source)
        self._source_header = percent_encoded(source)
        self._source_bytes = source.encode()

    @staticmethod
    def check(message: Message) -> None:
        """PermanentError if the message cannot be a CloudEvent: its strings are the
        attributes, which may not be empty (`type`) or hold control characters."""
        if not message.event_type:
            raise PermanentError("event_type is empty: a CloudEvent needs a type")
        for what, value in (
            ("event_type", message.event_type),
            ("aggregate_type", message.aggregate_type),
            ("aggregate_id", message.aggregate_id),
        ):
            if _NOT_IN_STRING.search(value):
                raise PermanentError(
                    f"{what} {value[:64]!r} holds a control character, which a CloudEvents "
                    "attribute may not"
                )

    def structured(self, message: Message) -> str:
        """The JSON event format: attributes and `data` (the payload verbatim)."""
        self.check(message)
        subject = (
            f'"subject":{encode_basestring(message.aggregate_id)},' if message.aggregate_id else ""
        )
        return (
            f'{{"specversion":"{SPECVERSION}","id":"{message.id:d}",'
            f'"source":{self._source_json},"type":{encode_basestring(message.event_type)},'
            f'{subject}"time":"{timestamp(message.created_at)}",'
            f'"datacontenttype":"{DATACONTENTTYPE}",'
            f'"{AGGREGATE_TYPE_ATTRIBUTE}":{encode_basestring(message.aggregate_type)},'
            f'"{ATTEMPT_ATTRIBUTE}":{message.attempts:d},{_replay_member(message)}'
            f'"data":{message.payload_json}}}'
        )

    def _binary(self, message: Message) -> dict[str, str]:
        """`ce-` headers (HTTP and NATS): every attribute but `datacontenttype`."""
        self.check(message)
        headers = {
            "ce-specversion": SPECVERSION,
            "ce-id": str(message.id),
            "ce-source": self._source_header,
            "ce-type": percent_encoded(message.event_type),
            "ce-time": timestamp(message.created_at),
            "ce-" + AGGREGATE_TYPE_ATTRIBUTE: percent_encoded(message.aggregate_type),
            "ce-" + ATTEMPT_ATTRIBUTE: str(message.attempts),
        }
        if message.aggregate_id:
            headers["ce-subject"] = percent_encoded(message.aggregate_id)
        if message.replay is not None:
            headers["ce-" + REPLAY_ATTRIBUTE] = str(message.replay)
        return headers

    def http_binary(self, message: Message) -> dict[str, str]:
        """HTTP binary mode's headers; `Content-Type` is the `datacontenttype`."""
        headers = self._binary(message)
        headers["Content-Type"] = DATACONTENTTYPE
        return headers

    def nats_binary(self, message: Message) -> dict[str, str]:
        """NATS binary mode's headers: every attribute a `ce-` header."""
        headers = self._binary(message)
        headers["ce-datacontenttype"] = DATACONTENTTYPE
        return headers

    def kafka_binary(self, message: Message) -> list[tuple[str, bytes]]:
        """Kafka binary mode's headers: `ce_` names, UTF-8 values; `content-type`."""
        self.check(message)
        headers = [
            ("ce_specversion", b"1.0"),
            ("ce_id", str(message.id).encode()),
            ("ce_source", self._source_bytes),
            ("ce_type", message.event_type.encode()),
            ("ce_time", timestamp(message.created_at).encode()),
            ("ce_" + AGGREGATE_TYPE_ATTRIBUTE, message.aggregate_type.encode()),
            ("ce_" + ATTEMPT_ATTRIBUTE, str(message.attempts).encode()),
            ("content-type", DATACONTENTTYPE.encode()),
        ]
        if message.aggregate_id:
            headers.append(("ce_subject", message.aggregate_id.encode()))
        if message.replay is not None:
            headers.append(("ce_" + REPLAY_ATTRIBUTE, str(message.replay).encode()))
        return headers


def _replay_member(message: Message) -> str:
    """The structured event's `replay` member, on a replay only (empty otherwise)."""
    return "" if message.replay is None else f'"{REPLAY_ATTRIBUTE}":{message.replay:d},'


V = TypeVar("V", str, bytes)


@dataclass(frozen=True)
class Binding(Generic[V]):
    """How a transport carries a CloudEvent: binary mode's headers, and structured mode's
    content-type header."""

    binary: Callable[[CloudEvents, Message], Iterable[tuple[str, V]]]
    structured: tuple[str, V]


HTTP = Binding[str](
    lambda events, message: events.http_binary(message).items(),
    ("Content-Type", STRUCTURED_CONTENT_TYPE),
)
NATS = Binding[str](
    lambda events, message: events.nats_binary(message).items(),
    ("Content-Type", STRUCTURED_CONTENT_TYPE),
)
KAFKA = Binding[bytes](CloudEvents.kafka_binary, ("content-type", STRUCTURED_CONTENT_TYPE.encode()))


def encode(
    message: Message, wire_format: str, events: CloudEvents, binding: Binding[V]
) -> tuple[bytes, Iterable[tuple[str, V]]]:
    """A message's body in `wire_format`, and the headers that format adds on `binding`
    (PermanentError if it cannot be a CloudEvent). The one place every publisher encodes a
    message that is not a plain envelope; the plain envelope's path does not come here."""
    if wire_format == BINARY:
        return message.payload_json.encode(), binding.binary(events, message)
    if wire_format == STRUCTURED:
        return events.structured(message).encode(), (binding.structured,)
    return envelope(message).encode(), ()
