"""The boundary between the dispatch loop and the outside world.

A publisher sends one message and either returns (success) or raises one of the three
failure classes below; a batch publisher sends many at once and reports, for each, None
(success) or one of those failures. Translating a client library's exceptions into these
classes is the publisher's job; the loop knows nothing of HTTP or brokers. Any other
exception is a bug: the loop logs it with its traceback and leaves the row alone, so its
lease expires and the attempt limit eventually sends it to dead.

What else the worker may use of a publisher is declared on `PublisherBase`, with what it
means when a publisher says nothing (as harlequin's adapter declares its optional
capabilities): the destination its messages go to, one for all or one per message, whose
breaker the worker keeps; the server it talks to and the names it renders per message, for
publish spans. The built-in publishers subclass it. A plugin written to the structural
protocols (`Publisher`, `BatchPublisher`, docs/publishers/plugins.md) is declared once, when
the worker takes it (`declared`), from the members that protocol documents.
"""

from __future__ import annotations

import urllib.parse
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any, Protocol

from outbox.models import Message
from outbox.plumbing.redact import redact_text
from outbox.plumbing.text import printable


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


def reason(exc: BaseException) -> str:
    """A publisher's reason as stored in last_error (readable by anyone who may SELECT the
    table, and shown by the TUI) and in a span's status: URL credentials and query values
    redacted, and control characters escaped (a broker's or a downstream's words, one line),
    whichever publisher wrote it. Redacted first: a PEM block is told by its line breaks."""
    return printable(redact_text(str(exc)))


class PublisherBase:
    """A publisher and everything the worker may use of it, each optional part declared here
    with what it means when a publisher leaves it as it is. The worker never looks for
    members a publisher might have: it reads these.

    Sending: `publish` (one message per call), or, with `batched` true, `publish_batch`
    alone (see `BatchPublisher` for its contract).

    Destinations (whose breakers the worker keeps): `destination`, where every message goes,
    or with `per_message_destinations` true, `destination_of(message)`, one per message. The
    name is stored in the database and shown to people: the endpoint, never a secret.

    Publish spans: `server` (host and port, see `server_of`), `destination_template` (the
    template names are rendered from, e.g. a subject's) and `destination_name(message)` (the
    name one message is sent to).
    """

    name: str = "publisher"
    batched: bool = False
    per_message_destinations: bool = False
    destination: str | None = None  # None: the publisher is one destination, its name
    server: tuple[str, int | None] | None = None
    destination_template: str | None = None

    async def start(self) -> None:
        pass

    async def close(self) -> None:
        pass

    async def publish(self, message: Message) -> None:
        raise NotImplementedError(f"{self.name} publishes in batches (publish_batch)")

    async def publish_batch(self, messages: Sequence[Message]) -> Sequence[Exception | None]:
        raise NotImplementedError(f"{self.name} publishes one message at a time (publish)")

    def one_destination(self) -> str:
        """The destination of every message, when one serves all: the publisher's name
        unless it names one."""
        return self.destination or self.name

    def destination_of(self, message: Message) -> str:
        """The destination of a message; the one destination unless per message."""
        return self.one_destination()

    def destination_name(self, message: Message) -> str:
        """The name a message is sent to (a span's `messaging.destination.name`): the
        template's rendering where there is one, else the destination. It may raise for a
        message the publisher refuses; its publish then says why."""
        return self.destination_template or self.destination_of(message)


class _Declared(PublisherBase):
    """A plugin written to the structural protocols, with what it declares: `publish` or
    `publish_batch`, and a `destination` attribute or a `destination_of` method (the members
    docs/publishers/plugins.md names). It sends through the plugin's own methods."""

    def __init__(self, plugin: Any) -> None:
        # The one place a publisher's members are looked for: a plugin that predates
        # PublisherBase declares its optional parts by having them, as its protocol said.
        self.plugin = plugin
        self.name = str(plugin.name)
        self._batch: Callable[[Sequence[Message]], Any] | None = getattr(
            plugin, "publish_batch", None
        )
        self.batched = self._batch is not None
        destination = getattr(plugin, "destination", None)
        self.destination = None if destination is None else str(destination)
        self._destination_of: Callable[[Message], str] | None = getattr(
            plugin, "destination_of", None
        )
        self.per_message_destinations = self._destination_of is not None

    async def start(self) -> None:
        await self.plugin.start()

    async def close(self) -> None:
        await self.plugin.close()

    async def publish(self, message: Message) -> None:
        await self.plugin.publish(message)

    async def publish_batch(self, messages: Sequence[Message]) -> Sequence[Exception | None]:
        assert self._batch is not None
        results: Sequence[Exception | None] = await self._batch(messages)
        return results

    def destination_of(self, message: Message) -> str:
        if self._destination_of is None:
            return self.one_destination()
        return self._destination_of(message)


def declared(publisher: PublisherBase | Publisher | BatchPublisher) -> PublisherBase:
    """The publisher as the worker uses it: itself when it subclasses PublisherBase, else the
    plugin with what the structural protocols let it declare, read once, here."""
    if isinstance(publisher, PublisherBase):
        return publisher
    return _Declared(publisher)
