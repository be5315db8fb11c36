"""The informer (controller/informer.py) against the emulator, when its watch goes wrong.

A cache that no watch keeps current must not answer reads: a watch refused, failing, or
sending what does not read as an event makes the scope's reads GETs until a list succeeds
again; a watch too old to resume (410 Gone) lists again at once. A line longer than aiohttp's
line limit is read whole (aiohttp's LineTooLong is neither a ValueError nor a ClientError: it
ended the informer, leaving its cache served for good). And a write that meets a Deployment
deleted since the cache saw it (404) makes the name read from the server, as a conflict does
(controller/kube.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import kmock
import pytest
from kubernetes.aio.client import ApiClient, AppsV1Api, Configuration
from kubernetes.aio.client.exceptions import ApiException

from outbox.controller import informer as informer_module
from outbox.controller.informer import SELECTOR, Deployments
from outbox.controller.kube import Kube

from .cluster import ADMIN_TOKEN, LocalCluster

DEPLOYMENTS = kmock.resource("apps", "v1", "deployments")
NAMESPACE = "default"


def _ours(name: str, **annotations: str) -> dict[str, Any]:
    """A Deployment the informer selects (the operator's labels)."""
    labels = dict(pair.split("=", 1) for pair in SELECTOR.split(","))
    pod = {"app": name}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {
            "name": name,
            "namespace": NAMESPACE,
            "labels": labels,
            "annotations": annotations,
        },
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": pod},
            "template": {
                "metadata": {"labels": pod},
                "spec": {"containers": [{"name": "main", "image": "example/app:1"}]},
            },
        },
    }


@pytest.fixture
async def api(k8s: LocalCluster) -> AsyncIterator[ApiClient]:
    configuration = Configuration()
    configuration.host = k8s.url
    configuration.api_key = {"authorization": ADMIN_TOKEN}
    configuration.api_key_prefix = {"authorization": "Bearer"}
    # aiohttp's own read buffer (the client raises it to 2 MiB), whose line limit is 128 KiB:
    # a watch line must be read whole past it, whatever buffer the client is given.
    configuration.client_session_kwargs = {"read_bufsize": 2**16}
    async with ApiClient(configuration) as client:
        yield client


class Informer:
    """A running `Deployments` of the default namespace, and a read that counts its GETs."""

    def __init__(self, api: ApiClient, *, listed: bool = True) -> None:
        self.listed = listed  # entered once the first list answered
        self.apps = AppsV1Api(api)
        self.deployments = Deployments(api, [NAMESPACE])
        self.gets = 0
        self._task: asyncio.Task[None] | None = None

    async def read(self, namespace: str, name: str) -> dict[str, Any] | None:
        self.gets += 1
        try:
            found = await self.apps.read_namespaced_deployment(name, namespace)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        data: dict[str, Any] = self.apps.api_client.sanitize_for_serialization(found)  # type: ignore[no-untyped-call]
        return data

    async def get(self, name: str) -> dict[str, Any] | None:
        return await self.deployments.get(NAMESPACE, name, self.read)

    async def __aenter__(self) -> Informer:
        self._task = asyncio.create_task(self.deployments.run())
        if self.listed:
            await until("the first list", lambda: self.deployments.lists >= 1)
        return self

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def __aexit__(self, *_: object) -> None:
        await self.stop()


async def until(
    what: str, probe: Callable[[], bool | Awaitable[bool]], timeout: float = 20
) -> None:
    """Poll `probe` until it holds; fail naming `what` after `timeout` seconds."""
    deadline = asyncio.get_running_loop().time() + timeout
    while asyncio.get_running_loop().time() < deadline:
        held = probe()
        if held if isinstance(held, bool) else await held:
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


async def _gone(informer: Informer, name: str) -> bool:
    return await informer.get(name) is None


async def _cached(informer: Informer, name: str) -> bool:
    """Whether the cache (not a GET) answers `name` with a Deployment."""
    gets = informer.gets
    found = await informer.get(name)
    return found is not None and informer.gets == gets


async def test_a_refused_watch_stops_the_cache_serving_until_a_list_succeeds(
    k8s: LocalCluster, api: ApiClient
) -> None:
    apps = AppsV1Api(api)
    await apps.create_namespaced_deployment(NAMESPACE, _ours("orders-worker"))
    refusing = threading.Event()  # read on the emulator's thread
    k8s.on_loop(lambda e: e["watch", DEPLOYMENTS][lambda: refusing.is_set()] << 403)
    async with Informer(api) as informer:
        assert await informer.get("orders-worker") is not None
        assert informer.gets == 0  # served from the list

        refusing.set()
        with k8s.outage():  # the open watch cut; every new one is refused (a Role without watch)
            pass
        await apps.delete_namespaced_deployment("orders-worker", NAMESPACE)
        # No watch tells the cache: the reads ask the server, which says it is gone (so the
        # next pass creates it again) instead of the cache's copy from before the deletion.
        await until("the deletion seen", lambda: _gone(informer, "orders-worker"))
        assert informer.gets >= 1

        refusing.clear()  # the watch allowed again: the next list makes the cache whole
        # No wait for a list made after this: the list before it may be the last one, its
        # watch still on its way and let through now (the refusal is decided as the watch
        # arrives), after which the scope never lists again. A Deployment made now is served
        # from memory once a list and an allowed watch (made after the list) keep it.
        await apps.create_namespaced_deployment(NAMESPACE, _ours("billing-worker"))
        await until("the watch's new Deployment", lambda: _cached(informer, "billing-worker"))


async def test_a_list_that_hangs_ends_at_the_request_timeout_and_reads_are_gets(
    k8s: LocalCluster, api: ApiClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(informer_module, "REQUEST_SECONDS", 1)
    await AppsV1Api(api).create_namespaced_deployment(NAMESPACE, _ours("orders-worker"))

    async def hang() -> None:  # on the emulator's loop, until the client gives up
        await asyncio.Event().wait()

    k8s.on_loop(lambda e: e["list", DEPLOYMENTS][:1] << hang)
    async with Informer(api, listed=False) as informer:
        # The first pass waits for the first list to end: at the timeout, not never.
        found = await asyncio.wait_for(informer.get("orders-worker"), 20)
        assert found is not None
        assert informer.gets == 1
        await until("a list again", lambda: informer.deployments.lists >= 1)
        await until("the cache serving", lambda: _cached(informer, "orders-worker"))


async def test_a_watch_too_old_to_resume_lists_again(
    k8s: LocalCluster, api: ApiClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(informer_module, "WATCH_SECONDS", 1)  # the server ends each at once
    async with Informer(api) as informer:
        # Another object's write moves the server's version past the watch's, which sees no
        # event of it; compacted, the next resume is from a version too old.
        k8s.kubectl("create", "configmap", "elsewhere")
        k8s.call(k8s.emulator.compact())
        await until("a list again", lambda: informer.deployments.lists >= 2)
        await AppsV1Api(api).create_namespaced_deployment(NAMESPACE, _ours("orders-worker"))
        await until("the watch's new Deployment", lambda: _cached(informer, "orders-worker"))
        assert informer.gets == 0  # a 410 is no failure: the cache served throughout


async def test_a_watch_line_that_is_no_event_lists_again(k8s: LocalCluster, api: ApiClient) -> None:
    async with Informer(api) as informer:
        k8s.on_loop(lambda e: e["watch", DEPLOYMENTS][:1] << b"<html>a proxy's page</html>\n")
        with k8s.outage():  # the open watch cut; the next one answers the page above
            pass
        # Resuming at the same version would meet the same line again: the scope lists.
        await until("a list again", lambda: informer.deployments.lists >= 2)
        await AppsV1Api(api).create_namespaced_deployment(NAMESPACE, _ours("orders-worker"))
        await until("the watch's new Deployment", lambda: _cached(informer, "orders-worker"))


async def test_a_watch_line_longer_than_aiohttps_limit_is_read(
    k8s: LocalCluster, api: ApiClient
) -> None:
    async with Informer(api) as informer:
        # 200 kB of annotation (the API allows 256 KiB): one watch line past aiohttp's 128 KiB.
        big = _ours("orders-worker", **{"example.com/notes": "x" * 200_000})
        await AppsV1Api(api).create_namespaced_deployment(NAMESPACE, big)
        await until("the watch's new Deployment", lambda: _cached(informer, "orders-worker"))
        found = await informer.get("orders-worker")
        assert found is not None
        assert len(found["metadata"]["annotations"]["example.com/notes"]) == 200_000
        assert informer.deployments.lists == 1  # the watch went on; nothing failed


async def test_a_replace_of_a_deployment_deleted_since_reads_it_from_the_server(
    k8s: LocalCluster, api: ApiClient
) -> None:
    apps = AppsV1Api(api)
    body = _ours("orders-worker")
    await apps.create_namespaced_deployment(NAMESPACE, body)
    informer = Informer(api)
    kube = Kube(api, lambda: None, "test", deployments=informer.deployments)
    async with informer:
        cached = await kube.deployment(NAMESPACE, "orders-worker")
        assert cached is not None
    # The watch stopped (as one hung would leave it): the cache still holds the Deployment
    # that is deleted now.
    await apps.delete_namespaced_deployment("orders-worker", NAMESPACE)
    assert await kube.deployment(NAMESPACE, "orders-worker") is not None
    with pytest.raises(ApiException) as refused:
        await kube.replace_deployment(body, cached["metadata"]["resourceVersion"])
    assert refused.value.status == 404
    # As after a conflict, the name is read from the server: gone, so the pass creates it.
    assert await kube.deployment(NAMESPACE, "orders-worker") is None
