"""A realistic, validating Kubernetes API server for the tests, built on `kmock`.

`kmock.KubernetesEmulator` gives the request handling, the request parsing and the DSL for
injecting reactions (a 503 for the next patch still works for fault tests, see README.md);
its in-memory semantics are too loose for kopf and kubectl, so this subclass answers
Kubernetes requests itself, as an API server would:

- the server owns `metadata.uid`, `resourceVersion` (one counter for all objects),
  `creationTimestamp` and `generation` (bumped only when something other than metadata and
  status changes); `generateName` works; names are checked;
- create answers 201, PUT and the three PATCH formats work (a failed JSON-patch `test` is a
  422, a stale `resourceVersion` a 409), `?dryRun=All` runs everything but stores nothing;
- lists carry `kind`, `apiVersion` and the list's `resourceVersion`; watches stream JSON lines
  (`application/json`) and start either with the current objects (no `resourceVersion`) or
  exactly after the given one, replayed from an event log taken under the same lock that
  writes hold, so nothing written between a list and its watch is lost or replayed stale
  (410 Gone once the log no longer reaches back that far);
- the `status` subresource (writes to `/status` change only status, writes to the object
  ignore status) and the `scale` subresource (an `autoscaling/v1` Scale, GET, PUT and PATCH);
- deletion: finalizers hold an object with `deletionTimestamp` until they are gone; owner
  references are garbage-collected (an object whose owners are all gone is deleted too;
  `propagationPolicy` Background, Foreground and Orphan); deleting a namespace deletes its
  objects;
- discovery (`/api`, `/apis`, per group and version), `/version`, Table output with the
  CRDs' printer columns for `kubectl get`, and `/openapi/v3` so that `kubectl apply`
  validates on the server (`fieldValidation=Strict`) without `--validate=false`;
- validation: custom resources against their CRD's schema and CEL rules, built-in kinds
  against the Kubernetes schemas (`validation.py`); refusals are 422 Status objects whose
  message names the field and the reason;
- an optional authorizer (`rbac.py`): bearer tokens mapped to identities and the RBAC objects
  given to it decide, and a request not allowed is answered 403.

- server-side apply (`applying.py`): `PATCH` with `application/apply-patch+yaml` creates or
  merges, prunes what a manager stopped applying, and answers 409 on another manager's
  fields unless `force`; every write records its field manager in `managedFields`;
- `serviceaccounts/token` (a TokenRequest, which the authorizer then knows as the account),
  streaming lists (`sendInitialEvents`, ended by a bookmark), and the protobuf bodies of
  `kubectl create namespace|secret|configmap` and of client-go's Secret writes and deletes.

Not emulated: protobuf otherwise, admission webhooks, API priority, conversion between CRD
versions (served versions share one storage form), pagination (`limit` returns everything),
and real controllers except garbage collection; the local kubelet (`kubelet.py`) plays the
deployment controller's and kube-proxy's parts.
"""

from __future__ import annotations

import asyncio
import base64
import copy
import datetime
import json
import re
import secrets
import traceback
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import aiohttp.web
import attrs
import kmock
import yaml
from kmock._internal import apps, parsing, rendering

from . import applying
from .metadata import check_meta, check_pod_spec
from .openapi import OpenAPI
from .patching import PatchError, json_patch, merge_patch, strategic_merge_patch
from .quantities import canonical_resources
from .rbac import Authorizer, Identity
from .selectors import match_fields, match_labels, selector_string
from .tables import table
from .validation import BuiltinSchemas, CustomSchema, FieldError

JSON = dict[str, Any]
SERVER_VERSION = {
    "major": "1",
    "minor": "32",
    "gitVersion": "v1.32.0-emulator",
    "platform": "linux/amd64",
}
FOREGROUND = "foregroundDeletion"
# How many events per resource a watch can replay; older resourceVersions are 410 Gone.
EVENT_LOG_SIZE = 10_000


def now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True, eq=False)
class ResourceType:
    """One served resource (a plural of a group/version), built in or from a CRD.

    Equal and hashed by group, version and plural: a CRD changed keeps its stored objects.
    """

    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool = True
    short_names: tuple[str, ...] = ()
    subresources: frozenset[str] = frozenset()
    categories: tuple[str, ...] = ()
    # The scale subresource's paths (specReplicasPath, statusReplicasPath, labelSelectorPath).
    scale: tuple[str, str, str | None] | None = None
    printer_columns: tuple[JSON, ...] = ()
    crd: str | None = None  # the defining CRD's name; None for built-in kinds
    verbs: tuple[str, ...] = (
        "create",
        "delete",
        "deletecollection",
        "get",
        "list",
        "patch",
        "update",
        "watch",
    )

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ResourceType) and self.key == other.key

    def __hash__(self) -> int:
        return hash(self.key)

    @property
    def key(self) -> tuple[str, str, str]:
        return self.group, self.version, self.plural

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def singular(self) -> str:
        return self.kind.lower()

    @property
    def qualified(self) -> str:
        """`kind.group` as Status messages name it (`Deployment.apps`, `Secret`)."""
        return f"{self.kind}.{self.group}" if self.group else self.kind

    @property
    def plural_qualified(self) -> str:
        return f"{self.plural}.{self.group}" if self.group else self.plural


def _builtin(group: str, version: str, plural: str, kind: str, **kw: Any) -> ResourceType:
    return ResourceType(group, version, plural, kind, **kw)


BUILTINS = (
    # Answered, never stored: `kubectl auth can-i` asks the authorizer through it.
    _builtin(
        "authorization.k8s.io",
        "v1",
        "selfsubjectaccessreviews",
        "SelfSubjectAccessReview",
        namespaced=False,
        verbs=("create",),
    ),
    _builtin(
        "",
        "v1",
        "namespaces",
        "Namespace",
        namespaced=False,
        short_names=("ns",),
        subresources=frozenset({"status"}),
    ),
    _builtin("", "v1", "events", "Event", short_names=("ev",)),
    _builtin("", "v1", "secrets", "Secret"),
    _builtin("", "v1", "configmaps", "ConfigMap", short_names=("cm",)),
    _builtin(
        "",
        "v1",
        "serviceaccounts",
        "ServiceAccount",
        short_names=("sa",),
        subresources=frozenset({"token"}),  # TokenRequest: what a kubelet mounts in a pod
    ),
    _builtin(
        "", "v1", "services", "Service", short_names=("svc",), subresources=frozenset({"status"})
    ),
    _builtin(
        "", "v1", "pods", "Pod", short_names=("po",), subresources=frozenset({"status", "log"})
    ),
    _builtin(
        "apps",
        "v1",
        "deployments",
        "Deployment",
        short_names=("deploy",),
        categories=("all",),
        subresources=frozenset({"status", "scale"}),
        scale=(".spec.replicas", ".status.replicas", None),
    ),
    _builtin("coordination.k8s.io", "v1", "leases", "Lease"),
    _builtin(
        "networking.k8s.io", "v1", "networkpolicies", "NetworkPolicy", short_names=("netpol",)
    ),
    _builtin(
        "apiextensions.k8s.io",
        "v1",
        "customresourcedefinitions",
        "CustomResourceDefinition",
        namespaced=False,
        short_names=("crd", "crds"),
        subresources=frozenset({"status"}),
    ),
    _builtin("rbac.authorization.k8s.io", "v1", "roles", "Role"),
    _builtin("rbac.authorization.k8s.io", "v1", "rolebindings", "RoleBinding"),
    _builtin("rbac.authorization.k8s.io", "v1", "clusterroles", "ClusterRole", namespaced=False),
    _builtin(
        "rbac.authorization.k8s.io",
        "v1",
        "clusterrolebindings",
        "ClusterRoleBinding",
        namespaced=False,
    ),
    _builtin(
        "policy",
        "v1",
        "poddisruptionbudgets",
        "PodDisruptionBudget",
        short_names=("pdb",),
        subresources=frozenset({"status"}),
    ),
)


class ApiError(Exception):
    """An answer other than success, rendered as a `Status` object."""

    def __init__(self, code: int, reason: str, message: str, details: JSON | None = None) -> None:
        super().__init__(message)
        self.code, self.reason, self.message, self.details = code, reason, message, details

    def status(self) -> JSON:
        body: JSON = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        }
        if self.details:
            body["details"] = self.details
        return body


def _not_found(rtype: ResourceType, name: str) -> ApiError:
    return ApiError(
        404,
        "NotFound",
        f'{rtype.plural_qualified} "{name}" not found',
        {"name": name, "group": rtype.group, "kind": rtype.plural},
    )


def _invalid(rtype: ResourceType, name: str, errors: list[FieldError]) -> ApiError:
    listed = str(errors[0]) if len(errors) == 1 else "[" + ", ".join(map(str, errors)) + "]"
    return ApiError(
        422,
        "Invalid",
        f'{rtype.qualified} "{name}" is invalid: {listed}',
        {
            "name": name,
            "group": rtype.group,
            "kind": rtype.kind,
            "causes": [e.cause() for e in errors],
        },
    )


_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_GENERATED = "bcdfghjklmnpqrstvwxz2456789"
APPLY_PATCH = "application/apply-patch+yaml"


@dataclass(frozen=True)
class Writer:
    """Who writes: the field manager (the request's `fieldManager`, else its User-Agent up to
    the first `/`, as a real server names it), and for an apply whether it forces."""

    manager: str
    force: bool = False
    scale: bool = False  # through the scale subresource: recorded as subresource "scale"


# Writes the harness makes itself (`install`), not through HTTP.
HARNESS = Writer("emulator")


@dataclass
class _Event:
    rv: int
    type: str
    obj: JSON
    previous: JSON | None


@dataclass
class _Log:
    """A resource's recent events; watchers hold absolute positions in it."""

    events: list[_Event] = field(default_factory=list)
    dropped: int = 0  # events trimmed from the front (absolute position of events[0])
    floor: int = 0  # resourceVersions at or below this are no longer replayable

    @property
    def end(self) -> int:
        return self.dropped + len(self.events)

    def since(self, position: int) -> list[_Event] | None:
        """The events from an absolute position on; None if they were trimmed already."""
        if position < self.dropped:
            return None
        return self.events[position - self.dropped :]


@dataclass(frozen=True)
class _Target:
    """What a resource URL addresses."""

    rtype: ResourceType
    namespace: str | None
    name: str | None
    subresource: str | None


def _fixed_parse_path(path: str) -> parsing.ParsedPath:
    # kmock 0.8 reads `/api/v1/namespaces[/name[/status]]` as a namespace scope and fails or
    # mis-parses it; its DSL filters go through this parser, so it is corrected for them.
    parts = path.strip("/").split("/")
    if (
        len(parts) >= 3
        and parts[0] == "api"
        and parts[2] == "namespaces"
        and (len(parts) <= 4 or (len(parts) == 5 and parts[4] in ("status", "finalize")))
    ):
        return parsing.ParsedPath(
            group="",
            version=parts[1],
            plural="namespaces",
            name=parts[3] if len(parts) > 3 else None,
            subresource=parts[4] if len(parts) > 4 else None,
        )
    return _original_parse_path(path)


_original_parse_path = parsing.parse_path
parsing.parse_path = _fixed_parse_path


class _BinaryBody:
    """A request whose body is not text (protobuf), as kmock gets it: kmock reads every
    body as text, which fails on bytes that are not UTF-8."""

    def __init__(self, raw: aiohttp.web.BaseRequest) -> None:
        self._raw = raw

    def __getattr__(self, name: str) -> Any:
        return getattr(self._raw, name)

    async def text(self) -> str:
        return (await self._raw.read()).decode("latin-1")

    async def json(self, **_: Any) -> Any:
        raise ValueError("not JSON")


async def _parse_any_body(raw_request: aiohttp.web.BaseRequest, *, id: int = 0) -> Any:
    body = await raw_request.read()
    try:
        body.decode(raw_request.charset or "utf-8")
    except UnicodeDecodeError:
        return await _original_request_parse(_BinaryBody(raw_request), id=id)
    return await _original_request_parse(raw_request, id=id)


_original_request_parse = rendering.Request._parse
rendering.Request._parse = staticmethod(_parse_any_body)  # type: ignore[method-assign,assignment]


@attrs.define(kw_only=True)
class Emulator(kmock.KubernetesEmulator):
    """The API server: an aiohttp handler, entered (`async with`) and served by cluster.py."""

    authorizer: Authorizer | None = None
    # Where `pods/log` comes from: (namespace, pod) -> the log text, None if unknown (kubelet).
    pod_logs: Callable[[str, str], str | None] | None = None
    _store: dict[tuple[ResourceType, str | None, str], JSON] = attrs.field(factory=dict, init=False)
    _types: dict[tuple[str, str, str], ResourceType] = attrs.field(factory=dict, init=False)
    _schemas: dict[tuple[str, str, str], CustomSchema] = attrs.field(factory=dict, init=False)
    _logs: dict[tuple[str, str, str], _Log] = attrs.field(factory=dict, init=False)
    _rv: int = attrs.field(default=1, init=False)
    _changed: asyncio.Condition = attrs.field(init=False)
    _builtin_schemas: BuiltinSchemas = attrs.field(factory=BuiltinSchemas.shared, init=False)
    _openapi: OpenAPI = attrs.field(init=False)
    _fields: applying.Schemas = attrs.field(init=False)
    _shapes: dict[tuple[str, str, str], applying.Shape] = attrs.field(factory=dict, init=False)
    failures: list[str] = attrs.field(factory=list, init=False)

    def __attrs_post_init__(self) -> None:
        # Deliberately not the parent's: its fallback reactions are replaced by `_serve`.
        self._changed = asyncio.Condition(self._lock)
        self._openapi = OpenAPI(self._builtin_schemas)
        self._fields = applying.Schemas(self._builtin_schemas.definitions)
        for rtype in BUILTINS:
            self._register(rtype)
        for name in ("default", "kube-system", "kube-public"):
            self._commit_create(
                self._types[("", "v1", "namespaces")],
                None,
                {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}},
            )

    # ---- the request pipeline ----------------------------------------------------------

    async def _handle(self, request: kmock.Request) -> aiohttp.web.StreamResponse:
        headers = request._raw_request.headers if request._raw_request else request.headers
        try:
            identity = (
                self.authorizer.authenticate(headers, self._rbac_objects())
                if (self.authorizer)
                else None
            )
            target = self._target(request.url.path)
            if self.authorizer is not None:
                attributes = self._attributes(request, target)
                self.authorizer.check(identity, attributes, self._rbac_objects())
        except ApiError as exc:
            return aiohttp.web.json_response(exc.status(), status=exc.code)
        # Reactions that tests add with kmock's DSL come first (faults, delays, spies).
        try:
            return await apps.RawHandler._handle(self, request)
        except NotImplementedError:
            pass
        try:
            if target is not None and target.rtype.kind == "SelfSubjectAccessReview":
                return aiohttp.web.json_response(self._review(request, identity), status=201)
            return await self._serve(request, target)
        except ApiError as exc:
            return aiohttp.web.json_response(exc.status(), status=exc.code)

    def _rbac_objects(self) -> list[JSON]:
        return [
            obj
            for (rtype, _, _), obj in self._store.items()
            if rtype.group == "rbac.authorization.k8s.io"
        ]

    def _review(self, request: kmock.Request, identity: Identity | None) -> JSON:
        if "protobuf" in request.headers.get("Content-Type", ""):
            review = _access_review_from_protobuf(request.body)  # what `kubectl auth can-i` sends
        else:
            review = self._body(request, "POST")
        if not isinstance(review, dict):
            raise ApiError(400, "BadRequest", "the body of the request must be an object")
        spec = review.get("spec", {})
        if "resourceAttributes" in spec:
            wanted = spec["resourceAttributes"]
            attributes = {
                "verb": wanted.get("verb", ""),
                "apiGroup": wanted.get("group", ""),
                "resource": wanted.get("resource", ""),
                "subresource": wanted.get("subresource", ""),
                "namespace": wanted.get("namespace", ""),
                "name": wanted.get("name", ""),
            }
        else:
            wanted = spec.get("nonResourceAttributes", {})
            attributes = {"path": wanted.get("path", "/"), "verb": wanted.get("verb", "get")}
        allowed = (
            identity is None
            or self.authorizer is None
            or self.authorizer.allowed(identity, attributes, self._rbac_objects())
        )
        return {**review, "status": {"allowed": allowed}}

    async def _render_error(self, exc: Exception) -> aiohttp.web.StreamResponse:
        # An emulator bug, not an API answer: remembered so that the fixture fails the test.
        self.failures.append(traceback.format_exc())
        return aiohttp.web.json_response(
            ApiError(500, "InternalError", f"emulator failure: {exc!r}").status(), status=500
        )

    def _attributes(self, request: kmock.Request, target: _Target | None) -> JSON:
        method = request.method.value.upper() if request.method else "GET"
        if target is None:
            return {"path": request.url.path, "verb": method.lower()}
        watching = request.params.get("watch") in ("true", "1")
        verb = {
            "GET": "watch" if watching else ("get" if target.name else "list"),
            "POST": "create",
            "PUT": "update",
            "PATCH": "patch",
            "DELETE": "delete" if target.name else "deletecollection",
        }.get(method, method.lower())
        return {
            "verb": verb,
            "apiGroup": target.rtype.group,
            "resource": target.rtype.plural,
            "subresource": target.subresource or "",
            "namespace": target.namespace or "",
            "name": target.name or "",
        }

    def _target(self, path: str) -> _Target | None:
        parts = [p for p in path.split("/") if p]
        if len(parts) >= 2 and parts[0] == "api":
            group, version, rest = "", parts[1], parts[2:]
        elif len(parts) >= 3 and parts[0] == "apis":
            group, version, rest = parts[1], parts[2], parts[3:]
        else:
            return None
        if not rest:
            return None
        namespace = None
        if (
            rest[0] == "namespaces"
            and len(rest) >= 3
            and not (len(rest) == 3 and rest[2] in ("status", "finalize"))
        ):
            namespace, rest = rest[1], rest[2:]
        rtype = self._types.get((group, version, rest[0]))
        if rtype is None:
            raise ApiError(404, "NotFound", "the server could not find the requested resource", {})
        if rtype.namespaced != (namespace is not None) and len(rest) > 1:
            raise ApiError(404, "NotFound", "the server could not find the requested resource", {})
        name = rest[1] if len(rest) > 1 else None
        subresource = "/".join(rest[2:]) or None
        if subresource and subresource not in rtype.subresources:
            raise ApiError(404, "NotFound", "the server could not find the requested resource", {})
        return _Target(rtype, namespace, name, subresource)

    async def _serve(
        self, request: kmock.Request, target: _Target | None
    ) -> aiohttp.web.StreamResponse:
        method = request.method.value.upper() if request.method else "GET"
        path = request.url.path.rstrip("/") or "/"
        if target is None:
            if method != "GET":
                raise ApiError(405, "MethodNotAllowed", "the server does not allow this method")
            return aiohttp.web.json_response(self._discovery(path))
        params = dict(request.params)
        if target.subresource == "log" and method == "GET":
            found = (
                self.pod_logs(target.namespace or "", target.name or "")
                if (self.pod_logs)
                else None
            )
            if found is None or (target.rtype, target.namespace, target.name) not in self._store:
                raise _not_found(target.rtype, target.name or "")
            return aiohttp.web.Response(text=found, content_type="text/plain")
        if method == "GET" and params.get("watch") in ("true", "1"):
            return await self._watch(request, target, params)
        if target.subresource == "token" and method == "POST":
            async with self._lock:
                return aiohttp.web.json_response(self._token_request(target), status=201)
        body = self._body(request, method, target)
        media = request.headers.get("Content-Type", "").split(";")[0].strip()
        writer = self._writer(request, params, method, media)
        answer: tuple[int, JSON]
        async with self._lock:
            if method == "GET":
                answer = 200, self._read(target, request, params)
            elif method == "POST" and target.name is None:
                answer = 201, self._create(target, body, params, writer)
            elif method == "PUT" and target.name:
                answer = 200, self._update(target, lambda _: body, params, writer)
            elif method == "PATCH" and target.name and media == APPLY_PATCH:
                answer = self._apply(target, body, params, writer)
            elif method == "PATCH" and target.name:
                patcher = self._patcher(target, media, body)
                answer = 200, self._update(target, patcher, params, writer)
            elif method == "DELETE" and target.name:
                answer = 200, self._delete(target, body or {}, params)
            elif method == "DELETE":
                answer = 200, self._delete_collection(target, body or {}, params)
            else:
                raise ApiError(405, "MethodNotAllowed", "the server does not allow this method")
            self._changed.notify_all()
        status, payload = answer
        headers = {}
        warnings = payload.pop("\0warnings", None) if isinstance(payload, dict) else None
        if warnings:
            # RFC 7234 warn-text: a quoted string, its quotes and backslashes escaped.
            quoted = (w.replace("\\", "\\\\").replace('"', '\\"') for w in warnings)
            headers["Warning"] = ", ".join(f'299 - "{w}"' for w in quoted)
        return aiohttp.web.json_response(payload, status=status, headers=headers)

    def _body(self, request: kmock.Request, method: str, target: _Target | None = None) -> Any:
        if method not in ("POST", "PUT", "PATCH", "DELETE") or not request.body:
            return None
        content_type = request.headers.get("Content-Type", "")
        if "protobuf" in content_type:
            # kubectl's typed generators (`kubectl create namespace|secret|configmap`) send
            # protobuf: those creations are read; anything else must be JSON or YAML.
            kind = target.rtype.kind if target is not None else ""
            if method in ("POST", "PUT") and kind in _PROTOBUF_KINDS:
                return _object_from_protobuf(request.body, kind)
            if method == "DELETE":
                return _delete_options_from_protobuf(request.body)
            raise ApiError(
                415,
                "UnsupportedMediaType",
                f"the emulator accepts JSON bodies only (got {content_type}); use kubectl apply -f",
            )
        try:
            if "yaml" in content_type:
                return yaml.safe_load(request.body)
            return json.loads(request.body)
        except (ValueError, yaml.YAMLError) as exc:
            raise ApiError(
                400, "BadRequest", f"the body of the request was in an unknown format: {exc}"
            ) from exc

    # ---- discovery and OpenAPI --------------------------------------------------------

    def _discovery(self, path: str) -> Any:
        types = list(self._types.values())
        groups: dict[str, list[str]] = {}
        for rtype in types:
            versions = groups.setdefault(rtype.group, [])
            if rtype.version not in versions:
                versions.append(rtype.version)
        if path == "/version":
            return SERVER_VERSION
        if path in ("/healthz", "/readyz", "/livez"):
            return "ok"
        if path == "/":
            return {
                "paths": sorted(
                    {"/api", "/api/v1", "/apis", "/version", "/openapi/v3"}
                    | {f"/apis/{g}/{v}" for g, vs in groups.items() if g for v in vs}
                )
            }
        if path == "/api":
            return {"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": []}
        if path == "/apis":
            return {
                "kind": "APIGroupList",
                "apiVersion": "v1",
                "groups": [self._group(g, vs) for g, vs in groups.items() if g],
            }
        if path.startswith("/openapi/v3"):
            rest = path.removeprefix("/openapi/v3").strip("/")
            if not rest:
                return self._openapi.index([(t.group, t.version) for t in types])
            return self._openapi.document(
                rest,
                [
                    t
                    for t in types
                    if rest
                    in (f"api/{t.version}" if not t.group else f"apis/{t.group}/{t.version}")
                ],
                self._crd_schemas(),
            )
        parts = path.strip("/").split("/")
        if parts[0] == "api" and len(parts) == 2:
            return self._resource_list("", parts[1], types)
        if parts[0] == "apis" and len(parts) == 2 and parts[1] in groups:
            return {
                "kind": "APIGroup",
                "apiVersion": "v1",
                **self._group(parts[1], groups[parts[1]]),
            }
        if parts[0] == "apis" and len(parts) == 3 and parts[2] in groups.get(parts[1], []):
            return self._resource_list(parts[1], parts[2], types)
        raise ApiError(404, "NotFound", "the server could not find the requested resource", {})

    def _crd_schemas(self) -> dict[tuple[str, str, str], JSON]:
        return {key: schema.schema for key, schema in self._schemas.items()}

    @staticmethod
    def _group(name: str, versions: list[str]) -> JSON:
        listed = [{"groupVersion": f"{name}/{v}", "version": v} for v in versions]
        return {"name": name, "versions": listed, "preferredVersion": listed[0]}

    @staticmethod
    def _resource_list(group: str, version: str, types: list[ResourceType]) -> JSON:
        resources = []
        for rtype in types:
            if (rtype.group, rtype.version) != (group, version):
                continue
            resources.append(
                {
                    "name": rtype.plural,
                    "singularName": rtype.singular,
                    "namespaced": rtype.namespaced,
                    "kind": rtype.kind,
                    "verbs": list(rtype.verbs),
                    "shortNames": list(rtype.short_names),
                    "categories": list(rtype.categories),
                }
            )
            for sub in sorted(rtype.subresources):
                kind = {"scale": "Scale", "token": "TokenRequest"}.get(sub, rtype.kind)
                resources.append(
                    {
                        "name": f"{rtype.plural}/{sub}",
                        "singularName": "",
                        "namespaced": rtype.namespaced,
                        "kind": kind,
                        "verbs": ["create"] if sub == "token" else ["get", "patch", "update"],
                        **({"group": "autoscaling", "version": "v1"} if sub == "scale" else {}),
                        **(
                            {"group": "authentication.k8s.io", "version": "v1"}
                            if sub == "token"
                            else {}
                        ),
                    }
                )
        return {
            "kind": "APIResourceList",
            "apiVersion": "v1",
            "groupVersion": f"{group}/{version}" if group else version,
            "resources": resources,
        }

    # ---- reading ----------------------------------------------------------------------

    def _read(self, target: _Target, request: kmock.Request, params: JSON) -> JSON:
        if target.name is None:
            items = self._select(target, params)
            accept = request.headers.get("Accept", "")
            if "as=Table" in accept:
                return table(target.rtype, items, str(self._rv), params.get("includeObject"))
            return {
                "kind": f"{target.rtype.kind}List",
                "apiVersion": target.rtype.api_version,
                "metadata": {"resourceVersion": str(self._rv)},
                "items": items,
            }
        obj = self._get(target)
        if target.subresource == "scale":
            return self._scale_of(target.rtype, obj)
        if "as=Table" in request.headers.get("Accept", ""):
            return table(target.rtype, [obj], str(self._rv), params.get("includeObject"))
        return copy.deepcopy(obj)

    def _get(self, target: _Target) -> JSON:
        assert target.name is not None
        obj = self._store.get((target.rtype, target.namespace, target.name))
        if obj is None:
            raise _not_found(target.rtype, target.name)
        return obj

    def _select(self, target: _Target, params: JSON) -> list[JSON]:
        return [
            copy.deepcopy(obj)
            for (rtype, ns, _), obj in sorted(
                self._store.items(), key=lambda kv: (kv[0][1] or "", kv[0][2])
            )
            if rtype == target.rtype
            and target.namespace in (None, ns)
            and self._matches(obj, params)
        ]

    @staticmethod
    def _matches(obj: JSON, params: JSON) -> bool:
        labels = obj.get("metadata", {}).get("labels") or {}
        return match_labels(params.get("labelSelector"), labels) and match_fields(
            params.get("fieldSelector"), obj
        )

    async def _watch(
        self, request: kmock.Request, target: _Target, params: JSON
    ) -> aiohttp.web.StreamResponse:
        key = self._key(target.rtype)
        since = params.get("resourceVersion") or "0"
        if target.name:  # a watch on one object is a watch with a name selector
            names = f"metadata.name={target.name}"
            params = {
                **params,
                "fieldSelector": ",".join(filter(None, (params.get("fieldSelector"), names))),
            }
        initial: list[JSON] = []
        # A streaming list (client-go's WatchList, which Helm 4's waiters use): the current
        # state, then a bookmark that marks the end of it, then what follows.
        streaming = params.get("sendInitialEvents") == "true"
        async with self._lock:
            log = self._logs[key]
            if since == "0" or streaming:
                # "Any version": the current state first, as ADDED, then what follows.
                position: int | None = log.end
                initial = [
                    {"type": "ADDED", "object": obj}
                    for obj in self._select(replace(target, name=None), params)
                ]
                if streaming:
                    initial.append(
                        {
                            "type": "BOOKMARK",
                            "object": {
                                "kind": target.rtype.kind,
                                "apiVersion": target.rtype.api_version,
                                "metadata": {
                                    "resourceVersion": str(self._rv),
                                    "annotations": {"k8s.io/initial-events-end": "true"},
                                },
                            },
                        }
                    )
            elif not since.isdigit() or int(since) < log.floor:
                position = None
            else:
                position = log.dropped + next(
                    (i for i, e in enumerate(log.events) if e.rv > int(since)), len(log.events)
                )
        response = aiohttp.web.StreamResponse(headers={"Content-Type": "application/json"})
        assert request._raw_request is not None
        await response.prepare(request._raw_request)
        as_table = "as=Table" in request.headers.get("Accept", "")
        if position is None:
            await self._gone(response, since, log)
            return response
        timeout = float(params.get("timeoutSeconds") or 1800)
        deadline = asyncio.get_running_loop().time() + timeout
        try:
            for event in initial:
                await self._send(response, event, target.rtype, as_table)
            while True:
                async with self._changed:
                    while position >= log.end:
                        remaining = deadline - asyncio.get_running_loop().time()
                        if remaining <= 0:
                            return response
                        try:
                            await asyncio.wait_for(self._changed.wait(), remaining)
                        except TimeoutError:
                            return response
                    batch = log.since(position)
                    position = log.end
                if batch is None:  # this watcher fell behind the log: start over, as kopf can
                    await self._gone(response, since, log)
                    return response
                for logged in batch:
                    out = self._watch_event(logged, target, params)
                    if out is not None:
                        await self._send(response, out, target.rtype, as_table)
        except (ConnectionResetError, asyncio.CancelledError):
            return response

    @staticmethod
    async def _gone(response: aiohttp.web.StreamResponse, since: str, log: _Log) -> None:
        gone = ApiError(410, "Expired", f"too old resource version: {since} ({log.floor})")
        await response.write(
            json.dumps({"type": "ERROR", "object": gone.status()}).encode() + b"\n"
        )

    def _watch_event(self, event: _Event, target: _Target, params: JSON) -> JSON | None:
        def visible(obj: JSON | None) -> bool:
            if obj is None:
                return False
            ns = obj.get("metadata", {}).get("namespace")
            return target.namespace in (None, ns) and self._matches(obj, params)

        now_visible, was_visible = visible(event.obj), visible(event.previous)
        if event.type == "DELETED":
            return {"type": "DELETED", "object": event.obj} if now_visible else None
        if now_visible and was_visible:
            return {"type": "MODIFIED", "object": event.obj}
        if now_visible:
            return {"type": "ADDED", "object": event.obj}
        if was_visible:  # it left the selection: a watcher sees it go
            return {"type": "DELETED", "object": event.obj}
        return None

    @staticmethod
    async def _send(
        response: aiohttp.web.StreamResponse, event: JSON, rtype: ResourceType, as_table: bool
    ) -> None:
        if as_table and event["type"] not in ("ERROR", "BOOKMARK"):
            event = {
                **event,
                "object": table(
                    rtype,
                    [event["object"]],
                    event["object"]["metadata"]["resourceVersion"],
                    "Object",
                ),
            }
        await response.write(json.dumps(event).encode() + b"\n")

    # ---- writing ----------------------------------------------------------------------

    @staticmethod
    def _key(rtype: ResourceType) -> tuple[str, str, str]:
        return rtype.group, rtype.version, rtype.plural

    def _next_rv(self) -> str:
        self._rv += 1
        return str(self._rv)

    def _record(self, rtype: ResourceType, kind: str, obj: JSON, previous: JSON | None) -> None:
        log = self._logs[self._key(rtype)]
        log.events.append(
            _Event(int(obj["metadata"]["resourceVersion"]), kind, copy.deepcopy(obj), previous)
        )
        if len(log.events) > EVENT_LOG_SIZE:
            trimmed = log.events[: len(log.events) - EVENT_LOG_SIZE]
            del log.events[: len(trimmed)]
            log.dropped += len(trimmed)
            log.floor = trimmed[-1].rv

    def _create(
        self,
        target: _Target,
        body: Any,
        params: JSON,
        writer: Writer = HARNESS,
        managers: applying.Managers | None = None,
    ) -> JSON:
        """Create `body`; `managers` are an apply's (else the writer owns all it set)."""
        if not isinstance(body, dict):
            raise ApiError(400, "BadRequest", "the body of the request must be an object")
        rtype = target.rtype
        obj = copy.deepcopy(body)
        self._check_kind(rtype, obj)
        meta = obj.setdefault("metadata", {})
        if rtype.namespaced:
            if meta.get("namespace") not in (None, target.namespace):
                raise ApiError(
                    400,
                    "BadRequest",
                    "the namespace of the provided object does "
                    "not match the namespace sent on the request",
                )
            meta["namespace"] = target.namespace
            if (self._types[("", "v1", "namespaces")], None, target.namespace) not in self._store:
                raise _not_found(self._types[("", "v1", "namespaces")], str(target.namespace))
        else:
            meta.pop("namespace", None)
        if not meta.get("name") and meta.get("generateName"):
            for _ in range(16):
                suffix = "".join(secrets.choice(_GENERATED) for _ in range(5))
                if (rtype, target.namespace, meta["generateName"] + suffix) not in self._store:
                    break
            meta["name"] = meta["generateName"] + suffix
        name = meta.get("name") or ""
        errors = self._check_name(name, rtype)
        if errors:
            raise _invalid(rtype, name, errors)
        if (rtype, target.namespace, name) in self._store:
            raise ApiError(
                409,
                "AlreadyExists",
                f'{rtype.plural_qualified} "{name}" already exists',
                {"name": name, "group": rtype.group, "kind": rtype.plural},
            )
        if "status" in rtype.subresources:
            obj.pop("status", None)  # status is written through /status only
        for server_field in (
            "uid",
            "resourceVersion",
            "creationTimestamp",
            "deletionTimestamp",
            "generation",
            "deletionGracePeriodSeconds",
            "managedFields",
        ):
            meta.pop(server_field, None)
        warnings = self._admit(rtype, obj, None, params)
        if managers is None:
            managers = self._track(target, None, obj, {}, writer)
        _set_managers(obj, managers)
        if params.get("dryRun"):
            meta.update(uid=str(uuid.uuid4()), creationTimestamp=now(), generation=1)
            return obj
        created = self._commit_create(rtype, target.namespace, obj)
        self._side_effects(rtype, None, created)
        answer = {**copy.deepcopy(created), "\0warnings": warnings}
        self._collect_garbage()  # created with owners that are gone: collected at once
        return answer

    def _commit_create(self, rtype: ResourceType, namespace: str | None, obj: JSON) -> JSON:
        obj.setdefault("apiVersion", rtype.api_version)
        obj.setdefault("kind", rtype.kind)
        meta = obj["metadata"]
        meta.update(
            uid=str(uuid.uuid4()),
            creationTimestamp=now(),
            generation=1,
            resourceVersion=self._next_rv(),
        )
        if rtype.kind == "Namespace":
            meta.setdefault("labels", {})["kubernetes.io/metadata.name"] = meta["name"]
            obj["status"] = {"phase": "Active"}
        self._store[(rtype, namespace, meta["name"])] = obj
        self._record(rtype, "ADDED", obj, None)
        return obj

    def _update(
        self,
        target: _Target,
        change: Callable[[JSON], Any],
        params: JSON,
        writer: Writer = HARNESS,
        *,
        applied: bool = False,
    ) -> JSON:
        """Write `change(a copy of the object)`; `applied`: its managedFields are an apply's,
        else the writer owns what it changed."""
        rtype, old = target.rtype, self._get(target)
        assert target.name is not None
        if target.subresource == "scale":
            scale = change(self._scale_of(rtype, old))
            return self._write_scale(target, old, scale, params, writer)
        proposed = change(copy.deepcopy(old))
        if not isinstance(proposed, dict):
            raise ApiError(400, "BadRequest", "the body of the request must be an object")
        proposed = copy.deepcopy(proposed)
        self._check_kind(rtype, proposed)
        meta = proposed.setdefault("metadata", {})
        old_meta = old["metadata"]
        wanted_rv = meta.get("resourceVersion")
        if wanted_rv and wanted_rv != old_meta["resourceVersion"]:
            raise ApiError(
                409,
                "Conflict",
                f"Operation cannot be fulfilled on "
                f'{rtype.plural_qualified} "{target.name}": the object has been '
                "modified; please apply your changes to the latest version and try "
                "again",
                {"name": target.name, "group": rtype.group, "kind": rtype.plural},
            )
        if meta.get("name", target.name) != target.name:
            raise ApiError(
                400, "BadRequest", "the name of the object does not match the name on the URL"
            )
        # The server's fields are the server's; status or the rest, as the URL says.
        for server_field in (
            "uid",
            "creationTimestamp",
            "deletionTimestamp",
            "generation",
            "namespace",
            "name",
            "deletionGracePeriodSeconds",
        ):
            if server_field in old_meta:
                meta[server_field] = old_meta[server_field]
            else:
                meta.pop(server_field, None)
        if target.subresource == "status":
            proposed = {**copy.deepcopy(old), "status": proposed.get("status")}
            if proposed["status"] is None:
                del proposed["status"]
        elif "status" in rtype.subresources:
            if "status" in old:
                proposed["status"] = copy.deepcopy(old["status"])
            else:
                proposed.pop("status", None)
        if old_meta.get("deletionTimestamp"):
            added = set(proposed["metadata"].get("finalizers") or []) - set(
                old_meta.get("finalizers") or []
            )
            if added:
                raise _invalid(
                    rtype,
                    target.name,
                    [
                        FieldError(
                            "metadata.finalizers",
                            "FieldValueForbidden",
                            "no new finalizers can be added if the object is being deleted, "
                            f"found new finalizers {sorted(added)}",
                        )
                    ],
                )
        warnings = self._admit(rtype, proposed, old, params)
        if not applied:
            # Managed fields sent with the object replace the server's (as a real server
            # takes them); none sent keep the stored ones.
            sent = applying.decode(proposed["metadata"].get("managedFields"))
            base = sent or applying.decode(old_meta.get("managedFields"))
            _set_managers(proposed, self._track(target, old, proposed, base, writer))
        if _without(proposed, "metadata", "status") != _without(old, "metadata", "status"):
            proposed["metadata"]["generation"] = old_meta.get("generation", 1) + 1
        if _same(proposed, old):
            # A no-op write: no new resourceVersion, no event (its warnings all the same).
            return {**copy.deepcopy(old), "\0warnings": warnings}
        if params.get("dryRun"):
            return proposed
        proposed["metadata"]["resourceVersion"] = self._next_rv()
        self._store[(rtype, target.namespace, target.name)] = proposed
        self._record(rtype, "MODIFIED", proposed, old)
        self._side_effects(rtype, old, proposed)
        self._collect_garbage()
        return {**copy.deepcopy(proposed), "\0warnings": warnings}

    def _patcher(self, target: _Target, content_type: str, patch: Any) -> Callable[[JSON], Any]:
        media = content_type.split(";")[0].strip()
        rtype = target.rtype

        def apply(current: JSON) -> Any:
            try:
                if media == "application/json-patch+json":
                    return json_patch(current, patch)
                if media == "application/merge-patch+json":
                    return merge_patch(current, patch)
                if media == "application/strategic-merge-patch+json" and rtype.crd is None:
                    kind = "Scale" if target.subresource == "scale" else rtype.kind
                    group, version = (
                        ("autoscaling", "v1") if kind == "Scale" else (rtype.group, rtype.version)
                    )
                    return strategic_merge_patch(
                        current,
                        patch,
                        lambda path: self._builtin_schemas.merge_key(group, version, kind, path),
                    )
            except PatchError as exc:
                if exc.test_failed:
                    raise ApiError(422, "Invalid", str(exc)) from exc
                raise ApiError(400, "BadRequest", str(exc)) from exc
            raise ApiError(
                415,
                "UnsupportedMediaType",
                "the body of the request was in an "
                "unknown format - accepted media types include: "
                "application/json-patch+json, application/merge-patch+json"
                + (", application/strategic-merge-patch+json" if rtype.crd is None else ""),
            )

        return apply

    def _token_request(self, target: _Target) -> JSON:
        """A token for a service account (TokenRequest), known to the authorizer from now
        on as that account."""
        self._get(target)  # 404 for an account that does not exist
        namespace, name = target.namespace or "", target.name or ""
        token = secrets.token_urlsafe(24)
        if self.authorizer is not None:
            self.authorizer.tokens[token] = Identity.service_account(namespace, name)
        expires = datetime.datetime.now(datetime.UTC) + datetime.timedelta(hours=1)
        return {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenRequest",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"audiences": [], "expirationSeconds": 3600},
            "status": {
                "token": token,
                "expirationTimestamp": expires.strftime("%Y-%m-%dT%H:%M:%SZ"),
            },
        }

    # ---- field managers and server-side apply ------------------------------------------

    @staticmethod
    def _writer(request: kmock.Request, params: JSON, method: str, media: str) -> Writer:
        apply = method == "PATCH" and media == APPLY_PATCH
        manager = params.get("fieldManager")
        problems = []
        if apply and not manager:
            problems.append("fieldManager: Required value: is required for apply patch")
        if "force" in params and not apply:
            problems.append("force: Forbidden: may not be specified for non-apply patch")
        if manager and len(manager) > 128:
            problems.append("fieldManager: Too long: may not be longer than 128")
        if problems:
            kind = "PatchOptions" if method == "PATCH" else "CreateOptions"
            raise ApiError(
                422,
                "Invalid",
                f'{kind}.meta.k8s.io "" is invalid: ' + ", ".join(problems),
            )
        if not manager:
            manager = request.headers.get("User-Agent", "").split("/")[0][:128]
        return Writer(manager, force=params.get("force") in ("true", "1"))

    def _shape(self, rtype: ResourceType) -> applying.Shape:
        key = self._key(rtype)
        if rtype.crd is not None:
            shape = self._shapes.get(key)
            if shape is None:
                shape = self._shapes[key] = self._fields.custom(self._schemas[key].schema)
            return shape
        return self._fields.builtin(
            self._builtin_schemas.definition_name(rtype.group, rtype.version, rtype.kind)
        )

    def _scope(self, target: _Target) -> applying.Scope:
        subresource = "status" if target.subresource == "status" else ""
        return applying.Scope("status" in target.rtype.subresources, subresource)

    def _track(
        self,
        target: _Target,
        old: JSON | None,
        new: JSON,
        managers: applying.Managers,
        writer: Writer,
    ) -> applying.Managers:
        """The managers once `writer` changed `old` into `new` (an update: no conflicts)."""
        subresource = "scale" if writer.scale else target.subresource or ""
        key = applying.ManagerKey(writer.manager, "Update", subresource, target.rtype.api_version)
        try:
            return applying.update(
                old, new, managers, key, self._shape(target.rtype), self._scope(target)
            )
        except applying.ApplyError:
            return managers  # an object SSA cannot type (validation refuses most): untracked

    def _apply(self, target: _Target, body: Any, params: JSON, writer: Writer) -> tuple[int, JSON]:
        """Server-side apply: create the object or merge the configuration into it."""
        rtype = target.rtype
        assert target.name is not None
        if target.subresource not in (None, "status"):
            raise ApiError(
                415,
                "UnsupportedMediaType",
                f"the emulator does not apply to the {target.subresource} subresource",
            )
        if not isinstance(body, dict):
            raise ApiError(400, "BadRequest", "the body of the request must be an object")
        for key in ("kind", "apiVersion"):
            if not body.get(key):
                missing = "Kind" if key == "kind" else "apiVersion"
                raise ApiError(
                    400, "BadRequest", f"Object '{missing}' is missing in '{json.dumps(body)}'"
                )
        self._check_kind(rtype, copy.deepcopy(body))
        meta = body.get("metadata") or {}
        if meta.get("managedFields") is not None:
            raise ApiError(400, "BadRequest", "metadata.managedFields must be nil")
        if meta.get("name", target.name) != target.name:
            raise ApiError(
                400,
                "BadRequest",
                f"the name of the object ({meta.get('name')}) does not match the name on "
                f"the URL ({target.name})",
            )
        config = {**body, "metadata": {**meta, "name": target.name}}
        if rtype.namespaced:
            config["metadata"]["namespace"] = target.namespace
        key = applying.ManagerKey(writer.manager, "Apply", target.subresource or "")
        shape, scope = self._shape(rtype), self._scope(target)

        def merged(live: JSON | None) -> tuple[JSON, applying.Managers]:
            managers = applying.decode((live or {}).get("metadata", {}).get("managedFields"))
            try:
                return applying.apply(
                    live,
                    config,
                    managers,
                    key,
                    rtype.api_version,
                    shape,
                    scope,
                    force=writer.force,
                )
            except applying.Conflicts as exc:
                raise ApiError(
                    409,
                    "Conflict",
                    str(exc),
                    {
                        "causes": [
                            {
                                "type": "FieldManagerConflict",
                                "message": f"conflict with {c.manager.printed()}",
                                "field": applying.render_path(c.path),
                            }
                            for c in exc.conflicts
                        ]
                    },
                ) from exc
            except applying.ApplyError as exc:
                raise ApiError(
                    500,
                    "InternalError",
                    f"failed to create typed patch object ({rtype.api_version}, "
                    f"Kind={rtype.kind}): {exc}",
                ) from exc

        if (rtype, target.namespace, target.name) not in self._store:
            if target.subresource:
                raise _not_found(rtype, target.name)
            obj, managers = merged(None)
            return 201, self._create(
                replace(target, name=None), obj, params, writer, managers=managers
            )

        def change(current: JSON) -> JSON:
            obj, managers = merged(current)
            _set_managers(obj, managers)
            return obj

        return 200, self._update(target, change, params, writer, applied=True)

    def _scale_of(self, rtype: ResourceType, obj: JSON) -> JSON:
        assert rtype.scale is not None
        spec_path, status_path, selector_path = rtype.scale
        status: JSON = {"replicas": _lookup(obj, status_path) or 0}
        selector: str | None
        if rtype.crd is None:
            selector = selector_string(obj.get("spec", {}).get("selector"))
        else:
            selector = _lookup(obj, selector_path) if selector_path else None
        if selector:
            status["selector"] = selector
        meta = obj["metadata"]
        return {
            "kind": "Scale",
            "apiVersion": "autoscaling/v1",
            "metadata": {
                k: meta[k]
                for k in ("name", "namespace", "uid", "resourceVersion", "creationTimestamp")
                if k in meta
            },
            "spec": {"replicas": _lookup(obj, spec_path) or 0},
            "status": status,
        }

    def _write_scale(
        self, target: _Target, old: JSON, scale: Any, params: JSON, writer: Writer
    ) -> JSON:
        rtype = target.rtype
        assert rtype.scale is not None and target.name is not None
        replicas = scale.get("spec", {}).get("replicas") if isinstance(scale, dict) else None
        if not isinstance(replicas, int) or isinstance(replicas, bool) or replicas < 0:
            raise ApiError(
                422,
                "Invalid",
                f'Scale.autoscaling "{target.name}" is invalid: '
                f"spec.replicas: Invalid value: {json.dumps(replicas)}: must be a "
                "non-negative integer",
            )
        wanted_rv = scale.get("metadata", {}).get("resourceVersion")
        spec_path = rtype.scale[0]

        def set_replicas(current: JSON) -> JSON:
            _assign(current, spec_path, replicas)
            if wanted_rv:
                current["metadata"]["resourceVersion"] = wanted_rv
            return current

        updated = self._update(
            replace(target, subresource=None), set_replicas, params, replace(writer, scale=True)
        )
        updated.pop("\0warnings", None)
        return self._scale_of(rtype, updated)

    def _check_kind(self, rtype: ResourceType, obj: JSON) -> None:
        kind, api_version = obj.get("kind"), obj.get("apiVersion")
        if kind not in (None, rtype.kind) or api_version not in (None, rtype.api_version):
            raise ApiError(
                400,
                "BadRequest",
                f"the API version in the data ({api_version}) "
                f"and kind ({kind}) do not match the URL ({rtype.api_version}, "
                f"{rtype.kind})",
            )
        obj["kind"], obj["apiVersion"] = rtype.kind, rtype.api_version

    @staticmethod
    def _check_name(name: str, rtype: ResourceType) -> list[FieldError]:
        if not name:
            return [
                FieldError(
                    "metadata.name", "FieldValueRequired", "name or generateName is required"
                )
            ]
        if len(name) > 253 or not _NAME.match(name):
            return [
                FieldError(
                    "metadata.name",
                    "FieldValueInvalid",
                    "a lowercase RFC 1123 subdomain must consist of lower case "
                    "alphanumeric characters, '-' or '.', and must start and end "
                    "with an alphanumeric character",
                    name,
                )
            ]
        return []

    def _admit(self, rtype: ResourceType, obj: JSON, old: JSON | None, params: JSON) -> list[str]:
        """Default, prune and validate `obj` in place; return warnings; raise 4xx on refusal."""
        name = obj["metadata"].get("name", "")
        strict = params.get("fieldValidation") == "Strict"
        warnings: list[str] = []
        if rtype.crd is not None:
            schema = self._schemas[self._key(rtype)]
            unknown = schema.prune(obj)
            if unknown and strict:
                fields = ", ".join(f'unknown field "{u}"' for u in unknown)
                raise ApiError(
                    400,
                    "BadRequest",
                    f'{rtype.kind} in version "{rtype.version}" '
                    f"cannot be handled as a {rtype.kind}: strict decoding error: "
                    f"{fields}",
                )
            warnings += [f'unknown field "{u}"' for u in unknown]
            schema.default(obj)
            errors = check_meta(obj["metadata"], "metadata") + schema.validate(obj, old)
        else:
            _default_builtin(obj)
            if strict:
                unknown_errors = [
                    e
                    for e in self._builtin_schemas.validate(obj, strict=True)
                    if e.detail == "unknown field"
                ]
                if unknown_errors:
                    fields = ", ".join(f'unknown field "{e.field}"' for e in unknown_errors)
                    raise ApiError(
                        400,
                        "BadRequest",
                        f"{rtype.kind} in version "
                        f'"{rtype.version}" cannot be handled as a {rtype.kind}: '
                        f"strict decoding error: {fields}",
                    )
            errors = self._builtin_schemas.validate(obj)
            errors += check_meta(obj["metadata"], "metadata")
            errors += _builtin_rules(rtype, obj, old)
            if rtype.kind == "CustomResourceDefinition" and not errors:
                errors += self._check_crd(obj)
                if not errors:
                    obj["status"] = _crd_status(obj, old)
        if errors:
            raise _invalid(rtype, name, errors)
        return warnings

    # ---- deletion and garbage collection ----------------------------------------------

    def _delete(self, target: _Target, options: JSON, params: JSON) -> JSON:
        obj = self._get(target)
        assert target.name is not None
        preconditions = options.get("preconditions") or {}
        for key in ("uid", "resourceVersion"):
            if preconditions.get(key) and preconditions[key] != obj["metadata"].get(key):
                raise ApiError(
                    409,
                    "Conflict",
                    f"Precondition failed: {key} in precondition: "
                    f"{preconditions[key]}, {key} in object meta: "
                    f"{obj['metadata'].get(key)}",
                )
        if params.get("dryRun") or options.get("dryRun"):
            return copy.deepcopy(obj)
        policy = options.get("propagationPolicy") or params.get("propagationPolicy")
        if policy == "Orphan" or options.get("orphanDependents") is True:
            self._orphan(obj["metadata"]["uid"])
        elif policy == "Foreground" and not obj["metadata"].get("deletionTimestamp"):
            # The owner stays (deletionTimestamp, this finalizer) until its dependents are gone.
            finalizers = obj["metadata"].setdefault("finalizers", [])
            if FOREGROUND not in finalizers:
                finalizers.append(FOREGROUND)
        result = self._mark_deleted(target.rtype, target.namespace, target.name)
        self._collect_garbage()
        return result

    def _delete_collection(self, target: _Target, options: JSON, params: JSON) -> JSON:
        items = self._select(target, params)
        for item in items:
            meta = item["metadata"]
            self._delete(
                replace(target, namespace=meta.get("namespace"), name=meta["name"]), options, {}
            )
        return {
            "kind": f"{target.rtype.kind}List",
            "apiVersion": target.rtype.api_version,
            "metadata": {"resourceVersion": str(self._rv)},
            "items": items,
        }

    def _mark_deleted(self, rtype: ResourceType, namespace: str | None, name: str) -> JSON:
        """Delete now, or set `deletionTimestamp` while finalizers remain."""
        key = (rtype, namespace, name)
        obj = self._store[key]
        if obj["metadata"].get("deletionTimestamp"):
            return copy.deepcopy(obj)
        blocked = obj["metadata"].get("finalizers") or (
            rtype.kind == "Namespace" and self._namespace_has_objects(name)
        )
        if blocked:
            old = copy.deepcopy(obj)
            obj["metadata"]["deletionTimestamp"] = now()
            obj["metadata"]["deletionGracePeriodSeconds"] = 0
            if rtype.kind == "Namespace":
                obj["status"] = {"phase": "Terminating"}
                for (other, ns, other_name), _ in list(self._store.items()):
                    if ns == name and (other, ns, other_name) in self._store:
                        self._mark_deleted(other, ns, other_name)
            obj["metadata"]["resourceVersion"] = self._next_rv()
            self._record(rtype, "MODIFIED", obj, old)
            return copy.deepcopy(obj)
        del self._store[key]
        gone = copy.deepcopy(obj)
        gone["metadata"]["resourceVersion"] = self._next_rv()
        self._record(rtype, "DELETED", gone, obj)
        self._side_effects(rtype, obj, None)
        return gone

    def _namespace_has_objects(self, namespace: str) -> bool:
        return any(ns == namespace for (_, ns, _) in self._store)

    def _orphan(self, uid: str) -> None:
        for (rtype, _, _), obj in list(self._store.items()):
            refs = obj["metadata"].get("ownerReferences") or []
            if any(ref.get("uid") == uid for ref in refs):
                old = copy.deepcopy(obj)
                kept = [ref for ref in refs if ref.get("uid") != uid]
                if kept:
                    obj["metadata"]["ownerReferences"] = kept
                else:
                    del obj["metadata"]["ownerReferences"]
                obj["metadata"]["resourceVersion"] = self._next_rv()
                self._record(rtype, "MODIFIED", obj, old)

    def _collect_garbage(self) -> None:
        """Until nothing changes: release finalized objects, delete orphans, empty namespaces."""
        changed = True
        while changed:
            changed = False
            uids = {obj["metadata"]["uid"] for obj in self._store.values()}
            for (rtype, ns, name), obj in list(self._store.items()):
                if (rtype, ns, name) not in self._store:
                    continue
                meta = obj["metadata"]
                refs = meta.get("ownerReferences") or []
                if meta.get("deletionTimestamp") and FOREGROUND in (meta.get("finalizers") or []):
                    changed |= self._delete_dependents_first(rtype, obj)
                elif meta.get("deletionTimestamp"):
                    finished = not meta.get("finalizers") and not (
                        rtype.kind == "Namespace" and self._namespace_has_objects(name)
                    )
                    if finished:
                        old = self._store.pop((rtype, ns, name))
                        gone = copy.deepcopy(old)
                        gone["metadata"]["resourceVersion"] = self._next_rv()
                        self._record(rtype, "DELETED", gone, old)
                        self._side_effects(rtype, old, None)
                        changed = True
                elif refs and not any(ref.get("uid") in uids for ref in refs):
                    self._mark_deleted(rtype, ns, name)
                    changed = True

    def _delete_dependents_first(self, rtype: ResourceType, owner: JSON) -> bool:
        """Foreground deletion: delete the dependents, then drop the owner's finalizer."""
        uid = owner["metadata"]["uid"]
        dependents = [
            (other, ns, name)
            for (other, ns, name), obj in self._store.items()
            if any(ref.get("uid") == uid for ref in obj["metadata"].get("ownerReferences") or [])
        ]
        pending = [
            key for key in dependents if not self._store[key]["metadata"].get("deletionTimestamp")
        ]
        for other, ns, name in pending:
            self._mark_deleted(other, ns, name)
        if dependents:
            return bool(pending)
        old = copy.deepcopy(owner)
        owner["metadata"]["finalizers"].remove(FOREGROUND)
        owner["metadata"]["resourceVersion"] = self._next_rv()
        self._record(rtype, "MODIFIED", owner, old)
        return True

    # ---- CustomResourceDefinitions ----------------------------------------------------

    def _check_crd(self, crd: JSON) -> list[FieldError]:
        spec = crd.get("spec", {})
        names = spec.get("names", {})
        expected = f"{names.get('plural')}.{spec.get('group')}"
        if crd["metadata"].get("name") != expected:
            return [
                FieldError(
                    "metadata.name",
                    "FieldValueInvalid",
                    'must be spec.names.plural+"."+spec.group',
                    crd["metadata"].get("name"),
                )
            ]
        errors = []
        storage = [v for v in spec.get("versions", []) if v.get("storage")]
        if len(storage) != 1:
            errors.append(
                FieldError(
                    "spec.versions",
                    "FieldValueInvalid",
                    "must have exactly one version marked as storage version",
                    spec.get("versions"),
                )
            )
        for index, version in enumerate(spec.get("versions", [])):
            schema = version.get("schema", {}).get("openAPIV3Schema")
            if schema is None:
                errors.append(
                    FieldError(
                        f"spec.versions[{index}].schema.openAPIV3Schema",
                        "FieldValueRequired",
                        "schemas are required",
                    )
                )
                continue
            try:
                CustomSchema(schema)
            except ValueError as exc:
                errors.append(
                    FieldError(
                        f"spec.versions[{index}].schema.openAPIV3Schema",
                        "FieldValueInvalid",
                        f"compilation failed: {exc}",
                        "object",
                    )
                )
        return errors

    def _side_effects(self, rtype: ResourceType, old: JSON | None, new: JSON | None) -> None:
        if rtype.kind != "CustomResourceDefinition":
            return
        if old is not None:
            for key, served in list(self._types.items()):
                if served.crd == old["metadata"]["name"]:
                    if new is None:
                        for stored in [k for k in self._store if k[0] == served]:
                            gone = self._store.pop(stored)
                            self._record(served, "DELETED", gone, gone)
                    del self._types[key]
                    self._schemas.pop(key, None)
                    self._shapes.pop(key, None)
                    self._openapi.invalidate()
        if new is None:
            return
        spec = new["spec"]
        names = spec["names"]
        for version in spec.get("versions", []):
            if not version.get("served", True):
                continue
            subresources = version.get("subresources") or {}
            scale = subresources.get("scale")
            rtype = ResourceType(
                group=spec["group"],
                version=version["name"],
                plural=names["plural"],
                kind=names["kind"],
                namespaced=spec.get("scope", "Namespaced") == "Namespaced",
                short_names=tuple(names.get("shortNames", [])),
                categories=tuple(names.get("categories", [])),
                subresources=frozenset(subresources),
                scale=(
                    scale["specReplicasPath"],
                    scale["statusReplicasPath"],
                    scale.get("labelSelectorPath"),
                )
                if scale
                else None,
                printer_columns=tuple(version.get("additionalPrinterColumns", [])),
                crd=new["metadata"]["name"],
            )
            self._register(rtype)
            self._schemas[self._key(rtype)] = CustomSchema(version["schema"]["openAPIV3Schema"])
            self._shapes.pop(self._key(rtype), None)

    def _register(self, rtype: ResourceType) -> None:
        key = self._key(rtype)
        self._types[key] = rtype
        self._logs.setdefault(key, _Log(floor=self._rv))
        self._openapi.invalidate()

    # ---- for tests and the harness (call from the emulator's event loop) ---------------

    async def install(self, crd: JSON) -> None:
        """Create or replace a CRD, as `kubectl apply` of it would."""
        rtype = self._types[("apiextensions.k8s.io", "v1", "customresourcedefinitions")]
        target = _Target(rtype, None, None, None)
        async with self._lock:
            name = crd["metadata"]["name"]
            if (rtype, None, name) in self._store:
                self._update(
                    replace(target, name=name),
                    lambda old: {
                        **crd,
                        "metadata": {
                            **crd["metadata"],
                            "resourceVersion": old["metadata"]["resourceVersion"],
                        },
                    },
                    {},
                )
            else:
                self._create(target, crd, {})
            self._changed.notify_all()

    async def compact(self) -> None:
        """etcd's compaction: no watch may start or resume from a resourceVersion older than
        the newest (410 Gone); watches already open go on."""
        async with self._lock:
            for log in self._logs.values():
                log.dropped += len(log.events)
                log.events.clear()
                log.floor = self._rv

    async def snapshot(
        self, api_version: str, plural: str, namespace: str | None = None, name: str | None = None
    ) -> list[JSON]:
        """Copies of the stored objects of a resource (one namespace, or one object)."""
        group, _, version = api_version.rpartition("/")
        async with self._lock:
            rtype = self._types[(group, version, plural)]
            return [
                copy.deepcopy(obj)
                for (t, ns, n), obj in self._store.items()
                if t == rtype and namespace in (None, ns) and name in (None, n)
            ]


def _protobuf_fields(data: bytes) -> dict[int, list[bytes | int]]:
    """The fields of one protobuf message (wire types varint and length-delimited only)."""
    fields: dict[int, list[bytes | int]] = {}
    position = 0

    def varint() -> int:
        nonlocal position
        result = shift = 0
        while True:
            byte = data[position]
            position += 1
            result |= (byte & 0x7F) << shift
            shift += 7
            if not byte & 0x80:
                return result

    while position < len(data):
        key = varint()
        number, wire = key >> 3, key & 7
        if wire == 0:
            fields.setdefault(number, []).append(varint())
        elif wire == 2:
            length = varint()
            fields.setdefault(number, []).append(data[position : position + length])
            position += length
        else:
            raise ApiError(415, "UnsupportedMediaType", f"unexpected protobuf wire type {wire}")
    return fields


def _access_review_from_protobuf(body: bytes) -> JSON:
    """A SelfSubjectAccessReview from Kubernetes' protobuf envelope (`k8s\\0` + Unknown)."""
    if not body.startswith(b"k8s\x00"):
        raise ApiError(415, "UnsupportedMediaType", "not a Kubernetes protobuf body")

    def text(fields: dict[int, list[bytes | int]], number: int) -> str:
        value = fields.get(number, [b""])[0]
        return value.decode() if isinstance(value, bytes) else str(value)

    def message(fields: dict[int, list[bytes | int]], number: int) -> dict[int, list[bytes | int]]:
        value = fields.get(number)
        return _protobuf_fields(value[0]) if value and isinstance(value[0], bytes) else {}

    raw = message(_protobuf_fields(body[4:]), 2)  # Unknown.raw: the review itself
    spec = message(raw, 2)
    review: JSON = {
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SelfSubjectAccessReview",
        "metadata": {},
        "spec": {},
    }
    if 1 in spec:
        attributes = message(spec, 1)
        names = ("namespace", "verb", "group", "version", "resource", "subresource", "name")
        review["spec"]["resourceAttributes"] = {
            key: text(attributes, number) for number, key in enumerate(names, 1)
        }
    if 2 in spec:
        attributes = message(spec, 2)
        review["spec"]["nonResourceAttributes"] = {
            "path": text(attributes, 1),
            "verb": text(attributes, 2),
        }
    return review


# What `kubectl create namespace|secret|configmap` sends as protobuf, read back into JSON:
# the kind's message has ObjectMeta as field 1, then these fields (number → name, how).
_PROTOBUF_KINDS: dict[str, dict[int, tuple[str, str]]] = {
    "Namespace": {2: ("spec", "namespace-spec")},
    "Secret": {
        2: ("data", "map-bytes"),
        3: ("type", "string"),
        4: ("stringData", "map-string"),
        5: ("immutable", "bool"),
    },
    "ConfigMap": {
        2: ("data", "map-string"),
        3: ("binaryData", "map-bytes"),
        4: ("immutable", "bool"),
    },
}


def _object_from_protobuf(body: bytes, kind: str) -> JSON:
    """A Namespace, Secret or ConfigMap from Kubernetes' protobuf envelope (`k8s\\0` +
    runtime.Unknown{typeMeta, raw}): the fields kubectl's generators set."""
    if not body.startswith(b"k8s\x00"):
        raise ApiError(415, "UnsupportedMediaType", "not a Kubernetes protobuf body")
    unknown = _protobuf_fields(body[4:])

    def first(fields: dict[int, list[bytes | int]], number: int) -> bytes | int | None:
        values = fields.get(number)
        return values[0] if values else None

    def text(value: bytes | int | None) -> str:
        return value.decode() if isinstance(value, bytes) else ""

    def entries(values: list[bytes | int]) -> dict[str, bytes]:
        found = {}
        for entry in values:
            if isinstance(entry, bytes):
                pair = _protobuf_fields(entry)
                value = first(pair, 2)
                found[text(first(pair, 1))] = value if isinstance(value, bytes) else b""
        return found

    type_meta = first(unknown, 1)
    meta_fields = _protobuf_fields(type_meta) if isinstance(type_meta, bytes) else {}
    raw = first(unknown, 2)
    fields = _protobuf_fields(raw) if isinstance(raw, bytes) else {}
    object_meta = first(fields, 1)
    meta = _protobuf_fields(object_meta) if isinstance(object_meta, bytes) else {}
    metadata: JSON = {}
    for number, name in (
        (1, "name"),
        (2, "generateName"),
        (3, "namespace"),
        (5, "uid"),
        (6, "resourceVersion"),
    ):
        if text(first(meta, number)):  # protobuf's empty string is an unset field
            metadata[name] = text(first(meta, number))
    for number, name in ((11, "labels"), (12, "annotations")):
        if number in meta:
            metadata[name] = {k: v.decode() for k, v in entries(meta[number]).items()}
    if 14 in meta:
        metadata["finalizers"] = [text(v) for v in meta[14]]
    obj: JSON = {
        "apiVersion": text(first(meta_fields, 1)) or "v1",
        "kind": text(first(meta_fields, 2)) or kind,
        "metadata": metadata,
    }
    for number, (name, how) in _PROTOBUF_KINDS[kind].items():
        if number not in fields:
            continue
        values = fields[number]
        if how == "map-bytes":
            obj[name] = {k: base64.b64encode(v).decode() for k, v in entries(values).items()}
        elif how == "map-string":
            obj[name] = {k: v.decode() for k, v in entries(values).items()}
        elif how == "string" and text(values[0]):  # empty: unset, and defaulted
            obj[name] = text(values[0])
        elif how == "bool":
            obj[name] = bool(values[0])
        elif how == "namespace-spec" and isinstance(values[0], bytes):
            spec = _protobuf_fields(values[0])
            obj[name] = {"finalizers": [text(v) for v in spec.get(1, [])]}
    return obj


def _delete_options_from_protobuf(body: bytes) -> JSON:
    """DeleteOptions as client-go's typed clients send them (protobuf): the policy and the
    preconditions; the rest (grace period, dry run) plays no part here."""
    if not body.startswith(b"k8s\x00"):
        raise ApiError(415, "UnsupportedMediaType", "not a Kubernetes protobuf body")
    raw = _protobuf_fields(body[4:]).get(2, [b""])[0]
    fields = _protobuf_fields(raw) if isinstance(raw, bytes) else {}
    options: JSON = {}
    policy = fields.get(4, [b""])[0]
    if isinstance(policy, bytes) and policy:
        options["propagationPolicy"] = policy.decode()
    if 3 in fields:
        options["orphanDependents"] = bool(fields[3][0])
    preconditions = fields.get(2, [b""])[0]
    if isinstance(preconditions, bytes) and preconditions:
        found = _protobuf_fields(preconditions)
        options["preconditions"] = {
            name: value.decode()
            for number, name in ((1, "uid"), (2, "resourceVersion"))
            if isinstance(value := found.get(number, [b""])[0], bytes) and value
        }
    return options


def _set_managers(obj: JSON, managers: applying.Managers) -> None:
    encoded = applying.encode(managers)
    if encoded:
        obj["metadata"]["managedFields"] = encoded
    else:
        obj["metadata"].pop("managedFields", None)


def _crd_status(crd: JSON, old: JSON | None) -> JSON:
    """A CRD is established at once (a real server takes a moment)."""
    if old is not None and old.get("status"):
        return copy.deepcopy(old["status"])
    spec = crd["spec"]
    return {
        "acceptedNames": dict(spec["names"]),
        "storedVersions": [v["name"] for v in spec["versions"] if v.get("storage")],
        "conditions": [
            {
                "type": "NamesAccepted",
                "status": "True",
                "reason": "NoConflicts",
                "message": "no conflicts found",
                "lastTransitionTime": now(),
            },
            {
                "type": "Established",
                "status": "True",
                "reason": "InitialNamesAccepted",
                "message": "the initial names have been accepted",
                "lastTransitionTime": now(),
            },
        ],
    }


def _same(a: JSON, b: JSON) -> bool:
    def bare(obj: JSON) -> JSON:
        meta = {k: v for k, v in obj["metadata"].items() if k != "resourceVersion"}
        return {**obj, "metadata": meta}

    return bare(a) == bare(b)


def _without(obj: JSON, *keys: str) -> JSON:
    return {k: v for k, v in obj.items() if k not in keys and k not in ("apiVersion", "kind")}


def _lookup(obj: JSON, path: str | None) -> Any:
    value: Any = obj
    for part in (path or "").strip(".").split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return value


def _assign(obj: JSON, path: str, value: Any) -> None:
    parts = path.strip(".").split(".")
    for part in parts[:-1]:
        obj = obj.setdefault(part, {})
    obj[parts[-1]] = value


def _default_builtin(obj: JSON) -> None:
    """The defaults of built-in kinds that the code under test reads back."""
    kind = obj["kind"]
    if kind == "Secret":
        obj.setdefault("type", "Opaque")
        string_data = obj.pop("stringData", None) or {}
        data: JSON = obj.setdefault("data", {}) if string_data else {}
        for key, value in string_data.items():
            data[key] = base64.b64encode(str(value).encode()).decode()
    if kind == "Pod":
        canonical_resources(obj.get("spec", {}))
    if kind == "Deployment":
        spec = obj.setdefault("spec", {})
        spec.setdefault("replicas", 1)
        spec.setdefault("revisionHistoryLimit", 10)
        spec.setdefault("progressDeadlineSeconds", 600)
        strategy = spec.setdefault("strategy", {"type": "RollingUpdate"})
        if strategy.get("type", "RollingUpdate") == "RollingUpdate":
            strategy.setdefault("type", "RollingUpdate")
            strategy.setdefault("rollingUpdate", {}).setdefault("maxUnavailable", "25%")
            strategy["rollingUpdate"].setdefault("maxSurge", "25%")
        pod = spec.setdefault("template", {}).setdefault("spec", {})
        pod.setdefault("restartPolicy", "Always")
        pod.setdefault("terminationGracePeriodSeconds", 30)
        pod.setdefault("dnsPolicy", "ClusterFirst")
        pod.setdefault("schedulerName", "default-scheduler")
        pod.setdefault("securityContext", {})
        canonical_resources(pod)
        for container in pod.get("containers", []):
            image = str(container.get("image", ""))
            latest = ":" not in image.rsplit("/", 1)[-1] or image.endswith(":latest")
            container.setdefault("imagePullPolicy", "Always" if latest else "IfNotPresent")
            container.setdefault("terminationMessagePath", "/dev/termination-log")
            container.setdefault("terminationMessagePolicy", "File")
            for port in container.get("ports", []):
                port.setdefault("protocol", "TCP")
            for probe_name in ("readinessProbe", "livenessProbe", "startupProbe"):
                probe = container.get(probe_name)
                if isinstance(probe, dict):
                    probe.setdefault("timeoutSeconds", 1)
                    probe.setdefault("periodSeconds", 10)
                    probe.setdefault("successThreshold", 1)
                    probe.setdefault("failureThreshold", 3)
                    if isinstance(probe.get("httpGet"), dict):
                        probe["httpGet"].setdefault("scheme", "HTTP")


def _builtin_rules(rtype: ResourceType, obj: JSON, old: JSON | None) -> list[FieldError]:
    """The few validations of built-in kinds that their schemas cannot say."""
    errors: list[FieldError] = []
    if rtype.kind == "Pod":
        errors += check_pod_spec(obj.get("spec", {}), "spec")
    if rtype.kind == "Deployment":
        spec = obj.get("spec", {})
        template = spec.get("template", {})
        errors += check_meta(template.get("metadata", {}), "spec.template.metadata")
        errors += check_pod_spec(template.get("spec", {}), "spec.template.spec")
        selector = spec.get("selector") or {}
        labels = spec.get("template", {}).get("metadata", {}).get("labels") or {}
        if not match_labels(selector_string(selector), labels) or not selector:
            errors.append(
                FieldError(
                    "spec.template.metadata.labels",
                    "FieldValueInvalid",
                    "`selector` does not match template `labels`",
                    labels,
                )
            )
        if old is not None and old.get("spec", {}).get("selector") != selector:
            errors.append(
                FieldError("spec.selector", "FieldValueInvalid", "field is immutable", selector)
            )
        if isinstance(spec.get("replicas"), int) and spec["replicas"] < 0:
            errors.append(
                FieldError(
                    "spec.replicas",
                    "FieldValueInvalid",
                    "must be greater than or equal to 0",
                    spec["replicas"],
                )
            )
    if rtype.kind == "Secret":
        for key, value in (obj.get("data") or {}).items():
            try:
                base64.b64decode(str(value), validate=True)
            except ValueError:
                errors.append(
                    FieldError(
                        f"data[{key}]", "FieldValueInvalid", "illegal base64 data", "<redacted>"
                    )
                )
    return errors
