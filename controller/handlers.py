"""The kopf side: watch OutboxDispatcher resources, one `DispatcherLoop` per resource.

kopf only watches here. No change handlers, daemons or timers are registered, so kopf puts no
finalizers, annotations or status of its own on the resources: deleting a resource is never
held up by the operator (its Deployment goes with it through the owner reference), and every
write goes through `kube.Kube`. A resource's loop starts on its first event (the initial
listing included, so resources made while the operator was down are served on start) and is
cancelled when the resource is deleted.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import kopf

from outbox.controller.kube import REQUEST_SECONDS
from outbox.controller.leader import LeadershipLost
from outbox.controller.reconcile import Context, DispatcherLoop
from outbox.controller.reconcile.read import secret_names
from outbox.controller.resource import GROUP, PLURAL, VERSION
from outbox.plumbing.waiting import cancel_and_wait, cancel_soon

log = logging.getLogger("outbox.controller")


class Supervisor:
    """The DispatcherLoops of this replica; a lost leadership stops them all."""

    def __init__(self, context: Context) -> None:
        self.context = context
        self._loops: dict[tuple[str, str], tuple[DispatcherLoop, asyncio.Task[None]]] = {}
        # The loops of deleted resources, cancelled until they have ended (`_stop`).
        self._ending: set[asyncio.Task[None]] = set()
        self.lost = asyncio.Event()
        self._closed = False

    def on_event(self, event_type: str | None, body: Mapping[str, Any]) -> None:
        if self._closed:  # stopping: kopf may still hand over events it had queued
            return
        meta = body.get("metadata") or {}
        key = (str(meta.get("namespace")), str(meta.get("name")))
        if event_type == "DELETED":
            self._stop(key)
            return
        existing = self._loops.get(key)
        if existing is not None and existing[0].body["metadata"].get("uid") == meta.get("uid"):
            existing[0].update(body)
            return
        self._stop(key)  # deleted and re-created under the same name while unseen
        dispatcher = DispatcherLoop(self.context, body)
        task = asyncio.create_task(dispatcher.run(), name=f"dispatcher {key[0]}/{key[1]}")
        task.add_done_callback(self._ended)
        self._loops[key] = (dispatcher, task)
        log.info("%s/%s: serving", *key)

    def _stop(self, key: tuple[str, str]) -> None:
        found = self._loops.pop(key, None)
        if found is not None:
            # Cancelled again should it drop the cancellation (Python 3.11's asyncio.wait_for,
            # in the database pool and clients under a pass): it would serve a deleted
            # resource for ever.
            task = found[1]
            self._ending.add(task)
            task.add_done_callback(self._ending.discard)
            cancel_soon([task])
            self.context.metrics.forget(*key)
            self.context.tables.forget(*key)  # its table is free for another resource
            self.context.database.release(key)  # its database's pool closes if it was the last
            # Its Secrets' reads leave memory with it (another dispatcher naming one reads it
            # anew once), and so do the reads past their recheck.
            spec = found[0].body.get("spec") or {}
            self.context.kube.forget_secrets(key[0], secret_names(spec), sweep=True)
            log.info("%s/%s: deleted; its Deployment goes with it", *key)

    def _ended(self, task: asyncio.Task[None]) -> None:
        if task.cancelled():
            return
        if isinstance(task.exception(), LeadershipLost):
            self.lost.set()

    async def close(self) -> None:
        """Stop every loop; no event starts another afterwards."""
        self._closed = True
        tasks = [task for _, task in self._loops.values()] + list(self._ending)
        self._loops.clear()
        # A loop that dropped its cancellation is cancelled again: waited for once, it held the
        # operator's stop for ever.
        await cancel_and_wait(tasks)
        await self.context.database.close()


def build_registry(
    supervisor: Supervisor,
    stop_flag: asyncio.Event,
    close_connections: Callable[[], Awaitable[None]],
) -> kopf.OperatorRegistry:
    """kopf's handlers; `stop_flag` is the one kopf.operator() is given, and
    `close_connections` ends the health server's open connections."""
    registry = kopf.OperatorRegistry()

    @kopf.on.cleanup(registry=registry)
    async def cleanup(**_: Any) -> None:
        # On SIGTERM, which kopf handles itself, kopf then waits up to 5 s for every task
        # started after it, and only then cancels them: the dispatcher loops, the handlers
        # of the health server's keep-alive connections (Prometheus keeps one open), and
        # kopf's own waiter on the stop flag, which it leaves pending when a signal stops
        # it. Its cleanup runs before that wait: end them here, and the operator stops at
        # once.
        await supervisor.close()
        await close_connections()
        stop_flag.set()
        log.info("stopping: every dispatcher loop and connection closed")

    @kopf.on.login(registry=registry)
    def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
        # The same credentials as the writer's: in-cluster, else the kubeconfig.
        return kopf.login_via_client(**kwargs)

    @kopf.on.event(GROUP, VERSION, PLURAL, registry=registry)
    async def watched(type: str | None, body: kopf.Body, **_: Any) -> None:
        supervisor.on_event(type, body)

    return registry


def build_kopf_settings(log_level: str) -> kopf.OperatorSettings:
    settings = kopf.OperatorSettings()
    # Our own Events and status carry the story; kopf posts nothing and scans no
    # namespaces or CRDs (so the operator needs no permission on either).
    settings.posting.enabled = False
    settings.scanning.disabled = True
    settings.watching.server_timeout = 300
    settings.watching.client_timeout = 330
    settings.networking.request_timeout = REQUEST_SECONDS
    return settings
