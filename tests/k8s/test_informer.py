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
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import kmock
import pytest
from kubernetes.aio.client import ApiClient, AppsV1Api, Configuration
from kubernetes.aio.client.exceptions import ApiException

from outbox.controller import informer as informer_module
from outbox.controller.informer import SELECTOR, Deployments

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
