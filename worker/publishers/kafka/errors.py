"""librdkafka's errors as the worker's failure classes (the table is the package's)."""

from __future__ import annotations

import logging

from confluent_kafka import KafkaError, KafkaException

from outbox.worker.publishers.base import (
    PermanentError,
    RetryableError,
)

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
