"""The three patch formats of the Kubernetes API, applied to plain JSON objects.

- JSON patch (RFC 6902, `application/json-patch+json`): done by `jsonpatch`; a failed `test`
  operation is the caller's 422, as on a real server.
- JSON merge patch (RFC 7386, `application/merge-patch+json`): `null` deletes a key, objects
  merge, everything else (lists included) replaces.
- Strategic merge patch (`application/strategic-merge-patch+json`, built-in kinds only): like a
  merge patch, but lists whose schema names a patch merge key (containers by `name`, env by
  `name`, ports by `containerPort`, ...) merge item by item, and the `$patch`,
  `$retainKeys`, `$deleteFromPrimitiveList/...` and `$setElementOrder/...` directives that
  kubectl sends are honoured or dropped. The merge keys come from the Kubernetes schemas that
  `kubernetes-validate` ships (`x-kubernetes-patch-merge-key`), so they are the real ones.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import jsonpatch

JSON = dict[str, Any]
# Given the path of a list field (keys only, list items skipped), its merge key if it has one.
MergeKeys = Callable[[tuple[str, ...]], str | None]


class PatchError(Exception):
    """A patch that cannot be applied; `test_failed` marks a failed JSON-patch `test`."""

    def __init__(self, message: str, *, test_failed: bool = False) -> None:
        super().__init__(message)
        self.test_failed = test_failed


def json_patch(target: JSON, operations: Any) -> JSON:
    if not isinstance(operations, list):
        raise PatchError("a JSON patch must be a list of operations")
    try:
        result = jsonpatch.apply_patch(target, operations, in_place=False)
    except jsonpatch.JsonPatchTestFailed as exc:
        raise PatchError(
            f"the server rejected our request due to an error in our request: {exc}",
            test_failed=True,
        ) from exc
    except (jsonpatch.JsonPatchException, jsonpatch.JsonPointerException) as exc:
        raise PatchError(str(exc)) from exc
    if not isinstance(result, dict):
        raise PatchError("a JSON patch must leave an object")
    return result


def merge_patch(target: Any, patch: Any) -> Any:
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def strategic_merge_patch(target: Any, patch: Any, merge_keys: MergeKeys) -> Any:
    return _strategic(target, patch, (), merge_keys)


def _strategic(target: Any, patch: Any, path: tuple[str, ...], merge_keys: MergeKeys) -> Any:
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    if patch.get("$patch") == "replace":
        return {k: copy.deepcopy(v) for k, v in patch.items() if k != "$patch"}
    if patch.get("$patch") == "delete":
        return None
    result = copy.deepcopy(target) if isinstance(target, dict) else {}
    retain = patch.get("$retainKeys")
    for key, value in patch.items():
        if key.startswith("$setElementOrder/") or key in ("$retainKeys", "$patch"):
            continue  # ordering hints and handled directives
        if key.startswith("$deleteFromPrimitiveList/"):
            field = key.split("/", 1)[1]
            if isinstance(result.get(field), list):
                result[field] = [item for item in result[field] if item not in value]
            continue
        if value is None:
            result.pop(key, None)
        elif isinstance(value, list):
            merge_key = merge_keys((*path, key))
            old = result.get(key)
            if merge_key is not None and isinstance(old, list):
                result[key] = _merge_list(old, value, merge_key, (*path, key), merge_keys)
            else:
                result[key] = [_strip_directives(item) for item in value]
        else:
            merged = _strategic(result.get(key), value, (*path, key), merge_keys)
            if merged is None:
                result.pop(key, None)
            else:
                result[key] = merged
    if isinstance(retain, list):
        result = {k: v for k, v in result.items() if k in retain}
    return result


def _merge_list(
    old: list[Any], patch: list[Any], merge_key: str, path: tuple[str, ...], merge_keys: MergeKeys
) -> list[Any]:
    result = copy.deepcopy(old)
    for item in patch:
        if not isinstance(item, dict) or merge_key not in item:
            if item not in result:
                result.append(copy.deepcopy(item))
            continue
        index = next(
            (
                i
                for i, o in enumerate(result)
                if isinstance(o, dict) and o.get(merge_key) == item[merge_key]
            ),
            None,
        )
        if item.get("$patch") == "delete":
            if index is not None:
                del result[index]
        elif index is None:
            result.append(_strip_directives(item))
        else:
            result[index] = _strategic(result[index], item, path, merge_keys)
    return result


def _strip_directives(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _strip_directives(v) for k, v in value.items() if not k.startswith("$")}
    if isinstance(value, list):
        return [_strip_directives(item) for item in value]
    return value
