"""The inbox as a plain ASGI application: Starlette, FastAPI, or any ASGI server.

    from psycopg_pool import AsyncConnectionPool
    from outbox.receiver.asgi import InboxEndpoint

    pool = AsyncConnectionPool(dsn, open=False)  # opened by the app's lifespan, below
    events = InboxEndpoint(apply_payment, connect=pool.connection, consumer="billing")

    @asynccontextmanager
    async def lifespan(app):
        await pool.open(wait=True)
        yield
        await pool.close()

    app = FastAPI(lifespan=lifespan)              # or Starlette(lifespan=lifespan)
    app.mount("/events", events)

It answers POST (405 otherwise) and runs the handler in the transaction that records the
message id (see `outbox.receiver.http` for the id, the signature and every answer). No
framework is imported: the request is read from the ASGI messages themselves.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping, Sequence
from typing import Any

from outbox import inbox
from outbox.receiver.core import DEFAULT_TRIES, AsyncConnect
from outbox.receiver.http import (
    ABSORB,
    DEFAULT_MAX_BODY,
    Handler,
    HttpInbox,
    Reply,
    lower_headers,
)
from outbox.table import Table

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]


class InboxEndpoint:
    """An ASGI app that applies each POSTed message once."""

    def __init__(
        self,
        handler: Handler,
        *,
        connect: AsyncConnect,
        consumer: str,
        table: str | Table = inbox.DEFAULT_INBOX_TABLE,
        secrets: Sequence[str] = (),
        max_body: int = DEFAULT_MAX_BODY,
        tries: int = DEFAULT_TRIES,
        replays: str = ABSORB,
    ) -> None:
        self.inbox = HttpInbox(
            handler,
            connect=connect,
            consumer=consumer,
            table=table,
            secrets=secrets,
            max_body=max_body,
            tries=tries,
            replays=replays,
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":  # served alone: nothing to start or stop
            await _lifespan(receive, send)
            return
        if scope["type"] != "http":
            raise RuntimeError(f"InboxEndpoint serves HTTP, not {scope['type']}")
        if scope["method"] != "POST":
            await _answer(send, Reply(405, b"POST only\n", {"Allow": "POST"}))
            return
        headers = lower_headers(
            [(name.decode("latin-1"), value.decode("latin-1")) for name, value in scope["headers"]]
        )
        body = await _body(receive, self.inbox.max_body)
        if body is None:
            return  # the client went away: nobody to answer
        if len(body) > self.inbox.max_body:
            await _answer(send, self.inbox.too_large())
            return
        await _answer(send, await self.inbox.receive(headers, body))


async def _body(receive: Receive, limit: int) -> bytes | None:
    """The request body; reading stops just past `limit`. None if the client disconnected."""
    body = bytearray()
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        body += message.get("body", b"")
        if len(body) > limit or not message.get("more_body", False):
            return bytes(body)


async def _answer(send: Send, reply: Reply) -> None:
    headers = [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in reply.headers.items()]
    if reply.status not in (204, 304):  # those have no body, and no length either (RFC 9110)
        headers.append((b"content-length", str(len(reply.body)).encode()))
    await send({"type": "http.response.start", "status": reply.status, "headers": headers})
    await send({"type": "http.response.body", "body": reply.body})


async def _lifespan(receive: Receive, send: Send) -> None:
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return


__all__ = ["InboxEndpoint"]
