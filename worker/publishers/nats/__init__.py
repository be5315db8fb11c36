"""Publishes to NATS JetStream and gathers the stream's acknowledgements (PubAcks).

A batch publisher: the worker hands it the messages it holds, a batch at a time; it
publishes them all asynchronously, each with its own reply subject, and returns a result per
message once each has its PubAck (or its failure, or the ack timeout, one timer per batch).

The subject comes from a template (default `outbox.{aggregate_type}.{event_type}`); every
substituted value is made a single valid subject token (whitespace, control characters, `.`,
`*` and `>` become `_`). A subject longer than MAX_SUBJECT_BYTES makes its message permanent,
alone: the server would close the connection on it ("maximum control line exceeded") and fail
every message in flight with it. The body is the JSON envelope; the header `Nats-Msg-Id` is
the outbox id, the same on every retry, so the stream's duplicate window drops a message it
already stored: the PubAck then says `duplicate` and the worker counts it in
`outbox_broker_duplicates_total`. Headers `Outbox-Event-Type`, `Outbox-Aggregate-Type` and
`Outbox-Aggregate-Id` carry the unsanitized values. `--format` may make the message a
CloudEvent instead (formats.py: `ce-` headers in binary mode, a JSON CloudEvent in structured
mode); the row's own headers follow the project's (headers.py), never replacing them nor
JetStream's `Nats-*` control headers.

The connection is made in the background and kept up forever (`max_reconnect_attempts=-1`):
a worker starts, and keeps running, while NATS is unreachable. A publish while not connected
fails at once as retryable (the whole batch), so rows back off and are delivered once the
server is back.

| what happened                                                               | class     |
|-----------------------------------------------------------------------------|-----------|
| PubAck received; with `duplicate` true the stream dropped it as a duplicate | success   |
| no responders: no stream bound to the subject (`NoStreamResponseError`)     | dead (1)  |
| JetStream API 404, e.g. stream not found (`NotFoundError`)                  | dead (1)  |
| server -ERR "permissions violation for publish to" the subject              | dead (1)  |
| server -ERR "permissions violation for subscription to" the PubAck inbox    | dead (1)  |
| the reply is not a PubAck: a plain NATS responder answered, not a stream    | dead (1)  |
| JetStream API 503 (`ServiceUnavailableError`) or 500 (`ServerError`)        | retryable |
| any other JetStream API error, e.g. 400 message over the `max_msg_size`     | dead      |
| no PubAck in time (`nats.errors.TimeoutError`) (2)                          | retryable |
| not connected: connecting, reconnecting, closed, no servers                 | retryable |
| `ConnectionClosedError`, `NoServersError`, `StaleConnectionError`           | retryable |
| `SlowConsumerError`, `OutboundBufferLimitError`, `ConnectionDrainingError`  | retryable |
| socket errors (`OSError`) and any other `nats.errors.Error`                 | retryable |
| body over the server's `max_payload` (`MaxPayloadError`)                    | dead      |
| invalid subject or header (`BadSubjectError`, `BadHeaderError`)             | dead      |
| subject past MAX_SUBJECT_BYTES (checked before publishing)                  | dead      |

(1) `--nats-no-stream retry` makes these retryable instead: for a stream or a permission
that will be added later. (2) Also what a connection lost mid-request, or PubAcks dropped by a
slow consumer, look like. Authentication failures (wrong password, bad credentials) happen
while connecting: publishes fail as retryable "not connected", and the cause is logged.
"""

from outbox.worker.publishers.nats.config import (
    DEFAULT_URL,
    SCHEMES,
    TLS_DIR_FILES,
    creds_file,
    readable_dir,
    readable_file,
    server_urls,
    tls_context,
    tls_dir_files,
)
from outbox.worker.publishers.nats.errors import (
    DEFAULT_NO_STREAM,
    NO_RESPONDERS_STATUS,
    NO_STREAM_POLICIES,
    classify,
    no_stream_policy,
)
from outbox.worker.publishers.nats.publisher import (
    CONNECT_TIMEOUT,
    RECONNECT_WAIT,
    NatsPublisher,
)
from outbox.worker.publishers.nats.subjects import (
    DEFAULT_SUBJECT,
    MAX_CONTROL_LINE,
    MAX_SUBJECT_BYTES,
    SUBJECT_CACHE_SIZE,
    render_subject,
    subject_template,
    subject_token,
)

__all__ = [
    "CONNECT_TIMEOUT",
    "DEFAULT_NO_STREAM",
    "DEFAULT_SUBJECT",
    "DEFAULT_URL",
    "MAX_CONTROL_LINE",
    "MAX_SUBJECT_BYTES",
    "NO_RESPONDERS_STATUS",
    "NO_STREAM_POLICIES",
    "RECONNECT_WAIT",
    "SCHEMES",
    "SUBJECT_CACHE_SIZE",
    "TLS_DIR_FILES",
    "NatsPublisher",
    "classify",
    "creds_file",
    "no_stream_policy",
    "readable_dir",
    "readable_file",
    "render_subject",
    "server_urls",
    "subject_template",
    "subject_token",
    "tls_context",
    "tls_dir_files",
]
