"""What an API server checks before it stores an object, and how it words its refusals.

Custom resources follow their CRD's structural OpenAPI v3 schema the way the apiextensions
server does: unknown fields pruned (or refused under `fieldValidation=Strict`), defaults applied,
then types, enums, ranges, lengths, patterns, `required`, list types, and the CEL rules of
`x-kubernetes-validations` (with `self`, and `oldSelf` for transition rules on updates),
evaluated with `cel-python`. Built-in kinds are checked against the Kubernetes schemas shipped
by `kubernetes-validate` (those schemas also give the strategic-merge keys and the OpenAPI
documents kubectl reads). Each finding is a `FieldError`, worded as apimachinery words them
(`spec.replicas: Invalid value: "string": ...`), so a test can assert what a user would read.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import json
import math
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, ClassVar
from urllib.parse import urlparse

import celpy
import celpy.celtypes
import jsonschema
from celpy.adapter import json_to_cel
from celpy.celparser import CELParseError
from celpy.evaluation import CELEvalError
from kubernetes_validate import utils as kv
from referencing import Registry, Resource

JSON = dict[str, Any]
# The Kubernetes minor whose schemas built-in objects are checked against (kubectl's here).
KUBERNETES_VERSION = "1.32"

_REASONS = {
    "FieldValueInvalid": "Invalid value",
    "FieldValueTypeInvalid": "Invalid value",
    "FieldValueRequired": "Required value",
    "FieldValueForbidden": "Forbidden",
    "FieldValueDuplicate": "Duplicate value",
    "FieldValueNotSupported": "Unsupported value",
    "FieldValueTooLong": "Too long",
    "FieldValueTooMany": "Too many",
}


@dataclass(frozen=True)
class FieldError:
    """One refusal, as a cause of a 422 Status."""

    field: str
    reason: str  # a Status cause reason: FieldValueInvalid, FieldValueRequired, ...
    detail: str = ""
    value: Any = None
    show_value: bool = True

    def __str__(self) -> str:
        kind = _REASONS.get(self.reason, self.reason)
        parts = [self.field, kind]
        if self.reason not in ("FieldValueRequired", "FieldValueForbidden") and self.show_value:
            parts.append(_render_value(self.value))
        if self.detail:
            parts.append(self.detail)
        return ": ".join(parts)

    def cause(self) -> JSON:
        kind = _REASONS.get(self.reason, self.reason)
        message = str(self).removeprefix(f"{self.field}: ").removeprefix(f"{kind}: ")
        return {"reason": self.reason, "message": f"{kind}: {message}", "field": self.field}


def _render_value(value: Any) -> str:
    if isinstance(value, dict):
        return '"object"'
    if isinstance(value, list):
        return '"array"' if value else "[]"
    if value is None:
        return '"null"'
    return json.dumps(value)


def _join(path: str, key: str | int) -> str:
    if isinstance(key, int):
        return f"{path}[{key}]"
    return f"{path}.{key}" if path else key


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object"


# ---- custom resources: structural schemas --------------------------------------------------


class CustomSchema:
    """One served version's `openAPIV3Schema` of a CRD, with its CEL rules compiled."""

    _env: ClassVar[celpy.Environment] = celpy.Environment()

    def __init__(self, schema: JSON) -> None:
        self.schema = schema
        self._programs: dict[str, Any] = {}
        problems = [f"{path}: {rule}: {err}" for path, rule, err in self._compile(schema, "")]
        if problems:
            raise ValueError("; ".join(problems))

    def _compile(self, node: JSON, path: str) -> Iterator[tuple[str, str, str]]:
        for rule in node.get("x-kubernetes-validations", []):
            for source in filter(None, (rule.get("rule"), rule.get("messageExpression"))):
                try:
                    self._program(source)
                except CELParseError as exc:
                    yield path or "<root>", source, str(exc).splitlines()[0]
        for key, child in node.get("properties", {}).items():
            yield from self._compile(child, _join(path, key))
        for child_key in ("items", "additionalProperties"):
            child = node.get(child_key)
            if isinstance(child, dict):
                yield from self._compile(child, f"{path}[*]")

    def _program(self, source: str) -> Any:
        if source not in self._programs:
            self._programs[source] = self._env.program(
                self._env.compile(source), functions=_CEL_FUNCTIONS
            )
        return self._programs[source]

    # Pruning and defaulting, in the order the apiextensions server applies them.

    def prune(self, obj: JSON) -> list[str]:
        """Drop the fields the schema does not declare; return their paths."""
        unknown: list[str] = []
        for key in list(obj):
            if key in ("apiVersion", "kind", "metadata"):
                continue
            child = self.schema.get("properties", {}).get(key)
            if child is None:
                if not self.schema.get("x-kubernetes-preserve-unknown-fields"):
                    unknown.append(key)
                    del obj[key]
            else:
                obj[key] = _prune(child, obj[key], key, unknown)
        return unknown

    def default(self, obj: JSON) -> None:
        for key, child in self.schema.get("properties", {}).items():
            if key in ("apiVersion", "kind", "metadata"):
                continue
            if key not in obj and "default" in child:
                obj[key] = copy.deepcopy(child["default"])
            if key in obj:
                obj[key] = _default(child, obj[key])

    def validate(self, obj: JSON, old: JSON | None) -> list[FieldError]:
        errors: list[FieldError] = []
        for key, child in self.schema.get("properties", {}).items():
            if key in ("apiVersion", "kind", "metadata"):
                continue
            if key in obj:
                errors += _check(child, obj[key], key)
        # As on a real server: wrong types and unsupported values keep the CEL rules from
        # running (they would see nonsense); other schema errors do not.
        if any(e.reason in ("FieldValueTypeInvalid", "FieldValueNotSupported") for e in errors):
            errors.append(
                FieldError(
                    "<nil>",
                    "FieldValueInvalid",
                    "some validation rules were not checked because "
                    "the object was invalid; correct the existing errors to complete validation",
                )
            )
        else:
            errors += self._rules(self.schema, obj, old, "", root=True)
        for required in self.schema.get("required", []):
            if required not in obj:
                errors.append(FieldError(required, "FieldValueRequired"))
        return errors

    def _rules(
        self, node: JSON, value: Any, old: Any, path: str, *, root: bool = False
    ) -> list[FieldError]:
        errors: list[FieldError] = []
        if value is None:
            return errors
        for rule in node.get("x-kubernetes-validations", []):
            errors += self._rule(rule, value, old, path, root=root)
        if isinstance(value, dict):
            for key, child in node.get("properties", {}).items():
                if key in value and not (root and key in ("apiVersion", "kind", "metadata")):
                    old_child = old.get(key) if isinstance(old, dict) else None
                    errors += self._rules(child, value[key], old_child, _join(path, key))
            extra = node.get("additionalProperties")
            if isinstance(extra, dict):
                for key, item in value.items():
                    old_item = old.get(key) if isinstance(old, dict) else None
                    errors += self._rules(extra, item, old_item, f"{path}[{key}]")
        if isinstance(value, list) and isinstance(node.get("items"), dict):
            # List items have no old value to compare with (only map lists correlate; not here).
            for index, item in enumerate(value):
                errors += self._rules(node["items"], item, None, _join(path, index))
        return errors

    def _rule(self, rule: JSON, value: Any, old: Any, path: str, *, root: bool) -> list[FieldError]:
        source = rule["rule"]
        transition = re.search(r"\boldSelf\b", source) is not None
        if transition and old is None:
            return []  # a transition rule only judges a change of an existing value
        activation: dict[str, Any] = {"self": json_to_cel(_strip_meta(value, root))}
        if transition:
            activation["oldSelf"] = json_to_cel(_strip_meta(old, root))
        field = path + rule.get("fieldPath", "") if rule.get("fieldPath") else path
        field = field.lstrip(".") or "<root>"
        try:
            result = self._program(source).evaluate(activation)
        except CELEvalError as exc:
            return [FieldError(field, "FieldValueInvalid", _cel_error(exc), value)]
        if isinstance(result, CELEvalError):
            return [FieldError(field, "FieldValueInvalid", _cel_error(result), value)]
        if bool(result):
            return []
        message = rule.get("message") or f"failed rule: {source}"
        if rule.get("messageExpression"):
            # On an evaluation error a real server falls back to the static message too.
            with contextlib.suppress(CELEvalError):
                message = str(self._program(rule["messageExpression"]).evaluate(activation))
        reason = rule.get("reason", "FieldValueInvalid")
        return [FieldError(field, reason, message, value)]


def _strip_meta(value: Any, root: bool) -> Any:
    # At the root, CEL sees apiVersion, kind and metadata.name/generateName only.
    if not root or not isinstance(value, dict):
        return value
    result = {k: v for k, v in value.items() if k != "metadata"}
    meta = {k: v for k, v in value.get("metadata", {}).items() if k in ("name", "generateName")}
    result["metadata"] = meta
    return result


def _cel_error(exc: CELEvalError) -> str:
    message = exc.args[0] if exc.args else str(exc)
    if "no such member" in str(message) or "no such key" in str(message):
        key = str(message).rsplit(":", 1)[-1].strip().strip("'")
        return f"no such key: {key}"
    return str(message)


def _prune(node: JSON, value: Any, path: str, unknown: list[str]) -> Any:
    if isinstance(value, dict) and not node.get("x-kubernetes-preserve-unknown-fields"):
        properties = node.get("properties")
        extra = node.get("additionalProperties")
        if node.get("x-kubernetes-embedded-resource"):
            properties = {**(properties or {}), "apiVersion": {}, "kind": {}, "metadata": {}}
        if properties is not None or extra is not None:
            for key in list(value):
                child = (properties or {}).get(key)
                if child is None and isinstance(extra, dict):
                    child = extra
                if child is None and extra is not True:
                    unknown.append(_join(path, key))
                    del value[key]
                elif child is not None:
                    value[key] = _prune(child, value[key], _join(path, key), unknown)
        elif node.get("type") == "object":
            for key in list(value):
                unknown.append(_join(path, key))
                del value[key]
    elif isinstance(value, list) and isinstance(node.get("items"), dict):
        return [
            _prune(node["items"], item, _join(path, i), unknown) for i, item in enumerate(value)
        ]
    return value


def _default(node: JSON, value: Any) -> Any:
    if isinstance(value, dict):
        for key, child in node.get("properties", {}).items():
            if value.get(key, ...) is None and not child.get("nullable") and "default" in child:
                del value[key]  # a null the schema does not allow is dropped, then defaulted
            if key not in value and "default" in child:
                value[key] = copy.deepcopy(child["default"])
            if key in value:
                value[key] = _default(child, value[key])
        extra = node.get("additionalProperties")
        if isinstance(extra, dict):
            for key in value:
                value[key] = _default(extra, value[key])
    elif isinstance(value, list) and isinstance(node.get("items"), dict):
        return [_default(node["items"], item) for item in value]
    return value


def _check(node: JSON, value: Any, path: str) -> list[FieldError]:
    errors: list[FieldError] = []
    if value is None:
        if node.get("nullable"):
            return errors
        return [
            FieldError(
                path,
                "FieldValueTypeInvalid",
                f'{path} in body must be of type {node.get("type", "object")}: "null"',
                None,
            )
        ]
    actual = _json_type(value)
    expected = node.get("type")
    if node.get("x-kubernetes-int-or-string"):
        if actual not in ("integer", "string"):
            errors.append(
                FieldError(
                    path,
                    "FieldValueTypeInvalid",
                    f'{path} in body must be of type integer,string: "{actual}"',
                    actual,
                )
            )
            return errors
    elif expected and not (actual == expected or (expected == "number" and actual == "integer")):
        detail = f'{path} in body must be of type {expected}: "{actual}"'
        return [FieldError(path, "FieldValueTypeInvalid", detail, actual)]

    if "enum" in node and value not in node["enum"]:
        supported = ", ".join(json.dumps(v) for v in node["enum"])
        errors.append(
            FieldError(path, "FieldValueNotSupported", f"supported values: {supported}", value)
        )
    if isinstance(value, int | float) and not isinstance(value, bool):
        errors += _check_number(node, value, path)
    if isinstance(value, str):
        errors += _check_string(node, value, path)
    if isinstance(value, list):
        errors += _check_list(node, value, path)
    if isinstance(value, dict):
        errors += _check_object(node, value, path)
    for sub in node.get("allOf", []):
        errors += _check(sub, value, path)
    if node.get("anyOf") and all(_check(sub, value, path) for sub in node["anyOf"]):
        errors.append(
            FieldError(
                path, "FieldValueInvalid", "must validate at least one schema (anyOf)", value
            )
        )
    if node.get("oneOf"):
        matching = sum(1 for sub in node["oneOf"] if not _check(sub, value, path))
        if matching != 1:
            errors.append(
                FieldError(
                    path,
                    "FieldValueInvalid",
                    "must validate one and only one schema (oneOf)",
                    value,
                )
            )
    if isinstance(node.get("not"), dict) and not _check(node["not"], value, path):
        errors.append(
            FieldError(path, "FieldValueInvalid", "must not validate the schema (not)", value)
        )
    return errors


def _check_number(node: JSON, value: float, path: str) -> list[FieldError]:
    errors = []
    if "minimum" in node:
        low = node["minimum"]
        if value < low or (node.get("exclusiveMinimum") and value == low):
            word = "greater than" if node.get("exclusiveMinimum") else "greater than or equal to"
            errors.append(
                FieldError(
                    path, "FieldValueInvalid", f"{path} in body should be {word} {low}", value
                )
            )
    if "maximum" in node:
        high = node["maximum"]
        if value > high or (node.get("exclusiveMaximum") and value == high):
            word = "less than" if node.get("exclusiveMaximum") else "less than or equal to"
            errors.append(
                FieldError(
                    path, "FieldValueInvalid", f"{path} in body should be {word} {high}", value
                )
            )
    step = node.get("multipleOf")
    if step and not math.isclose(value / step, round(value / step)):
        errors.append(
            FieldError(
                path, "FieldValueInvalid", f"{path} in body should be a multiple of {step}", value
            )
        )
    return errors


def _check_string(node: JSON, value: str, path: str) -> list[FieldError]:
    errors = []
    if "maxLength" in node and len(value) > node["maxLength"]:
        errors.append(
            FieldError(
                path,
                "FieldValueTooLong",
                f"may not be more than {node['maxLength']} bytes",
                value,
                show_value=False,
            )
        )
    if "minLength" in node and len(value) < node["minLength"]:
        errors.append(
            FieldError(
                path,
                "FieldValueInvalid",
                f"{path} in body should be at least {node['minLength']} chars long",
                value,
            )
        )
    if "pattern" in node and not re.search(go_regex(node["pattern"]), value):
        errors.append(
            FieldError(
                path, "FieldValueInvalid", f"{path} in body should match '{node['pattern']}'", value
            )
        )
    return errors


@functools.cache
def go_regex(pattern: str) -> str:
    """A schema's `pattern` (Go's RE2 syntax) as Python's `re` reads it the same way: `$`
    outside a character class ends the text only, as in Go without the `m` flag (Python's
    `$` also matches before a final newline, so `^[a-z]+$` took "abc\\n"), and `\\z` is
    Python's `\\Z`."""
    out: list[str] = []
    index, in_class = 0, False
    while index < len(pattern):
        char = pattern[index]
        if char == "\\" and index + 1 < len(pattern):
            pair = pattern[index : index + 2]
            out.append("\\Z" if pair == "\\z" and not in_class else pair)
            index += 2
            continue
        if in_class:
            in_class = char != "]"
        elif char == "[":
            in_class = True
            # A `]` first in the class (after an optional `^`) is a literal.
            start = index + 1 + (pattern[index + 1 : index + 2] == "^")
            if pattern[start : start + 1] == "]":
                out.append(pattern[index : start + 1])
                index = start + 1
                continue
        elif char == "$":
            char = "\\Z"
        out.append(char)
        index += 1
    return "".join(out)


def _check_list(node: JSON, value: list[Any], path: str) -> list[FieldError]:
    errors = []
    if "maxItems" in node and len(value) > node["maxItems"]:
        errors.append(
            FieldError(
                path, "FieldValueTooMany", f"must have at most {node['maxItems']} items", len(value)
            )
        )
    if "minItems" in node and len(value) < node["minItems"]:
        errors.append(
            FieldError(
                path,
                "FieldValueInvalid",
                f"{path} in body should have at least {node['minItems']} items",
                len(value),
            )
        )
    list_type = node.get("x-kubernetes-list-type")
    if list_type in ("set", "map") or node.get("uniqueItems"):
        keys = node.get("x-kubernetes-list-map-keys", [])
        seen: list[Any] = []
        for index, item in enumerate(value):
            identity = [item.get(k) for k in keys] if list_type == "map" and keys else item
            if identity in seen:
                errors.append(FieldError(_join(path, index), "FieldValueDuplicate", "", identity))
            seen.append(identity)
    items = node.get("items")
    if isinstance(items, dict):
        for index, item in enumerate(value):
            errors += _check(items, item, _join(path, index))
    return errors


def _check_object(node: JSON, value: JSON, path: str) -> list[FieldError]:
    errors = []
    for required in node.get("required", []):
        if required not in value:
            errors.append(FieldError(_join(path, required), "FieldValueRequired"))
    if "maxProperties" in node and len(value) > node["maxProperties"]:
        errors.append(
            FieldError(
                path,
                "FieldValueTooMany",
                f"must have at most {node['maxProperties']} items",
                len(value),
            )
        )
    if "minProperties" in node and len(value) < node["minProperties"]:
        errors.append(
            FieldError(
                path,
                "FieldValueInvalid",
                f"{path} in body should have at least {node['minProperties']} properties",
                len(value),
            )
        )
    properties = node.get("properties", {})
    extra = node.get("additionalProperties")
    for key, item in value.items():
        child = properties.get(key)
        if child is None and isinstance(extra, dict):
            child = extra
        if child is not None:
            errors += _check(child, item, _join(path, key))
    return errors


# ---- a few of the CEL libraries Kubernetes adds to the standard ones ------------------------


def _is_url(value: celpy.celtypes.StringType) -> celpy.celtypes.BoolType:
    parsed = urlparse(str(value))
    return celpy.celtypes.BoolType(bool(parsed.scheme and parsed.netloc))


def _string_fn(fn: Any) -> Any:
    return lambda *args: json_to_cel(fn(*(str(a) if isinstance(a, str) else a for a in args)))


_CEL_FUNCTIONS: dict[str, Any] = {
    "isURL": _is_url,
    "lowerAscii": _string_fn(str.lower),
    "upperAscii": _string_fn(str.upper),
    "trim": _string_fn(str.strip),
    "split": _string_fn(lambda s, sep: s.split(sep)),
    "indexOf": _string_fn(lambda s, sub: s.find(sub)),
    "replace": _string_fn(lambda s, old, new: s.replace(old, new)),
    "join": lambda items, sep="": celpy.celtypes.StringType(str(sep).join(str(i) for i in items)),
}


# ---- built-in kinds: the Kubernetes schemas -------------------------------------------------


class BuiltinSchemas:
    """The schemas of built-in kinds (loaded once; validators cached per kind)."""

    def __init__(self, version: str = KUBERNETES_VERSION) -> None:
        self.version = version
        self._local = kv.schema_contents(
            f"kubernetes-json-schema/v{version}.0-local/_definitions.json", version
        )
        self.definitions: JSON = self._local["$defs"]
        self._by_gvk: dict[tuple[str, str, str], str] = {}
        for name, definition in self.definitions.items():
            for gvk in definition.get("x-kubernetes-group-version-kind", []):
                self._by_gvk[(gvk["group"], gvk["version"], gvk["kind"])] = name

    @classmethod
    @functools.cache
    def shared(cls) -> BuiltinSchemas:
        """One loaded copy for every emulator of the process (loading takes a moment)."""
        return cls()

    def definition_name(self, group: str, version: str, kind: str) -> str | None:
        return self._by_gvk.get((group, version, kind))

    @functools.cache  # noqa: B019 - one instance per emulator; the cache lives as long
    def _validator(self, kind: str, api_version: str, strict: bool) -> Any:
        folder = f"v{self.version}.0-local" + ("-strict" if strict else "")
        gv = re.sub(r"^([^./]*)(?:\.[^/]*)?/", r"\1-", api_version)
        try:
            schema = kv.schema_contents(
                f"kubernetes-json-schema/{folder}/{kind.lower()}-{gv}.json", self.version
            )
        except FileNotFoundError:
            return None
        defs = kv.schema_contents(
            f"kubernetes-json-schema/{folder}/_definitions.json", self.version
        )
        registry: Registry[Any] = Resource.from_contents(schema) @ Registry()
        registry = Resource.from_contents(defs) @ registry
        return jsonschema.Draft202012Validator(schema, registry=registry)

    def validate(self, obj: JSON, *, strict: bool = False) -> list[FieldError]:
        validator = self._validator(obj["kind"], obj["apiVersion"], strict)
        if validator is None:
            return []
        errors = []
        for error in sorted(validator.iter_errors(obj), key=lambda e: list(map(str, e.path))):
            path = ""
            for part in error.absolute_path:
                path = _join(path, part)
            if error.validator == "required":
                missing = re.match(r"'([^']+)' is a required property", error.message)
                field = _join(path, missing.group(1)) if missing else path
                errors.append(FieldError(field, "FieldValueRequired"))
            elif error.validator == "additionalProperties":
                extra = re.findall(r"'([^']+)'", error.message.split("(", 1)[-1])
                for key in extra:
                    errors.append(
                        FieldError(_join(path, key), "FieldValueForbidden", "unknown field")
                    )
            elif error.validator == "enum":
                supported = ", ".join(json.dumps(v) for v in error.validator_value if v)
                errors.append(
                    FieldError(
                        path,
                        "FieldValueNotSupported",
                        f"supported values: {supported}",
                        error.instance,
                    )
                )
            else:
                errors.append(
                    FieldError(path or "<root>", "FieldValueInvalid", error.message, error.instance)
                )
        return errors

    def merge_key(self, group: str, version: str, kind: str, path: tuple[str, ...]) -> str | None:
        """The strategic-merge key of the list at `path` (list items are transparent)."""
        name = self.definition_name(group, version, kind)
        node: JSON | None = self.definitions.get(name) if name else None
        for key in path:
            node = self._resolve(node)
            if node is None:
                return None
            if "items" in node and "properties" not in node:
                node = self._resolve(node["items"])
                if node is None:
                    return None
            child = node.get("properties", {}).get(key)
            if child is None and isinstance(node.get("additionalProperties"), dict):
                child = node["additionalProperties"]
            node = child
        node = self._resolve(node)
        if node is None or node.get("x-kubernetes-patch-strategy", "") not in (
            "merge",
            "merge,retainKeys",
        ):
            return None
        merge_key = node.get("x-kubernetes-patch-merge-key")
        return str(merge_key) if merge_key else None

    def _resolve(self, node: JSON | None) -> JSON | None:
        while node is not None and "$ref" in node:
            ref = node["$ref"].rsplit("/", 1)[-1]
            merged = {k: v for k, v in node.items() if k != "$ref"}
            node = {**self.definitions.get(ref, {}), **merged}
        return node
