"""Produces each message to Kafka with librdkafka's idempotent producer (confluent-kafka).

What is sent: the topic rendered from `--kafka-topic` (default `{aggregate_type}`), key =
`aggregate_id` (one aggregate, one partition: its order is kept), value = the JSON envelope,
headers `outbox-id`, `outbox-event-type`, `outbox-aggregate-type`, `outbox-attempt`.
`--format` may make the value a CloudEvent instead (formats.py: the payload with `ce_`
headers in binary mode, a JSON CloudEvent in structured mode); the key and the project's
headers stay as they are, and the row's own headers follow them (headers.py).
`enable.idempotence=true` and `acks=all`: librdkafka's own retries within one producer
session never duplicate or reorder; a re-publish after a lost lease does, so consumers
dedup by the `outbox-id` header.

A batch publisher: the worker hands it the messages it holds, a batch at a time, and it
produces them all, then returns a result per message once the broker acknowledged each (or
refused it). The event loop itself calls `poll(0)`, every few milliseconds while batches
await reports and rarely otherwise: delivery reports fill the batch's results there, and the
last one completes the batch (no thread, no cross-thread wake-up per batch). librdkafka gives up
on a message (`message.timeout.ms`) 1.5 s before the worker's publish timeout (half of it if
shorter), so a slow delivery ends with librdkafka's own verdict, not a blind timeout.

Errors, by librdkafka error code (the dispatcher prefixes `permanent:` / `retryable:`):

| error codes                                                                   | class     |
|-------------------------------------------------------------------------------|-----------|
| UNKNOWN_TOPIC_OR_PART, _UNKNOWN_TOPIC, _UNKNOWN_PARTITION, UNKNOWN_TOPIC_ID     | permanent |
| TOPIC_EXCEPTION (invalid topic), _INVALID_ARG, INVALID_REQUIRED_ACKS            | permanent |
| MSG_SIZE_TOO_LARGE, RECORD_LIST_TOO_LARGE, INVALID_MSG_SIZE                     | permanent |
| INVALID_RECORD, INVALID_TIMESTAMP, POLICY_VIOLATION, UNSUPPORTED_FOR_MESSAGE_FORMAT | permanent |
| TOPIC_AUTHORIZATION_FAILED, CLUSTER_AUTHORIZATION_FAILED                        | permanent |
| _TRANSPORT, _ALL_BROKERS_DOWN, _RESOLVE, NETWORK_EXCEPTION, BROKER_NOT_AVAILABLE | retryable |
| REQUEST_TIMED_OUT, _MSG_TIMED_OUT, _TIMED_OUT, _TIMED_OUT_QUEUE                 | retryable |
| NOT_ENOUGH_REPLICAS, NOT_ENOUGH_REPLICAS_AFTER_APPEND, KAFKA_STORAGE_ERROR      | retryable |
| LEADER_NOT_AVAILABLE, NOT_LEADER_FOR_PARTITION, REPLICA_NOT_AVAILABLE           | retryable |
| FENCED_LEADER_EPOCH, UNKNOWN_LEADER_EPOCH, INVALID_MSG, THROTTLING_QUOTA_EXCEEDED | retryable |
| _QUEUE_FULL (and BufferError), _PURGE_QUEUE, _PURGE_INFLIGHT, _DESTROY          | retryable |
| OUT_OF_ORDER_SEQUENCE_NUMBER, UNKNOWN_PRODUCER_ID, INVALID_PRODUCER_EPOCH       | retryable |
| PRODUCER_FENCED, _FATAL, _AUTHENTICATION, SASL_AUTHENTICATION_FAILED, _SSL      | retryable |
| any other code whose error is `fatal()` or `retriable()`                        | retryable |
| any other code                                                                  | permanent |

A topic name the template renders empty, `.` or `..`, or longer than 249 characters (never
cut: a cut name could be another topic), is permanent too, for that message alone.
Authentication and TLS failures are retryable: they are the worker's configuration, not the
message's fault. A *fatal* error (the idempotent producer lost its guarantees, e.g. a
sequence desynchronisation) makes the producer unusable: a new producer replaces it, the
messages it had in flight are retried, later ones go to the new producer.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import re
import threading
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Producer

from outbox.errors import SettingError
from outbox.models import Message
from outbox.redact import is_secret_name, mask_userinfo, mask_values, redact_mapping
from outbox.worker.publishers.base import (
    PermanentError,
    PublisherBase,
    RetryableError,
    server_of,
)
from outbox.worker.publishers.envelope import envelope
from outbox.worker.publishers.formats import ENVELOPE, KAFKA, CloudEvents, encode
from outbox.worker.publishers.formats import wire_format as check_format
from outbox.worker.publishers.headers import kafka_headers
from outbox.worker.publishers.registry import Option, PublisherContext
from outbox.worker.publishers.template import Template

log = logging.getLogger("outbox.kafka")

E = KafkaError  # short, for the two tables below
PERMANENT_CODES = frozenset({
    E.UNKNOWN_TOPIC_OR_PART, E._UNKNOWN_TOPIC, E._UNKNOWN_PARTITION, E.UNKNOWN_TOPIC_ID,
    E.TOPIC_EXCEPTION, E.MSG_SIZE_TOO_LARGE, E.RECORD_LIST_TOO_LARGE, E.INVALID_MSG_SIZE,
    E.INVALID_RECORD, E.INVALID_TIMESTAMP, E.TOPIC_AUTHORIZATION_FAILED,
    E.CLUSTER_AUTHORIZATION_FAILED, E.POLICY_VIOLATION, E.UNSUPPORTED_FOR_MESSAGE_FORMAT,
    E.INVALID_REQUIRED_ACKS, E._INVALID_ARG,
})  # fmt: skip
RETRYABLE_CODES = frozenset({
    E._TRANSPORT, E._ALL_BROKERS_DOWN, E._RESOLVE, E.NETWORK_EXCEPTION, E.BROKER_NOT_AVAILABLE,
    E.REQUEST_TIMED_OUT, E._MSG_TIMED_OUT, E._TIMED_OUT, E._TIMED_OUT_QUEUE,
    E.NOT_ENOUGH_REPLICAS, E.NOT_ENOUGH_REPLICAS_AFTER_APPEND, E.LEADER_NOT_AVAILABLE,
    E.NOT_LEADER_FOR_PARTITION, E.FENCED_LEADER_EPOCH, E.UNKNOWN_LEADER_EPOCH,
    E.REPLICA_NOT_AVAILABLE, E.KAFKA_STORAGE_ERROR, E.INVALID_MSG, E.THROTTLING_QUOTA_EXCEEDED,
    E._QUEUE_FULL, E._PURGE_QUEUE, E._PURGE_INFLIGHT, E._DESTROY,
    E.OUT_OF_ORDER_SEQUENCE_NUMBER, E.UNKNOWN_PRODUCER_ID, E.INVALID_PRODUCER_EPOCH,
    E.PRODUCER_FENCED, E._FATAL, E._AUTHENTICATION, E.SASL_AUTHENTICATION_FAILED, E._SSL,
})  # fmt: skip

MAX_TOPIC_LENGTH = 249
_ILLEGAL_TOPIC_CHARS = re.compile(r"[^a-zA-Z0-9._-]")
COMPRESSIONS = ("none", "gzip", "snappy", "lz4", "zstd")
# librdkafka's security protocols: a bootstrap server may name one (`SSL://h:9093`, any case),
# and librdkafka drops a server whose protocol is not security.protocol's.
PROTOCOLS = ("plaintext", "ssl", "sasl_plaintext", "sasl_ssl")
# One bootstrap server as librdkafka reads it (rd_kafka_broker_name_parse): an optional
# `PROTOCOL://` (then a path, ignored by librdkafka, may follow: only an empty one is taken),
# a host, then `:port` unless the host is an IPv6 address written without brackets.
_BOOTSTRAP_SERVER = re.compile(
    r"(?:(?P<protocol>[A-Za-z_]+)://)?"
    r"(?:(?P<name>[A-Za-z0-9_-]+(?:\.[A-Za-z0-9_-]+)*\.?)|\[(?P<ipv6>[^\]]+)\])"
    r"(?::(?P<port>[0-9]+))?"
    r"(?(protocol)/?)"
)
BOOTSTRAP_EXPECTED = (
    "expected host:port[,host:port...] (host a name, an IPv4 or a [bracketed] IPv6 address; "
    "port 1-65535; optionally PROTOCOL:// first)"
)

# Set by this publisher (or by another flag); a passthrough value would break its guarantees.
RESERVED_CONFIG = {
    "bootstrap.servers": "use --kafka-bootstrap-servers",
    "metadata.broker.list": "use --kafka-bootstrap-servers",
    "enable.idempotence": "always true",
    "acks": "always all",
    "request.required.acks": "always all",
    "message.timeout.ms": "derived from --publish-timeout",
    "delivery.timeout.ms": "derived from --publish-timeout",
    "compression.type": "use --kafka-compression",
    "compression.codec": "use --kafka-compression",
    "transactional.id": "transactions are not supported",
    "delivery.report.only.error": "every delivery report is needed",
}

# How much earlier than the worker's publish timeout librdkafka gives up on a message.
MESSAGE_TIMEOUT_MARGIN = 1.5

# A message refused because librdkafka's own queue is full (BufferError from produce()).
QUEUE_FULL = (
    "Kafka _QUEUE_FULL: the local producer queue is full "
    "(queue.buffering.max.messages, queue.buffering.max.kbytes)"
)

# The fate of a message whose delivery report never came (its producer was replaced).
_UNKNOWN = KafkaError(KafkaError._FATAL, "producer replaced before delivery was reported")
# Most seconds a producer replaced after a fatal error gets to finish what it has in flight.
RETIRE_FLUSH = 5.0
# Most seconds close() waits for queued messages before purging them.
MAX_CLOSE_FLUSH = 30.0
# Seconds between the loop's poll(0) calls while batches await delivery reports: a report
# waits at most this long once librdkafka has it. A poll thread instead cost ~1 µs per message
# more in CPU (bench/results/brokers.md); at 1 ms the extra loop iterations ate the gain.
POLL_BUSY = 0.003
# ... and while none do: librdkafka's log lines and errors are still served.
POLL_IDLE = 0.1
TOPIC_CACHE_SIZE = 4096  # rendered topics kept; emptied when full
_Headers = list[tuple[str, str | bytes | None]]  # what produce() takes
# The attempt header of the first attempts, made once: most messages go on their first.
_ATTEMPT_HEADERS = tuple(("outbox-attempt", str(n).encode()) for n in range(32))
# A route: the topic, and the event type and aggregate type headers.
_Routing = tuple[str, tuple[str, bytes], tuple[str, bytes]]


# -- errors ----------------------------------------------------------------------------------


def is_fatal(error: KafkaError) -> bool:
    # After a fatal error, produce() raises _FATAL without the fatal flag set.
    return error.fatal() or error.code() == KafkaError._FATAL


def classify(error: KafkaError) -> RetryableError | PermanentError:
    """The failure class for a librdkafka error (see the table above)."""
    reason = f"Kafka {error.name()}: {error.str()}"
    code = error.code()
    if code in PERMANENT_CODES:
        return PermanentError(reason)
    if code in RETRYABLE_CODES or is_fatal(error) or error.retriable():
        return RetryableError(reason)
    return PermanentError(reason)


def _error_of(exc: KafkaException) -> KafkaError:
    first = exc.args[0] if exc.args else None
    return first if isinstance(first, KafkaError) else KafkaError(KafkaError._FAIL, str(exc))


def _fatal_in(exc: BaseException | None) -> KafkaError | None:
    """The fatal KafkaError behind an exception from poll(), if any.

    confluent-kafka raises a fatal error from poll(); a delivery callback run in the same
    poll may then fail with a SystemError chained to it, so the whole chain is searched.
    """
    while exc is not None:
        if isinstance(exc, KafkaException) and is_fatal(error := _error_of(exc)):
            return error
        exc = exc.__cause__ or exc.__context__
    return None


# -- topics ----------------------------------------------------------------------------------


def topic_name(value: str) -> str:
    """A value as it may stand in a topic name: characters Kafka does not allow become `_`."""
    return _ILLEGAL_TOPIC_CHARS.sub("_", value)


def topic_template(text: str) -> str:
    """Validate a topic template: known placeholders only, legal characters around them."""
    if not text:
        raise ValueError("empty topic template")
    template = Template(text, topic_name)
    if any(_ILLEGAL_TOPIC_CHARS.search(literal) for literal in template.literals):
        raise ValueError(
            f"{text!r} contains characters Kafka does not allow in topic names "
            "(allowed: a-z A-Z 0-9 . _ -)"
        )
    if len(template.sample()) > MAX_TOPIC_LENGTH:
        raise ValueError(f"longer than the {MAX_TOPIC_LENGTH} characters of a Kafka topic name")
    return text


def render_topic(template: str | Template, message: Message) -> str:
    """The topic for a message: placeholders filled with sanitized values.

    Characters Kafka does not allow become `_`; a name that is still not legal is permanent,
    and so is one longer than 249 characters: it is never cut, since a cut name can be
    another topic (two names that differ past the cut would share one).
    """
    if isinstance(template, str):
        template = Template(template, topic_name)
    topic = template.render(message)
    if len(topic) > MAX_TOPIC_LENGTH:
        raise PermanentError(
            f"topic template {template.text!r} renders {len(topic)} characters for this message, "
            f"more than the {MAX_TOPIC_LENGTH} of a Kafka topic name; not sent"
        )
    if topic in ("", ".", ".."):
        raise PermanentError(
            f"topic template {template.text!r} renders {topic!r}, not a legal topic"
        )
    return topic


# -- settings --------------------------------------------------------------------------------


def bootstrap_server_list(text: str) -> str:
    """A comma-separated list of `[PROTOCOL://]host[:port]`, whitespace around each server
    dropped: what librdkafka's bootstrap.servers takes, and nothing else.

    librdkafka checks none of it: it reads `user:password@host:port` as a host name, and logs
    it, password and all, on every connection attempt (the destination's name would store it
    too), and it reads `host:x` as port 0 and `host:70000` as port 4464. The value is quoted
    in the error only without an `@`: with one, all before the last `@` is masked (a password
    may hold a comma, which would split it across two servers).
    """
    servers = [server.strip() for server in text.split(",")]
    if "@" in text:
        raise ValueError(
            f"{mask_userinfo(text)!r} holds user-info: expected host:port[,host:port...]; "
            "credentials go in --kafka-config sasl.username/sasl.password"
        )
    if not all(servers):
        raise ValueError(f"{text!r} has an empty entry: {BOOTSTRAP_EXPECTED}")
    for server in servers:
        problem = _bootstrap_server_problem(server)
        if problem:
            raise ValueError(f"{server!r} {problem}: {BOOTSTRAP_EXPECTED}")
    return ",".join(servers)


def _bootstrap_server_problem(server: str) -> str | None:
    """What is wrong with one bootstrap server, or None."""
    match = _BOOTSTRAP_SERVER.fullmatch(server)
    if match is None:
        with contextlib.suppress(ValueError):
            # librdkafka takes an IPv6 address without brackets, and then no port.
            ipaddress.IPv6Address(server.rpartition("://")[2])
            return _protocol_problem(server.rpartition("://")[0] or None)
        return "is not [PROTOCOL://]host[:port]"
    if match["ipv6"] is not None:
        try:
            ipaddress.IPv6Address(match["ipv6"])
        except ValueError:
            return "has no IPv6 address between its brackets"
    if match["port"] is not None and not 1 <= int(match["port"]) <= 65535:
        return "has a port outside 1-65535"
    return _protocol_problem(match["protocol"])


def _protocol_problem(protocol: str | None) -> str | None:
    if protocol is not None and protocol.lower() not in PROTOCOLS:
        return f"names no security protocol of librdkafka's ({', '.join(PROTOCOLS)})"
    return None


def _protocol(server: str) -> str | None:
    """The protocol a (checked) bootstrap server names, lower case; None if none."""
    protocol, sep, _ = server.partition("://")
    return protocol.lower() if sep else None


def compression(text: str) -> str:
    if text not in COMPRESSIONS:
        raise ValueError(f"{text!r} is not one of {', '.join(COMPRESSIONS)}")
    return text


def config_entry(text: str) -> tuple[str, str]:
    """One `KEY=VALUE` librdkafka property, checked by librdkafka itself."""
    key, sep, value = text.partition("=")
    key = key.strip()
    if not sep or not key:
        raise ValueError("expected KEY=VALUE, a librdkafka property such as security.protocol=ssl")
    if key in RESERVED_CONFIG:
        raise ValueError(f"{key} cannot be set here: {RESERVED_CONFIG[key]}")
    try:
        # Building a client checks the name and the value's syntax. No bootstrap servers: it
        # connects nowhere, and its log lines stay in a queue nobody polls.
        Producer({key: value, "logger": log})
    except (KafkaException, TypeError) as exc:
        reason = str(_error_of(exc).str() if isinstance(exc, KafkaException) else exc)
        # Errors only rd_kafka_new finds depend on the other properties (security.protocol
        # alone wants a SASL mechanism): the whole configuration is checked at start.
        if not reason.startswith("Failed to create producer"):
            if is_secret_name(key):
                reason = mask_values(reason, [value])
            raise ValueError(reason) from None
    return key, value


def message_timeout_ms(publish_timeout: float) -> int:
    """librdkafka's own deadline, under the worker's so that its verdict comes first.

    librdkafka looks for timed-out messages once a second, so its report may come up to a
    second late: 1.5 s of margin covers that for publish timeouts of 3 s and more.
    """
    margin = min(MESSAGE_TIMEOUT_MARGIN, publish_timeout / 2)
    return max(1, int((publish_timeout - margin) * 1000))


# -- the producer ----------------------------------------------------------------------------


class _Batch:
    """The delivery reports of messages produced together, on one producer.

    One callback serves the whole batch (no object per message): a success is only
    counted; a failure, rare, is placed by the outbox id at the start of the message's
    value (the envelope's first field: delivery reports carry the value, not the headers).
    A CloudEvent's value holds no id where it can be read cheaply: each of its messages gets
    a callback of its own that knows its place (`report_at`).
    The last report completes `future`. Reports run on the loop (its poll(0) calls), or on
    the thread closing the session; the future is touched on the loop alone.
    """

    __slots__ = (
        "_index",
        "_loop",
        "_loop_thread",
        "end",
        "failed",
        "first",
        "future",
        "messages",
        "produced",
        "reported",
        "results",
        "unplaced",
    )

    def __init__(
        self,
        messages: Sequence[Message],
        results: list[Any],
        first: int,
        loop: asyncio.AbstractEventLoop,
    ) -> None:
        self.messages = messages
        self.results = results  # the call's: None for a message produced and not failed
        self.first = self.end = first  # the slots [first, end) are this batch's
        self.produced = -1  # not known until every message of the batch is produced
        self.reported = 0
        self.failed = 0
        # A failure that could not be placed: every message of the batch is then in doubt.
        self.unplaced: KafkaError | None = None
        self.future: asyncio.Future[None] = loop.create_future()
        self._loop = loop
        self._loop_thread = threading.get_ident()  # made on the loop
        self._index: dict[int, int] | None = None

    def report(self, error: KafkaError | None, message: Any) -> None:
        # Inside poll() or flush(). Anything raised here would surface from them: a failure
        # that cannot be placed is kept, not raised. Called once per message: `_reported`
        # written out here, one Python call per report instead of two.
        if error is not None:
            self._place(error, message)
        self.reported += 1
        if self.reported == self.produced:
            self._reported_all()

    def report_at(self, index: int, error: KafkaError | None, message: Any) -> None:
        """`report` for the message at `index` of the call's results."""
        if error is not None:
            self.failed += 1
            self.results[index] = error
        self._reported()

    def _reported(self) -> None:
        self.reported += 1
        if self.reported == self.produced:
            self._reported_all()

    def _reported_all(self) -> None:
        if threading.get_ident() == self._loop_thread:
            self.complete()
        else:  # the thread closing the session
            with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits
                self._loop.call_soon_threadsafe(self.complete)

    def _place(self, error: KafkaError, message: Any) -> None:
        self.failed += 1
        try:
            value = message.value()
            outbox_id = int(value[6 : value.index(b",", 6)])  # {"id":123,...
            if self._index is None:
                self._index = {m.id: i for i, m in enumerate(self.messages)}
            self.results[self._index[outbox_id]] = error
        except Exception:
            self.unplaced = error

    def seal(self, end: int, produced: int) -> None:
        """Loop: every message of the batch was handed to librdkafka (or refused at once)."""
        self.end = end
        self.produced = produced
        if self.reported == produced:  # all reported already, or nothing produced
            self.complete()

    def complete(self) -> None:
        if not self.future.done():  # a batch past the publish timeout was cancelled
            self.future.set_result(None)

    def in_doubt(self, error: KafkaError) -> None:
        """Loop, once the batch is complete or its producer gone: if a report was lost or
        could not be placed, every message not known to have failed gets `error` (sent
        again: a duplicate at worst, never a message marked done that was not)."""
        if self.unplaced is None and self.reported >= self.produced:
            return
        results, error = self.results, self.unplaced or error
        doubtful = [i for i in range(self.first, self.end) if results[i] is None]
        log.warning(
            "kafka: a batch's delivery reports are missing or could not be placed; its %d "
            "messages not known to have failed are sent again (%s)", len(doubtful), error.str(),
        )  # fmt: skip
        for index in doubtful:
            results[index] = error
        self.failed += len(doubtful)
        self.unplaced, self.reported = None, self.produced  # told once


class _Session:
    """One librdkafka producer, polled by the event loop.

    A timer on the loop calls poll(0): every POLL_BUSY seconds while batches await their
    reports, every POLL_IDLE otherwise. The delivery callbacks only fill their batch's
    results; a batch's last report completes it.
    """

    def __init__(
        self,
        config: dict[str, Any],
        loop: asyncio.AbstractEventLoop,
        on_fatal: Callable[[_Session], object],
    ) -> None:
        self.producer = Producer(config)
        self.fatal: KafkaError | None = None
        self.loop = loop
        # Batches with reports still to come (the loop's alone: added when produced,
        # dropped once complete), so that a retired producer can end them.
        self.pending: set[_Batch] = set()
        self._on_fatal = on_fatal
        self._timer: asyncio.TimerHandle | None = loop.call_later(POLL_IDLE, self._poll)

    def track(self, batch: _Batch) -> None:
        if not batch.future.done():
            self.pending.add(batch)
            batch.future.add_done_callback(lambda _: self.pending.discard(batch))
            timer = self._timer
            if timer is not None and timer.when() > self.loop.time() + POLL_BUSY:
                timer.cancel()  # idle cadence: reports are now awaited
                self._timer = self.loop.call_later(POLL_BUSY, self._poll)

    def _poll(self) -> None:
        try:
            self.producer.poll(0)
        except Exception as exc:
            fatal = _fatal_in(exc)
            if fatal is None:
                log.error("kafka poll failed: %r", exc)
            elif self.fatal is None:
                self.fatal = fatal
                log.error("kafka producer fatal error: %s", fatal.str())
                self.loop.call_soon(self._on_fatal, self)
        if self._timer is not None:  # not stopped meanwhile
            self._timer = self.loop.call_later(POLL_BUSY if self.pending else POLL_IDLE, self._poll)

    def stop(self) -> None:
        """Loop: no more polling from the loop (close() then serves the reports)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def close(self, timeout: float) -> None:
        """Blocking, off the loop, after stop(): deliver what is queued within `timeout`,
        purge the rest."""
        try:
            left = self.producer.flush(timeout)
            if left:
                log.warning("kafka: %d messages not delivered within %.1fs, purged", left, timeout)
                self.producer.purge()
                self.producer.flush(1.0)  # serves the purged messages' delivery reports
        except KafkaException as exc:
            log.warning("kafka: flush on close failed: %s", _error_of(exc).str())
        # Producer.close() (confluent-kafka 2.13+) flushes without a bound, so only once empty;
        # otherwise, or on older versions, dropping the last reference destroys the client.
        close = getattr(self.producer, "close", None)
        if close is not None and len(self.producer) == 0:
            close()


class KafkaPublisher(PublisherBase):
    name = "kafka"
    batched = True
    options = (
        Option(
            "--kafka-bootstrap-servers",
            "host:port[,host:port...] of Kafka brokers (credentials go in --kafka-config)",
            convert=bootstrap_server_list,
            required=True,
        ),
        Option(
            "--kafka-topic",
            "topic template; placeholders {aggregate_type}, {aggregate_id}, {event_type} "
            "(default {aggregate_type})",
            convert=topic_template,
            default="{aggregate_type}",
        ),
        Option(
            "--kafka-compression",
            f"{', '.join(COMPRESSIONS)} (default none)",
            convert=compression,
            default="none",
        ),
        Option(
            "--kafka-config",
            "librdkafka property KEY=VALUE, e.g. security.protocol=sasl_ssl; values of keys "
            "naming a password, secret, key or token are never logged",
            convert=config_entry,
            repeatable=True,
            secret=True,
        ),
    )

    @classmethod
    def create(cls, values: dict[str, Any], context: PublisherContext) -> KafkaPublisher:
        publisher = cls(
            values["kafka_bootstrap_servers"],
            topic=values["kafka_topic"],
            compression=values["kafka_compression"],
            config=dict(values["kafka_config"]),
            publish_timeout=context.publish_timeout,
            client_id=context.owner,
            wire_format=context.format,
            source=context.cloudevents_source,
        )
        publisher.check_config()
        return publisher

    def __init__(
        self,
        bootstrap_servers: str,
        *,
        topic: str = "{aggregate_type}",
        compression: str = "none",
        config: dict[str, str] | None = None,
        publish_timeout: float = 10.0,
        client_id: str = "outbox-dispatcher",
        wire_format: str = ENVELOPE,
        source: str = "/outbox/outbox",
    ) -> None:
        # Checked here too, whoever makes the publisher: the destination's name is stored and
        # logged, and the servers are logged at start and by librdkafka, so none may hold
        # user-info (ValueError).
        bootstrap_servers = bootstrap_server_list(bootstrap_servers)
        self.destination = f"kafka {bootstrap_servers}"  # the cluster
        # The first bootstrap server: the span's `server.address` and `server.port`.
        self.server = server_of(bootstrap_servers.split(",")[0], default_port=9092)
        self.format = check_format(wire_format)
        self._cloudevents = CloudEvents(source)
        self._row_headers = kafka_headers()
        self.topic = self.destination_template = topic_template(topic)
        self._extra = dict(config or {})
        self._publish_timeout = publish_timeout
        # Defaults a passthrough property may change, then what this publisher relies on.
        self.config: dict[str, Any] = {
            "client.id": client_id,
            # Java's partitioner: a key lands on the partition Java producers would choose.
            "partitioner": "murmur2_random",
            **self._extra,
            "bootstrap.servers": bootstrap_servers,
            "enable.idempotence": True,
            "acks": "all",
            "compression.type": compression,
            "message.timeout.ms": message_timeout_ms(publish_timeout),
            "logger": log,  # librdkafka's log lines go through logging, served by poll()
        }
        self._session: _Session | None = None
        self._retiring: set[asyncio.Task[None]] = set()
        # Rendering a topic is three regex substitutions; messages of one aggregate type and
        # event type share theirs (and the aggregate id, when the template uses it).
        self._template = Template(self.topic, topic_name)
        self._by_id = self._template.by_id
        self._routes: dict[tuple[str, str, str], _Routing] = {}

    def check_config(self) -> None:
        """Raise SettingError if librdkafka refuses the whole configuration.

        Each --kafka-config entry was checked alone; this finds what depends on several (a
        SASL protocol without a usable mechanism, linger.ms beyond the message timeout, a
        missing certificate file). Without bootstrap servers the check connects nowhere.
        """
        # librdkafka drops, with a warning and no error, a server naming another protocol than
        # security.protocol's, and the servers after it: the worker would never connect.
        wanted = str(self.config.get("security.protocol", "plaintext")).lower()
        for server in str(self.config["bootstrap.servers"]).split(","):
            named = _protocol(server)
            if named is not None and named != wanted:
                raise SettingError(
                    f"--kafka-bootstrap-servers: {server!r} names {named.upper()} but "
                    f"security.protocol is {wanted} (--kafka-config security.protocol=...): "
                    "librdkafka would not connect to it"
                )
        config = {k: v for k, v in self.config.items() if k != "bootstrap.servers"}
        try:
            Producer(config)
        except KafkaException as exc:
            reason = mask_values(
                _error_of(exc).str(), [v for k, v in self._extra.items() if is_secret_name(k)]
            )
            raise SettingError(f"--kafka-config: {reason}") from None

    async def start(self) -> None:
        log.info(
            "kafka publisher: bootstrap %s, topic %s, compression %s, message timeout %sms, "
            "config %s", self.config["bootstrap.servers"], self.topic,
            self.config["compression.type"], self.config["message.timeout.ms"],
            redact_mapping(self._extra),
        )  # fmt: skip
        self._session = self._new_session()

    def _new_session(self) -> _Session:
        return _Session(self.config, asyncio.get_running_loop(), self._replace)

    def _replace(self, failed: _Session) -> None:
        """After a fatal error: a new producer for what comes next; the old one winds down."""
        if failed is not self._session:  # replaced already, or closed
            return
        log.warning("kafka: replacing the producer after a fatal error")
        self._session = self._new_session()
        task = asyncio.get_running_loop().create_task(self._retire(failed))
        self._retiring.add(task)
        task.add_done_callback(self._retiring.discard)

    async def _retire(self, session: _Session) -> None:
        session.stop()
        await asyncio.to_thread(session.close, RETIRE_FLUSH)
        # Every delivery report of the old producer was served before to_thread returned
        # (close() purges what it could not deliver, which reports it), and the batches they
        # completed were told first; a batch still short of reports has messages of unknown
        # fate: they are sent again.
        for batch in list(session.pending):
            batch.in_doubt(_UNKNOWN)
            batch.complete()
        session.pending.clear()

    def _live_session(self) -> _Session:
        assert self._session is not None, "start() first"
        if self._session.fatal is not None:
            self._replace(self._session)
        return self._session

    def destination_name(self, message: Message) -> str:
        """The topic a message goes to (its span's `messaging.destination.name`)."""
        route = self._routes.get(
            (
                message.aggregate_type,
                message.event_type,
                message.aggregate_id if self._by_id else "",
            )
        )
        return (route or self._routing(message))[0]

    def _routing(self, message: Message) -> _Routing:
        """The topic, and the event type and aggregate type headers, of a message (the
        headers as produce() takes them, made once per route)."""
        key = (
            message.aggregate_type,
            message.event_type,
            message.aggregate_id if self._by_id else "",
        )
        routing = self._routes.get(key)
        if routing is None:
            if len(self._routes) >= TOPIC_CACHE_SIZE:
                self._routes.clear()
            topic = render_topic(self._template, message)  # may raise: uncached
            routing = (
                topic,
                ("outbox-event-type", message.event_type.encode()),
                ("outbox-aggregate-type", message.aggregate_type.encode()),
            )
            self._routes[key] = routing
        return routing

    async def publish_batch(self, messages: Sequence[Message]) -> list[Exception | None]:
        """Produce every message, then wait for their delivery reports: a result per message,
        None when the broker acknowledged it, else its failure class."""
        results: list[Any] = [None] * len(messages)
        batches: list[tuple[_Session, _Batch]] = []
        start, replaced = 0, False
        while start < len(messages):
            session = self._live_session()
            batch = self._produce(session, messages, start, results, last_chance=replaced)
            batches.append((session, batch))
            start = batch.end
            if start < len(messages):
                # The producer turned fatal before a poll() told us: the rest once
                # more, on a new one.
                self._replace(session)
                replaced = True
        for session, batch in batches:
            await batch.future
            batch.in_doubt(_UNKNOWN)
            if batch.failed:
                for index in range(batch.first, batch.end):
                    error = results[index]
                    if isinstance(error, KafkaError):
                        if is_fatal(error):
                            self._replace(session)
                        results[index] = classify(error)
        return results

    def _produce(
        self,
        session: _Session,
        messages: Sequence[Message],
        start: int,
        results: list[Any],
        *,
        last_chance: bool,
    ) -> _Batch:
        """Hand messages from `start` on to the producer, until the end or until it turns
        out fatal (then the batch ends before that message, unless `last_chance`). A
        message refused at once gets its failure in `results` right away."""
        batch = _Batch(messages, results, start, session.loop)
        produce, report, routing = session.producer.produce, batch.report, self._routing
        routes, by_id, attempt_headers = self._routes, self._by_id, _ATTEMPT_HEADERS
        last_kind: tuple[str, str] | None = None
        route: _Routing = ("", ("", b""), ("", b""))  # replaced first: no kind is None
        produced, index, plain = 0, start, self.format == ENVELOPE
        try:
            for index in range(start, len(messages)):
                message = messages[index]
                try:
                    # The route of the message before when this one shares its types (a
                    # batch mostly does), else the route cache read here, the method only on
                    # a miss: per message, no key tuple to hash, no call, no header tuples.
                    kind = message.aggregate_type, message.event_type
                    if kind != last_kind or by_id:
                        route = routes.get(
                            (*kind, message.aggregate_id if by_id else "")
                        ) or routing(message)  # may raise: then not kept as the last
                        last_kind = kind
                    topic, event_type, aggregate_type = route
                    attempts = message.attempts
                    # produce() takes str as well as bytes for the value, the key and header
                    # values, and encodes it as UTF-8 in C: no bytes object per message.
                    headers: _Headers = [
                        ("outbox-id", str(message.id)),
                        event_type,
                        aggregate_type,
                        attempt_headers[attempts]
                        if attempts < len(attempt_headers)
                        else ("outbox-attempt", str(attempts).encode()),
                    ]
                    value: str | bytes
                    if plain and not message.headers:
                        value = envelope(message)
                    else:
                        value = self._encode(message, headers)
                    on_delivery = report if plain else partial(batch.report_at, index)
                    # Positional, as produce(topic, value, key, partition, on_delivery, None,
                    # timestamp, headers): keyword parsing was a tenth of the call.
                    produce(
                        topic,
                        value,
                        message.aggregate_id,
                        -1,  # the partitioner's choice
                        on_delivery,
                        None,
                        0,  # now
                        headers,
                    )
                except PermanentError as exc:  # the topic renders illegal, a header cannot go
                    results[index] = exc
                except BufferError:
                    results[index] = RetryableError(QUEUE_FULL)
                except KafkaException as exc:  # refused at once, e.g. over message.max.bytes
                    error = _error_of(exc)
                    if is_fatal(error) and not last_chance:
                        return batch  # `finally` ends the batch before this message
                    results[index] = classify(error)
                else:
                    produced += 1
            index = len(messages)
        finally:
            batch.seal(index, produced)
            session.track(batch)
        return batch

    def _encode(self, message: Message, headers: _Headers) -> bytes:
        """The value of a message in the chosen format, its headers completed: the format's,
        then the row's own (PermanentError if one cannot be sent)."""
        row = self._row_headers.of(message)
        value, attributes = encode(message, self.format, self._cloudevents, KAFKA)
        headers.extend(attributes)
        headers.extend(row)  # produce() encodes str header values as UTF-8
        return value

    async def close(self) -> None:
        if self._session is not None:
            session, self._session = self._session, None
            session.stop()
            await asyncio.to_thread(session.close, min(self._publish_timeout, MAX_CLOSE_FLUSH))
        if self._retiring:
            await asyncio.gather(*self._retiring, return_exceptions=True)
