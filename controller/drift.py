"""Drift: what of the worker pod template someone else changed, in words.

The operator renders the Deployment; a person (`kubectl set image`, `kubectl edit`) or another
controller may change its live template. `template_drift` names each difference as a path in
the template; the reconcile loop puts the template back and posts a `DriftCorrected` Event.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kubernetes.utils.quantity import parse_quantity

# Lists whose items are named: compared item by item by name (an added or removed item is
# named as such); other lists are compared by position.
NAMED_LISTS = frozenset(
    {"containers", "initContainers", "env", "ports", "volumes", "volumeMounts", "imagePullSecrets"}
)
SHOWN_VALUES = frozenset({"image", "imagePullPolicy", "command", "args"})


def template_drift(rendered: Any, live: Any, path: str = "") -> tuple[str, ...]:
    """What of `rendered` the live template does not hold, in words, as paths in the
    template (`spec.containers[worker].image evil:latest (rendered: outbox:1)`,
    `spec.containers[worker].env[FOO] added`).

    Only what the operator renders is compared: fields the server defaults (or a person adds
    where the operator renders nothing, e.g. `kubectl rollout restart`'s annotation) are
    not drift. Named lists must hold the same names: an added env variable is drift.
    Quantities compare by value (`0.5` is `500m`), as the server canonicalizes them."""
    if isinstance(rendered, Mapping):
        if not isinstance(live, Mapping):
            return (f"{path or 'template'} replaced",)
        found: list[str] = []
        for key, value in rendered.items():
            where = f"{path}.{key}" if path else str(key)
            if key not in live:
                if value not in ({}, [], None, ""):  # an empty value is not stored
                    found.append(f"{where} removed")
                continue
            found.extend(template_drift(value, live[key], where))
        return tuple(found)
    field_name = path.rsplit(".", 1)[-1]
    if isinstance(rendered, list) and not all(_scalar(i) for i in rendered):
        if not isinstance(live, list):
            return (f"{path} replaced",)
        if field_name in NAMED_LISTS and all(_named(i) for i in rendered):
            return _named_drift(rendered, live, path)
        if len(rendered) != len(live):
            return (f"{path} has {len(live)} items (rendered: {len(rendered)})",)
        return tuple(
            d for i, (r, v) in enumerate(zip(rendered, live, strict=True))
            for d in template_drift(r, v, f"{path}[{i}]")
        )  # fmt: skip
    if _same(rendered, live, path):
        return ()
    if field_name in SHOWN_VALUES:
        return (f"{path} {_shown(live)} (rendered: {_shown(rendered)})",)
    return (f"{path} changed",)


def _named_drift(rendered: list[Any], live: list[Any], path: str) -> tuple[str, ...]:
    mine = {item["name"]: item for item in rendered}
    theirs = {item.get("name"): item for item in live if isinstance(item, Mapping)}
    found = [f"{path}[{name}] added" for name in theirs if name not in mine]
    for name, item in mine.items():
        if name not in theirs:
            found.append(f"{path}[{name}] removed")
        else:
            found.extend(template_drift(item, theirs[name], f"{path}[{name}]"))
    return tuple(found)


def _scalar(value: Any) -> bool:
    return not isinstance(value, (Mapping, list))


def _named(value: Any) -> bool:
    return isinstance(value, Mapping) and "name" in value


def _same(rendered: Any, live: Any, path: str) -> bool:
    if rendered == live:
        return True
    if ".resources." in path or path.endswith("sizeLimit"):
        try:
            return bool(parse_quantity(rendered) == parse_quantity(live))  # type: ignore[no-untyped-call]
        except (ValueError, TypeError):
            return False
    return False


def _shown(value: Any) -> str:
    text = " ".join(map(str, value)) if isinstance(value, list) else str(value)
    return text if len(text) <= 120 else text[:119] + "…"
