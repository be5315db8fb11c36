"""A throwaway kopf operator against the emulator: kopf's own machinery must work on it."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import kopf
import pytest
from helpers import wait_until

from .cluster import ADMIN_TOKEN, LocalCluster

WIDGETS = Path(__file__).parent / "manifests" / "widgets.yaml"


def widget(name: str, size: int) -> str:
    return f"apiVersion: example.com/v1\nkind: Widget\nmetadata: {{name: {name}}}\n" + (
        f"spec: {{size: {size}}}\n"
    )


@contextlib.asynccontextmanager
async def operator(k8s: LocalCluster) -> AsyncIterator[list[str]]:
    """A kopf operator with create/update/delete handlers; yields the log of what it did."""
    registry = kopf.OperatorRegistry()
    handled: list[str] = []

    @kopf.on.login(registry=registry)
    def login(**_: Any) -> kopf.ConnectionInfo:
        return kopf.ConnectionInfo(server=k8s.url, token=ADMIN_TOKEN, scheme="Bearer")

    @kopf.on.startup(registry=registry)
    def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
        settings.posting.level = logging.INFO
        settings.watching.server_timeout = 10

    @kopf.on.create("example.com", "v1", "widgets", registry=registry)
    def created(
        name: str, spec: dict[str, Any], body: kopf.Body, patch: kopf.Patch, **_: Any
    ) -> None:
        handled.append(f"create {name}")
        kopf.info(body, reason="Sized", message=f"size {spec['size']}")
        patch.status["replicas"] = spec["size"]

    @kopf.on.update("example.com", "v1", "widgets", registry=registry, field="spec.size")
    def resized(name: str, new: int, patch: kopf.Patch, **_: Any) -> None:
        handled.append(f"update {name} {new}")
        patch.status["replicas"] = new

    @kopf.on.delete("example.com", "v1", "widgets", registry=registry)
    def deleted(name: str, **_: Any) -> None:
        handled.append(f"delete {name}")

    stop = asyncio.Event()
    task = asyncio.create_task(
        kopf.operator(registry=registry, clusterwide=True, standalone=True, stop_flag=stop)
    )
    try:
        yield handled
    finally:
        stop.set()
        await asyncio.wait_for(task, 30)


def status_replicas(k8s: LocalCluster, name: str) -> Any:
    found = k8s.objects("example.com/v1", "widgets", "default", name)
    return found[0].get("status", {}).get("replicas") if found else None


def _watching_crds(k8s: LocalCluster) -> bool:
    return k8s.on_loop(
        lambda emulator: any(
            request.url.path.endswith("/customresourcedefinitions")
            and request.url.query.get("watch") in ("true", "1")
            for request in emulator
        )
    )


@pytest.mark.slow
async def test_kopf_handles_resources_made_before_and_after_it_started(k8s: LocalCluster) -> None:
    k8s.install_crd(WIDGETS)
    await asyncio.to_thread(k8s.kubectl, "apply", "-f", "-", input=widget("early", 2))
    async with operator(k8s) as handled:
        await wait_until(lambda: status_replicas(k8s, "early") == 2, what="early handled")
        await asyncio.to_thread(k8s.kubectl, "apply", "-f", "-", input=widget("late", 3))
        await wait_until(lambda: status_replicas(k8s, "late") == 3, what="late handled")
        await asyncio.to_thread(k8s.kubectl, "apply", "-f", "-", input=widget("late", 5))
        await wait_until(lambda: status_replicas(k8s, "late") == 5, what="late resized")
        # kopf's finalizer holds the object until its delete handler has run.
        await asyncio.to_thread(k8s.kubectl, "delete", "widget", "late", "--wait=false")
        await wait_until(
            lambda: not k8s.objects("example.com/v1", "widgets", "default", "late"),
            what="late deleted",
        )
        assert sorted(handled) == ["create early", "create late", "delete late", "update late 5"]
        # kopf posts Events in the background: wait for the one of the early resource.
        await wait_until(
            lambda: any(
                e["involvedObject"]["name"] == "early" and e["reason"] == "Sized"
                for e in k8s.objects("v1", "events", "default")
            ),
            what="an Event posted",
        )


@pytest.mark.slow
async def test_kopf_starts_serving_a_crd_installed_after_it_started(k8s: LocalCluster) -> None:
    async with operator(k8s) as handled:
        # kopf scans the API's resources, then lists and watches CRDs, and ignores what that
        # listing holds (the scan saw it). A CRD made between the scan and the listing goes
        # unnoticed until a restart (a window in kopf, not the emulator): so the CRD comes once
        # the watch is open, which replays anything written after its listing.
        await wait_until(lambda: _watching_crds(k8s), what="kopf watching CRDs")
        await asyncio.to_thread(k8s.kubectl, "apply", "-f", str(WIDGETS))
        # kopf notices the new CRD through that watch; until then a kubectl apply of a widget
        # may come first, which is fine: kopf lists what exists once it serves the resource.
        await asyncio.to_thread(k8s.kubectl, "apply", "-f", "-", input=widget("fresh", 4))
        await wait_until(lambda: status_replicas(k8s, "fresh") == 4, what="fresh handled")
        assert handled == ["create fresh"]
