"""A publisher plugin for the poison scenario, loaded by dotted path like any third-party
publisher: `--publisher chaos.plugins:CrashingHttpPublisher`.

It is the real http publisher, except that a message whose payload has `"crash": true`
kills the worker process on the spot (os._exit: no cleanup, no finalize), every time any
worker claims it: the poison that the attempt limit and reaping must stop.
"""

from __future__ import annotations

import os
from typing import Any

from outbox.worker.plugin import Message, PublisherContext
from outbox.worker.publishers.http import HttpPublisher

CRASH_EXIT_CODE = 70
CRASH_MARK = '"crash": true'  # as PostgreSQL renders the jsonb


class CrashingHttpPublisher(HttpPublisher):
    name = "crashing-http"
    options = HttpPublisher.options

    @classmethod
    def create(cls, values: dict[str, Any], context: PublisherContext) -> CrashingHttpPublisher:
        return cls(
            values["http_url"],
            owner=context.owner,
            headers=dict(values.get("http_header") or ()),
            max_connections=context.concurrency,
        )

    async def publish(self, message: Message) -> None:
        if CRASH_MARK in message.payload_json:
            os._exit(CRASH_EXIT_CODE)
        await super().publish(message)
