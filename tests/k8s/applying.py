"""Server-side apply and field managers, as the API server's structured-merge-diff does them.

Every write records who set which field in `metadata.managedFields`; an apply
(`PATCH` with `application/apply-patch+yaml`) merges the applied configuration into the
object, removes what the same manager applied before and no longer applies (unless someone
else owns it), and is refused with a conflict when it would change a field that another
manager owns, unless forced. The rules follow sigs.k8s.io/structured-merge-diff (the
library the API server uses), ported closely where the outcome depends on them:

- a field set (`FieldSet`) holds paths; a path's elements are a field name (`f:`), an
  associative list's item by its keys (`k:`), a set's item by its value (`v:`), or an index
  (`i:`, never produced here, as in the server). What an object's configuration owns is
  `to_set`: every scalar, every atomic list or map as a whole, every list item, an empty or
  null map field, and a map's entries; a struct's own path only when it is empty;
- lists are atomic unless the schema says `x-kubernetes-list-type: set` or `map` (with
  `x-kubernetes-list-map-keys`; the built-in kinds' schemas say so where the real ones do),
  maps and structs are granular unless `x-kubernetes-map-type: atomic` (label selectors);
  what the schema does not describe (preserved unknown fields) is deduced from the value:
  maps granular, lists atomic;
- an update (create, PUT, the other patches, subresources) gives its manager the fields it
  added or changed and takes them from every other manager, never conflicting;
- an apply sets the manager's fields to exactly its configuration's, merges (associative
  lists item by item, in SMD's order), prunes, and conflicts on fields another manager owns
  whose value it changes (the same value is shared ownership); `force` takes them over.

Managers are told apart by name, operation (Apply or Update), subresource, and for updates
the API version, as the server's manager identifiers are.
"""

from __future__ import annotations

import copy
import datetime
import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

JSON = dict[str, Any]
Element = tuple[str, Any]  # ("f", name) | ("k", keys as JSON) | ("v", value as JSON) | ("i", n)
Path = tuple[Element, ...]
FieldSet = frozenset[Path]
# Paths as a tree: each node maps elements to subtrees, and "." to True for a member.
Tree = dict[Any, Any]
# The fields the server owns (stripped from every manager's set, as the server's stripMeta).
SERVER_FIELDS: FieldSet = frozenset(
    {
        (("f", "apiVersion"),),
        (("f", "kind"),),
        (("f", "metadata"),),
        *(
            (("f", "metadata"), ("f", name))
            for name in (
                "name",
                "namespace",
                "creationTimestamp",
                "selfLink",
                "uid",
                "generation",
                "managedFields",
                "resourceVersion",
                "deletionTimestamp",
                "deletionGracePeriodSeconds",
            )
        ),
    }
)
# Associative-list keys that the Kubernetes schemas default (their OpenAPI says so; the
# schemas shipped here lack `default`): an item without one is keyed by the default.
KEY_DEFAULTS = {"protocol": "TCP"}


class ApplyError(Exception):
    """A configuration that cannot be typed (a list item without its keys, duplicates)."""


@dataclass(frozen=True)
class Conflict:
    manager: ManagerKey
    path: Path


class Conflicts(Exception):
    def __init__(self, conflicts: list[Conflict]) -> None:
        super().__init__(conflict_message(conflicts))
        self.conflicts = conflicts


# ---- schemas -------------------------------------------------------------------------------


class Shape:
    """A schema node as SSA sees it: a scalar, a list (atomic, set, map with keys), a struct or
    a map (granular or atomic), or nothing known (decided by the value)."""

    __slots__ = ("_children", "_item", "_resolve", "atomic", "keys", "kind", "list_type", "node")

    def __init__(self, node: JSON | None, resolve: Callable[[JSON], JSON]) -> None:
        self._resolve = resolve
        self.node = resolve(node) if node is not None else None
        self._children: dict[str, Shape] = {}
        self._item: Shape | None = None
        self.kind, self.list_type, self.atomic = _classify(self.node)
        self.keys: tuple[str, ...] = tuple((self.node or {}).get("x-kubernetes-list-map-keys", ()))

    def kind_of(self, value: Any) -> str:
        """This node's kind for `value`: the schema's, or the value's where they disagree."""
        by_value = (
            "map" if isinstance(value, dict) else "list" if isinstance(value, list) else "scalar"
        )
        if self.kind == "struct" and by_value == "map":
            return "struct"
        if self.kind == by_value:
            return by_value
        return by_value

    def is_atomic(self, value: Any) -> bool:
        kind = self.kind_of(value)
        if kind == "list":
            return self.kind != "list" or self.list_type == "atomic"
        if kind in ("map", "struct"):
            return self.atomic and self.kind in ("map", "struct")
        return False

    def declares(self, name: str) -> bool:
        return self.kind == "struct" and name in (self.node or {}).get("properties", {})

    def child(self, name: str) -> Shape:
        found = self._children.get(name)
        if found is None:
            node = self.node or {}
            sub = node.get("properties", {}).get(name)
            if sub is None and isinstance(node.get("additionalProperties"), dict):
                sub = node["additionalProperties"]
            found = self._children[name] = Shape(sub, self._resolve)
        return found

    def item(self) -> Shape:
        if self._item is None:
            node = self.node or {}
            self._item = Shape(node.get("items") if isinstance(node.get("items"), dict) else None,
                               self._resolve)  # fmt: skip
        return self._item

    def at(self, path: Path) -> Shape:
        shape = self
        for kind, name in path:
            shape = shape.child(name) if kind == "f" else shape.item()
        return shape


def _classify(node: JSON | None) -> tuple[str, str, bool]:
    """(kind, list type, atomic) of a resolved schema node; kind "" when undescribed."""
    if not node:
        return "", "atomic", False
    types = node.get("type")
    types = set(types) if isinstance(types, list) else {types} if types else set()
    atomic = node.get("x-kubernetes-map-type") == "atomic"
    list_type = str(node.get("x-kubernetes-list-type", "atomic"))
    if node.get("x-kubernetes-int-or-string") or types & {"string", "integer", "number", "boolean"}:
        return "scalar", list_type, False
    if "array" in types or "items" in node:
        return "list", list_type, False
    if "properties" in node:
        return "struct", list_type, atomic
    if isinstance(node.get("additionalProperties"), dict):
        return "map", list_type, atomic
    if "oneOf" in node or "anyOf" in node:
        return "scalar", list_type, False  # int-or-string, quantities
    return "", list_type, atomic


class Schemas:
    """Shapes of kinds: built in (from the Kubernetes schemas' definitions) or from a CRD."""

    def __init__(self, definitions: JSON) -> None:
        self.definitions = definitions
        self._resolved: dict[int, JSON] = {}
        self._roots: dict[Any, Shape] = {}

    def resolve(self, node: JSON) -> JSON:
        if "$ref" not in node:
            return node
        # Keyed by identity: the definitions live as long as this object (they hold the nodes).
        key = id(node)
        found = self._resolved.get(key)
        if found is None:
            found = node
            while "$ref" in found:
                target = self.definitions.get(found["$ref"].rsplit("/", 1)[-1], {})
                found = {**target, **{k: v for k, v in found.items() if k != "$ref"}}
            self._resolved[key] = found
        return found

    def builtin(self, definition: str | None) -> Shape:
        root = self._roots.get(definition)
        if root is None:
            node = self.definitions.get(definition) if definition else None
            root = self._roots[definition] = Shape(node, self.resolve)
        return root

    def custom(self, schema: JSON) -> Shape:
        """A CRD version's schema (the caller keeps it while the CRD stays the same); its
        `metadata` is ObjectMeta, whatever the CRD says."""
        meta = {"$ref": "#/$defs/io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"}
        return Shape({**schema, "properties": {**schema.get("properties", {}), "metadata": meta}},
                     self.resolve)  # fmt: skip


# ---- path elements ---------------------------------------------------------------------------


def _dumps(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), sort_keys=True)


def item_element(item: Any, shape: Shape, where: Path) -> Element:
    """The path element of a list item (the list is a set or a map, never atomic here)."""
    if shape.list_type == "set":
        if isinstance(item, (dict, list)):
            raise ApplyError(f"{render_path(where)}: a set's items must be scalars")
        return ("v", _dumps(item))
    if not isinstance(item, dict):
        raise ApplyError(f"{render_path(where)}: an associative list's items must be objects")
    keys = {}
    for key in shape.keys:
        if key in item and item[key] is not None:
            keys[key] = item[key]
        elif key in KEY_DEFAULTS:
            keys[key] = KEY_DEFAULTS[key]
        else:
            raise ApplyError(
                f"{render_path(where)}: associative list with keys has an element that omits "
                f'key field "{key}" (and doesn\'t have default value)'
            )
    return ("k", _dumps(keys))


def _items(value: list[Any], shape: Shape, where: Path) -> list[tuple[Element, Any]]:
    return [(item_element(item, shape, where), item) for item in value]


def render_element(element: Element) -> str:
    kind, name = element
    if kind == "f":
        return f".{name}"
    if kind == "k":
        keys = json.loads(name)
        return "[" + ",".join(f"{k}={json.dumps(v)}" for k, v in sorted(keys.items())) + "]"
    if kind == "v":
        return f"[={name}]"
    return f"[{name}]"


def render_path(path: Path) -> str:
    """A path as the server prints it: `.spec.containers[name="app"].image`."""
    return "".join(map(render_element, path))


# ---- the walks -------------------------------------------------------------------------------


def to_set(value: Any, shape: Shape) -> FieldSet:
    """The fields a configuration sets (SMD's ToFieldSet)."""
    out: set[Path] = set()
    _to_set(value, shape, (), out)
    return frozenset(out)


def _to_set(value: Any, shape: Shape, path: Path, out: set[Path]) -> None:
    kind = shape.kind_of(value)
    if kind == "scalar" or shape.is_atomic(value):
        out.add(path)
    elif kind == "list":
        item_shape = shape.item()
        seen: dict[Element, int] = {}
        pairs = _items(value, shape, path)
        for element, _ in pairs:
            seen[element] = seen.get(element, 0) + 1
        for element, item in pairs:
            if seen[element] > 1:
                out.add((*path, element))  # duplicates are owned as items, never descended
                continue
            if not isinstance(item, (dict, list)):
                out.add((*path, element))
                continue
            _to_set(item, item_shape, (*path, element), out)
            out.add((*path, element))
    else:
        for key, child in value.items():
            if child is None:
                out.add((*path, ("f", key)))
                continue
            _to_set(child, shape.child(key), (*path, ("f", key)), out)
            if child == {} or not shape.declares(key):
                out.add((*path, ("f", key)))


@dataclass
class Comparison:
    added: set[Path] = field(default_factory=set)
    modified: set[Path] = field(default_factory=set)
    removed: set[Path] = field(default_factory=set)


def compare(lhs: Any, rhs: Any, shape: Shape) -> Comparison:
    """What changed from `lhs` to `rhs` (SMD's Compare)."""
    result = Comparison()
    _compare(lhs, rhs, shape, (), result)
    return result


def _compare(lhs: Any, rhs: Any, shape: Shape, path: Path, out: Comparison) -> None:
    if lhs is None and rhs is None:
        return
    value = rhs if rhs is not None else lhs
    kind = shape.kind_of(value)
    empty = not lhs and not rhs and kind != "scalar"
    other = lhs if rhs is not None else rhs
    mismatched = other is not None and shape.kind_of(other) != kind
    if kind == "scalar" or shape.is_atomic(value) or empty or mismatched:
        if lhs is None:
            out.added.add(path)
        elif rhs is None:
            out.removed.add(path)
        elif lhs != rhs:
            out.modified.add(path)
        return
    if lhs is None:
        out.added.add(path)
    elif rhs is None:
        out.removed.add(path)
    if kind == "list":
        item_shape = shape.item()
        left = dict(_items(lhs or [], shape, path))
        right = dict(_items(rhs or [], shape, path))
        for element in {**left, **right}:
            _compare(left.get(element), right.get(element), item_shape, (*path, element), out)
    else:
        for key in {**(lhs or {}), **(rhs or {})}:
            _compare(
                (lhs or {}).get(key),
                (rhs or {}).get(key),
                shape.child(key),
                (*path, ("f", key)),
                out,
            )


def merge(lhs: Any, rhs: Any, shape: Shape, path: Path = ()) -> Any:
    """The applied configuration `rhs` merged into the live `lhs` (SMD's Merge)."""
    if rhs is None:
        return copy.deepcopy(lhs)
    if lhs is None:
        return copy.deepcopy(rhs)
    kind = shape.kind_of(rhs)
    if kind == "scalar" or shape.is_atomic(rhs) or shape.kind_of(lhs) != kind:
        return copy.deepcopy(rhs)
    if kind == "list":
        return _merge_list(lhs, rhs, shape, path)
    result = copy.deepcopy(lhs)
    for key, value in rhs.items():
        if value is None:
            continue
        result[key] = merge(lhs.get(key), value, shape.child(key), (*path, ("f", key)))
    return result


def _merge_list(lhs: list[Any], rhs: list[Any], shape: Shape, path: Path) -> list[Any]:
    """SMD's list merge: the applied order for the applied items, live items kept where
    they were relative to the shared ones."""
    item_shape = shape.item()
    left_pairs, right_pairs = _items(lhs, shape, path), _items(rhs, shape, path)
    if len({e for e, _ in right_pairs}) != len(right_pairs):
        duplicate = next(e for e, _ in right_pairs if [x for x, _ in right_pairs].count(e) > 1)
        raise ApplyError(
            f"{render_path(path)}: duplicate entries for key {render_element(duplicate)}"
        )
    left: dict[Element, Any] = {}
    for element, item in left_pairs:
        left[element] = None if element in left else item  # duplicates are not merged
    right = dict(right_pairs)
    lpes, rpes = [e for e, _ in left_pairs], [e for e, _ in right_pairs]
    shared = [e for e in rpes if e in left]
    next_shared = shared.pop(0) if shared else None
    merged_right: set[Element] = set()
    out: list[Any] = []
    li = ri = 0
    while li < len(lpes) or ri < len(rpes):
        if li < len(lpes) and ri < len(rpes):
            element = lpes[li]
            if element == rpes[ri]:
                merged_right.add(element)
                out.append(merge(left[element], right[element], item_shape, (*path, element)))
                li, ri = li + 1, ri + 1
                next_shared = shared.pop(0) if shared else None
                continue
            if element in right and next_shared is not None and next_shared != element:
                li += 1
                continue
        if li < len(lpes):
            element = lpes[li]
            if element not in right:
                out.append(copy.deepcopy(lhs[li]))
                li += 1
                continue
            if element in merged_right:
                li += 1
        if ri < len(rpes):
            element = rpes[ri]
            merged_right.add(element)
            out.append(merge(left.get(element), right[element], item_shape, (*path, element)))
            ri += 1
            if next_shared is not None and next_shared == element:
                next_shared = shared.pop(0) if shared else None
    return out


def remove(value: Any, paths: Iterable[Path], shape: Shape) -> Any:
    """`value` without the members `paths` (SMD's RemoveItems); a map or list that loses its
    last entry this way goes too."""
    tree = _tree(paths)
    result = _remove(value, tree, shape, ())
    return result if result is not None else ({} if isinstance(value, dict) else None)


def _tree(paths: Iterable[Path]) -> Tree:
    """Paths as a tree: each node maps elements to subtrees; "." marks a member."""
    root: Tree = {}
    for path in paths:
        node = root
        for element in path:
            node = node.setdefault(element, {})
        node["."] = True
    return root


def _remove(value: Any, tree: Tree, shape: Shape, path: Path) -> Any:
    if value is None or shape.kind_of(value) == "scalar" or shape.is_atomic(value):
        return value
    if not value:
        return None
    if isinstance(value, list):
        kept = []
        for element, item in _items(value, shape, path):
            sub = tree.get(element)
            if sub is None:
                kept.append(item)
            elif not sub.get("."):
                reduced = _remove(item, sub, shape.item(), (*path, element))
                if reduced is not None:
                    kept.append(reduced)
        return kept or None
    result = {}
    for key, child in value.items():
        sub = tree.get(("f", key))
        if sub is None:
            result[key] = child
        elif not sub.get("."):
            reduced = _remove(child, sub, shape.child(key), (*path, ("f", key)))
            if reduced is not None:
                result[key] = reduced
    return result or None


def named_members(paths: FieldSet, shape: Shape) -> FieldSet:
    """The set with every declared struct field on the way to a member made a member too
    (SMD's EnsureNamedFieldsAreMembers), so that a struct field nobody owns any more goes."""
    out = set(paths)
    for path in paths:
        current = shape
        for index, element in enumerate(path[:-1]):
            if element[0] == "f" and current.declares(element[1]):
                out.add(path[: index + 1])
            current = current.child(element[1]) if element[0] == "f" else current.item()
    return frozenset(out)


# ---- managers ------------------------------------------------------------------------------


@dataclass(frozen=True)
class ManagerKey:
    manager: str
    operation: str  # "Apply" or "Update"
    subresource: str = ""
    api_version: str = ""  # updates only: appliers keep one entry across versions

    def printed(self) -> str:
        """As the server names a manager in a conflict."""
        text = json.dumps(self.manager)
        if self.subresource:
            text += f" with subresource {json.dumps(self.subresource)}"
        if self.operation == "Update":
            text += f" using {self.api_version}"
        return text


@dataclass
class Entry:
    fields: FieldSet
    api_version: str
    time: str


Managers = dict[ManagerKey, Entry]


def now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def decode(managed: Any) -> Managers:
    """`metadata.managedFields` as managers; entries that do not decode are dropped."""
    result: Managers = {}
    for entry in managed if isinstance(managed, list) else []:
        if not isinstance(entry, dict) or not isinstance(entry.get("fieldsV1"), dict):
            continue
        operation = str(entry.get("operation", "Update"))
        api_version = str(entry.get("apiVersion", ""))
        key = ManagerKey(
            str(entry.get("manager", "")),
            operation,
            str(entry.get("subresource", "")),
            api_version if operation == "Update" else "",
        )
        fields: set[Path] = set()
        _decode_fields(entry["fieldsV1"], (), fields)
        result[key] = Entry(frozenset(fields), api_version, str(entry.get("time", now())))
    return result


def _decode_fields(node: JSON, path: Path, out: set[Path]) -> None:
    if not node and path:
        out.add(path)
    for key, child in node.items():
        if key == ".":
            out.add(path)
            continue
        kind, _, rest = key.partition(":")
        element: Element = (kind, int(rest) if kind == "i" else rest)
        _decode_fields(child if isinstance(child, dict) else {}, (*path, element), out)


def encode(managers: Managers) -> list[JSON]:
    """Managers as `metadata.managedFields`, in the server's order."""
    entries = []
    for key, entry in managers.items():
        encoded: JSON = {
            "manager": key.manager,
            "operation": key.operation,
            "apiVersion": entry.api_version,
            "time": entry.time,
            "fieldsType": "FieldsV1",
            "fieldsV1": _encode_fields(entry.fields),
        }
        if key.subresource:
            encoded["subresource"] = key.subresource
        entries.append(encoded)
    entries.sort(
        key=lambda e: (
            e["operation"],
            e["time"],
            e["manager"],
            e["apiVersion"],
            e.get("subresource", ""),
        )
    )
    return entries


_ORDER = {"f": 0, "k": 1, "v": 2, "i": 3}


def _encode_fields(paths: FieldSet) -> JSON:
    tree = _tree(paths)

    def render(node: Tree) -> JSON:
        children = sorted((k for k in node if k != "."), key=lambda e: (_ORDER[e[0]], str(e[1])))
        out: JSON = {".": {}} if node.get(".") and children else {}
        for kind, name in children:
            out[f"{kind}:{name}"] = render(node[(kind, name)])
        return out

    return render(tree)


# ---- the operations --------------------------------------------------------------------------


@dataclass(frozen=True)
class Scope:
    """What a write may own: the main resource's fields but status (when status is a
    subresource), or only status (the status subresource)."""

    status_subresource: bool
    subresource: str = ""

    def owns(self, path: Path) -> bool:
        if path in SERVER_FIELDS or not path:
            return False
        under_status = path[0] == ("f", "status")
        if self.subresource == "status":
            return under_status
        return not (under_status and self.status_subresource)

    def filter(self, paths: Iterable[Path]) -> FieldSet:
        return frozenset(p for p in paths if self.owns(p))


def update(
    live: JSON | None, new: JSON, managers: Managers, key: ManagerKey, shape: Shape, scope: Scope
) -> Managers:
    """The managers after an update by `key` from `live` to `new` (never conflicting): it
    owns what it added or changed, which no one else owns any more, and what it removed goes
    from every manager."""
    diff = compare(_bare(live), _bare(new), shape)
    changed = scope.filter(diff.added | diff.modified)
    removed = scope.filter(diff.removed)
    result: Managers = {}
    for other, entry in managers.items():
        if other == key:
            continue
        kept = entry.fields - changed - removed
        if kept:
            result[other] = Entry(kept, entry.api_version, entry.time)
    previous = managers.get(key)
    mine = (previous.fields - removed if previous else frozenset()) | changed
    if mine:
        # The time says when the manager last changed something (as the server keeps it).
        time = now() if changed or previous is None else previous.time
        result[key] = Entry(mine, key.api_version, time)
    return result


def apply(
    live: JSON | None,
    config: JSON,
    managers: Managers,
    key: ManagerKey,
    api_version: str,
    shape: Shape,
    scope: Scope,
    *,
    force: bool,
) -> tuple[JSON, Managers]:
    """`config` applied by `key` to `live`: the merged object and the managers, or
    `Conflicts` when it would change what others own (unless `force`)."""
    base = _bare(live) or {}
    config = _drop_nulls(config)
    merged = merge(base, config, shape)
    last = managers.get(key)
    fields = scope.filter(to_set(config, shape))
    updated = {**managers, key: Entry(fields, api_version, last.time if last else now())}
    if last is not None and last.fields:
        merged = _prune(merged, updated, last.fields, shape)
    diff = compare(base, merged, shape)
    changed = scope.filter(diff.added | diff.modified)
    removed = scope.filter(diff.removed)
    conflicts = [
        Conflict(other, path)
        for other, entry in updated.items()
        if other != key
        for path in sorted(entry.fields & changed, key=render_path)
    ]
    if conflicts and not force:
        raise Conflicts(conflicts)
    result: Managers = {}
    for other, entry in updated.items():
        if other == key:
            result[other] = entry
            continue
        kept = entry.fields - changed - removed
        if kept:
            result[other] = Entry(kept, entry.api_version, entry.time)
    if not fields:
        result.pop(key, None)
    elif merged != base or last is None or last.fields != fields:
        result[key] = Entry(fields, api_version, now())
    return merged, result


def _prune(merged: JSON, managers: Managers, last: FieldSet, shape: Shape) -> JSON:
    """Remove what the applier applied last time and not now, unless another manager (or
    its own new configuration) owns it (SMD's prune, add back owned, add back dangling)."""
    last_named = named_members(last, shape)
    pruned = remove(merged, last_named, shape)
    managed = named_members(frozenset().union(*(e.fields for e in managers.values())), shape)
    merged_set = named_members(to_set(merged, shape), shape)
    pruned_set = named_members(to_set(pruned, shape), shape)
    pruned = remove(merged, merged_set - (pruned_set | managed), shape)
    pruned_set = named_members(to_set(pruned, shape), shape)
    return remove(merged, (merged_set - pruned_set) & last_named, shape)  # type: ignore[no-any-return]


def _bare(obj: JSON | None) -> JSON | None:
    """The object as field sets see it: without its managedFields."""
    if obj is None:
        return None
    meta = {k: v for k, v in (obj.get("metadata") or {}).items() if k != "managedFields"}
    return {**obj, "metadata": meta}


def _drop_nulls(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _drop_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_drop_nulls(v) for v in value]
    return value


def conflict_message(conflicts: list[Conflict]) -> str:
    """The server's wording (apiserver's managedfields NewConflictError)."""
    if len(conflicts) == 1:
        [only] = conflicts
        return (
            f"Apply failed with 1 conflict: conflict with {only.manager.printed()}: "
            f"{render_path(only.path)}"
        )
    grouped: dict[str, list[str]] = {}
    for conflict in conflicts:
        grouped.setdefault(conflict.manager.printed(), []).append(render_path(conflict.path))
    lines = []
    for manager in sorted(grouped):
        lines.append(f"conflicts with {manager}:")
        lines += [f"- {path}" for path in grouped[manager]]
    return f"Apply failed with {len(conflicts)} conflicts: " + "\n".join(lines)
