"""POSTs each message as JSON to one URL, with the outbox id as `Idempotency-Key`.

The key is the same on every retry of a message, so a receiver that honours it applies the
message once however many times it arrives. Responses are classified:

| response                                   | class                         |
|--------------------------------------------|-------------------------------|
| 2xx                                        | success                       |
| 408, 425, 429, 5xx, connection errors      | retryable (Retry-After honoured) |
| other 4xx, 1xx/3xx (redirects not followed)| permanent                     |

Timeouts are applied by the dispatch loop around every publish and are retryable.

What is read of a response is bounded (`MAX_RESPONSE_BYTES`): enough for an error excerpt; a
receiver that answers and keeps streaming costs the worker no more than that, and its
connection is closed instead of reused. A message whose event type cannot stand in a header
(a CR, LF or another control character in it) is permanent: it could never be sent. URLs in
any reason (user-info, query values) are redacted before they are logged or stored.
"""

from __future__ import annotations

import re
import urllib.parse
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from email.utils import parsedate_to_datetime
from typing import Any

import aiohttp
from yarl import URL

from outbox.models import Message
from outbox.redact import redact_text, redact_url
from outbox.worker.publishers.base import PermanentError, RetryableError
from outbox.worker.publishers.envelope import envelope
from outbox.worker.publishers.registry import Option, PublisherContext

RETRYABLE_STATUSES = frozenset({408, 425, 429})
_BODY_SNIPPET = 300
# Most bytes read of any response: a 2xx body read to its end keeps the connection reusable;
# anything longer is cut here and its connection closed.
MAX_RESPONSE_BYTES = 64 * 1024
# What may not stand in a header value: control characters other than tab (CR and LF would
# end the header and start another: header injection). In a header name, only RFC 9110
# token characters may.
_NOT_IN_HEADER_VALUE = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")
_HEADER_NAME = re.compile(r"^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$")
_MAX_RETRY_AFTER_SECONDS = 10**9  # ~31 years


def parse_retry_after(value: str | None, *, now: datetime | None = None) -> timedelta | None:
    """Retry-After as delay-seconds or an HTTP-date; None when absent or unreadable."""
    if not value:
        return None
    value = value.strip()
    if value.isascii() and value.isdigit():
        # An absurd hint must not overflow timedelta; the caller caps the delay anyway.
        seconds = int(value) if len(value) <= 12 else _MAX_RETRY_AFTER_SECONDS
        return timedelta(seconds=min(seconds, _MAX_RETRY_AFTER_SECONDS))
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max(when - (now or datetime.now(UTC)), timedelta(0))


def classify(
    status: int, retry_after: str | None, body: bytes, secrets: Sequence[str] = ()
) -> None:
    """Raise the failure class for a response status; return for success. The reason quotes
    the body's start, redacted, with `secrets` (the request's own header values, which a
    receiver may echo) masked."""
    if 200 <= status < 300:
        return
    snippet = body[:_BODY_SNIPPET].decode("utf-8", "replace").strip()
    reason = redact_text(f"HTTP {status}" + (f": {snippet}" if snippet else ""), secrets=secrets)
    if status in RETRYABLE_STATUSES or status >= 500:
        raise RetryableError(reason, retry_after=parse_retry_after(retry_after))
    raise PermanentError(reason)


def _url(text: str) -> str:
    try:
        parts = urllib.parse.urlsplit(text)
        parts.port  # noqa: B018 - raises for a port that is not a number in 0-65535
    except ValueError as exc:
        raise ValueError(f"{redact_url(text)!r} is not a valid URL ({exc})") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"{redact_url(text)!r} is not an http:// or https:// URL")
    # Accepted, these would fail every publish as "retryable" until each message is dead.
    if any(c.isspace() or not c.isprintable() for c in text):
        raise ValueError(f"{redact_url(text)!r} contains whitespace or control characters")
    return text


def _header(text: str) -> tuple[str, str]:
    """`Name: value`, refused here if it could not be sent: every request would fail."""
    name, sep, value = text.partition(":")
    name, value = name.strip(), value.strip()
    if not sep or not name:
        raise ValueError("expected 'Name: value'")
    if not _HEADER_NAME.match(name):
        raise ValueError(f"{name!r} is not a header name (letters, digits and !#$%&'*+-.^_`|~)")
    if _NOT_IN_HEADER_VALUE.search(value):  # the value is a secret: never echoed
        raise ValueError(f"the value of {name} holds a CR, LF or another control character")
    return name, value


def header_value(what: str, value: str) -> str:
    """A value from a message for a header, or PermanentError: it could never be sent."""
    if _NOT_IN_HEADER_VALUE.search(value):
        raise PermanentError(
            f"{what} {value!r} holds a CR, LF or another control character and cannot be sent "
            "in a header"
        )
    return value


class HttpPublisher:
    name = "http"
    options = (
        Option("--http-url", "URL the http publisher POSTs to", convert=_url, required=True),
        Option(
            "--http-header",
            "extra request header 'Name: value', e.g. Authorization; never logged",
            convert=_header,
            repeatable=True,
            secret=True,
        ),
    )

    @classmethod
    def create(cls, values: dict[str, Any], context: PublisherContext) -> HttpPublisher:
        return cls(
            values["http_url"],
            owner=context.owner,
            headers=dict(values.get("http_header") or ()),
            max_connections=context.concurrency,
        )

    def __init__(
        self,
        url: str,
        *,
        owner: str,
        headers: dict[str, str] | None = None,
        max_connections: int = 100,
    ) -> None:
        self.url = url
        # Health is the origin's: every path of one server shares its breaker.
        self.destination = str(URL(url).origin())
        self._owner = owner
        self._headers = headers or {}
        # Header values are secrets (tokens, API keys): masked in any reason that quotes them.
        self._secrets = tuple(self._headers.values())
        self._max_connections = max_connections
        self._session: aiohttp.ClientSession | None = None

    async def start(self) -> None:
        connector = aiohttp.TCPConnector(limit=self._max_connections)
        self._session = aiohttp.ClientSession(
            connector=connector,
            # The dispatch loop times every publish out (connecting included); aiohttp's own
            # default timer (5 minutes) would only add a timer per request that never fires.
            timeout=aiohttp.ClientTimeout(),
            headers={
                "Content-Type": "application/json",
                "User-Agent": "outbox-dispatcher",
                "Outbox-Worker": self._owner,
                **self._headers,
            },
        )

    async def publish(self, message: Message) -> None:
        assert self._session is not None, "start() first"
        headers = {
            "Idempotency-Key": str(message.id),
            "Outbox-Event-Type": header_value("event_type", message.event_type),
            "Outbox-Attempt": str(message.attempts),
        }
        try:
            async with self._session.post(
                self.url,
                data=envelope(message).encode(),
                headers=headers,
                allow_redirects=False,
            ) as response:
                body = await _bounded_body(response)
                classify(
                    response.status,
                    response.headers.get("Retry-After"),
                    body,
                    self._secrets,
                )
        except aiohttp.ClientError as exc:
            # Connection refused or reset, DNS failure, broken response: the receiver may or may
            # not have the message; the same Idempotency-Key makes the retry safe.
            reason = " ".join(f"{type(exc).__name__}: {exc}".split())  # one line, for last_error
            raise RetryableError(redact_text(reason, secrets=self._secrets)) from exc

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()


async def _bounded_body(response: aiohttp.ClientResponse) -> bytes:
    """At most MAX_RESPONSE_BYTES of the body; a longer one's connection is closed, not
    drained (a receiver may stream for ever)."""
    content = response.content
    first = await content.read(MAX_RESPONSE_BYTES)
    if content.at_eof():  # the usual short answer, whole in one read
        return first
    body = bytearray(first)
    while len(body) < MAX_RESPONSE_BYTES:
        chunk = await content.read(MAX_RESPONSE_BYTES - len(body))
        if not chunk:
            return bytes(body)
        body += chunk
    if not content.at_eof():
        response.close()
    return bytes(body)
