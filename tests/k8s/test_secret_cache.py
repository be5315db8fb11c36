"""The Secret cache (controller/secret_cache.py) over real reads from the emulator.

A read under way when its Secret is forgotten (the pass found a problem, or the spec
changed) may hold the Secret from before the change: a later pass neither joins it nor finds
its value kept. And what no pass can be served any more (reads past their recheck, the
Secrets of a resource deleted since) does not stay in memory.
"""

from __future__ import annotations

import asyncio
import base64
import json
from typing import Any

import kubernetes.client
from kubernetes.aio.client import ApiClient, Configuration

from outbox.controller.handlers import Supervisor
from outbox.controller.kube import Kube, Secret
from outbox.controller.metrics import Metrics
from outbox.controller.reconcile import Context
from outbox.controller.secret_cache import SecretCache
from outbox.controller.settings import ControllerSettings

from .cluster import ADMIN_TOKEN, LocalCluster
from .test_informer import until
from .test_operator import apply, dispatcher_manifest, get, own_table, secret_manifest

NAMESPACE = "default"


def _secret(name: str, dsn: str) -> str:
    return json.dumps(
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": name},
            "stringData": {"dsn": dsn},
        }
    )


class Reads:
    """Reads of a Secret's `dsn` from the server; the first one can be held after its GET
    answered, as a slow answer would be."""

    def __init__(self, k8s: LocalCluster) -> None:
        self._core = kubernetes.client.CoreV1Api(k8s.api_client())
        self.fetched = asyncio.Event()  # the held read has its answer
        self.release = asyncio.Event()
        self.hold_first = False

    async def __call__(self, namespace: str, name: str) -> str:
        found = await asyncio.to_thread(self._core.read_namespaced_secret, name, namespace)
        value = base64.b64decode(found.data["dsn"]).decode()
        if self.hold_first:
            self.hold_first = False
            self.fetched.set()
            await self.release.wait()
        return value


async def test_a_read_under_way_when_its_secret_is_forgotten_is_neither_joined_nor_kept(
    k8s: LocalCluster,
) -> None:
    k8s.kubectl("apply", "-f", "-", input=_secret("orders-db", "postgresql://old@db/orders"))
    cache = SecretCache[str](recheck_seconds=600)
    read = Reads(k8s)
    read.hold_first = True
    key = (NAMESPACE, "orders-db")
    before = asyncio.create_task(cache.get(key, read))
    await read.fetched.wait()  # the old value read, its answer still on its way

    # The Secret fixed, and the pass that failed on it forgets it: the next pass reads anew.
    k8s.kubectl("apply", "-f", "-", input=_secret("orders-db", "postgresql://new@db/orders"))
    cache.forget(NAMESPACE, ["orders-db"])
    # (Joining the held read would wait for its release: bounded, to fail rather than hang.)
    assert await asyncio.wait_for(cache.get(key, read), 20) == "postgresql://new@db/orders"

    read.release.set()
    assert await before == "postgresql://old@db/orders"  # its own pass began before the fix
    reads = cache.reads
    # What is kept is the new value: the forgotten read ended later and was not stored.
    assert await cache.get(key, read) == "postgresql://new@db/orders"
    assert cache.reads == reads


async def test_reads_past_their_recheck_leave_memory(k8s: LocalCluster) -> None:
    for name in ("orders-db", "billing-db"):
        k8s.kubectl("apply", "-f", "-", input=_secret(name, f"postgresql://app@db/{name}"))
    recheck = 0.5
    cache = SecretCache[str](recheck_seconds=recheck)
    read = Reads(k8s)
    await cache.get((NAMESPACE, "orders-db"), read)
    await cache.get((NAMESPACE, "billing-db"), read)
    assert len(cache) == 2
    # billing's resource deleted: nothing names its Secret again. Once a recheck went by,
    # orders' next pass rereads its own, and billing's old read is dropped.
    await asyncio.sleep(recheck + 0.1)  # time passing is what is tested: no event to await
    await cache.get((NAMESPACE, "orders-db"), read)
    assert len(cache) == 1
    assert cache.reads == 3


async def test_a_deleted_dispatchers_secret_reads_leave_memory_with_it(
    cluster: LocalCluster, dsn: str
) -> None:
    """The operator's own release (handlers.Supervisor): the deleted dispatcher's Secret is
    forgotten at once, however long its recheck, and the other's read stays served."""
    apply(
        cluster,
        secret_manifest("orders-db", dsn=dsn),
        secret_manifest("billing-db", dsn=dsn),
        _idle("orders", own_table(dsn, "orders", secret="orders-db")),
        _idle("billing", own_table(dsn, "billing", secret="billing-db")),
    )
    cache = SecretCache[Secret](recheck_seconds=600)
    configuration = Configuration()
    configuration.host = cluster.url
    configuration.api_key = {"authorization": ADMIN_TOKEN}
    configuration.api_key_prefix = {"authorization": "Bearer"}
    async with ApiClient(configuration) as api:
        kube = Kube(api, lambda: None, "test", secrets=cache)
        supervisor = Supervisor(Context(ControllerSettings(), kube, Metrics()))
        try:
            for name in ("orders", "billing"):
                supervisor.on_event("ADDED", get(cluster, "outboxdispatchers", name) or {})
            await until("both dispatchers' Secrets read", lambda: len(cache) == 2, timeout=60)
            reads = cache.reads

            billing = get(cluster, "outboxdispatchers", "billing") or {}
            cluster.kubectl("delete", "obd", "billing")
            supervisor.on_event("DELETED", billing)
            assert len(cache) == 1  # billing's read is gone with it
            await kube.secret(NAMESPACE, "orders-db")  # orders' read still served
            assert cache.reads == reads
            await kube.secret(NAMESPACE, "billing-db")  # billing's read from the server
            assert cache.reads == reads + 1
        finally:
            await supervisor.close()


def _idle(name: str, database: dict[str, Any]) -> dict[str, Any]:
    scaling = {"minReplicas": 0, "maxReplicas": 1, "pollIntervalSeconds": 1}
    return dispatcher_manifest(name, database=database, scaling=scaling)
