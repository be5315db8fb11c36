"""Publisher plugins for the benchmarks, loaded by dotted path like any third-party publisher.

`outbox-worker --publisher bench.publishers:SlowPublisher --slow-publish-delay 50ms`: every
publish takes 50 ms (the publisher-bound benchmark).
`outbox-worker --publisher bench.publishers:NullBatchPublisher`: discards every batch, so the
worker's batch path (claim, hold, take, outcomes, finalize) is measured alone.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from outbox.models import Message
from outbox.plumbing.durations import parse_duration
from outbox.publisher_options import Option
from outbox.worker.publishers.registry import PublisherContext


class SlowPublisher:
    name = "slow"
    options = (Option("--slow-publish-delay", "time one publish takes", convert=parse_duration),)

    def __init__(self, delay: float) -> None:
        self.delay = delay

    @classmethod
    def create(cls, values: dict[str, Any], context: PublisherContext) -> SlowPublisher:
        delay = values.get("slow_publish_delay")
        return cls(delay.total_seconds() if delay else 0.05)

    async def start(self) -> None: ...

    async def close(self) -> None: ...

    async def publish(self, message: Message) -> None:
        await asyncio.sleep(self.delay)


class NullBatchPublisher:
    """The null publisher as a batch publisher: what the batch path costs without a broker."""

    name = "null-batch"
    options: tuple[Option, ...] = ()

    @classmethod
    def create(cls, values: dict[str, Any], context: PublisherContext) -> NullBatchPublisher:
        return cls()

    async def start(self) -> None: ...

    async def close(self) -> None: ...

    async def publish_batch(self, messages: Sequence[Message]) -> list[Exception | None]:
        return [None] * len(messages)
