"""Publisher plugins for the benchmarks, loaded by dotted path like any third-party publisher.

`outbox-worker --publisher bench.publishers:SlowPublisher --slow-publish-delay 50ms`: every
publish takes 50 ms (the publisher-bound benchmark).
`outbox-worker --publisher bench.publishers:TimingPublisher --timing-out FILE`: notes when each
message reached the publisher, written to FILE on shutdown (latency, measured where pgqueuer's
is: at the call into the application's code).
`outbox-worker --publisher bench.publishers:NullBatchPublisher`: discards every batch, so the
worker's batch path (claim, hold, take, outcomes, finalize) is measured alone.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from outbox.durations import parse_duration
from outbox.models import Message
from outbox.worker.publishers.registry import Option, PublisherContext


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


class TimingPublisher:
    """Records time.time() per payload `n` at publish; a no-op otherwise."""

    name = "timing"
    options = (
        Option("--timing-out", "JSON file written on shutdown", convert=Path, required=True),
    )

    def __init__(self, out: Path) -> None:
        self.out = out
        self.reached: dict[int, float] = {}

    @classmethod
    def create(cls, values: dict[str, Any], context: PublisherContext) -> TimingPublisher:
        return cls(values["timing_out"])

    async def start(self) -> None: ...

    async def close(self) -> None:
        self.out.write_text(json.dumps(self.reached))

    async def publish(self, message: Message) -> None:
        self.reached.setdefault(int(json.loads(message.payload_json)["n"]), time.time())


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
