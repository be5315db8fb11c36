"""`/openapi/v3`: what kubectl reads before `apply` and `create`.

kubectl (1.27 and later) looks up each group/version's OpenAPI v3 document: when the PATCH
operation of a kind declares the `fieldValidation` query parameter, kubectl leaves validation
to the server and sends `fieldValidation=Strict`; the emulator then refuses unknown fields and
invalid values itself (`validation.py`), as a real server does. The documents also carry the
schemas (built-in kinds from the Kubernetes schemas, custom resources from their CRDs), which
kubectl uses for strategic-merge metadata. Without these documents kubectl needs
`--validate=false`; with them, no test does.
"""

from __future__ import annotations

import copy
import functools
import hashlib
import json
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .emulator import ResourceType
    from .validation import BuiltinSchemas

JSON = dict[str, Any]


def _gv_path(group: str, version: str) -> str:
    return f"apis/{group}/{version}" if group else f"api/{version}"


def _to_openapi3(node: Any) -> Any:
    """JSON-schema style (`type: [X, "null"]`, `$defs` refs) to OpenAPI v3 style."""
    if isinstance(node, list):
        return [_to_openapi3(item) for item in node]
    if not isinstance(node, dict):
        return node
    result = {}
    for key, value in node.items():
        if key == "$ref":
            result[key] = "#/components/schemas/" + value.rsplit("/", 1)[-1]
        elif key == "type" and isinstance(value, list):
            types = [t for t in value if t != "null"]
            result["type"] = types[0] if len(types) == 1 else types
            if "null" in value:
                result["nullable"] = True
        elif key == "properties" and isinstance(value, dict):
            result[key] = {k: _to_openapi3(v) for k, v in value.items()}
        else:
            result[key] = _to_openapi3(value)
    return result


class OpenAPI:
    def __init__(self, builtins: BuiltinSchemas) -> None:
        self._builtins = builtins

    def index(self, gvs: list[tuple[str, str]]) -> JSON:
        # The hash changes whenever a document might (a CRD installed or changed), so kubectl's
        # cache never serves a stale one; a per-call counter would defeat that cache entirely.
        return {
            "paths": {
                _gv_path(g, v): {"serverRelativeURL": f"/openapi/v3/{_gv_path(g, v)}?hash={h}"}
                for g, v in sorted(set(gvs))
                for h in [self._hash_of(g, v)]
            }
        }

    def _hash_of(self, group: str, version: str) -> str:
        return hashlib.sha256(f"{group}/{version}/{self._generation}".encode()).hexdigest()[:16]

    _generation = 0

    def invalidate(self) -> None:
        self._generation += 1

    def document(
        self, gv_path: str, types: list[ResourceType], crd_schemas: dict[tuple[str, str, str], JSON]
    ) -> JSON:
        paths: JSON = {}
        schemas: JSON = {}
        for rtype in types:
            gvk = {"group": rtype.group, "version": rtype.version, "kind": rtype.kind}
            base = "/" + gv_path + ("/namespaces/{namespace}" if rtype.namespaced else "")
            collection, item = f"{base}/{rtype.plural}", f"{base}/{rtype.plural}/{{name}}"
            paths[collection] = {
                "get": self._operation("list", gvk),
                "post": self._operation("post", gvk),
            }
            paths[item] = {
                verb: self._operation(action, gvk)
                for verb, action in (
                    ("get", "get"),
                    ("put", "put"),
                    ("patch", "patch"),
                    ("delete", "delete"),
                )
            }
            if rtype.crd is not None:
                key = (rtype.group, rtype.version, rtype.plural)
                schema = copy.deepcopy(crd_schemas.get(key, {}))
                schema["x-kubernetes-group-version-kind"] = [gvk]
                schemas[_crd_schema_name(rtype)] = schema
            else:
                name = self._builtins.definition_name(rtype.group, rtype.version, rtype.kind)
                if name:
                    schemas.update(self._closure(name))
        return {
            "openapi": "3.0.0",
            "info": {"title": "Kubernetes", "version": "v1.32.0"},
            "paths": paths,
            "components": {"schemas": schemas},
        }

    @staticmethod
    def _operation(action: str, gvk: JSON) -> JSON:
        parameters = []
        if action in ("post", "put", "patch"):
            parameters.append(
                {
                    "name": "fieldValidation",
                    "in": "query",
                    "schema": {"type": "string", "uniqueItems": True},
                }
            )
        return {
            "x-kubernetes-action": action,
            "x-kubernetes-group-version-kind": gvk,
            "parameters": parameters,
            "responses": {"200": {"description": "OK"}},
        }

    @functools.cache  # noqa: B019 - the schemas never change while the process lives
    def _closure(self, name: str) -> JSON:
        found: JSON = {}
        pending = [name]
        while pending:
            current = pending.pop()
            if current in found:
                continue
            definition = self._builtins.definitions.get(current)
            if definition is None:
                continue
            found[current] = _to_openapi3(definition)
            text = json.dumps(definition)
            for part in text.split('"$ref": "')[1:]:
                pending.append(part.split('"', 1)[0].rsplit("/", 1)[-1])
        return found


def _crd_schema_name(rtype: ResourceType) -> str:
    reversed_group = ".".join(reversed(rtype.group.split(".")))
    return f"{reversed_group}.{rtype.version}.{rtype.kind}"
