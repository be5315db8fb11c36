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
the header, never its value (a header may carry a token). A message whose `headers` is not a
mapping at all is permanent too (the claim lets none through: belt and braces).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

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
# someone), and what proxies and frameworks route, trust or rewrite by, so that a row can
# neither pass for another client nor redirect the request behind the receiver's edge:
# - the client's address: `Forwarded` (RFC 7239), `X-Forwarded-*`, `Via`, `X-Real-IP`
#   (nginx's realip module), `X-Client-IP`, `True-Client-IP` (Akamai, Cloudflare),
#   `CF-Connecting-IP` (Cloudflare), `Fastly-Client-IP` (Fastly), `X-Cluster-Client-IP`
#   (Rackspace, Riverbed), `X-Originating-IP` (Microsoft): what IP allow-lists and rate
#   limits read behind a proxy;
# - the URL and host: `X-Original-URL` and `X-Rewrite-URL` (IIS rewrite; honoured by Symfony
#   and Zend, known access-control bypasses), `X-Original-URI`, `X-Original-Host`, `X-Host`;
# - the method: `X-HTTP-Method-Override` (Google APIs, Express's method-override),
#   `X-HTTP-Method` (OData), `X-Method-Override`: a POST taken for a DELETE.
# Names are compared with `_` read as `-`: CGI-style servers (PHP, WSGI's environ, nginx's
# underscores_in_headers) fold both to the same variable, so `Idempotency_Key` or
# `X_Real_IP` would land where `Idempotency-Key` or `X-Real-IP` does.
HTTP_RESERVED = frozenset({
    "host", "transfer-encoding", "connection", "keep-alive", "upgrade", "te", "trailer",
    "expect", "proxy-connection", "user-agent", "idempotency-key", "authorization",
    "proxy-authorization", "cookie", "forwarded", "via",
    "x-real-ip", "x-client-ip", "true-client-ip", "cf-connecting-ip", "fastly-client-ip",
    "x-cluster-client-ip", "x-originating-ip",
    "x-original-url", "x-rewrite-url", "x-original-uri", "x-original-host", "x-host",
    "x-http-method-override", "x-http-method", "x-method-override",
})  # fmt: skip
HTTP_RESERVED_PREFIXES = ("outbox-", "ce-", "webhook-", "content-", "x-forwarded")
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
        fold_underscores: bool = False,
    ) -> None:
        self.transport = transport
        self._fold = fold_underscores
        self.reserved = frozenset(self._folded(name) for name in reserved)
        self.prefixes = prefixes
        self._token_names = token_names
        self._ascii_values = ascii_values

    def _folded(self, name: str) -> str:
        """A name as it is compared with the reserved ones."""
        name = name.lower()
        return name.replace("_", "-") if self._fold else name

    def of(self, message: Message) -> list[tuple[str, str]]:
        """The row's headers to send, in its order; PermanentError if one cannot be sent."""
        given = message.headers
        if not given:
            return []
        if not isinstance(given, Mapping):
            raise PermanentError(
                f"headers is a {type(given).__name__}, not a mapping of names to values; not sent"
            )
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
            lowered = self._folded(name)
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
    """For HTTP: the operator's `--http-header` names are reserved too (e.g. Authorization),
    and every name is compared with `_` read as `-`."""
    return RowHeaders(
        "an HTTP header",
        reserved=HTTP_RESERVED | {name.lower() for name in configured},
        prefixes=HTTP_RESERVED_PREFIXES,
        token_names=True,
        ascii_values=True,
        fold_underscores=True,
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
