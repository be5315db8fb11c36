"""The inbox for a Kafka consumer (confluent-kafka): dedup on the `outbox-id` header, the
offset stored only after the database commit.

    consumer = Consumer({"bootstrap.servers": ..., "group.id": "billing",
                         "enable.auto.offset.store": False})   # required
    consumer.subscribe(["order"])
    KafkaInbox(consumer, conn, apply_payment, consumer_name="billing").run(stop)

For each message: record its outbox id and run the handler in one transaction on `conn`,
commit, then `store_offsets` (librdkafka commits stored offsets in the background, every
`auto.commit.interval.ms`, and on `close()`). The offset is never ahead of the database.

What a crash means, by where it happens:

| the consumer dies                | after a restart, the message is               |
|----------------------------------|-----------------------------------------------|
| before the database commit       | read again and applied (nothing was left)     |
| after it, before the offset commit (stored or not) | read again, found in the inbox, skipped |
| after the offset commit          | not read again                                |

So a crash costs re-reading the messages since the last committed offset (up to
`auto.commit.interval.ms` of them), never a second effect. The worker itself writes a
message twice to the topic after a lost lease; those duplicates are dropped the same way.

A handler that raises rolls back and `run` (or `process`) raises: the offset of that message
is not stored, so a consumer that stops there and is started again resumes at it. Moving on
to the next message would store an offset past it and lose it. A message without the id
header cannot be de-duplicated: it is skipped (its offset stored) with an error logged.
`enable.auto.offset.store` must be false: with it, librdkafka would store each offset when
the message is handed over, before its effect commits (a crash would then lose it);
`store_offsets` refuses to run then, and so does this, before the first message's effect.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

import psycopg
from confluent_kafka import Consumer, KafkaError, KafkaException, Message, TopicPartition

from outbox import inbox
from outbox.receiver.core import DEFAULT_TRIES, Applied, apply
from outbox.table import Table

log = logging.getLogger("outbox.receiver")

ID_HEADER = "outbox-id"  # what the worker's kafka publisher sets to the outbox id
Handler = Callable[[psycopg.Connection[Any], Message], None]


class ConfigError(RuntimeError):
    """The consumer would store offsets before the effects commit."""


class KafkaInbox:
    def __init__(
        self,
        consumer: Consumer,
        conn: psycopg.Connection[Any],
        handler: Handler,
        *,
        consumer_name: str,
        table: str | Table = inbox.DEFAULT_INBOX_TABLE,
        id_header: str = ID_HEADER,
        tries: int = DEFAULT_TRIES,
    ) -> None:
        self.consumer = consumer
        self.conn = conn
        self.handler = handler
        self.consumer_name = inbox.check_key("consumer", consumer_name)
        self.table = table if isinstance(table, Table) else Table.parse(table)
        self.id_header = id_header
        self.tries = tries
        self._checked = False

    def message_id(self, message: Message) -> str | None:
        raw = message.headers() or []
        # A consumed message's headers are a list of pairs; the typing allows a dict too.
        for name, value in raw.items() if isinstance(raw, dict) else raw:
            if name == self.id_header and value is not None:
                text = value.decode() if isinstance(value, bytes) else str(value)
                try:
                    return inbox.check_key("message id", text)
                except ValueError:
                    return None
        return None

    def process(self, message: Message) -> Applied[None] | None:
        """Apply one consumed message once, then store its offset; None if it was skipped
        (no id). Raises what the handler raised (nothing stored)."""
        if not self._checked:
            # Storing this message's own offset (where to resume: at it) changes nothing, and
            # fails if the consumer stores offsets by itself: found before any effect.
            self._store(message, at_itself=True)
            self._checked = True
        message_id = self.message_id(message)
        if message_id is None:
            log.error(
                "Kafka message %s[%s]@%s has no usable %s header: skipped",
                message.topic(),
                message.partition(),
                message.offset(),
                self.id_header,
            )
            self._store(message)
            return None
        applied = apply(
            self.conn,
            lambda conn: self.handler(conn, message),
            consumer=self.consumer_name,
            message_id=message_id,
            table=self.table,
            tries=self.tries,
        )
        self._store(message)
        return applied

    def _store(self, message: Message, *, at_itself: bool = False) -> None:
        """Store the offset after `message` (or its own, `at_itself`) for librdkafka to
        commit."""
        try:
            if not at_itself:
                self.consumer.store_offsets(message=message)
            else:
                topic, partition, offset = message.topic(), message.partition(), message.offset()
                assert topic is not None and partition is not None and offset is not None
                at = TopicPartition(topic, partition, offset)
                self.consumer.store_offsets(offsets=[at])
        except KafkaException as exc:
            if exc.args and exc.args[0].code() == KafkaError._INVALID_ARG:
                raise ConfigError(
                    "the consumer stores offsets by itself: create it with "
                    '"enable.auto.offset.store": False, or a crash would lose messages'
                ) from exc
            raise

    def run(self, stop: threading.Event, *, poll: float = 0.5) -> None:
        """Poll and process until `stop` is set. Raises on a consumer error or a handler
        failure (see the module's docstring)."""
        while not stop.is_set():
            message = self.consumer.poll(poll)
            if message is None:
                continue
            error = message.error()
            if error is not None:
                if error.code() == KafkaError._PARTITION_EOF:
                    continue
                raise KafkaException(error)
            self.process(message)


__all__ = ["ID_HEADER", "ConfigError", "Handler", "KafkaInbox"]
