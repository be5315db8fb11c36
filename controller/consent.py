"""Secrets by consent: every Secret a resource names, and whether it agrees to be used.

A Secret is used for a dispatcher only when its annotation `outbox.dev/dispatchers` names
the dispatcher (or is `*`); `admit` checks the pod policy first (`policy`), then reads each
Secret the spec names from the resource's own namespace and checks its consent. Where a
publisher's block names Secrets is its description's (outbox.publisher_options): the fields
it carries from a Secret, or every entry of a plugin's `secretRefs`."""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from outbox.controller.defaults import PUBLISHER_TYPES
from outbox.controller.images import ANY
from outbox.controller.policy import POLICY_VIOLATION, check_pod_policy, shown
from outbox.controller.problem import Problem
from outbox.controller.spec import described
from outbox.publisher_options import PLUGIN

if TYPE_CHECKING:
    from outbox.controller.kube import Kube, Secret
    from outbox.controller.settings import ControllerSettings

SECRET_NOT_SHARED = "SecretNotShared"
# On a Secret: the dispatchers (of the Secret's namespace) that may use it, separated by
# commas, or `*` for all of them.
CONSENT_ANNOTATION = "outbox.dev/dispatchers"
# A Secret's name: a DNS subdomain, so never a path into another namespace.
SECRET_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")
# Where the spec names Secrets, from spec (`[]` walks a list, `{}` a map's values), besides
# its publisher's block. imagePullSecrets is the pod field the day-two pod settings add: a
# Secret of registry credentials is a Secret too.
DSN_SECRET_FIELD = "database.dsnSecretRef.name"
WORKER_SECRET_FIELDS = ("worker.imagePullSecrets[].name",)
# A plugin's Secrets: every entry of its generic block's secretRefs, whatever the plugin's
# options (an entry it has no option for is refused later, and named here first).
PLUGIN_SECRET_FIELD = f"publisher.{PLUGIN}.secretRefs{{}}.name"
DSN_FIELD = "spec." + DSN_SECRET_FIELD.removesuffix(".name")  # where a SecretUse says it is


@dataclass(frozen=True)
class SecretUse:
    field: str  # where the spec names it: spec.publisher.http.headersSecretRef
    name: str


def _walk(node: Any, parts: list[str], at: str) -> Iterator[tuple[str, Any]]:
    if not parts:
        yield at, node
        return
    head, rest = parts[0], parts[1:]
    listed, mapped = head.endswith("[]"), head.endswith("{}")
    head = head.removesuffix("[]").removesuffix("{}")
    if not isinstance(node, Mapping) or head not in node:
        return
    child = node[head]
    if listed:
        for index, item in enumerate(child or ()):
            yield from _walk(item, rest, f"{at}.{head}[{index}]")
    elif mapped:
        for key, item in sorted((child or {}).items()):
            yield from _walk(item, rest, f"{at}.{head}.{key}")
    else:
        yield from _walk(child, rest, f"{at}.{head}")


def publisher_secret_fields(publisher: Mapping[str, Any]) -> tuple[str, ...]:
    """Where the publisher's block names Secrets, from spec: the fields its description
    carries from a Secret, or a plugin's secretRefs."""
    if publisher.get("type") == PLUGIN:
        return (PLUGIN_SECRET_FIELD,)
    description, kind, _ = described(publisher)
    return tuple(
        f"publisher.{kind}.{f.secret_name_path}"
        for _, f in description.bindings(kind)
        if f.secret_name_path is not None
    )


def secret_fields() -> tuple[str, ...]:
    """Every place a resource may name a Secret, whatever its publisher (the CRD's types)."""
    publishers = (publisher_secret_fields({"type": kind}) for kind in PUBLISHER_TYPES)
    return (DSN_SECRET_FIELD, *(f for fields in publishers for f in fields), *WORKER_SECRET_FIELDS)


def secret_uses(spec: Mapping[str, Any]) -> list[SecretUse]:
    """Every Secret the spec names, and where (the reference, not its `.name`)."""
    paths = (DSN_SECRET_FIELD, *publisher_secret_fields(spec["publisher"]), *WORKER_SECRET_FIELDS)
    uses = []
    for path in paths:
        for at, name in _walk(spec, path.split("."), "spec"):
            uses.append(SecretUse(at.removesuffix(".name"), str(name)))
    return uses


def consents(annotations: Mapping[str, str] | None, dispatcher: str) -> bool:
    """Does a Secret with these annotations agree to be used by `dispatcher`?"""
    listed = (annotations or {}).get(CONSENT_ANNOTATION, "")
    names = {name.strip() for name in listed.split(",")}
    return ANY in names or dispatcher in names


def not_shared(namespace: str, secret: str, dispatcher: str, fields: list[str]) -> Problem:
    # The Secret by name and where the spec names it, never anything it holds.
    return Problem(
        SECRET_NOT_SHARED,
        f"Secret `{namespace}/{secret}` ({', '.join(fields)}) is not shared with dispatcher "
        f"`{dispatcher}`, so no workers run: whoever owns the Secret shares it with "
        f"`kubectl annotate secret {secret} {CONSENT_ANNOTATION}={dispatcher}` (names separated "
        f"by commas; {ANY} shares it with every dispatcher of the namespace)",
        stops_workers=True,
    )


async def admit(
    kube: Kube,
    settings: ControllerSettings,
    namespace: str,
    dispatcher: str,
    spec: Mapping[str, Any],
) -> dict[str, Secret]:
    """Check the spec against the pod policy, then read the Secrets it names (only the
    resource's namespace: a name cannot leave it) and check each consents; raises the
    Problem. Returns the Secrets read, by name. Without --secret-consent only the DSN's
    Secret is read, as the operator needs its value."""
    check_pod_policy(spec, settings, dispatcher)
    uses = secret_uses(spec)
    named = [use for use in uses if not SECRET_NAME.match(use.name)]
    if named:
        listed = "; ".join(f"{u.field}.name: `{shown(u.name)}` is not a Secret name" for u in named)
        raise Problem(POLICY_VIOLATION, listed, stops_workers=True)
    if not settings.secret_consent:
        uses = [use for use in uses if use.field == DSN_FIELD]
    fields: dict[str, list[str]] = {}
    for use in uses:
        fields.setdefault(use.name, []).append(use.field)
    secrets = {}
    for name, where in fields.items():
        secret = await kube.secret(namespace, name)
        if settings.secret_consent and not consents(secret.annotations, dispatcher):
            raise not_shared(namespace, name, dispatcher, where)
        secrets[name] = secret
    return secrets
