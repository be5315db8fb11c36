"""Discards every message: measures the dispatcher itself, for benchmarks."""

from __future__ import annotations

from typing import Any

from outbox.models import Message
from outbox.publisher_options import Option
from outbox.worker.publishers.base import PublisherBase
from outbox.worker.publishers.registry import PublisherContext


class NullPublisher(PublisherBase):
    name = "null"
    options: tuple[Option, ...] = ()

    @classmethod
    def create(cls, values: dict[str, Any], context: PublisherContext) -> NullPublisher:
        return cls()

    async def start(self) -> None:
        pass

    async def publish(self, message: Message) -> None:
        pass

    async def close(self) -> None:
        pass
