"""Produces each message to Kafka with librdkafka's idempotent producer (confluent-kafka).

What is sent: the topic rendered from `--kafka-topic` (default `{aggregate_type}`), key =
`aggregate_id` (one aggregate, one partition: its order is kept), value = the JSON envelope,
headers `outbox-id`, `outbox-event-type`, `outbox-aggregate-type`, `outbox-attempt`.
`enable.idempotence=true` and `acks=all`: librdkafka's own retries within one producer
session never duplicate or reorder; a re-publish after a lost lease does, so consumers
dedup by the `outbox-id` header.

A publish returns when the broker acknowledged the message. Delivery reports arrive on a
background thread that calls `poll()` and hands each result to the event loop; librdkafka
gives up on a message (`message.timeout.ms`) 1.5 s before the worker's publish timeout (half
of it if shorter), so a slow delivery ends with librdkafka's own verdict, not a blind timeout.

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

A topic name the template renders empty, `.` or `..` is permanent too.
Authentication and TLS failures are retryable: they are the worker's configuration, not the
message's fault. A *fatal* error (the idempotent producer lost its guarantees, e.g. a
sequence desynchronisation) makes the producer unusable: a new producer replaces it, the
messages it had in flight are retried, later ones go to the new producer.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import string
import threading
from collections.abc import Callable
from functools import partial
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Producer

from outbox.models import Message
from outbox.settings import SettingError
from outbox.worker.publishers.base import PermanentError, RetryableError
from outbox.worker.publishers.envelope import envelope
from outbox.worker.publishers.registry import Option, PublisherContext

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

TOPIC_PLACEHOLDERS = ("aggregate_type", "aggregate_id", "event_type")
MAX_TOPIC_LENGTH = 249
_ILLEGAL_TOPIC_CHARS = re.compile(r"[^a-zA-Z0-9._-]")
COMPRESSIONS = ("none", "gzip", "snappy", "lz4", "zstd")

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
# Values of keys containing any of these never appear in logs or errors.
_SENSITIVE = ("password", "secret", "key", "token", "oauthbearer.config")

# How much earlier than the worker's publish timeout librdkafka gives up on a message.
MESSAGE_TIMEOUT_MARGIN = 1.5

Headers = list[tuple[str, str | bytes | None]]

# Most seconds a producer replaced after a fatal error gets to finish what it has in flight.
RETIRE_FLUSH = 5.0
# Most seconds close() waits for queued messages before purging them.
MAX_CLOSE_FLUSH = 30.0
# How long the poll thread blocks in one poll(); also its reaction time to stop().
POLL_INTERVAL = 0.1
TOPIC_CACHE_SIZE = 4096  # rendered topics kept; emptied when full


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


def topic_template(text: str) -> str:
    """Validate a topic template: known placeholders only, legal characters around them."""
    if not text:
        raise ValueError("empty topic template")
    try:
        parts = list(string.Formatter().parse(text))
    except ValueError as exc:
        raise ValueError(f"{text!r}: {exc}") from None
    for literal, field, spec, conversion in parts:
        if _ILLEGAL_TOPIC_CHARS.search(literal):
            raise ValueError(
                f"{text!r} contains characters Kafka does not allow in topic names "
                "(allowed: a-z A-Z 0-9 . _ -)"
            )
        if field is None:
            continue
        if field not in TOPIC_PLACEHOLDERS:
            known = ", ".join(f"{{{name}}}" for name in TOPIC_PLACEHOLDERS)
            raise ValueError(f"{text!r}: unknown placeholder {{{field}}} (known: {known})")
        if spec or conversion:
            raise ValueError(f"{text!r}: write {{{field}}} without a conversion or format spec")
    return text


def render_topic(template: str, message: Message) -> str:
    """The topic for a message: placeholders filled with sanitized values, at most 249 chars.

    Characters Kafka does not allow become `_`; a name that is still not legal is permanent.
    """
    values = {
        name: _ILLEGAL_TOPIC_CHARS.sub("_", getattr(message, name)) for name in TOPIC_PLACEHOLDERS
    }
    topic = template.format_map(values)[:MAX_TOPIC_LENGTH]
    if topic in ("", ".", ".."):
        raise PermanentError(f"topic template {template!r} renders {topic!r}, not a legal topic")
    return topic


# -- settings --------------------------------------------------------------------------------


def is_sensitive(key: str) -> bool:
    return any(word in key.lower() for word in _SENSITIVE)


def redacted(config: dict[str, str]) -> dict[str, str]:
    return {k: "***" if is_sensitive(k) else v for k, v in config.items()}


def bootstrap_servers(text: str) -> str:
    servers = [s.strip() for s in text.split(",")]
    if not all(servers):
        raise ValueError(f"{text!r} is not a comma-separated list of host:port")
    return ",".join(servers)


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
            if is_sensitive(key) and value:
                reason = reason.replace(value, "***")
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


class _Session:
    """One librdkafka producer and the thread serving its delivery reports.

    Delivery callbacks run on the poll thread and only collect results; what one poll()
    served goes to the event loop in one call (one wake-up of the loop per batch, not per
    message). The futures are touched on the loop alone.
    """

    def __init__(
        self,
        config: dict[str, Any],
        loop: asyncio.AbstractEventLoop,
        on_fatal: Callable[[_Session], object],
    ) -> None:
        self.producer = Producer(config)
        self.fatal: KafkaError | None = None
        self.pending: set[asyncio.Future[KafkaError | None]] = set()
        # Delivery reports served by the current poll() or flush(), not yet on the loop.
        self._reports: list[tuple[asyncio.Future[KafkaError | None], KafkaError | None]] = []
        self._loop = loop
        self._on_fatal = on_fatal
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._poll, name="kafka-poll", daemon=True)
        self._thread.start()

    def produce(
        self, topic: str, key: bytes, value: bytes, headers: Headers
    ) -> asyncio.Future[KafkaError | None]:
        future: asyncio.Future[KafkaError | None] = self._loop.create_future()
        self.producer.produce(
            topic, value=value, key=key, headers=headers, on_delivery=partial(self._report, future)
        )
        self.pending.add(future)
        return future

    def _report(self, future: asyncio.Future[KafkaError | None], error: Any, _: Any) -> None:
        # Inside poll() or flush(). Anything raised here would surface from them: keep it
        # to an append, which cannot fail.
        self._reports.append((future, error))

    def _hand_over(self) -> None:
        """Poll thread (or the closing thread): the reports collected so far to the loop."""
        if self._reports:
            reports, self._reports = self._reports, []
            with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits any more
                self._loop.call_soon_threadsafe(self._settle, reports)

    def _settle(
        self, reports: list[tuple[asyncio.Future[KafkaError | None], KafkaError | None]]
    ) -> None:
        for future, error in reports:
            self.pending.discard(future)
            if not future.done():  # a publish that timed out has cancelled its future
                future.set_result(error)

    def _poll(self) -> None:
        while not self._stopping.is_set():
            try:
                self.producer.poll(POLL_INTERVAL)
            except Exception as exc:
                fatal = _fatal_in(exc)
                if fatal is None:
                    log.error("kafka poll failed: %r", exc)
                elif self.fatal is None:
                    self.fatal = fatal
                    log.error("kafka producer fatal error: %s", fatal.str())
                    with contextlib.suppress(RuntimeError):
                        self._loop.call_soon_threadsafe(self._on_fatal, self)
            finally:
                self._hand_over()

    def close(self, timeout: float) -> None:
        """Blocking: stop polling, deliver what is queued within `timeout`, purge the rest."""
        self._stopping.set()
        self._thread.join()
        try:
            left = self.producer.flush(timeout)
            if left:
                log.warning("kafka: %d messages not delivered within %.1fs, purged", left, timeout)
                self.producer.purge()
                self.producer.flush(1.0)  # serves the purged messages' delivery reports
        except KafkaException as exc:
            log.warning("kafka: flush on close failed: %s", _error_of(exc).str())
        finally:
            self._hand_over()  # the reports flush() served
        # Producer.close() (confluent-kafka 2.13+) flushes without a bound, so only once empty;
        # otherwise, or on older versions, dropping the last reference destroys the client.
        close = getattr(self.producer, "close", None)
        if close is not None and len(self.producer) == 0:
            close()


class KafkaPublisher:
    name = "kafka"
    options = (
        Option(
            "--kafka-bootstrap-servers",
            "host:port[,host:port...] of Kafka brokers",
            convert=bootstrap_servers,
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
    ) -> None:
        self.topic = topic_template(topic)
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
        self._by_id = "{aggregate_id}" in self.topic
        self._topics: dict[tuple[str, str, str], str] = {}

    def check_config(self) -> None:
        """Raise SettingError if librdkafka refuses the whole configuration.

        Each --kafka-config entry was checked alone; this finds what depends on several (a
        SASL protocol without a usable mechanism, linger.ms beyond the message timeout, a
        missing certificate file). Without bootstrap servers the check connects nowhere.
        """
        config = {k: v for k, v in self.config.items() if k != "bootstrap.servers"}
        try:
            Producer(config)
        except KafkaException as exc:
            reason = _error_of(exc).str()
            for key, value in self._extra.items():
                if is_sensitive(key) and value:
                    reason = reason.replace(value, "***")
            raise SettingError(f"--kafka-config: {reason}") from None

    async def start(self) -> None:
        log.info(
            "kafka publisher: bootstrap %s, topic %s, compression %s, message timeout %sms, "
            "config %s", self.config["bootstrap.servers"], self.topic,
            self.config["compression.type"], self.config["message.timeout.ms"],
            redacted(self._extra),
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
        await asyncio.to_thread(session.close, RETIRE_FLUSH)
        # Every delivery report of the old producer reached the loop before to_thread
        # returned; a message still without one has an unknown fate: it is sent again.
        unknown = KafkaError(KafkaError._FATAL, "producer replaced before delivery was reported")
        for future in session.pending:
            if not future.done():
                future.set_result(unknown)
        session.pending.clear()

    def _live_session(self) -> _Session:
        assert self._session is not None, "start() first"
        if self._session.fatal is not None:
            self._replace(self._session)
        return self._session

    def _produce(
        self, topic: str, key: bytes, value: bytes, headers: Headers
    ) -> tuple[_Session, asyncio.Future[KafkaError | None]]:
        session = self._live_session()
        try:
            return session, session.produce(topic, key, value, headers)
        except KafkaException as exc:
            if not is_fatal(_error_of(exc)):
                raise
        # The producer turned fatal before its poll thread told us: once more on a new one.
        self._replace(session)
        session = self._live_session()
        return session, session.produce(topic, key, value, headers)

    def _topic(self, message: Message) -> str:
        key = (
            message.aggregate_type,
            message.event_type,
            message.aggregate_id if self._by_id else "",
        )
        topic = self._topics.get(key)
        if topic is None:
            if len(self._topics) >= TOPIC_CACHE_SIZE:
                self._topics.clear()
            topic = self._topics[key] = render_topic(self.topic, message)  # may raise: uncached
        return topic

    async def publish(self, message: Message) -> None:
        topic = self._topic(message)
        headers: Headers = [
            ("outbox-id", str(message.id).encode()),
            ("outbox-event-type", message.event_type.encode()),
            ("outbox-aggregate-type", message.aggregate_type.encode()),
            ("outbox-attempt", str(message.attempts).encode()),
        ]
        try:
            session, delivered = self._produce(
                topic, message.aggregate_id.encode(), envelope(message).encode(), headers
            )
        except BufferError as exc:
            raise RetryableError(
                "Kafka _QUEUE_FULL: the local producer queue is full "
                "(queue.buffering.max.messages, queue.buffering.max.kbytes)"
            ) from exc
        except KafkaException as exc:  # refused at once, e.g. larger than message.max.bytes
            raise classify(_error_of(exc)) from exc
        error = await delivered
        if error is not None:
            if is_fatal(error):
                self._replace(session)
            raise classify(error)

    async def close(self) -> None:
        if self._session is not None:
            session, self._session = self._session, None
            await asyncio.to_thread(session.close, min(self._publish_timeout, MAX_CLOSE_FLUSH))
        if self._retiring:
            await asyncio.gather(*self._retiring, return_exceptions=True)
