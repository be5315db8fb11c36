"""Every read and write the operator makes, through the official `kubernetes` client.

kopf only watches; this is the one room that changes the cluster, and each write first asks
the leader elector whether this replica may still act (see `leader.py`).

Reads take the server's JSON as plain dicts (the client's `..._without_preload_content`
calls): building the client's models and turning them back into dicts cost a fifth of a
fleet's passes, and every caller wants dicts.
"""

from __future__ import annotations

import base64
import binascii
import json
import secrets
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, TypeVar, cast

import aiohttp
from kubernetes.aio.client import (
    ApiClient,
    AppsV1Api,
    CoreV1Api,
    CoreV1Event,
    CustomObjectsApi,
    NetworkingV1Api,
    PolicyV1Api,
    V1Deployment,
    V1NetworkPolicy,
    V1PodDisruptionBudget,
)
from kubernetes.aio.client.exceptions import ApiException

from outbox.controller.problem import Problem
from outbox.controller.resource import API_VERSION, GROUP, KIND, MANAGER, PLURAL, VERSION
from outbox.controller.status import json_message, timestamp

if TYPE_CHECKING:
    from outbox.controller.informer import Deployments
    from outbox.controller.secret_cache import SecretCache

MERGE_PATCH = "application/merge-patch+json"
# The longest one API request (not a watch) may take: kopf's, the informer's lists and every
# call below alike (the client's own default is five minutes, a pass held up that long by a
# server that accepted the connection and never answered).
REQUEST_SECONDS = 30
TIMEOUT: Mapping[str, Any] = {"_request_timeout": REQUEST_SECONDS}  # every call of the client
# The API server out of reach: socket errors and timeouts, and aiohttp's own for a connection
# the server (or a proxy) closed mid-request, which are not OSErrors.
UNREACHABLE = (TimeoutError, OSError, aiohttp.ClientError)
M = TypeVar("M", V1Deployment, CoreV1Event, V1NetworkPolicy, V1PodDisruptionBudget)


def model(cls: type[M], data: Mapping[str, Any]) -> M:
    """A client model from a plain object (the client takes models, we render dicts)."""
    built = cls.from_dict(dict(data))
    assert built is not None
    return built


def api_reason(exc: ApiException) -> str:
    """What the API server said, in its own words: the message of the Status it answered
    (e.g. a 422's `Deployment.apps "x" is invalid: metadata.labels: Invalid value: ...`),
    else the HTTP status line."""
    text = exc.body.decode(errors="replace") if isinstance(exc.body, bytes) else exc.body
    message = (json_message(text) if text else None) or ""
    head = f"{exc.status} {exc.reason}".strip()
    return f"{head}: {message}" if message else head


def failure_reason(error: ApiException | TimeoutError) -> str:
    """What one request met, for a status and an Event: the server's own words, or that it
    did not answer within REQUEST_SECONDS (a server, or a proxy before it, that accepted the
    connection and never answered)."""
    if isinstance(error, ApiException):
        return api_reason(error)
    return f"no answer from the API server within {REQUEST_SECONDS} s"


def secret_key(namespace: str, name: str, key: str) -> str:
    """Where a value came from, for messages that must name it without showing it."""
    return f"key `{key}` of Secret `{namespace}/{name}`"


@dataclass(frozen=True)
class Secret:
    """A Secret as read: its annotations say who may use it (controller/consent.py)."""

    namespace: str
    name: str
    annotations: Mapping[str, str]
    data: Mapping[str, str] = field(repr=False)  # base64, as the API serves it
    version: str  # resourceVersion

    def value(self, key: str, *, refused_as: str) -> str:
        """One key, decoded; a Problem names what is missing, or a value that is not text
        under `refused_as`, the reason of what the value is for (`InvalidDsn`, an option's)."""
        if key not in self.data:
            # Only the key asked for: the Secret's other keys are not the resource author's
            # to learn (they may even name what they hold).
            raise Problem(
                "SecretKeyMissing", f"Secret `{self.namespace}/{self.name}` has no key `{key}`"
            )
        try:
            return base64.b64decode(self.data[key], validate=True).decode()
        except (binascii.Error, UnicodeDecodeError):
            raise Problem(
                refused_as, f"{secret_key(self.namespace, self.name, key)} is not UTF-8 text"
            ) from None


async def _json(call: Awaitable[aiohttp.ClientResponse]) -> dict[str, Any] | None:
    """The object a read answers, as the server sent it; None for 404 Not Found; an
    ApiException, as the client's own calls raise, for any other error."""
    response = await call
    async with response:
        body = await response.read()
    if response.status == 404:
        return None
    if not 200 <= response.status < 300:
        text = body.decode(errors="replace")
        raise ApiException(status=response.status, reason=response.reason, body=text)
    found: dict[str, Any] = json.loads(body)
    return found


class Kube:
    """Reads and writes; with `deployments` and `secrets`, the Deployments are read from the
    informer (controller/informer.py) and the Secrets from their cache
    (controller/secret_cache.py), and every write of a Deployment updates the informer."""

    def __init__(
        self,
        api: ApiClient,
        check: Callable[[], None],
        identity: str,
        *,
        deployments: Deployments | None = None,
        secrets: SecretCache[Secret] | None = None,
    ) -> None:
        self._api = api
        self._apps = AppsV1Api(api)
        self._core = CoreV1Api(api)
        self._custom = CustomObjectsApi(api)
        self._networking = NetworkingV1Api(api)
        self._disruption = PolicyV1Api(api)
        self._check = check  # raises LeadershipLost when this replica may not write
        self._identity = identity
        self._deployments = deployments
        self._secrets = secrets

    def _dict(self, obj: Any) -> dict[str, Any]:
        data: dict[str, Any] = self._api.sanitize_for_serialization(obj)  # type: ignore[no-untyped-call]
        return data

    # -- reads ----------------------------------------------------------------------------------

    async def served(self, namespaces: Sequence[str]) -> set[tuple[str, str]]:
        """The OutboxDispatchers this replica serves, as (namespace, name): those of
        `namespaces`, or of every namespace when none are named."""
        found: list[dict[str, Any]] = []
        if not namespaces:
            listed = cast(
                dict[str, Any],
                await self._custom.list_cluster_custom_object(GROUP, VERSION, PLURAL, **TIMEOUT),
            )
            found.extend(listed.get("items") or ())
        for namespace in namespaces:
            one = cast(
                dict[str, Any],
                await self._custom.list_namespaced_custom_object(
                    GROUP, VERSION, namespace, PLURAL, **TIMEOUT
                ),
            )
            found.extend(one.get("items") or ())
        return {(str(i["metadata"]["namespace"]), str(i["metadata"]["name"])) for i in found}

    async def secret(self, namespace: str, name: str) -> Secret:
        """A Secret of `namespace`, as last read if that is recent (the cache); a Problem
        says it is missing or unreadable."""
        if self._secrets is None:
            return await self._read_secret(namespace, name)
        return await self._secrets.get((namespace, name), self._read_secret)

    def forget_secrets(self, namespace: str, names: Iterable[str], *, sweep: bool = False) -> None:
        """The next read of these Secrets asks the server; `sweep`: the reads past their
        recheck go too (a dispatcher was released: nothing else may read them again)."""
        if self._secrets is not None:
            self._secrets.forget(namespace, names)
            if sweep:
                self._secrets.sweep()

    async def _read_secret(self, namespace: str, name: str) -> Secret:
        try:
            secret = await _json(self._core.read_namespaced_secret_without_preload_content(
                name, namespace, **TIMEOUT
            ))  # fmt: skip
        except ApiException as exc:
            if exc.status == 403:
                raise Problem(
                    "SecretForbidden", f"the operator may not read Secret {namespace}/{name}"
                ) from None
            raise
        if secret is None:
            raise Problem("SecretNotFound", f"Secret {namespace}/{name} does not exist")
        meta = secret.get("metadata") or {}
        return Secret(
            namespace,
            name,
            dict(meta.get("annotations") or {}),
            dict(secret.get("data") or {}),
            str(meta.get("resourceVersion") or ""),
        )

    async def secret_versions(
        self, namespace: str, names: Iterable[str], read: Mapping[str, Secret]
    ) -> dict[str, str]:
        """The resourceVersion of each named Secret, by name, for the pod template's hash;
        those in `read` are not read again. One that cannot be read counts as "" (the pods
        report it, and its appearing rolls them)."""
        versions = {}
        for name in sorted(set(names)):
            if name in read:
                versions[name] = read[name].version
                continue
            try:
                versions[name] = (await self.secret(namespace, name)).version
            except Problem:
                versions[name] = ""
        return versions

    async def _read(
        self, read: Callable[[str, str], Awaitable[Any]], namespace: str, name: str
    ) -> dict[str, Any] | None:
        """An object as a dict, by `read`ing it by name (a `..._without_preload_content`
        call); None when it does not exist."""
        return await _json(read(name, namespace, **TIMEOUT))

    async def _create_or_replace(
        self,
        create: Callable[..., Awaitable[Any]],
        replace: Callable[..., Awaitable[Any]],
        kind: type[Any],
        body: Mapping[str, Any],
        current: Mapping[str, Any] | None,
    ) -> None:
        """Create the object, or replace `current` with it (its resourceVersion: a concurrent
        change is a 409, and the next pass tries again)."""
        self._check()
        meta = body["metadata"]
        if current is None:
            await create(meta["namespace"], model(kind, body), field_manager=MANAGER, **TIMEOUT)
            return
        version = current["metadata"]["resourceVersion"]
        full = {**body, "metadata": {**meta, "resourceVersion": version}}
        await replace(
            meta["name"], meta["namespace"], model(kind, full), field_manager=MANAGER, **TIMEOUT
        )

    async def deployment(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The Deployment, from the informer when there is one (never to be mutated)."""
        if self._deployments is None:
            return await self._read_deployment(namespace, name)
        return await self._deployments.get(namespace, name, self._read_deployment)

    async def _read_deployment(self, namespace: str, name: str) -> dict[str, Any] | None:
        return await self._read(
            self._apps.read_namespaced_deployment_without_preload_content, namespace, name
        )

    def _written(self, namespace: str, name: str, write: Awaitable[Any]) -> Awaitable[Any]:
        """`write`; a conflict (409) or a Not Found (404: deleted since the cache saw it)
        tells the informer its view of the name is stale."""

        async def written() -> Any:
            try:
                return await write
            except ApiException as exc:
                if exc.status in (404, 409) and self._deployments is not None:
                    self._deployments.refused(namespace, name)
                raise

        return written()

    def _stored(self, obj: Any) -> dict[str, Any]:
        stored = self._dict(obj)
        if self._deployments is not None:
            self._deployments.stored(stored)
        return stored

    async def pods(self, namespace: str, selector: str) -> list[dict[str, Any]] | None:
        """The pods `selector` selects (their status says why a worker does not run); None
        when RBAC does not let the operator list pods (an older chart's Role)."""
        try:
            found = await _json(self._core.list_namespaced_pod_without_preload_content(
                namespace, label_selector=selector, **TIMEOUT
            ))  # fmt: skip
        except ApiException as exc:
            if exc.status == 403:
                return None
            raise
        return list((found or {}).get("items") or ())

    # -- writes ---------------------------------------------------------------------------------

    async def create_deployment(self, body: Mapping[str, Any]) -> dict[str, Any]:
        self._check()
        namespace, name = body["metadata"]["namespace"], body["metadata"]["name"]
        created = await self._written(
            namespace,
            name,
            self._apps.create_namespaced_deployment(
                namespace, model(V1Deployment, body), field_manager=MANAGER, **TIMEOUT
            ),
        )
        return self._stored(created)

    async def replace_deployment(
        self, body: Mapping[str, Any], resource_version: str
    ) -> dict[str, Any]:
        """PUT the whole rendered Deployment; resourceVersion makes a concurrent change a 409."""
        self._check()
        meta = body["metadata"]
        full = {**body, "metadata": {**meta, "resourceVersion": resource_version}}
        replaced = await self._written(
            meta["namespace"],
            meta["name"],
            self._apps.replace_namespaced_deployment(
                meta["name"],
                meta["namespace"],
                model(V1Deployment, full),
                field_manager=MANAGER,
                **TIMEOUT,
            ),
        )
        return self._stored(replaced)

    async def scale_deployment(self, namespace: str, name: str, replicas: int) -> None:
        """Resize through the `scale` subresource: the only write to a Deployment the operator
        needs besides create and replace, so RBAC grants `deployments/scale` patch and no
        patch of the Deployment itself."""
        self._check()
        scale = await self._written(
            namespace,
            name,
            self._apps.patch_namespaced_deployment_scale(
                name,
                namespace,
                {"spec": {"replicas": replicas}},
                field_manager=MANAGER,
                _content_type=MERGE_PATCH,
                **TIMEOUT,
            ),
        )
        version = scale.metadata.resource_version if scale.metadata is not None else None
        if self._deployments is not None and version:
            # The scale's resourceVersion is the Deployment's after the resize.
            self._deployments.resized(namespace, name, replicas, str(version))

    async def network_policy(self, namespace: str, name: str) -> dict[str, Any] | None:
        read = self._networking.read_namespaced_network_policy_without_preload_content
        return await self._read(read, namespace, name)

    async def apply_network_policy(
        self, body: Mapping[str, Any], current: Mapping[str, Any] | None
    ) -> None:
        """Create the policy, or replace the one there."""
        n = self._networking
        await self._create_or_replace(
            n.create_namespaced_network_policy,
            n.replace_namespaced_network_policy,
            V1NetworkPolicy,
            body,
            current,
        )

    async def disruption_budget(self, namespace: str, name: str) -> dict[str, Any] | None:
        d = self._disruption
        return await self._read(
            d.read_namespaced_pod_disruption_budget_without_preload_content, namespace, name
        )

    async def apply_disruption_budget(
        self, body: Mapping[str, Any], current: Mapping[str, Any] | None
    ) -> None:
        """Create the workers' PodDisruptionBudget, or replace the one there."""
        d = self._disruption
        await self._create_or_replace(
            d.create_namespaced_pod_disruption_budget,
            d.replace_namespaced_pod_disruption_budget,
            V1PodDisruptionBudget,
            body,
            current,
        )

    async def patch_status(self, namespace: str, name: str, status: Mapping[str, Any]) -> None:
        self._check()
        await self._custom.patch_namespaced_custom_object_status(
            GROUP,
            VERSION,
            namespace,
            PLURAL,
            name,
            {"status": dict(status)},
            field_manager=MANAGER,
            _content_type=MERGE_PATCH,
            **TIMEOUT,
        )

    async def event(
        self, resource: Mapping[str, Any], type_: str, reason: str, message: str
    ) -> None:
        """A core/v1 Event about the resource, as `kubectl describe obd` shows them."""
        self._check()
        meta = resource["metadata"]
        now = datetime.now(UTC)
        event = model(
            CoreV1Event,
            {
                "apiVersion": "v1",
                "kind": "Event",
                "metadata": {
                    "name": f"{meta['name']}.{secrets.token_hex(8)}",
                    "namespace": meta["namespace"],
                },
                "involvedObject": {
                    "apiVersion": API_VERSION,
                    "kind": KIND,
                    "name": meta["name"],
                    "namespace": meta["namespace"],
                    "uid": meta.get("uid"),
                },
                "type": type_,
                "reason": reason,
                "message": message[:1024],
                "source": {"component": MANAGER},
                "reportingComponent": MANAGER,
                "reportingInstance": self._identity,
                "firstTimestamp": timestamp(now),
                "lastTimestamp": timestamp(now),
                "count": 1,
            },
        )
        await self._core.create_namespaced_event(meta["namespace"], event, **TIMEOUT)
