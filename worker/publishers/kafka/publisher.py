"""The Kafka publisher: messages produced in batches, a result per message."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from functools import partial
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Producer

from outbox.models import REPLAY_HEADER, Message
from outbox.plumbing.errors import SettingError
from outbox.plumbing.redact import is_secret_name, mask_values, redact_mapping
from outbox.publisher_options import Carried, Field, Option
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
from outbox.worker.publishers.kafka.config import (
    COMPRESSIONS,
    RESOURCE_CONFIG_KEYS,
    _protocol,
    bootstrap_server_list,
    compression,
    config_entry,
    message_timeout_ms,
)
from outbox.worker.publishers.kafka.errors import (
    _error_of,
    classify,
    is_fatal,
    log,
)
from outbox.worker.publishers.kafka.producer import (
    _UNKNOWN,
    _Batch,
    _Session,
)
from outbox.worker.publishers.kafka.topics import (
    TOPIC_CACHE_SIZE,
    render_topic,
    topic_name,
    topic_template,
)
from outbox.worker.publishers.registry import PublisherContext
from outbox.worker.publishers.template import Renderings, Template

# A message refused because librdkafka's own queue is full (BufferError from produce()).
QUEUE_FULL = (
    "Kafka _QUEUE_FULL: the local producer queue is full "
    "(queue.buffering.max.messages, queue.buffering.max.kbytes)"
)
# Most seconds a producer replaced after a fatal error gets to finish what it has in flight.
RETIRE_FLUSH = 5.0
# Most seconds close() waits for queued messages before purging them.
MAX_CLOSE_FLUSH = 30.0
_Headers = list[tuple[str, str | bytes | None]]  # what produce() takes
# The attempt header of the first attempts, made once: most messages go on their first.
_ATTEMPT_HEADERS = tuple(("outbox-attempt", str(n).encode()) for n in range(32))
# A route: the topic, and the event type and aggregate type headers.
_Routing = tuple[str, tuple[str, bytes], tuple[str, bytes]]


class KafkaPublisher(PublisherBase):
    name = "kafka"
    batched = True
    options = (
        Option(
            "--kafka-bootstrap-servers",
            "host:port[,host:port...] of Kafka brokers (credentials go in --kafka-config)",
            convert=bootstrap_server_list,
            required=True,
            fields=(Field("bootstrapServers"),),
        ),
        Option(
            "--kafka-topic",
            "topic template; placeholders {aggregate_type}, {aggregate_id}, {event_type} "
            "(default {aggregate_type})",
            convert=topic_template,
            default="{aggregate_type}",
            fields=(Field("topic"),),
        ),
        Option(
            "--kafka-compression",
            f"{', '.join(COMPRESSIONS)} (default none)",
            convert=compression,
            default="none",
            fields=(Field("compression"),),
        ),
        Option(
            "--kafka-config",
            "librdkafka property KEY=VALUE, e.g. security.protocol=sasl_ssl; values of keys "
            "naming a password, secret, key or token are never logged",
            convert=config_entry,
            repeatable=True,
            secret=True,
            fields=(
                Field("config", Carried.PAIRS, RESOURCE_CONFIG_KEYS),
                Field("configSecretRef", Carried.SECRET_KEY),
            ),
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
        self._routes = Renderings(self._template, self._route, TOPIC_CACHE_SIZE)

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
        return self._routes.of(message)[0]

    def _route(self, message: Message) -> _Routing:
        """The topic, and the event type and aggregate type headers, of a message (the
        headers as produce() takes them, made once per route)."""
        return (
            render_topic(self._template, message),  # may raise: then nothing is kept
            ("outbox-event-type", message.event_type.encode()),
            ("outbox-aggregate-type", message.aggregate_type.encode()),
        )

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
        produce, report, routing = session.producer.produce, batch.report, self._routes.of
        routes, by_id, attempt_headers = self._routes.kept, self._routes.by_id, _ATTEMPT_HEADERS
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
                    if message.replay is not None:
                        headers.append((REPLAY_HEADER, str(message.replay).encode()))
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
