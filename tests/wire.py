"""What reached the other end: a real aiohttp HTTP receiver that records every request, and
rows dispatched through a real worker (in this process) to it."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass

from aiohttp import web
from multidict import CIMultiDict

from outbox.demo.embedded import free_port


@dataclass
class Received:
    method: str
    raw_path: str
    headers: CIMultiDict[str]
    body: bytes


class Receiver:
    """An HTTP server on a free port: records each request, answers with `answer(n)`'s status
    for the n-th request (0-based; 200 when not given)."""

    def __init__(self, answer: Callable[[int], int] | None = None) -> None:
        self.port = free_port()
        self.requests: list[Received] = []
        self._answer = answer or (lambda _: 200)
        self._arrived = asyncio.Condition()
        self._runner: web.AppRunner | None = None

    @property
    def origin(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def url(self) -> str:
        return f"{self.origin}/hooks"

    async def __aenter__(self) -> Receiver:
        async def handle(request: web.Request) -> web.Response:
            body = await request.read()
            n = len(self.requests)
            self.requests.append(
                Received(request.method, request.raw_path, CIMultiDict(request.headers), body)
            )
            async with self._arrived:
                self._arrived.notify_all()
            return web.Response(status=self._answer(n), text="ok")

        app = web.Application()
        # Any path, decoded CR and LF included (a `.*` route would answer them 404).
        app.router.add_route("*", r"/{tail:[\s\S]*}", handle)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", self.port).start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._runner is not None
        await self._runner.cleanup()

    async def wait_for(self, count: int, timeout: float = 30.0) -> list[Received]:
        async with self._arrived:
            await asyncio.wait_for(
                self._arrived.wait_for(lambda: len(self.requests) >= count), timeout
            )
        return self.requests
