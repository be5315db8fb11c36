"""Discards every message: measures the dispatcher itself, for benchmarks."""

from __future__ import annotations

from outbox.models import Message


class NullPublisher:
    name = "null"

    async def start(self) -> None:
        pass

    async def publish(self, message: Message) -> None:
        pass

    async def close(self) -> None:
        pass
