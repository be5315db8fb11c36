"""The row's own headers (schema v4's `headers`), as each transport may carry them.

A producer's headers (trace context, tenant ids) travel after the project's own, which they
never replace: a row header whose name the publisher sets itself, or that belongs to the
transport or to the project (below), is left out, so the id a receiver de-duplicates on, the
signature, the CloudEvents attributes, the content type and the operator's configured
headers are always the project's. Names compare case-insensitively on every transport.

A header that cannot be sent makes the message permanent (dead, with the reason), never a
broken request: a name that is not an RFC 9110 token (HTTP, NATS) or is empty or holds a
control character (Kafka), a value with a CR, LF or another control character (a header
injection on HTTP and NATS; refused on Kafka too, so that a consumer passing it on to HTTP
cannot be surprised), a value outside ASCII on HTTP and NATS (their header lines are ASCII;
percent-encode such values), and headers longer than MAX_HEADERS_BYTES in all. Reasons name
the header, never its value (a header may carry a token).
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from outbox.limits import MAX_HEADERS_BYTES, format_bytes
from outbox.models import Message
from outbox.worker.publishers.base import PermanentError

# RFC 9110 token characters: what an HTTP (and NATS) header name may hold.
_TOKEN = re.compile(r"^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$")
# Control characters (C0 but tab, DEL, C1) and the Unicode line breaks some parsers honour.
_CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f-\x9f\u2028\u2029]")
_CONTROL_IN_NAME = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")

# Names no row may set, by transport: framing and connection headers the client writes, and
# the project's namespaces (its own `Outbox-*` headers, CloudEvents' `ce-`/`ce_`, Standard
# Webhooks' `webhook-`, JetStream's `Nats-` control headers such as Nats-Rollup).
# On HTTP also what would make the request mean something else than the worker sent: every
# `Content-*` (a `Content-Encoding: gzip` or `Content-Range` misdescribes the body), the
# credentials (`Authorization`, `Proxy-Authorization`, `Cookie`: a row must not act as
# someone), and what proxies route or trust by (`Forwarded`, `X-Forwarded-*`, `Via`).
HTTP_RESERVED = frozenset({
    "host", "transfer-encoding", "connection", "keep-alive", "upgrade", "te", "trailer",
    "expect", "proxy-connection", "user-agent", "idempotency-key", "authorization",
    "proxy-authorization", "cookie", "forwarded", "via",
})  # fmt: skip
HTTP_RESERVED_PREFIXES = ("outbox-", "ce-", "webhook-", "content-", "x-forwarded-")
NATS_RESERVED = frozenset({"content-type"})
NATS_RESERVED_PREFIXES = ("nats-", "outbox-", "ce-")
KAFKA_RESERVED = frozenset({"content-type"})
KAFKA_RESERVED_PREFIXES = ("outbox-", "ce_")


class RowHeaders:
    """Checks and filters a message's headers for one transport."""

    def __init__(
        self,
        transport: str,
        *,
        reserved: Iterable[str],
        prefixes: tuple[str, ...],
        token_names: bool,
        ascii_values: bool,
    ) -> None:
        self.transport = transport
        self.reserved = frozenset(name.lower() for name in reserved)
        self.prefixes = prefixes
        self._token_names = token_names
        self._ascii_values = ascii_values

    def of(self, message: Message) -> list[tuple[str, str]]:
        """The row's headers to send, in its order; PermanentError if one cannot be sent."""
        given = message.headers
        if not given:
            return []
        sent: list[tuple[str, str]] = []
        size = 0
        for name, value in given.items():
            self._check(name, value)
            size += len(name.encode()) + len(value.encode())
            if size > MAX_HEADERS_BYTES:
                raise PermanentError(
                    f"headers: {size} bytes by header {name[:64]!r}, more than "
                    f"{format_bytes(MAX_HEADERS_BYTES)} in all; not sent"
                )
            lowered = name.lower()
            if lowered in self.reserved or lowered.startswith(self.prefixes):
                continue  # the project's own, or the transport's: never the row's
            sent.append((name, value))
        return sent

    def _check(self, name: object, value: object) -> None:
        transport = self.transport
        if not isinstance(name, str) or not isinstance(value, str):
            raise PermanentError(f"headers: {name!r} is not a string name with a string value")
        if self._token_names:
            if not _TOKEN.match(name):
                raise PermanentError(
                    f"header name {name[:64]!r} cannot be sent in {transport} (a name holds "
                    "letters, digits and !#$%&'*+-.^_`|~ only)"
                )
        elif not name or _CONTROL_IN_NAME.search(name):
            raise PermanentError(
                f"header name {name[:64]!r} cannot be sent in {transport} (empty, or a control "
                "character)"
            )
        if _CONTROL.search(value):
            raise PermanentError(
                f"header {name!r}: its value holds a CR, LF or another control character and "
                f"cannot be sent in {transport}"
            )
        if self._ascii_values and not value.isascii():
            raise PermanentError(
                f"header {name!r}: its value is not ASCII and cannot be sent in {transport} "
                "(percent-encode it)"
            )


def http_headers(configured: Iterable[str] = ()) -> RowHeaders:
    """For HTTP: the operator's `--http-header` names are reserved too (e.g. Authorization)."""
    return RowHeaders(
        "an HTTP header",
        reserved=HTTP_RESERVED | {name.lower() for name in configured},
        prefixes=HTTP_RESERVED_PREFIXES,
        token_names=True,
        ascii_values=True,
    )


def nats_headers() -> RowHeaders:
    return RowHeaders(
        "a NATS header",
        reserved=NATS_RESERVED,
        prefixes=NATS_RESERVED_PREFIXES,
        token_names=True,
        ascii_values=True,
    )


def kafka_headers() -> RowHeaders:
    return RowHeaders(
        "a Kafka header",
        reserved=KAFKA_RESERVED,
        prefixes=KAFKA_RESERVED_PREFIXES,
        token_names=False,
        ascii_values=False,
    )
