"""What a publish's failure means: nats-py's and JetStream's errors as the worker's failure
classes (the table is the package's), and what a reply on the PubAck inbox says."""

from __future__ import annotations

import json
import re

import nats.errors
from nats.aio.msg import Msg
from nats.js.errors import (
    APIError,
    NoStreamResponseError,
    NotFoundError,
    ServerError,
    ServiceUnavailableError,
)

from outbox.worker.publishers.base import PermanentError, RetryableError

NO_STREAM_POLICIES = ("dead", "retry")
DEFAULT_NO_STREAM = "dead"
NO_RESPONDERS_STATUS = "503"  # the server's status reply when nothing listens on a subject
# The asynchronous -ERR a server sends for a publish or a subscription it does not permit.
PERMISSION_VIOLATION = re.compile(r'permissions violation for (publish|subscription) to "([^"]*)"')


def no_stream_policy(text: str) -> str:
    if text not in NO_STREAM_POLICIES:
        raise ValueError(f"{text!r} is not one of {', '.join(NO_STREAM_POLICIES)}")
    return text


def no_stream_error(reason: str, policy: str) -> PermanentError | RetryableError:
    """A missing stream or permission, as the `--nats-no-stream` policy classes it."""
    return RetryableError(reason) if policy == "retry" else PermanentError(reason)


def classify(exc: Exception, subject: str, no_stream: str = DEFAULT_NO_STREAM) -> Exception:
    """The failure class (see the package's table) for an exception from publishing to `subject`;
    an exception of no known kind is returned as it is: a bug for the loop to report."""
    if isinstance(exc, NoStreamResponseError | nats.errors.NoRespondersError):
        return no_stream_error(f"no stream bound to subject {subject!r} (no responders)", no_stream)
    if isinstance(exc, ValueError | TypeError):
        # json.loads or PubAck(**reply) failed: whatever answered is not a JetStream stream.
        return no_stream_error(
            f"subject {subject!r} was answered by a plain NATS responder, not a stream ({exc})",
            no_stream,
        )
    if isinstance(exc, NotFoundError):
        return no_stream_error(
            f"stream not found for subject {subject!r}: {exc.description}", no_stream
        )
    if isinstance(exc, ServiceUnavailableError | ServerError):
        return RetryableError(f"JetStream unavailable ({exc.code}): {exc.description}")
    if isinstance(exc, APIError):
        return PermanentError(
            f"JetStream refused the message ({exc.code}, err_code {exc.err_code}): "
            f"{exc.description}"
        )
    if isinstance(exc, TimeoutError):  # nats-py's own subclasses the builtin it also raises
        return RetryableError(f"no PubAck for subject {subject!r} in time")
    if isinstance(
        exc, nats.errors.MaxPayloadError | nats.errors.BadSubjectError | nats.errors.BadHeaderError
    ):
        return PermanentError(f"{exc} (subject {subject!r})")
    if isinstance(exc, nats.errors.Error | OSError):
        # Connection states (closed, reconnecting, draining, no servers, stale, outbound buffer
        # full, slow consumer) and socket errors: all pass once the connection is back.
        return RetryableError(str(exc) or type(exc).__name__)
    return exc


def is_duplicate(msg: Msg) -> bool:
    """Whether the stream already had this message id, as its PubAck says; raises what the
    reply says went wrong instead (for `classify`)."""
    if msg.headers and msg.headers.get("Status") == NO_RESPONDERS_STATUS:
        raise NoStreamResponseError
    answer = json.loads(msg.data)  # ValueError: not JSON, so not a stream
    if not isinstance(answer, dict):
        raise TypeError(f"not a PubAck: {msg.data[:100]!r}")
    if "error" in answer:
        raise APIError.from_error(answer["error"])
    # The fields a PubAck must have, checked without building nats-py's PubAck (reading
    # it field by field cost more than the rest of the reply's handling).
    if "stream" not in answer or "seq" not in answer:
        raise TypeError(f"not a PubAck: {msg.data[:100]!r}")
    return answer.get("duplicate") is True
