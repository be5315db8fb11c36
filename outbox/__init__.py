"""The outbox table protocol: schema, producer API, lease operations, stats.

Applications need only the producer API::

    from outbox import enqueue, enqueue_many, Event, PayloadTooLarge

`InvalidHeaders` and `HeadersTooLarge` are the refusals of `headers=`, `NameTooLong` of a
name (event_type, aggregate_type, aggregate_id) past its limit; `OutOfPartitions` says a
partitioned table has no partition made for the next id yet (docs/partitioning.md).
"""

from outbox.models import Event, Message, Outcome, OutcomeKind, Status
from outbox.producer import (
    HeadersTooLarge,
    InvalidHeaders,
    NameTooLong,
    OutOfPartitions,
    PayloadTooLarge,
    enqueue,
    enqueue_many,
)
from outbox.schema import SCHEMA_VERSION, SchemaError, migrate
from outbox.stats import QueueStats, queue_stats, queue_stats_async, rates
from outbox.table import Table

__all__ = [
    "SCHEMA_VERSION",
    "Event",
    "HeadersTooLarge",
    "InvalidHeaders",
    "Message",
    "NameTooLong",
    "OutOfPartitions",
    "Outcome",
    "OutcomeKind",
    "PayloadTooLarge",
    "QueueStats",
    "SchemaError",
    "Status",
    "Table",
    "enqueue",
    "enqueue_many",
    "migrate",
    "queue_stats",
    "queue_stats_async",
    "rates",
]
