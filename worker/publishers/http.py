"""POSTs each message as JSON to one URL, with the outbox id as `Idempotency-Key`.

The body and the attribute headers follow `--format` (formats.py: the envelope, or a
CloudEvent in binary or structured mode); the row's own headers follow the project's
(headers.py); `--http-signing-secret` signs each request the Standard Webhooks way
(signing.py); the URL may route by `{event_type}`, `{aggregate_type}` and `{aggregate_id}`
(routes.py).

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

import logging
import re
import urllib.parse
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from email.utils import parsedate_to_datetime
from typing import Any

import aiohttp
from yarl import URL

from outbox.models import REPLAY_HEADER, Message
from outbox.plumbing.errors import SettingError
from outbox.plumbing.redact import redact_text, refused_url
from outbox.plumbing.text import printable
from outbox.publisher_options import Carried, Field, Option
from outbox.signing_keys import signing_key
from outbox.worker.publishers.base import (
    PermanentError,
    PublisherBase,
    RetryableError,
    server_of,
)
from outbox.worker.publishers.envelope import envelope
from outbox.worker.publishers.formats import (
    BINARY,
    ENVELOPE,
    HTTP,
    NOT_IN_URI,
    CloudEvents,
    encode,
)
from outbox.worker.publishers.formats import wire_format as check_format
from outbox.worker.publishers.headers import http_headers
from outbox.worker.publishers.registry import PublisherContext
from outbox.worker.publishers.routes import Router, check_template, placeholders, sample
from outbox.worker.publishers.signing import Signer

log = logging.getLogger("outbox.worker")
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
    receiver may echo) masked, and its control characters escaped: the reason is logged and
    stored as `last_error`, which terminals show."""
    if 200 <= status < 300:
        return
    snippet = body[:_BODY_SNIPPET].decode("utf-8", "replace").strip()
    # Redacted first: a PEM block or a URL is told by the line breaks and spaces around it.
    reason = printable(
        redact_text(f"HTTP {status}" + (f": {snippet}" if snippet else ""), secrets=secrets)
    )
    if status in RETRYABLE_STATUSES or status >= 500:
        raise RetryableError(reason, retry_after=parse_retry_after(retry_after))
    raise PermanentError(reason)


def _url(text: str) -> str:
    """An http(s) URL, or a routed URL template (routes.py) whose renderings are."""
    if placeholders(text):
        check_template(text)
        _url(sample(text))
        return text
    try:
        parts = urllib.parse.urlsplit(text)
        parts.port  # noqa: B018 - raises for a port that is not a number in 0-65535
    except ValueError:
        # urllib's words quote what it could not read, e.g. as a port the password whose `/`,
        # `?` or `#` ended the authority early: none of them is passed on.
        raise ValueError(
            f"{refused_url(text)} is not a valid URL (its host or port cannot be read)"
        ) from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"{refused_url(text)} is not an http:// or https:// URL")
    # Accepted, these would fail every publish as "retryable" until each message is dead. The
    # class is the CRD pattern's too (formats.NOT_IN_URI): the two refuse the same URLs.
    if NOT_IN_URI.search(text):
        raise ValueError(
            f"{refused_url(text)} contains whitespace or control characters, or characters "
            "outside ASCII (percent-encode them; an international host in its xn-- form)"
        )
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


def check_credentials(url: str, headers: dict[str, str]) -> None:
    """SettingError if the URL holds user-info and an `Authorization` header is set too.

    aiohttp sends the user-info as an Authorization header of its own and refuses the pair
    with a ValueError on every request: each publish would fail unclassified, the message
    left to its lease and its attempts burnt. Neither the URL nor the header is quoted.
    """
    if placeholders(url):
        url = sample(url)  # the user-info is the template's own: placeholders may not be in it
    parsed = URL(url)  # yarl, as aiohttp reads it
    has_userinfo = parsed.raw_user is not None or parsed.raw_password is not None
    if has_userinfo and any(name.lower() == "authorization" for name in headers):
        raise SettingError(
            "--http-url and --http-header Authorization: give the credentials in one of them, "
            "not both (the URL's user-info is sent as an Authorization header)"
        )


def _header_safe(what: str, value: str) -> str:
    """A value from a message for a header, or PermanentError: it could never be sent."""
    if _NOT_IN_HEADER_VALUE.search(value):
        raise PermanentError(
            f"{what} {value!r} holds a CR, LF or another control character and cannot be sent "
            "in a header"
        )
    return value


class HttpPublisher(PublisherBase):
    name = "http"
    options = (
        Option(
            "--http-url",
            "URL the http publisher POSTs to; may route by {event_type}, {aggregate_type} and "
            "{aggregate_id} in its path or query, each value encoded as one segment",
            convert=_url,
            required=True,
            fields=(Field("url"),),
        ),
        Option(
            "--http-header",
            "extra request header 'Name: value', e.g. Authorization; never logged",
            convert=_header,
            repeatable=True,
            secret=True,
            fields=(Field("headersSecretRef", Carried.SECRET_KEY),),
        ),
        Option(
            "--http-signing-secret",
            "Standard Webhooks signing secret whsec_<base64>: every request gets webhook-id, "
            "webhook-timestamp and a webhook-signature entry per secret (give two while "
            "rotating); never logged",
            convert=signing_key,
            repeatable=True,
            secret=True,
            fields=(Field("signingSecretRef", Carried.SECRET_KEY),),
            refused_as="InvalidSigningSecret",  # a contract name (docs/operator.md)
        ),
    )

    @classmethod
    def create(cls, values: dict[str, Any], context: PublisherContext) -> HttpPublisher:
        return cls(
            values["http_url"],
            owner=context.owner,
            headers=dict(values.get("http_header") or ()),
            max_connections=context.concurrency,
            wire_format=context.format,
            source=context.cloudevents_source,
            signing_keys=tuple(values.get("http_signing_secret") or ()),
        )

    def __init__(
        self,
        url: str,
        *,
        owner: str,
        headers: dict[str, str] | None = None,
        max_connections: int = 100,
        wire_format: str = ENVELOPE,
        source: str = "/outbox/outbox",
        signing_keys: Sequence[bytes] = (),
    ) -> None:
        # Refused here, whoever makes the publisher: otherwise every publish fails.
        check_credentials(url, headers or {})
        self.url = url
        # A routed URL renders per message; its host cannot vary (routes.py).
        self._router = Router(url) if placeholders(url) else None
        # The breaker is the origin's: every path of one server shares it.
        self.destination = str(URL(url if self._router is None else sample(url)).origin())
        # The span's `server.address` and `server.port` (the origin's: never its user-info).
        self.server = server_of(
            self.destination, default_port=443 if self.destination.startswith("https:") else 80
        )
        self._owner = owner
        self._headers = headers or {}
        self.format = check_format(wire_format)
        self._cloudevents = CloudEvents(source)
        self._signer = Signer(signing_keys) if signing_keys else None
        if self._signer is not None and self.format == BINARY:
            # Allowed (a receiver may key on the signed webhook-id alone), but the project's
            # receiving helpers refuse to hand over attributes no signature covers.
            log.warning(
                "--format cloudevents-binary with --http-signing-secret: the signature covers "
                "the id, the timestamp and the body, not the ce- headers (type, subject, "
                "source); receivers that act on them cannot trust them: send "
                "cloudevents-structured to have them signed"
            )
        self._row_headers = http_headers(self._headers)
        # The envelope, unsigned, to one URL, from rows without headers: the path as it was.
        self._plain = wire_format == ENVELOPE and self._signer is None and self._router is None
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
            "Outbox-Event-Type": _header_safe("event_type", message.event_type),
            "Outbox-Attempt": str(message.attempts),
        }
        if message.replay is not None:  # informational: the signed body carries it too
            headers[REPLAY_HEADER] = str(message.replay)
        url: str | URL
        if self._plain and not message.headers:
            url, body = self.url, envelope(message).encode()
        else:
            url, body = self._request(message, headers)
        try:
            async with self._session.post(
                url,
                data=body,
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

    def _request(self, message: Message, headers: dict[str, str]) -> tuple[str | URL, bytes]:
        """The URL and the body of a message, its headers completed: the format's, the
        signature, then the row's own (whose names never collide with the project's: see
        headers.py)."""
        row = self._row_headers.of(message)
        body, attributes = encode(message, self.format, self._cloudevents, HTTP)
        headers.update(attributes)
        if self._signer is not None:
            headers.update(self._signer.headers(headers["Idempotency-Key"], body))
        headers.update(row)
        if self._router is None:
            return self.url, body
        # Already encoded: yarl must neither encode it again nor resolve its segments.
        return URL(self._router.url(message), encoded=True), body

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
