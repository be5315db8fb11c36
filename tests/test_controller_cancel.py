"""The operator's reconcile loops end when they are stopped, even when a cancellation was
dropped: on Python 3.11 `asyncio.wait_for` (the database pool's wait for a connection, and
other clients') drops one that comes together with its result (gh-86296), and a loop cancelled
once and waited for then held the operator's stop for ever."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from kubernetes.aio.client import ApiClient

from outbox.controller.handlers import Supervisor
from outbox.controller.kube import Kube
from outbox.controller.metrics import Metrics
from outbox.controller.reconcile import Context, DispatcherLoop
from outbox.controller.settings import load_settings
from outbox.controller.spec import DispatcherSpec

BODY: Mapping[str, Any] = {
    "apiVersion": "outbox.dev/v1alpha1",
    "kind": "OutboxDispatcher",
    "metadata": {"name": "orders", "namespace": "shop", "uid": "u-1", "generation": 1},
    "spec": {"database": {"dsnSecretRef": {"name": "db"}}, "publisher": {"type": "log"}},
}


@dataclass
class CountedPasses(DispatcherLoop):
    """A loop whose passes only count (no cluster, no database); the first, when
    `drop_first` is set, drops its cancellation as a pass waiting for a pooled connection
    may."""

    drop_first: bool = False
    passes: int = 0
    in_pass: asyncio.Event = field(default_factory=asyncio.Event)
    dropped: bool = False

    async def reconcile(self, spec: DispatcherSpec) -> None:
        self.passes += 1
        self.in_pass.set()
        if self.drop_first and not self.dropped:
            try:
                await asyncio.Event().wait()  # for a connection that does not come
            except asyncio.CancelledError:
                self.dropped = True
        self.memory.reconciled_generation = spec.generation


async def _context() -> tuple[Context, ApiClient]:
    api = ApiClient()
    settings = load_settings([], {"POD_NAMESPACE": "ns"})
    return Context(settings, Kube(api, lambda: None, "test"), Metrics()), api


async def test_a_loop_cancelled_as_it_is_woken_ends():
    context, api = await _context()
    try:
        loop = CountedPasses(context, BODY)
        running = asyncio.create_task(loop.run())
        await loop.in_pass.wait()
        await asyncio.sleep(0)  # the loop waits for its next pass
        loop.update({**BODY, "metadata": {**BODY["metadata"], "generation": 2}})  # wakes it
        running.cancel()
        done, _ = await asyncio.wait({running}, timeout=2)
    finally:
        await api.close()  # type: ignore[no-untyped-call]
    assert done and running.cancelled()


async def _serving(
    supervisor: Supervisor, context: Context
) -> tuple[CountedPasses, asyncio.Task[None]]:
    loop = CountedPasses(context, BODY, drop_first=True)
    running = asyncio.create_task(loop.run())
    supervisor._loops["shop", "orders"] = (loop, running)
    await loop.in_pass.wait()
    return loop, running


async def test_the_operators_stop_ends_a_loop_that_dropped_its_cancellation():
    context, api = await _context()
    supervisor = Supervisor(context)
    try:
        loop, running = await _serving(supervisor, context)
        async with asyncio.timeout(5):
            await supervisor.close()
    finally:
        await api.close()  # type: ignore[no-untyped-call]
    assert loop.dropped and running.cancelled()


async def test_a_deleted_resources_loop_that_dropped_its_cancellation_ends():
    context, api = await _context()
    supervisor = Supervisor(context)
    try:
        loop, running = await _serving(supervisor, context)
        supervisor.on_event("DELETED", BODY)
        done, _ = await asyncio.wait({running}, timeout=5)
        assert done and running.cancelled() and loop.dropped
        await supervisor.close()
    finally:
        await api.close()  # type: ignore[no-untyped-call]
