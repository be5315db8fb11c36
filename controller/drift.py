"""Drift: what of the worker pod template someone else changed, in words.

The operator renders the Deployment; a person (`kubectl set image`, `kubectl edit`, `kubectl
patch`) or another controller may change its live template. `template_drift` names each
difference as a path in the template; the reconcile loop puts the template back and posts a
`DriftCorrected` Event.

The pod spec is compared whole: a key the operator does not render is drift (`hostNetwork`,
`nodeName`, a privileged `securityContext`, `envFrom`, `tolerations` added by hand would
otherwise stay for good), except where the API server itself sets it to its default. Those
defaults are the fixed list below (`POD_DEFAULTS` and its neighbours), each stripped from the
live spec only where the operator renders nothing for it and the live value is the default
(`dnsPolicy: None` added by hand is drift; `dnsPolicy: ClusterFirst` is the server's). A
default the list does not know is learned from the server's answer to the operator's own
write (`reconcile.apply`), so it is never put back in a loop. The pod template's metadata is
compared only where the operator renders it (`kubectl rollout restart` annotates it).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeGuard

from kubernetes.utils.quantity import parse_quantity

# Lists whose items are named: compared item by item by name (an added or removed item is
# named as such); other lists are compared by position.
NAMED_LISTS = frozenset(
    {"containers", "initContainers", "env", "ports", "volumes", "volumeMounts", "imagePullSecrets"}
)
SHOWN_VALUES = frozenset({"image", "imagePullPolicy", "command", "args"})

# What the API server sets in a pod template it stores (SetDefaults_PodSpec and its parts in
# k8s.io/kubernetes pkg/apis/core/v1/defaults.go; the emulator in tests/k8s sets the same).
POD_DEFAULTS: Mapping[str, Any] = {
    "restartPolicy": "Always",
    "terminationGracePeriodSeconds": 30,
    "dnsPolicy": "ClusterFirst",
    "schedulerName": "default-scheduler",
    "securityContext": {},
    "enableServiceLinks": True,  # set on pods; harmless where a server sets it on templates
}
CONTAINER_DEFAULTS: Mapping[str, Any] = {
    "terminationMessagePath": "/dev/termination-log",
    "terminationMessagePolicy": "File",
    "resources": {},
}
PROBE_DEFAULTS: Mapping[str, Any] = {
    "timeoutSeconds": 1,
    "periodSeconds": 10,
    "successThreshold": 1,
    "failureThreshold": 3,
}
PROBES = ("readinessProbe", "livenessProbe", "startupProbe")
PORT_DEFAULTS: Mapping[str, Any] = {"protocol": "TCP"}
# Volume sources whose files get mode 0644 unless told otherwise.
MODE_SOURCES = ("secret", "configMap", "projected", "downwardAPI")
MODE_DEFAULTS: Mapping[str, Any] = {"defaultMode": 0o644}
EMPTY: tuple[Any, ...] = (
    {},
    [],
    None,
    "",
)  # never stored: an absent key and an empty value are one


def template_drift(rendered: Any, live: Any) -> tuple[str, ...]:
    """What differs between the rendered pod template and the live one, in words, as paths in
    the template (`spec.containers[worker].image evil:latest (rendered: outbox:1)`,
    `spec.containers[worker].env[FOO] added`, `spec.hostNetwork added`).

    The spec is compared whole, the server's defaults (the module's list) aside; the metadata
    only where rendered. Quantities compare by value (`0.5` is `500m`), as the server
    canonicalizes them."""
    if not isinstance(rendered, Mapping) or not isinstance(live, Mapping):
        return ("template replaced",)
    found: list[str] = []
    for key, value in rendered.items():
        if key == "spec":
            continue
        found.extend(_diff(value, live.get(key), key, whole=False))
    if "spec" in rendered:
        spec = live.get("spec")
        if isinstance(spec, Mapping) and isinstance(rendered["spec"], Mapping):
            spec = without_server_defaults(spec, rendered["spec"])
        found.extend(_diff(rendered["spec"], spec, "spec", whole=True))
    return tuple(found)


def without_server_defaults(live: Mapping[str, Any], rendered: Mapping[str, Any]) -> dict[str, Any]:
    """The live pod spec without what the API server set to its default where the operator
    rendered nothing: what is left was rendered or added by someone."""
    spec = _strip(live, rendered, POD_DEFAULTS)
    # The deprecated mirror the server keeps of serviceAccountName.
    if "serviceAccount" not in rendered and spec.get("serviceAccount") == spec.get(
        "serviceAccountName"
    ):
        spec.pop("serviceAccount", None)
    for kind in ("containers", "initContainers"):
        if isinstance(spec.get(kind), list):
            mine = _by_name(rendered.get(kind))
            spec[kind] = [
                _container(item, mine.get(item.get("name"), {})) if isinstance(item, Mapping)
                else item
                for item in spec[kind]
            ]  # fmt: skip
    if isinstance(spec.get("volumes"), list):
        mine = _by_name(rendered.get("volumes"))
        spec["volumes"] = [
            _volume(item, mine.get(item.get("name"), {})) if isinstance(item, Mapping) else item
            for item in spec["volumes"]
        ]
    return spec


def _container(live: Mapping[str, Any], rendered: Mapping[str, Any]) -> dict[str, Any]:
    image = str(live.get("image", ""))
    latest = ":" not in image.rsplit("/", 1)[-1] or image.endswith(":latest")
    pull = {"imagePullPolicy": "Always" if latest else "IfNotPresent"}
    container = _strip(live, rendered, {**CONTAINER_DEFAULTS, **pull})
    if isinstance(container.get("ports"), list):
        ports = {p.get("containerPort"): p for p in rendered.get("ports") or () if _map(p)}
        container["ports"] = [
            _strip(p, ports.get(p.get("containerPort"), {}), PORT_DEFAULTS) if _map(p) else p
            for p in container["ports"]
        ]
    for name in PROBES:
        probe, given = container.get(name), rendered.get(name)
        if _map(probe):
            rendered_probe = given if _map(given) else {}
            probe = _strip(probe, rendered_probe, PROBE_DEFAULTS)
            if _map(probe.get("httpGet")):
                probe["httpGet"] = _strip(
                    probe["httpGet"], rendered_probe.get("httpGet") or {}, {"scheme": "HTTP"}
                )
            container[name] = probe
    if isinstance(container.get("env"), list):
        env = _by_name(rendered.get("env"))
        container["env"] = [_env(e, env.get(e.get("name"), {})) if _map(e) else e
                            for e in container["env"]]  # fmt: skip
    return container


def _env(live: Mapping[str, Any], rendered: Mapping[str, Any]) -> dict[str, Any]:
    """fieldRef.apiVersion is defaulted to v1."""
    env = dict(live)
    source, mine = env.get("valueFrom"), rendered.get("valueFrom")
    if _map(source) and _map(source.get("fieldRef")):
        ref = (mine or {}).get("fieldRef") if _map(mine) else {}
        env["valueFrom"] = {
            **source,
            "fieldRef": _strip(source["fieldRef"], ref or {}, {"apiVersion": "v1"}),
        }
    return env


def _volume(live: Mapping[str, Any], rendered: Mapping[str, Any]) -> dict[str, Any]:
    volume = dict(live)
    for kind in MODE_SOURCES:
        if _map(volume.get(kind)):
            mine = rendered.get(kind)
            volume[kind] = _strip(volume[kind], mine if _map(mine) else {}, MODE_DEFAULTS)
    return volume


def _strip(
    live: Mapping[str, Any], rendered: Mapping[str, Any], defaults: Mapping[str, Any]
) -> dict[str, Any]:
    """`live` without each default key the operator does not render whose value is the
    default (any other value is someone's)."""
    return {
        key: value
        for key, value in live.items()
        if not (key in defaults and key not in rendered and value == defaults[key])
    }


def _by_name(items: Any) -> dict[Any, Mapping[str, Any]]:
    return {i.get("name"): i for i in items or () if _map(i)}


def _map(value: Any) -> TypeGuard[Mapping[str, Any]]:
    return isinstance(value, Mapping)


def _diff(rendered: Any, live: Any, path: str, *, whole: bool) -> tuple[str, ...]:
    """`whole`: keys only the live value holds are drift too (the pod spec); else only what
    is rendered is compared (the template's metadata)."""
    if isinstance(rendered, Mapping):
        if not isinstance(live, Mapping):
            if live is None and rendered in EMPTY:
                return ()
            return (f"{path} removed",) if live is None else (f"{path} replaced",)
        found: list[str] = []
        for key, value in rendered.items():
            where = f"{path}.{key}"
            if key not in live:
                if value not in EMPTY:  # an empty value is not stored
                    found.append(f"{where} removed")
                continue
            found.extend(_diff(value, live[key], where, whole=whole))
        if whole:
            found.extend(
                f"{path}.{key} added"
                for key, value in live.items()
                if key not in rendered and value not in EMPTY
            )
        return tuple(found)
    field_name = path.rsplit(".", 1)[-1]
    if isinstance(rendered, list) and not all(_scalar(i) for i in rendered):
        if not isinstance(live, list):
            return (f"{path} replaced",)
        if field_name in NAMED_LISTS and all(_named(i) for i in rendered):
            return _named_drift(rendered, live, path, whole=whole)
        if len(rendered) != len(live):
            return (f"{path} has {len(live)} items (rendered: {len(rendered)})",)
        return tuple(
            d for i, (r, v) in enumerate(zip(rendered, live, strict=True))
            for d in _diff(r, v, f"{path}[{i}]", whole=whole)
        )  # fmt: skip
    if _same(rendered, live, path):
        return ()
    if field_name in SHOWN_VALUES:
        return (f"{path} {_shown(live)} (rendered: {_shown(rendered)})",)
    return (f"{path} changed",)


def _named_drift(
    rendered: list[Any], live: list[Any], path: str, *, whole: bool
) -> tuple[str, ...]:
    mine = {item["name"]: item for item in rendered}
    theirs = {item.get("name"): item for item in live if isinstance(item, Mapping)}
    found = [f"{path}[{name}] added" for name in theirs if name not in mine]
    for name, item in mine.items():
        if name not in theirs:
            found.append(f"{path}[{name}] removed")
        else:
            found.extend(_diff(item, theirs[name], f"{path}[{name}]", whole=whole))
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
