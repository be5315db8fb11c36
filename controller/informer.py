"""The worker Deployments this operator manages, kept in memory by a list and a watch.

A pass reads its Deployment here instead of GETting it: an informer, as client-go's
controllers keep one. For each scope served (every namespace, or each `--namespace`) one
list selects the operator's Deployments by label (`SELECTOR`), and one watch from the list's
resourceVersion keeps them current; a watch the server ends is resumed from the last
version seen, and a 410 Gone (the server no longer reaches back that far) lists again. A
watch that fails (refused, a server error, a line that does not read as an event) leaves
the cache with no bound on how stale it grows, so the scope stops serving reads (they are
GETs, as before its first list) and is listed again, after a growing wait, before it serves
them again. The objects answered by the operator's own
writes are stored too (`stored`), so a read right after our own create, replace or resize
never sees the object from before it; a watch event older than what is stored is ignored,
as client-go's mutation cache compares resourceVersions.

Some names are read from the server instead, each pass (`_direct`): one whose write was
refused with a conflict or a Not Found (the cache was stale; read anew until the watch
catches up), and one
found outside the selection (someone else's Deployment of that name, which the read step
refuses to take over). Until a scope's first list succeeded (an older Role without list
and watch on Deployments: the list is refused), and from a failed watch until the next list
succeeds, every read of it is a GET.

The watches have an API client of their own (`api`): each holds a connection for minutes,
which must not take one of the reconcile work's requests in flight.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from typing import Any

import aiohttp
from aiohttp.http_exceptions import HttpProcessingError
from kubernetes.aio.client import ApiClient, AppsV1Api
from kubernetes.aio.client.exceptions import ApiException

from outbox.controller.kube import REQUEST_SECONDS
from outbox.controller.resource import MANAGER

log = logging.getLogger("outbox.controller")

# Every Deployment the operator renders carries these labels (resource.labels).
SELECTOR = f"app.kubernetes.io/managed-by={MANAGER},app.kubernetes.io/name=outbox-dispatcher"
WATCH_SECONDS = 300  # the server ends each watch after this; it is resumed where it was
RETRY_SECONDS = (1.0, 30.0)  # the wait after a failed list or watch: first, longest
Key = tuple[str, str]  # (namespace, name)
Reader = Callable[[str, str], Awaitable[dict[str, Any] | None]]


class _Gone(Exception):
    """410 Gone: the watch's resourceVersion is too old; list again."""


def _version(obj: Mapping[str, Any]) -> int | None:
    text = str((obj.get("metadata") or {}).get("resourceVersion") or "")
    return int(text) if text.isdigit() else None


def _newer(new: Mapping[str, Any], old: Mapping[str, Any] | None) -> bool:
    """Whether `new` is at least as new as `old` (resourceVersions read as integers, as the
    API server writes them; one that is not an integer always wins, as it arrived later)."""
    if old is None:
        return True
    a, b = _version(new), _version(old)
    return a is None or b is None or a >= b


def _selected(obj: Mapping[str, Any]) -> bool:
    labels = (obj.get("metadata") or {}).get("labels") or {}
    wanted = dict(pair.split("=", 1) for pair in SELECTOR.split(","))
    return all(labels.get(k) == v for k, v in wanted.items())


def _slim(obj: Mapping[str, Any]) -> dict[str, Any]:
    """What is kept of an object: all but its managedFields, which no pass reads and which
    are most of a Deployment's size."""
    meta = {k: v for k, v in (obj.get("metadata") or {}).items() if k != "managedFields"}
    return {**obj, "metadata": meta}


class Deployments:
    """The operator's Deployments by (namespace, name), kept current (see the module)."""

    def __init__(self, api: ApiClient, namespaces: Sequence[str]) -> None:
        self._apps = AppsV1Api(api)
        self._scopes: tuple[str | None, ...] = tuple(namespaces) or (None,)
        self._objects: dict[Key, dict[str, Any]] = {}
        self._tried = {scope: asyncio.Event() for scope in self._scopes}  # a first list ended
        self._listed: set[str | None] = set()  # scopes whose cache is whole and kept current
        self._direct: set[Key] = set()
        self.lists = 0  # lists made, for the logs and tests: every relist counts

    def _scope(self, namespace: str) -> str | None:
        return namespace if namespace in self._tried else None

    # -- what a pass sees ---------------------------------------------------------------------

    async def get(self, namespace: str, name: str, read: Reader) -> dict[str, Any] | None:
        """The Deployment `namespace/name` if it exists: from the cache, or by `read` (a GET)
        for a name read directly or a scope not listed yet. Never mutated by the caller."""
        key, scope = (namespace, name), self._scope(namespace)
        if scope in self._tried:
            await self._tried[scope].wait()
        if key not in self._direct and scope in self._listed:
            return self._objects.get(key)
        found = await read(namespace, name)
        if found is None or _selected(found):
            self._direct.discard(key)
            self._put(key, found)
        return found

    def stored(self, obj: Mapping[str, Any]) -> None:
        """An object the server answered one of our writes with: the newest we know."""
        meta = obj["metadata"]
        self._put((str(meta["namespace"]), str(meta["name"])), obj)

    def resized(self, namespace: str, name: str, replicas: int, version: str) -> None:
        """Our resize through the scale subresource took: its new replicas and version."""
        found = self._objects.get((namespace, name))
        if found is not None:
            spec = {**found["spec"], "replicas": replicas}
            meta = {**found["metadata"], "resourceVersion": version}
            self._put((namespace, name), {**found, "metadata": meta, "spec": spec})

    def refused(self, namespace: str, name: str) -> None:
        """A write of ours met a conflict (409) or a Not Found (404): the cache was stale, or
        the name is someone else's; the name is read from the server until the cache agrees
        again."""
        self._direct.add((namespace, name))

    def _put(self, key: Key, obj: Mapping[str, Any] | None) -> None:
        if obj is None:
            self._objects.pop(key, None)
        elif _newer(obj, self._objects.get(key)):
            self._objects[key] = _slim(obj)

    # -- keeping it current -------------------------------------------------------------------

    async def run(self) -> None:
        """List and watch every scope until cancelled."""
        await asyncio.gather(*(self._keep(scope) for scope in self._scopes))

    async def _keep(self, scope: str | None) -> None:
        version: str | None = None
        wait = RETRY_SECONDS[0]
        where = scope or "every namespace"
        failed = False  # since the last list
        while True:
            try:
                if version is None:
                    version = await self._list(scope)
                    if failed:
                        log.info("listed the Deployments in %s again: reads from memory", where)
                    failed = False
                version = await self._watch(scope, version)
                wait = RETRY_SECONDS[0]
                continue
            except _Gone:
                log.info("the Deployments' watch in %s is too old: listing them again", where)
                version = None
                continue
            except ApiException as exc:
                reason = f"{exc.status} {exc.reason}"
                if exc.status == 403:
                    reason += " (grant list and watch on deployments: docs/operator.md)"
            except (
                TimeoutError,
                OSError,
                ValueError,  # a line that is no JSON
                aiohttp.ClientError,
                HttpProcessingError,  # a response aiohttp could not read (no ClientError)
            ) as exc:
                reason = str(exc) or type(exc).__name__
            # Nothing keeps the cache current any more: reads are GETs until a list succeeds,
            # and the next try lists (resuming could meet the same failure at the same place).
            self._listed.discard(scope)
            version, failed = None, True
            self._tried[scope].set()
            log.warning(
                "watching the Deployments in %s: %s; reading them from the server, listing "
                "again in %g s",
                where,
                reason,
                wait,
            )
            await asyncio.sleep(wait)
            wait = min(wait * 2, RETRY_SECONDS[1])

    async def _list(self, scope: str | None) -> str:
        """Replace the scope's objects with a list's; its resourceVersion."""
        options: dict[str, Any] = {"label_selector": SELECTOR, "_request_timeout": REQUEST_SECONDS}
        if scope is None:
            call = self._apps.list_deployment_for_all_namespaces_without_preload_content(**options)
        else:
            call = self._apps.list_namespaced_deployment_without_preload_content(scope, **options)
        listed = await _answer(await call)
        self.lists += 1
        found: dict[Key, dict[str, Any]] = {}
        for item in listed.get("items") or ():
            meta = item["metadata"]
            found[(str(meta["namespace"]), str(meta["name"]))] = item
        version = str((listed.get("metadata") or {}).get("resourceVersion") or "")
        # Gone since, unless stored by a write of ours newer than the list.
        newer = {"metadata": {"resourceVersion": version}}
        for key in [k for k in self._objects if scope in (None, k[0]) and k not in found]:
            if _newer(newer, self._objects[key]):
                del self._objects[key]
        for key, item in found.items():
            self._put(key, item)
        self._listed.add(scope)
        self._tried[scope].set()
        return version

    async def _watch(self, scope: str | None, version: str) -> str:
        """Apply a watch's events from `version` until the server ends it; the last
        resourceVersion seen."""
        options: dict[str, Any] = {
            "label_selector": SELECTOR,
            "watch": True,
            "resource_version": version,
            "allow_watch_bookmarks": True,
            "timeout_seconds": WATCH_SECONDS,
            "_request_timeout": WATCH_SECONDS + 30,
        }
        if scope is None:
            call = self._apps.list_deployment_for_all_namespaces_without_preload_content(**options)
        else:
            call = self._apps.list_namespaced_deployment_without_preload_content(scope, **options)
        response = await call
        async with response:
            if response.status == 410:
                raise _Gone
            if not 200 <= response.status < 300:
                body = (await response.read()).decode(errors="replace")
                raise ApiException(status=response.status, reason=response.reason, body=body)
            async for line in _lines(response.content):
                if line.strip():
                    version = self._apply(json.loads(line), version)
        return version

    def _apply(self, event: Mapping[str, Any], version: str) -> str:
        """One watch event applied; the resourceVersion to resume from."""
        kind, obj = event.get("type"), event.get("object") or {}
        if kind == "ERROR":
            if obj.get("code") == 410:
                raise _Gone
            raise ApiException(status=obj.get("code"), reason=obj.get("message"))
        meta = obj.get("metadata") or {}
        if kind in ("ADDED", "MODIFIED"):
            self._put((str(meta["namespace"]), str(meta["name"])), obj)
        elif kind == "DELETED":
            key = (str(meta["namespace"]), str(meta["name"]))
            if _newer(obj, self._objects.get(key)):
                self._objects.pop(key, None)
        return str(meta.get("resourceVersion") or version)


async def _lines(content: aiohttp.StreamReader) -> AsyncIterator[bytes]:
    """A watch's lines, however long: aiohttp's own line reading refuses a line past twice
    the client's read buffer (128 KiB with aiohttp's default), and one Deployment's
    annotations alone may hold 256 KiB."""
    pending = bytearray()
    async for chunk in content.iter_any():
        pending += chunk
        while (end := pending.find(b"\n")) >= 0:
            yield bytes(pending[:end])
            del pending[: end + 1]
    if pending:
        yield bytes(pending)


async def _answer(response: Any) -> dict[str, Any]:
    async with response:
        body = await response.read()
    if not 200 <= response.status < 300:
        text = body.decode(errors="replace")
        raise ApiException(status=response.status, reason=response.reason, body=text)
    found: dict[str, Any] = json.loads(body)
    return found
