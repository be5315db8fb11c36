"""What a resource may ask for: the cluster admin's pod policy and each Secret's consent.

Who may write an OutboxDispatcher in a namespace is often not who may read its Secrets or
create pods there (docs/security.md). The operator acts with its own permissions, so it must
not do for a resource's author what the author could not do: run an image, a service account
or a placement the cluster admin did not allow, or hand a Secret to workers (and through
them to a destination the author picks) that the Secret did not agree to.

`consent.admit` runs both checks on every pass before anything else is read, and a resource that
fails them gets `Ready=False` (`PolicyViolation`, `SecretNotShared`) and no workers: its
Problem stops them (`decision.py`). The checks are pure functions of the spec, the settings
and a Secret's annotations, so they are tested without a cluster; the CRD refuses what is
static (env names and `valueFrom`, Secret names) before the operator ever sees it.

A new pod field of `spec.worker` gets a check in `WORKER_CHECKS` (or a place in
`UNRESTRICTED` when it widens nothing, or in `BY_CONSENT` when what it reaches is a Secret),
and a new Secret reference outside the publisher's block a path in `consent`; a publisher's
own Secrets and map fields are read from its description (outbox.publisher_options).
tests/test_controller_policy.py fails until the CRD and these tables agree.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from outbox.controller.images import ANY, allowed_images, image_allowed, parse_image
from outbox.controller.problem import Problem
from outbox.controller.resource import labels, selector_labels
from outbox.controller.spec import PublisherSpec
from outbox.publisher_options import Carried

if TYPE_CHECKING:  # settings.py validates its lists with this module's parsers
    from outbox.controller.settings import ControllerSettings

POLICY_VIOLATION = "PolicyViolation"
# The environment spec.worker.env may not set, whatever the admin allows: the worker's own
# settings, and every variable that changes how the worker process resolves names, loads
# code, or finds its configuration or credentials. With LOCALDOMAIN, glibc's resolver tried
# `orders-db.shop.svc.cluster.local.<the author's domain>` first and libpq sent the DSN's
# password there; PGHOSTADDR does it directly. One list, by prefix, name and suffix, each
# with the component that reads it and where that is documented; the CRD's CEL rule holds the
# same (tests/test_controller_policy.py compares them), docs/security.md explains it.
# OTEL_* stay allowed on purpose: OpenTelemetry's own settings (exporter headers, batching),
# which spec.worker.tracing leaves to the author; what they reach is a collector, a
# destination like the publisher's.
DENIED_ENV_PREFIXES: dict[str, str] = {
    "OUTBOX_": "the worker's own settings, which the spec's fields set",
    # postgresql.org/docs/current/libpq-envars.html: PGHOSTADDR, PGPASSFILE, PGSERVICEFILE,
    # PGSYSCONFDIR, PGSSLROOTCERT, PGGSSLIB, PGKRBSRVNAME...
    "PG": "libpq reads it (where to connect, its password, service and certificate files)",
    # ld.so(8): LD_PRELOAD, LD_LIBRARY_PATH, LD_AUDIT
    "LD_": "glibc's dynamic loader reads it (libraries to load)",
    # python(1), "Environment variables": PYTHONPATH, PYTHONHOME, PYTHONSTARTUP, PYTHONUSERBASE
    "PYTHON": "Python reads it (modules to load)",
    # SSL_CERT_FILE, SSL_CERT_DIR (OpenSSL, openssl-env(7)); SSLKEYLOGFILE (Python's ssl
    # writes every TLS session's keys there)
    "SSL": "OpenSSL or Python's ssl reads it (trusted CAs, a TLS key log)",
    # openssl-env(7): OPENSSL_CONF, OPENSSL_CONF_INCLUDE, OPENSSL_MODULES, OPENSSL_ENGINES
    "OPENSSL": "OpenSSL reads it (its configuration, providers and engines to load)",
    # MIT kerberos(7), for libpq's and librdkafka's GSSAPI: KRB5_CONFIG, KRB5CCNAME,
    # KRB5_KTNAME, KRB5_CLIENT_KTNAME, KRB5RCACHEDIR, KRB5_TRACE
    "KRB5": "Kerberos reads it (its configuration, plugins, credential caches, keytabs)",
    # MIT gssapi: GSS_MECH_CONFIG, the mechanism modules to load
    "GSS": "GSSAPI reads it (mechanism modules to load)",
    # Cyrus SASL (librdkafka's GSSAPI): SASL_PATH, SASL_CONF_PATH
    "SASL_": "Cyrus SASL reads it (plugins to load, its configuration)",
    # glibc's sysdeps/generic/unsecvars.h: RESOLV_HOST_CONF and the older RESOLV_* switches
    "RESOLV_": "glibc's resolver reads it",
    # bash(1): BASH_ENV (a file every non-interactive bash runs first), BASH_FUNC_*%%
    # (functions it defines); librdkafka runs its kinit command through a shell
    "BASH": "bash reads it (a file to run, functions to define)",
    # XDG Base Directory Specification: XDG_CONFIG_HOME, XDG_CONFIG_DIRS...
    "XDG_": "libraries find their configuration through it",
}
DENIED_ENV_NAMES: dict[str, str] = {
    # glibc drops these from the environment of set-user-ID programs as unsafe
    # (sysdeps/generic/unsecvars.h; LD_* and RESOLV_* above).
    "GCONV_PATH": "glibc reads it (character set converters to load)",
    "GETCONF_DIR": "glibc reads it",
    "GLIBC_TUNABLES": "glibc's loader and allocator read it",
    "HOSTALIASES": "glibc's resolver reads it (a file of host name aliases)",
    "LOCALDOMAIN": "glibc's resolver reads it (domains a host name is tried in first)",
    "LOCPATH": "glibc reads it (locales to load)",
    "MALLOC_TRACE": "glibc's allocator reads it (a file it writes)",
    "NIS_PATH": "glibc reads it",
    "NLSPATH": "glibc reads it (message catalogs to load)",
    "RES_OPTIONS": "glibc's resolver reads it (how many dots make a name tried as written)",
    "TMPDIR": "glibc and Python read it (where temporary files go)",
    "TZDIR": "glibc reads it (time zone files to load)",
    # openssl-env(7), beyond OPENSSL_* and SSL*
    "CTLOG_FILE": "OpenSSL reads it (certificate transparency logs)",
    "QLOGDIR": "OpenSSL reads it (a directory it writes QUIC logs to)",
    "RANDFILE": "OpenSSL reads it (its random seed file)",
    # libpq: ~/.pgpass, ~/.pg_service.conf, ~/.postgresql/root.crt, postgresql.crt and .key;
    # Python: the user's site-packages (~/.local); HTTP clients: ~/.netrc
    "HOME": "libpq, Python and HTTP clients find files through it (passwords, certificates)",
    # which programs run: librdkafka runs its kinit command through /bin/sh
    "PATH": "it decides which programs run",
    "ENV": "shells read it (a file to run)",
    "IFS": "shells read it (how a command line is split)",
    "SHELLOPTS": "bash reads it (xtrace runs PS4's commands)",
    "PS4": "shells read it (commands run with xtrace)",
    # requests (the OTLP exporter's HTTP client): CA bundles, and netrc's credentials
    "REQUESTS_CA_BUNDLE": "HTTP clients read it (trusted CAs)",
    "CURL_CA_BUNDLE": "HTTP clients read it (trusted CAs)",
    "NETRC": "HTTP clients read it (a file of credentials)",
}
# Python's urllib.request.getproxies takes every variable whose name ends in `_proxy`, in any
# case (http_proxy, HTTPS_PROXY, ALL_PROXY, no_proxy), as do requests and OpenSSL's HTTP
# client: every request to a destination would go through the author's proxy.
DENIED_ENV_SUFFIX = "_PROXY"  # compared in upper case, as the CRD's upperAscii()
DENIED_ENV_SUFFIX_WHY = "HTTP clients read it (a proxy every request goes through)"
# A map field of a publisher's block (Carried.PAIRS, e.g. spec.publisher.kafka.config)
# reaches the worker as one KEY=VALUE a line (read with str.splitlines, for which \r, \v, \f,
# \x1c-\x1e, \x85, U+2028 and U+2029 end a line too): a key outside the publisher's own
# pattern (its description's `Keys`), or a value with a line break, would add a pair the
# author did not write as one. The CRD takes values of printable ASCII only (a pattern); it
# cannot check map keys cheaply (see key_valid), so the policy does, with the keys the
# publisher refuses whatever the admin allows.
PAIRS_VALUE = re.compile(r"^[\x20-\x7e]*\Z")
SHOWN_CHARS = 80  # of a value the author wrote, quoted back in a message

# -- the pod policy -------------------------------------------------------------------------------

Violation = tuple[str, str]  # (the field, from spec.worker, and what is wrong with it)
# A check of one spec.worker field: (its value, the settings, the dispatcher's name).
Check = Callable[[Any, "ControllerSettings", str], Iterator[Violation]]


def shown(value: object) -> str:
    text = " ".join(str(value).split())
    return text if len(text) <= SHOWN_CHARS else text[: SHOWN_CHARS - 1] + "…"


def _listed(allowed: tuple[str, ...], none: str = "none") -> str:
    return f"allowed: {', '.join(allowed)}" if allowed else f"allowed: {none}"


def key_allowed(key: str, patterns: tuple[str, ...]) -> bool:
    """A label or annotation key against entries that are a key, a prefix ending in `*`, or `*`."""
    return any(key.startswith(p[:-1]) if p.endswith(ANY) else key == p for p in patterns)


def pair_allowed(key: str, value: str | None, patterns: tuple[str, ...]) -> bool:
    """`key=value` against entries `key` (any value), `key=value` or `*`; `value` None (a
    toleration with operator Exists) needs `key` or `*`."""
    return (
        ANY in patterns or key in patterns or (value is not None and f"{key}={value}" in patterns)
    )


def _image(value: Any, settings: ControllerSettings, dispatcher: str) -> Iterator[Violation]:
    if not value or value == settings.worker_image:  # absent: the admin's own default
        return
    allowed = allowed_images(settings)
    if parse_image(str(value)) is None:
        yield "image", f"`{shown(value)}` is not an image reference"
    elif not image_allowed(str(value), allowed):
        yield "image", f"image `{shown(value)}` is not allowed ({_listed(allowed)})"


def _service_account(
    value: Any, settings: ControllerSettings, dispatcher: str
) -> Iterator[Violation]:
    allowed = settings.allowed_service_accounts
    if not value or value == "default" or ANY in allowed or value in allowed:
        return
    why = _listed(allowed, "only the namespace's default")
    yield "serviceAccountName", f"service account `{shown(value)}` is not allowed ({why})"


def denied_env(name: str) -> str | None:
    """Why spec.worker.env may not set `name` (what reads it), or None when it may."""
    for prefix, why in DENIED_ENV_PREFIXES.items():
        if name.startswith(prefix):
            return why
    if name in DENIED_ENV_NAMES:
        return DENIED_ENV_NAMES[name]
    # bytes.upper changes ASCII letters only, as CEL's upperAscii().
    if name.encode().upper().endswith(DENIED_ENV_SUFFIX.encode()):
        return DENIED_ENV_SUFFIX_WHY
    return None


def _env(value: Any, settings: ControllerSettings, dispatcher: str) -> Iterator[Violation]:
    # Values are never quoted back: an author may have put a secret in one.
    for index, item in enumerate(value or ()):
        name = str(item.get("name", ""))
        if set(item) - {"name", "value"}:
            yield (
                f"env[{index}]",
                f"`{shown(name)}` must be a plain value (no valueFrom): Secrets reach the "
                "workers through the spec's secret references, with the Secret's consent",
            )
        why = denied_env(name)
        if why is not None:
            yield f"env[{index}]", f"`{shown(name)}` may not be set: {why}"


def _tolerations(value: Any, settings: ControllerSettings, dispatcher: str) -> Iterator[Violation]:
    allowed = settings.allowed_tolerations
    for index, toleration in enumerate(value or ()):
        key = str(toleration.get("key") or "")
        exists = toleration.get("operator") == "Exists"
        if not key:
            if ANY not in allowed:
                yield f"tolerations[{index}]", "a toleration without a key tolerates every taint"
            continue
        wanted = None if exists else str(toleration.get("value") or "")
        if not pair_allowed(key, wanted, allowed):
            entry = key if wanted is None else f"{key}={wanted}"
            yield (
                f"tolerations[{index}]",
                f"toleration `{shown(entry)}` is not allowed ({_listed(allowed)})",
            )


def _node_selector(
    value: Any, settings: ControllerSettings, dispatcher: str
) -> Iterator[Violation]:
    allowed = settings.allowed_node_selectors
    for key, wanted in sorted((value or {}).items()):
        if not key_valid(key):
            yield f"nodeSelector.{key}", f"`{shown(key)}` is not a label key ([prefix/]name)"
        elif not pair_allowed(key, str(wanted), allowed):
            yield (
                f"nodeSelector.{key}",
                f"`{shown(f'{key}={wanted}')}` is not allowed ({_listed(allowed)})",
            )


# Where a podAntiAffinity holds its terms (PodAffinityTerm), by list.
ANTI_AFFINITY_TERMS = (
    ("requiredDuringSchedulingIgnoredDuringExecution", None),
    ("preferredDuringSchedulingIgnoredDuringExecution", "podAffinityTerm"),
)


def _anti_affinity_terms(anti: Any) -> Iterator[tuple[str, Any]]:
    """Each term of a podAntiAffinity and where it is (`preferred…[1].podAffinityTerm`)."""
    if not isinstance(anti, Mapping):
        yield "", anti
        return
    for field, inner in ANTI_AFFINITY_TERMS:
        for index, item in enumerate(anti.get(field) or ()):
            if inner is None:
                yield f"{field}[{index}]", item
            else:
                term = item.get(inner) if isinstance(item, Mapping) else item
                yield f"{field}[{index}].{inner}", term


def _others_selected(term: Any, dispatcher: str) -> str | None:
    """Why a pod affinity term selects pods besides the dispatcher's own workers, or None.

    A term's pods are those of the pod's own namespace (no `namespaces`, no
    `namespaceSelector`) that its `labelSelector` matches; without a labelSelector it matches
    none. A selector whose matchLabels hold the workers' selector labels matches their pods
    only, whatever else it adds (matchExpressions, matchLabelKeys and mismatchLabelKeys only
    narrow it)."""
    if not isinstance(term, Mapping):
        return "is not a pod affinity term"
    if term.get("namespaces") or term.get("namespaceSelector") is not None:
        return (
            "selects pods of other namespaces (namespaces, namespaceSelector): only the "
            "dispatcher's own namespace is allowed"
        )
    selector = term.get("labelSelector")
    if selector is None:
        return None
    own = selector_labels(dispatcher)
    matched = selector.get("matchLabels") if isinstance(selector, Mapping) else None
    if isinstance(matched, Mapping) and all(matched.get(k) == v for k, v in own.items()):
        return None
    wanted = ", ".join(f"{k}: {v}" for k, v in own.items())
    return (
        "selects pods besides the dispatcher's own workers: its labelSelector.matchLabels "
        f"must hold {wanted}"
    )


def _affinity(value: Any, settings: ControllerSettings, dispatcher: str) -> Iterator[Violation]:
    # Node affinity would pass by the node selector's list, and pod affinity places the
    # workers beside pods of the author's choosing. Anti-affinity keeps the workers apart,
    # and apart from nothing else: the scheduler enforces a running pod's required
    # anti-affinity against every pod it would place (and weighs its preferred terms), so a
    # term selecting other pods holds them off the workers' nodes; an empty labelSelector, an
    # empty namespaceSelector and the topology key kubernetes.io/os would hold every pod of
    # the cluster off every node. So a term may select the dispatcher's own workers only.
    if settings.allow_affinity:
        return
    for kind in sorted(set(value or {}) - {"podAntiAffinity"}):
        yield f"affinity.{kind}", "not allowed (the policy allows podAntiAffinity only)"
    for at, term in _anti_affinity_terms((value or {}).get("podAntiAffinity") or {}):
        why = _others_selected(term, dispatcher)
        if why is not None:
            where = f"affinity.podAntiAffinity.{at}" if at else "affinity.podAntiAffinity"
            yield where, why


def _priority_class(
    value: Any, settings: ControllerSettings, dispatcher: str
) -> Iterator[Violation]:
    allowed = settings.allowed_priority_classes
    if value and ANY not in allowed and value not in allowed:
        yield (
            "priorityClassName",
            f"priority class `{shown(value)}` is not allowed ({_listed(allowed)})",
        )


# Keys the operator itself sets on the worker pods: never an author's, whatever the admin
# allows. The selector labels would take pods out of (or other pods into) the dispatcher's
# Deployment, NetworkPolicy and budget; the annotations roll the pods and point scrapes.
# The CRD refuses them too (tests/test_controller_policy.py compares).
OPERATOR_LABELS = tuple(sorted(labels("x")))
OPERATOR_ANNOTATION_PREFIXES = ("outbox.dev/", "prometheus.io/")


# A label or annotation key: an optional DNS-subdomain prefix and a name of at most 63
# characters. The CRD cannot check map keys cheaply (a CEL rule over keys of unknown length
# exceeds a real API server's cost budget), so the policy does: a bad key would otherwise
# come back as the API server's 422 on the Deployment.
_QUALIFIED_NAME = re.compile(
    r"^(?:(?=[^/]{1,253}/)[a-z0-9](?:[-a-z0-9.]*[a-z0-9])?/)?"
    r"(?=[^/]{1,63}$)[A-Za-z0-9](?:[-A-Za-z0-9_.]*[A-Za-z0-9])?$"
)


def key_valid(key: str) -> bool:
    return _QUALIFIED_NAME.match(key) is not None


def _operators(key: str, field: str) -> bool:
    if field == "podLabels":
        return key in OPERATOR_LABELS
    return key.startswith(OPERATOR_ANNOTATION_PREFIXES)


def _keys(field: str, what: str, setting: str) -> Check:
    def check(value: Any, settings: ControllerSettings, dispatcher: str) -> Iterator[Violation]:
        allowed: tuple[str, ...] = getattr(settings, setting)
        for key in sorted(value or {}):
            if not key_valid(key):
                yield f"{field}.{key}", f"`{shown(key)}` is not a {what} key ([prefix/]name)"
            elif _operators(key, field):
                yield f"{field}.{key}", f"{what} `{shown(key)}` is the operator's own"
            elif not key_allowed(key, allowed):
                yield (
                    f"{field}.{key}",
                    f"{what} `{shown(key)}` is not allowed ({_listed(allowed)})",
                )

    return check


# spec.worker's fields that can widen what the pods are or reach, and their checks.
WORKER_CHECKS: dict[str, Check] = {
    "image": _image,
    "serviceAccountName": _service_account,
    "env": _env,
    "tolerations": _tolerations,
    "nodeSelector": _node_selector,
    "affinity": _affinity,
    "priorityClassName": _priority_class,
    # Labels can join other Services' selectors and NetworkPolicies' pod selectors.
    "podLabels": _keys("podLabels", "label", "allowed_pod_labels"),
    # Annotations can turn off a mesh's sidecar, change AppArmor profiles, and the like.
    "podAnnotations": _keys("podAnnotations", "annotation", "allowed_pod_annotations"),
}
# spec.worker's fields that give the pods nothing the image and the namespace's quotas do not
# bound already. topologySpreadConstraints only narrow where the pods may go: they never pass
# a taint or a node selector, and the scheduler applies a pod's constraints to that pod alone
# (unlike a required anti-affinity, which it enforces against every other pod too), so the
# pods they count change nothing but the workers' own placement. disruptionBudget guards the
# workers from evictions and is rendered only while it cannot block a drain (render.py).
# tracing names a collector the workers send spans to: a destination, like the publisher's
# URL or brokers, which the policy leaves to the author too (the workers' egress is open,
# network.py), and which spec.worker.env could name anyway through
# OTEL_EXPORTER_OTLP_ENDPOINT. The spans say what the table says of each attempt (ids,
# types, destination, the redacted last_error).
UNRESTRICTED = frozenset(
    {
        "imagePullPolicy",
        "metricsPort",
        "shutdownGraceSeconds",
        "logLevel",
        "resources",
        "topologySpreadConstraints",
        "disruptionBudget",
        "tracing",
    }
)
# spec.worker's fields that name Secrets: each must consent (consent.secret_fields), as for every
# Secret a resource names; a registry credential is a Secret like any other.
BY_CONSENT = frozenset({"imagePullSecrets"})


def _pairs(publisher: Mapping[str, Any]) -> Iterator[Violation]:
    # Values are never quoted back: an author may have put a secret in one.
    parsed = PublisherSpec.parse(publisher)
    for _, field in parsed.description().bindings(parsed.kind):
        pairs = parsed.given(field.path) if field.carried is Carried.PAIRS else None
        if not pairs or field.keys is None:
            continue
        for key in sorted(pairs):
            at = f"spec.publisher.{parsed.kind}.{field.path}.{shown(key)}"
            if not field.keys.pattern.match(key):
                yield at, f"is not {field.keys.wording}"
            elif key in field.keys.refused:
                yield at, f"may not be set: {field.keys.refused[key]}"
            if not PAIRS_VALUE.match(str(pairs[key])):
                yield at, "its value must be one line of printable ASCII"


def violations(
    spec: Mapping[str, Any], settings: ControllerSettings, dispatcher: str = ""
) -> list[Violation]:
    """Every field of spec.worker outside the policy, as (`spec.worker.<field>`, why), for
    the dispatcher named `dispatcher` (whose own pods a podAntiAffinity may select), and the
    keys of the publisher's map fields that no resource may set (its description's)."""
    worker: Mapping[str, Any] = spec.get("worker") or {}
    found: list[Violation] = []
    for field, check in WORKER_CHECKS.items():
        if field in worker:
            found.extend(
                (f"spec.worker.{at}", why) for at, why in check(worker[field], settings, dispatcher)
            )
    found.extend(_pairs(spec["publisher"]))
    return found


def check_pod_policy(
    spec: Mapping[str, Any], settings: ControllerSettings, dispatcher: str = ""
) -> None:
    """Raise PolicyViolation naming each field outside the cluster admin's policy."""
    found = violations(spec, settings, dispatcher)
    if found:
        listed = "; ".join(f"{field}: {why}" for field, why in found)
        raise Problem(
            POLICY_VIOLATION,
            f"outside the cluster admin's pod policy, so no workers run: {listed}",
            stops_workers=True,
        )
