"""A publisher plugin for the publisher-bound benchmark: every publish takes 50 ms.

Loaded by dotted path, like any third-party publisher:
`outbox-worker --publisher bench.publishers:SlowPublisher --slow-publish-delay 50ms`.
"""

from __future__ import annotations

import asyncio
from typing import Any

from outbox.models import Message
from outbox.settings import parse_duration
from worker.publishers.registry import Option, PublisherContext


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
