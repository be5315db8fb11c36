"""The inbox as an aiohttp request handler.

    from psycopg_pool import AsyncConnectionPool
    from outbox.receiver.aiohttp import inbox_handler

    async def apply_payment(conn, delivery):
        event = delivery.json()
        await conn.execute("UPDATE accounts SET paid = paid + %s WHERE id = %s", (...))

    pool = AsyncConnectionPool(dsn, open=False)  # opened with the app, below

    async def database(app):
        await pool.open(wait=True)
        yield
        await pool.close()

    app.cleanup_ctx.append(database)
    app.router.add_post("/events", inbox_handler(apply_payment, connect=pool.connection,
                                                 consumer="billing"))

The handler runs in the transaction that records the message id (see
`outbox.receiver.http` for the id, the signature and every answer).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence

from aiohttp import web

from outbox import inbox
from outbox.receiver.core import DEFAULT_TRIES, AsyncConnect
from outbox.receiver.http import ABSORB, DEFAULT_MAX_BODY, Handler, HttpInbox, lower_headers
from outbox.table import Table

_CHUNK = 64 * 1024


def inbox_handler(
    handler: Handler,
    *,
    connect: AsyncConnect,
    consumer: str,
    table: str | Table = inbox.DEFAULT_INBOX_TABLE,
    secrets: Sequence[str] = (),
    max_body: int = DEFAULT_MAX_BODY,
    tries: int = DEFAULT_TRIES,
    replays: str = ABSORB,
) -> Callable[[web.Request], Awaitable[web.Response]]:
    """An aiohttp handler (for `router.add_post`) that applies each message once."""
    receiver = HttpInbox(
        handler,
        connect=connect,
        consumer=consumer,
        table=table,
        secrets=secrets,
        max_body=max_body,
        tries=tries,
        replays=replays,
    )

    async def receive(request: web.Request) -> web.Response:
        if request.content_length is not None and request.content_length > max_body:
            reply = receiver.too_large()
        else:
            body = bytearray()
            # Read in chunks, bounded: a chunked body has no length to refuse up front.
            while chunk := await request.content.read(_CHUNK):
                body += chunk
                if len(body) > max_body:
                    break
            headers = lower_headers(list(request.headers.items()))
            reply = await receiver.receive(headers, bytes(body))
        return web.Response(status=reply.status, body=reply.body, headers=dict(reply.headers))

    return receive


__all__ = ["inbox_handler"]
