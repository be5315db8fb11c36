"""The downstream under test control: the project's recording sink, with a script that also
knows which worker sent each request, so it can act on that worker (SIGKILL or SIGSTOP it
mid-request, i.e. after it published and before it finalized). Given `apply`, it applies what
it accepts through the inbox before answering (the demo's `InboxEffects`)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler
from typing import Any

from outbox.demo.sink import Apply, Reply, Sink


@dataclass(frozen=True)
class Call:
    body: dict[str, Any]
    nth: int  # nth request for this Idempotency-Key
    worker: str | None  # Outbox-Worker
    key: str | None  # Idempotency-Key


Script = Callable[[Call], Reply]


def always_ok(call: Call) -> Reply:
    return Reply()


class ChaosSink(Sink):
    def __init__(self, script: Script = always_ok, *, apply: Apply | None = None) -> None:
        self.script = script
        self._local = threading.local()
        super().__init__(self._route, apply=apply)

    def _route(self, body: dict[str, Any], nth: int) -> Reply:
        headers = self._local.headers
        call = Call(body, nth, headers.get("Outbox-Worker"), headers.get("Idempotency-Key"))
        return self.script(call)

    def _answer(self, handler: BaseHTTPRequestHandler) -> None:
        # The sink's behaviour sees only (body, nth); the headers travel beside it.
        self._local.headers = handler.headers
        super()._answer(handler)
