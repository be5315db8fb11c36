"""The boundary between the dispatch loop and the outside world.

A publisher sends one message and either returns (success) or raises one of the three
failure classes below; a batch publisher sends many at once and reports, for each, None
(success) or one of those failures. Translating a client library's exceptions into these
classes is the publisher's job; the loop knows nothing of HTTP or brokers. Any other
exception is a bug: the loop logs it with its traceback and leaves the row alone, so its
lease expires and the attempt limit eventually sends it to dead.

Each publisher names the destination of its messages, whose health the worker tracks:
`destination` (one for all: an HTTP origin, a broker cluster), or `destination_of(message)`
(one per message); a publisher that names none is one destination, its name. It may also
name the server it talks to, `server` (host and port, see `server_of`), for publish spans.
"""

from __future__ import annotations

import urllib.parse
from collections.abc import Sequence
from datetime import timedelta
from typing import Protocol

from outbox.models import Message


def server_of(address: str, *, default_port: int | None = None) -> tuple[str, int | None] | None:
    """The host and port of `host:port`, `[v6]:port` or a URL (`nats://u:p@host:4222`), the
    port `default_port` when absent; None when there is no host or the port is not one. Never
    the user-info: a span's `server.address` is exported."""
    text = address.strip()
    try:
        parts = urllib.parse.urlsplit(text if "://" in text else "//" + text)
        host, port = parts.hostname, parts.port
    except ValueError:
        return None
    return (host, port if port is not None else default_port) if host else None


class RetryableError(Exception):
    """A transient failure (timeout, 5xx, 429, connection refused): back off and retry.

    `retry_after` is the downstream's own hint (e.g. HTTP Retry-After), honoured when given.
    """

    def __init__(self, reason: str, *, retry_after: timedelta | None = None) -> None:
        super().__init__(reason)
        self.retry_after = retry_after


class PermanentError(Exception):
    """A failure retrying will not fix (validation error, unknown destination): dead."""


class Defer(Exception):
    """Not yet, for a business reason: try again after `delay`; the attempt is refunded."""

    def __init__(self, delay: timedelta, reason: str) -> None:
        super().__init__(reason)
        self.delay = delay


class Publisher(Protocol):
    """What every publisher implements. `start` and `close` bracket the worker's lifetime."""

    name: str

    async def start(self) -> None: ...

    async def publish(self, message: Message) -> None: ...

    async def close(self) -> None: ...


class BatchPublisher(Protocol):
    """A publisher whose client batches natively: `publish_batch` sends every message given
    and returns one result per message, in the same order: None when it was delivered, else
    the RetryableError, PermanentError or Defer that says why not. It should return within
    the publish timeout; past it, every message of the call counts as timed out."""

    name: str

    async def start(self) -> None: ...

    async def publish_batch(self, messages: Sequence[Message]) -> Sequence[Exception | None]: ...

    async def close(self) -> None: ...
