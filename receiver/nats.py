"""The inbox for a NATS JetStream consumer: dedup on `Nats-Msg-Id`, ack after the commit.

    inbox = NatsInbox(apply_payment, connect=pool.connection, consumer="billing")
    sub = await js.pull_subscribe("outbox.>", durable="billing")
    await inbox.run(sub, stop)          # or, per message: await inbox.handle(msg)

The worker's nats publisher sets `Nats-Msg-Id` to the outbox id: the stream drops a
re-publish inside its duplicate window, and this drops what the window cannot (a re-publish
after it, and every redelivery of the consumer: an ack lost, a consumer that died before
acking, an `ack_wait` that ran out while the handler worked).

For each message: record the id and run the handler in one transaction, commit, then ack.
A crash before the commit leaves nothing and the message comes again after `ack_wait`; a
crash between the commit and the ack leaves the effect, and the redelivery is recognised,
not applied, and acked. A handler that raises rolls back and the message is nak'd (with a
delay) for redelivery; a message without `Nats-Msg-Id` cannot be de-duplicated and is
terminated (`term`: never redelivered), with an error logged. The consumer's `max_deliver`
bounds how often a message that always fails comes back.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from nats.aio.msg import Msg
from nats.js import JetStreamContext

from outbox import inbox
from outbox.receiver.core import DEFAULT_TRIES, Applied, AsyncConnect, AsyncConnection, apply_async
from outbox.table import Table

log = logging.getLogger("outbox.receiver")

ID_HEADER = "Nats-Msg-Id"  # what the worker's nats publisher sets to the outbox id
Handler = Callable[[AsyncConnection, Msg], Awaitable[None]]


class NatsInbox:
    def __init__(
        self,
        handler: Handler,
        *,
        connect: AsyncConnect,
        consumer: str,
        table: str | Table = inbox.DEFAULT_INBOX_TABLE,
        nak_delay: float = 1.0,
        tries: int = DEFAULT_TRIES,
    ) -> None:
        self.handler = handler
        self.connect = connect
        self.consumer = inbox.check_key("consumer", consumer)
        self.table = table if isinstance(table, Table) else Table.parse(table)
        self.nak_delay = nak_delay
        self.tries = tries

    async def apply(self, msg: Msg, message_id: str) -> Applied[None]:
        """Record and apply in one transaction, committed on return; no ack."""

        async def effect(conn: AsyncConnection) -> None:
            await self.handler(conn, msg)

        return await apply_async(
            self.connect,
            effect,
            consumer=self.consumer,
            message_id=message_id,
            table=self.table,
            tries=self.tries,
        )

    async def handle(self, msg: Msg) -> Applied[None] | None:
        """Apply one message once and acknowledge it after the commit; None when it was not
        applied (no id: terminated; the handler failed: nak'd)."""
        message_id = (msg.headers or {}).get(ID_HEADER, "")
        try:
            inbox.check_key("message id", message_id)
        except ValueError as exc:
            log.error(
                "NATS message on %s not applied (%s: %s): terminated", msg.subject, ID_HEADER, exc
            )
            await msg.term()
            return None
        try:
            applied = await self.apply(msg, message_id)
        except Exception:
            log.exception("NATS message %s: the handler failed; rolled back, nak'd", message_id)
            await msg.nak(delay=self.nak_delay)
            return None
        try:
            await msg.ack()
        except Exception as exc:  # the connection went away: JetStream will redeliver
            log.warning("NATS message %s applied, its ack failed (%s): the redelivery will be "
                        "found in the inbox", message_id, exc)  # fmt: skip
        return applied

    async def run(
        self,
        subscription: JetStreamContext.PullSubscription,
        stop: asyncio.Event,
        *,
        batch: int = 10,
        wait: float = 1.0,
    ) -> None:
        """Fetch and handle messages until `stop` is set (checked between fetches)."""
        while not stop.is_set():
            try:
                messages = await subscription.fetch(batch, timeout=wait)
            except TimeoutError:
                # Nothing came in time. nats-py raises its own TimeoutError here, and the
                # builtin one when the server's answer and the deadline meet (a stalled loop):
                # both mean "fetch again", never "stop consuming".
                continue
            for msg in messages:
                await self.handle(msg)


__all__ = ["ID_HEADER", "Handler", "NatsInbox"]
