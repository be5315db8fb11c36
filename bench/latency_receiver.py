"""The latency benchmark's receiver: a fast HTTP endpoint in a process of its own that notes
when each request's first byte arrived, on the producer's clock.

python -m bench.latency_receiver PORT

POST /events   answers 200 at once; the arrival is keyed by the request's Idempotency-Key
GET  /results  {"arrivals": {key: [first_byte_ns, handler_ns]}, "duplicates": n}, and forgets
               them (the next run starts empty)
GET  /count    how many distinct keys arrived so far

Times are `time.time_ns()`: CLOCK_REALTIME, the clock the producer reads right after its
commit returns, and one clock for every process on one machine. The first byte is noted when
the connection's `data_received` is handed a chunk that starts a request (b"POST "), before
aiohttp parses it; the handler's own start is kept beside it, so the receiver's share of the
figure (parsing, scheduling its task) is measured too, and the report shows it is small.
aiohttp's low-level server on uvloop, no routing table, no access log: a receiver that is
not the bottleneck (Python's thread-per-connection http.server added a tail of its own of
20-35 ms even at 100 messages/s).
"""

from __future__ import annotations

import asyncio
import collections
import json
import signal
import sys
import time
from typing import Any

from aiohttp import web
from aiohttp.web_protocol import RequestHandler

from bench.env import uvloop_run

_now = time.time_ns


class _Stamping(RequestHandler):
    """aiohttp's connection protocol, noting when each request's first chunk came in. A
    client sends one request at a time on a connection (aiohttp's does not pipeline), so the
    handler of the connection's next request takes the oldest note."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.first_bytes: collections.deque[int] = collections.deque()

    def data_received(self, data: bytes) -> None:
        if data[:5] == b"POST ":
            self.first_bytes.append(_now())
        super().data_received(data)


class _Server(web.Server):
    def __call__(self) -> RequestHandler:
        return _Stamping(self, loop=self._loop, **self._kwargs)


class Receiver:
    def __init__(self) -> None:
        self.arrivals: dict[str, tuple[int, int]] = {}
        self.duplicates = 0

    async def handle(self, request: web.BaseRequest) -> web.StreamResponse:
        handler_ns = _now()
        if request.method == "POST":
            protocol = request.protocol
            assert isinstance(protocol, _Stamping)
            notes = protocol.first_bytes
            first_ns = notes.popleft() if notes else handler_ns
            key = request.headers.get("Idempotency-Key", "")
            if key in self.arrivals:
                self.duplicates += 1
            else:
                self.arrivals[key] = (first_ns, handler_ns)
            await request.read()
            return web.Response(text="{}", content_type="application/json")
        if request.path == "/count":
            return web.Response(text=str(len(self.arrivals)))
        body = {"arrivals": self.arrivals, "duplicates": self.duplicates}
        self.arrivals, self.duplicates = {}, 0
        return web.Response(text=json.dumps(body), content_type="application/json")


async def serve(port: int) -> None:
    receiver = Receiver()
    loop = asyncio.get_running_loop()
    server = await loop.create_server(
        _Server(receiver.handle, access_log=None), "127.0.0.1", port, backlog=1024
    )
    stop = asyncio.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    await stop.wait()
    server.close()


if __name__ == "__main__":
    uvloop_run(serve(int(sys.argv[1])))
