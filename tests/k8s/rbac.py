"""The emulator's optional authorizer: bearer tokens, identities and RBAC rules.

Given a mapping token → `Identity` and a set of Role, ClusterRole, RoleBinding and
ClusterRoleBinding objects (as rendered by a chart, for instance; those stored in the
emulator, e.g. by `kubectl apply`, count too), it answers each request the
way the RBAC authorizer of a real server does: 401 for a missing or unknown token, 403 with
the server's wording for what no rule allows. Members of `system:masters` may do anything;
every authenticated identity may read discovery and OpenAPI (`system:discovery`) and ask what
it may do (`system:basic-user`).
Impersonation (`kubectl --as`) and `kubectl auth can-i` (SelfSubjectAccessReview) work, so
a chart's RBAC can be checked identity by identity.
Service accounts are the users `system:serviceaccount:<namespace>:<name>` in the groups
`system:serviceaccounts` and `system:serviceaccounts:<namespace>`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

JSON = dict[str, Any]
MASTERS = "system:masters"
_DISCOVERY = ("/api", "/apis", "/version", "/openapi", "/healthz", "/readyz", "/livez", "/")


@dataclass(frozen=True)
class Identity:
    user: str
    groups: tuple[str, ...] = ()

    @classmethod
    def service_account(cls, namespace: str, name: str) -> Identity:
        return cls(
            f"system:serviceaccount:{namespace}:{name}",
            ("system:serviceaccounts", f"system:serviceaccounts:{namespace}"),
        )


ADMIN = Identity("kubernetes-admin", (MASTERS,))


class Authorizer:
    def __init__(self, tokens: Mapping[str, Identity], rbac: Iterable[JSON] = ()) -> None:
        self.tokens = dict(tokens)
        self.objects = list(rbac)

    def authenticate(self, headers: Mapping[str, str], stored: Iterable[JSON] = ()) -> Identity:
        """The identity of a request: its bearer token's, or the one it impersonates
        (`kubectl --as=... --as-group=...`) if the token's identity may impersonate."""
        from .emulator import ApiError

        header = headers.get("Authorization", "")
        token = header.removeprefix("Bearer ").strip() if header.startswith("Bearer ") else ""
        identity = self.tokens.get(token)
        if identity is None:
            raise ApiError(401, "Unauthorized", "Unauthorized")
        user = headers.get("Impersonate-User")
        if not user:
            return identity
        attributes = {
            "verb": "impersonate",
            "apiGroup": "",
            "resource": "users",
            "subresource": "",
            "namespace": "",
            "name": user,
        }
        if not self.allowed(identity, attributes, stored):
            raise ApiError(
                403,
                "Forbidden",
                f'users "{user}" is forbidden: User '
                f'"{identity.user}" cannot impersonate resource "users" in API '
                'group "" at the cluster scope',
            )
        getall = getattr(headers, "getall", None)
        groups = tuple(getall("Impersonate-Group", ())) if getall else ()
        if user.startswith("system:serviceaccount:"):
            namespace = user.split(":")[2]
            groups += ("system:serviceaccounts", f"system:serviceaccounts:{namespace}")
        return Identity(user, groups)

    def check(
        self, identity: Identity | None, attributes: JSON, stored: Iterable[JSON] = ()
    ) -> None:
        """Raise 403 unless allowed; `stored` are the RBAC objects the server holds."""
        from .emulator import ApiError

        if identity is None or self.allowed(identity, attributes, stored):
            return
        if "resource" not in attributes:
            raise ApiError(
                403,
                "Forbidden",
                f'forbidden: User "{identity.user}" cannot '
                f'{attributes["verb"]} path "{attributes["path"]}"',
            )
        resource = attributes["resource"]
        if attributes["subresource"]:
            resource += "/" + attributes["subresource"]
        group = attributes["apiGroup"]
        qualified = f"{attributes['resource']}.{group}" if group else attributes["resource"]
        named = f' "{attributes["name"]}"' if attributes["name"] else ""
        scope = (
            f' in the namespace "{attributes["namespace"]}"'
            if attributes["namespace"]
            else " at the cluster scope"
        )
        raise ApiError(
            403,
            "Forbidden",
            f'{qualified}{named} is forbidden: User "{identity.user}" cannot '
            f'{attributes["verb"]} resource "{resource}" in API group "{group}"'
            f"{scope}",
            {"name": attributes["name"], "group": group, "kind": attributes["resource"]},
        )

    def allowed(self, identity: Identity, attributes: JSON, stored: Iterable[JSON] = ()) -> bool:
        objects = [*self.objects, *stored]
        if MASTERS in identity.groups:
            return True
        if (
            attributes.get("apiGroup") == "authorization.k8s.io"
            and attributes.get("resource") == "selfsubjectaccessreviews"
        ):
            return True  # system:basic-user: anyone may ask what they may do
        if "resource" not in attributes:
            return (
                any(
                    attributes["path"] == p or attributes["path"].startswith(p.rstrip("/") + "/")
                    for p in _DISCOVERY
                    if p != "/"
                )
                or attributes["path"] == "/"
            )
        for binding in objects:
            kind = binding.get("kind")
            if kind not in ("RoleBinding", "ClusterRoleBinding"):
                continue
            namespace = binding.get("metadata", {}).get("namespace")
            if kind == "RoleBinding" and namespace != attributes["namespace"]:
                continue
            if not any(
                self._subject(s, identity, namespace) for s in binding.get("subjects") or []
            ):
                continue
            role = self._role(objects, binding.get("roleRef", {}), namespace)
            if role and any(self._rule(r, attributes) for r in role.get("rules") or []):
                return True
        return False

    @staticmethod
    def _role(objects: list[JSON], ref: JSON, namespace: str | None) -> JSON | None:
        for obj in objects:
            if obj.get("kind") != ref.get("kind"):
                continue
            meta = obj.get("metadata", {})
            if meta.get("name") != ref.get("name"):
                continue
            if obj["kind"] == "Role" and meta.get("namespace") != namespace:
                continue
            return obj
        return None

    @staticmethod
    def _subject(subject: JSON, identity: Identity, binding_namespace: str | None) -> bool:
        kind, name = subject.get("kind"), subject.get("name")
        if kind == "User":
            return bool(name == identity.user)
        if kind == "Group":
            return name in identity.groups
        if kind == "ServiceAccount":
            namespace = subject.get("namespace") or binding_namespace
            return identity.user == f"system:serviceaccount:{namespace}:{name}"
        return False

    @staticmethod
    def _rule(rule: JSON, attributes: JSON) -> bool:
        def has(values: list[str] | None, wanted: str) -> bool:
            return bool(values) and ("*" in values or wanted in values)  # type: ignore[operator]

        resource = attributes["resource"]
        if attributes["subresource"]:
            resource += "/" + attributes["subresource"]
        names = rule.get("resourceNames")
        return (
            has(rule.get("verbs"), attributes["verb"])
            and has(rule.get("apiGroups"), attributes["apiGroup"])
            and has(rule.get("resources"), resource)
            and (not names or attributes["name"] in names)
        )
