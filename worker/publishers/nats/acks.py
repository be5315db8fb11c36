"""A batch's PubAcks: a verdict per message, gathered on the event loop."""

from __future__ import annotations

import asyncio

import nats.errors
from nats.aio.msg import Msg


class BatchAcks:
    """The PubAcks of one batch: a verdict per message (the PubAck `Msg`, or the exception
    that ended it) and one future, set once every message has its verdict. Only the event
    loop touches it: no future, task or timer per message."""

    __slots__ = ("future", "left", "subjects", "verdicts")

    def __init__(self, size: int, loop: asyncio.AbstractEventLoop) -> None:
        self.verdicts: list[Msg | Exception | None] = [None] * size
        self.subjects: list[str] = [""] * size
        self.left = 0  # sent, still without a verdict
        self.future: asyncio.Future[None] = loop.create_future()

    def decide(self, index: int, verdict: Msg | Exception) -> None:
        if self.verdicts[index] is None:
            self.verdicts[index] = verdict
            self.left -= 1
            if self.left == 0 and not self.future.done():
                self.future.set_result(None)

    def refuse(self, index: int, verdict: Exception, *, counted: bool = False) -> None:
        """A verdict for a message that never left (`counted` if it was in `left`). The
        batch is still being sent: the future is not set here, even if every message sent
        so far has its PubAck (the batch would end before the messages still to send)."""
        if self.verdicts[index] is None:
            self.verdicts[index] = verdict
            if counted:
                self.left -= 1

    def expire(self) -> None:
        """The ack timeout: every message still waiting gets no PubAck in time."""
        for index, verdict in enumerate(self.verdicts):
            if verdict is None:
                self.verdicts[index] = nats.errors.TimeoutError()
        self.left = 0
        if not self.future.done():
            self.future.set_result(None)
