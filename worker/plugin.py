"""The publisher plugin API: everything a publisher plugin imports, from one public module.

    from outbox.worker.plugin import (
        Defer, Message, Option, PermanentError, PublisherContext, RetryableError, envelope,
    )

A publisher is a class with a `name`, its `options` (a tuple of `Option`), a `create` class
method taking the option values and a `PublisherContext`, `start` and `close` coroutines, and
one of two ways to send:

- `publish(message)`, the simple form and the default path (the `Publisher` protocol): the
  worker runs up to `--concurrency` publishes at once, each under `--publish-timeout`.
  `publish` returns on success or raises one of the three failure classes below. Write this
  one unless the client library batches natively.
- `publish_batch(messages)`, for clients that batch natively (the `BatchPublisher`
  protocol; the built-in Kafka and NATS publishers): the worker hands over up to `--batch`
  messages per call, a few calls in flight, each call under `--publish-timeout` (past it,
  every message of the call counts as timed out). It returns one result per message, in
  order: None when delivered, else an instance of one of the three failure classes (returned,
  not raised: one message's failure is not the batch's).

A class with `publish_batch` is driven through it alone. A plugin may instead subclass
`PublisherBase`, which declares every optional part with its default: `batched = True` then
says it sends through `publish_batch`, `per_message_destinations = True` that
`destination_of` names each message's destination. `PublisherFactory` is the class
side of either. The three failure classes:

- `RetryableError(reason, retry_after=None)`: transient; retried with full-jitter back-off,
  honouring `retry_after` when the downstream gave one;
- `PermanentError(reason)`: retrying cannot help; the message goes dead with the reason;
- `Defer(delay, reason)`: not yet, for a business reason; the attempt is refunded.

The destination gate: a retryable failure met by many different messages is the destination's,
and its breaker (shared by every replica) holds its messages back, attempts refunded, until
a probe gets through. A publisher names where its messages go: a `destination` attribute
(one for all, e.g. a queue URL without credentials), or a `destination_of(message)` method
(one per message, e.g. a route by event type). One that names none is one destination, its
`name`. Say only what identifies the endpoint, never a secret: the name is stored in the
database and shown to people.

Any other exception is a bug: logged with its traceback, the row left to its lease. An
exception `publish_batch` raises instead of returning stands for every message of the call.
`create` may raise `SettingError` for settings that only make sense together: the worker
exits 2 with its one-line message. An `Option` with `secret=True` is never echoed: its value
is masked in usage errors, in `--help` and in the worker's start-up line.

The `name` and `options` are the publisher's one description (outbox.publisher_options):
the worker's flags, and all the operator needs to render, check and document a plugin set by
a resource's generic block (`publisher.plugin`). Register a plugin under the
`outbox.publishers` entry-point group (`ENTRY_POINT_GROUP`), or name it
`package.module:Class`. docs/publishers/plugins.md has a complete example. The names
here are the stable surface; the modules they come from may move.
"""

from outbox.models import Message
from outbox.plumbing.errors import SettingError
from outbox.publisher_options import ENTRY_POINT_GROUP, Option
from outbox.worker.publishers.base import (
    BatchPublisher,
    Defer,
    PermanentError,
    Publisher,
    PublisherBase,
    RetryableError,
)
from outbox.worker.publishers.envelope import envelope
from outbox.worker.publishers.registry import PublisherContext, PublisherFactory

__all__ = [
    "ENTRY_POINT_GROUP",
    "BatchPublisher",
    "Defer",
    "Message",
    "Option",
    "PermanentError",
    "Publisher",
    "PublisherBase",
    "PublisherContext",
    "PublisherFactory",
    "RetryableError",
    "SettingError",
    "envelope",
]
