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

from confluent_kafka import KafkaError

from outbox.worker.publishers.kafka.config import (
    BOOTSTRAP_EXPECTED,
    COMPRESSIONS,
    PROTOCOLS,
    RESERVED_CONFIG,
    bootstrap_server_list,
    compression,
    config_entry,
    message_timeout_ms,
)
from outbox.worker.publishers.kafka.errors import (
    PERMANENT_CODES,
    RETRYABLE_CODES,
    classify,
    is_fatal,
)
from outbox.worker.publishers.kafka.publisher import QUEUE_FULL, KafkaPublisher
from outbox.worker.publishers.kafka.topics import (
    MAX_TOPIC_LENGTH,
    render_topic,
    topic_name,
    topic_template,
)

__all__ = [
    "BOOTSTRAP_EXPECTED",
    "COMPRESSIONS",
    "MAX_TOPIC_LENGTH",
    "PERMANENT_CODES",
    "PROTOCOLS",
    "QUEUE_FULL",
    "RESERVED_CONFIG",
    "RETRYABLE_CODES",
    "KafkaError",
    "KafkaPublisher",
    "bootstrap_server_list",
    "classify",
    "compression",
    "config_entry",
    "is_fatal",
    "message_timeout_ms",
    "render_topic",
    "topic_name",
    "topic_template",
]
