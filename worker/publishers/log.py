"""Writes each message as one JSON line to stdout: for trying things out and for piping."""

from __future__ import annotations

import sys
from typing import Any, TextIO

from outbox.models import Message
from outbox.publisher_options import Option
from outbox.worker.publishers.base import PublisherBase
from outbox.worker.publishers.envelope import envelope
from outbox.worker.publishers.registry import PublisherContext


class LogPublisher(PublisherBase):
    name = "log"
    options: tuple[Option, ...] = ()

    @classmethod
    def create(cls, values: dict[str, Any], context: PublisherContext) -> LogPublisher:
        return cls()

    def __init__(self, stream: TextIO | None = None) -> None:
        self._stream = stream or sys.stdout

    async def start(self) -> None:
        pass

    async def publish(self, message: Message) -> None:
        self._stream.write(envelope(message) + "\n")
        self._stream.flush()

    async def close(self) -> None:
        pass
