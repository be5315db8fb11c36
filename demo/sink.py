"""A recording HTTP receiver: the demo's downstream API and the tests' real HTTP server.

It accepts the http publisher's POSTs, records every request (Idempotency-Key, the worker
that sent it, the status it answered, when), and answers what a `behaviour` function decides:
a status, optional headers and an optional delay. Deliveries are the requests answered 2xx.

Given `apply` (the demo's `InboxEffects.apply`), it is also a receiver that applies what it
accepts: before a 2xx goes out, the message is applied through the inbox, and the request
records whether it was the first delivery or a duplicate the inbox absorbed.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass(frozen=True)
class Reply:
    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    delay: float = 0.0  # seconds before answering (a slow downstream)


@dataclass(frozen=True)
class Request:
    key: str | None  # Idempotency-Key
    worker: str | None  # Outbox-Worker
    attempt: int
    body: dict[str, Any]
    headers: dict[str, str]
    status: int
    received: float  # time.monotonic() at arrival
    answered: float
    # time.time() at arrival: the clock the database's now() reads, taken then (an offset
    # between the two clocks taken once goes stale if the wall clock is stepped, as a
    # paused and resumed virtual machine's is).
    received_at: float = 0.0
    # With `apply`: True if this delivery applied the message, False if the inbox found it
    # applied already (a duplicate absorbed); None when nothing was applied (not 2xx).
    applied: bool | None = None


class _QuietServer(ThreadingHTTPServer):
    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # clients that die or time out mid-request are part of the scenarios


Behaviour = Callable[[dict[str, Any], int], Reply]  # (body, nth request for this key) -> reply
# (message id) -> True if applied now, False for a duplicate; runs before the 2xx is sent.
Apply = Callable[[str], bool]


def always_ok(body: dict[str, Any], nth: int) -> Reply:
    return Reply()


class Sink:
    def __init__(
        self,
        behaviour: Behaviour = always_ok,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        apply: Apply | None = None,
    ) -> None:
        self.behaviour = behaviour
        self.apply = apply
        self.requests: list[Request] = []
        self._seen: dict[str, int] = {}
        # Requests arrived and not yet recorded: a delayed reply is recorded only after it
        # is answered, seconds after its effect was applied (see `wait_idle`).
        self._in_flight = 0
        self._changed = threading.Condition()
        self._server = _QuietServer((host, port), self._handler_class())
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}/events"

    def start(self) -> Sink:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> Sink:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- what it saw --------------------------------------------------------------------------

    def delivered(self) -> list[Request]:
        with self._changed:
            return [r for r in self.requests if 200 <= r.status < 300]

    def delivered_ids(self) -> list[int]:
        return [int(r.body["id"]) for r in self.delivered()]

    def wait_for(self, predicate: Callable[[Sink], bool], timeout: float = 30.0) -> bool:
        """Block until predicate(sink) holds (checked on every request), or the timeout."""
        with self._changed:
            return self._changed.wait_for(lambda: predicate(self), timeout)

    def wait_idle(self, timeout: float = 30.0) -> bool:
        """Block until every request that arrived is answered and recorded, or the timeout.
        A snapshot of `requests` taken earlier can miss a delayed reply whose effect is
        already applied (a duplicate after it would then look absorbed with no first)."""
        with self._changed:
            return self._changed.wait_for(lambda: self._in_flight == 0, timeout)

    # -- serving ------------------------------------------------------------------------------

    def _answer(self, handler: BaseHTTPRequestHandler) -> None:
        received, received_at = time.monotonic(), time.time()
        with self._changed:
            self._in_flight += 1
        try:
            self._serve(handler, received, received_at)
        finally:
            with self._changed:
                self._in_flight -= 1
                self._changed.notify_all()

    def _serve(self, handler: BaseHTTPRequestHandler, received: float, received_at: float) -> None:
        length = int(handler.headers.get("Content-Length") or 0)
        raw = handler.rfile.read(length)
        try:
            body = json.loads(raw)
        except (ValueError, RecursionError):  # RecursionError: nested deeper than json parses
            body = {"invalid": raw.decode("utf-8", "replace")}
        key = handler.headers.get("Idempotency-Key")
        with self._changed:
            nth = self._seen[key or ""] = self._seen.get(key or "", 0) + 1
        reply = self.behaviour(body, nth)
        applied: bool | None = None
        if self.apply is not None and 200 <= reply.status < 300:
            # The effect commits before the answer: a late answer or a sender killed before
            # it read it leaves the effect applied, and the retry is a duplicate.
            if key is None:
                reply = Reply(400)  # no id, no de-duplication: the sender's to fix
            else:
                try:
                    applied = self.apply(key)
                except Exception:
                    reply = Reply(500)  # rolled back: the sender retries
        if reply.delay:
            time.sleep(reply.delay)  # the slow downstream being simulated
        payload = json.dumps({"status": reply.status}).encode()
        try:
            handler.send_response(reply.status)
            for name, value in reply.headers.items():
                handler.send_header(name, value)
            handler.send_header("Content-Type", "application/json")
            handler.send_header("Content-Length", str(len(payload)))
            handler.end_headers()
            handler.wfile.write(payload)
        except OSError:
            pass  # the client gave up (publish timeout): we still record what we did
        with self._changed:
            self.requests.append(
                Request(
                    key=key,
                    worker=handler.headers.get("Outbox-Worker"),
                    attempt=int(handler.headers.get("Outbox-Attempt") or 0),
                    body=body,
                    headers=dict(handler.headers.items()),
                    status=reply.status,
                    received=received,
                    answered=time.monotonic(),
                    received_at=received_at,
                    applied=applied,
                )
            )
            self._changed.notify_all()

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        sink = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive, as real APIs do
            # Headers and body go out in separate writes: without TCP_NODELAY, Nagle's
            # algorithm and the client's delayed ACK add ~40 ms to every reply.
            disable_nagle_algorithm = True

            def do_POST(self) -> None:
                sink._answer(self)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        return Handler
