"""The outbox table protocol: schema, producer API, lease operations, stats.

Applications need only the producer API::

    from outbox import enqueue, enqueue_many, Event, PayloadTooLarge

`InvalidHeaders` and `HeadersTooLarge` are the refusals of `headers=`, `NameTooLong` of a
name (event_type, aggregate_type, aggregate_id) past its limit; `OutOfPartitions` says a
partitioned table has no partition made for the next id yet (docs/partitioning.md).
"""

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
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

# Where each name of the producer API lives, imported when first asked for: importing the
# package itself loads nothing (psycopg included), so that `outbox.entry`, the command's
# entry point, runs before the command's imports and can take a Ctrl-C during them.
_HOMES = {
    **dict.fromkeys(("Event", "Message", "Outcome", "OutcomeKind", "Status"), "outbox.models"),
    **dict.fromkeys(
        (
            "HeadersTooLarge",
            "InvalidHeaders",
            "NameTooLong",
            "OutOfPartitions",
            "PayloadTooLarge",
            "enqueue",
            "enqueue_many",
        ),
        "outbox.producer",
    ),
    **dict.fromkeys(("SCHEMA_VERSION", "SchemaError", "migrate"), "outbox.schema"),
    **dict.fromkeys(("QueueStats", "queue_stats", "queue_stats_async", "rates"), "outbox.stats"),
    "Table": "outbox.table",
}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        # A submodule, as `import outbox; outbox.schema` found it when this file imported
        # the API's homes (and with them most of the package) at once.
        try:
            return import_module(f"outbox.{name}")
        except ModuleNotFoundError as exc:
            if exc.name != f"outbox.{name}":
                raise
        raise AttributeError(f"module 'outbox' has no attribute {name!r}")
    value = getattr(import_module(home), name)
    globals()[name] = value  # asked for once
    return value


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
