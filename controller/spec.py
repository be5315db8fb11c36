"""An OutboxDispatcher as the operator reads it: parsed once per body into a frozen, typed
`DispatcherSpec`, with the CRD's defaults, in the manner of CloudNativePG's `api/v1` types.

Everything a pass decides on is read here once: the table, the retention, the poll interval
and the bounds (`ScalingSettings`), paused and pinned, the Secret keys the database and the
publisher's options come from, and the status stored with the body (the report step builds
the new status from this spec alone). A value the schema admits but the operator cannot use
(a table name that does not parse, a retention of zero from an older CRD) is not raised
here: it is kept as a `Problem` in `problems`, which the read step reports at the point of
the pass where it always has (after the pod policy and the Secrets' consent), so that what
a resource reads in status does not depend on how the spec was parsed.

The renderers (`render.py`, `network.py`, `budget.py`) read this spec alone; the pod
policy (`policy.py`) and the Secrets' consent (`consent.py`) check the resource's spec as
written (`raw`), field by field, as the API server stores it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from datetime import timedelta
from typing import Any

from outbox.controller.problem import Problem
from outbox.plumbing.durations import parse_duration
from outbox.plumbing.errors import SettingError
from outbox.publisher_options import (
    INVALID_PUBLISHER_OPTIONS,
    PLUGIN,
    Carried,
    Description,
    Option,
    installed,
)
from outbox.table import Table

# The range of each field of `spec.scaling`: the CRD's minimum and maximum (a test compares),
# so that the policy run outside a cluster (the autoscaling bench) takes what the API takes.
SCALING_RANGES: dict[str, tuple[float, float]] = {
    "min_replicas": (0, 1000),
    "max_replicas": (1, 1000),
    "target_oldest_ready_age_seconds": (0.1, 86400),
    "poll_interval_seconds": (1, 3600),
    "scale_down_stabilization_seconds": (0, 86400),
}


def camel(name: str) -> str:
    """A field's name as the CRD spells it: `min_replicas` -> `minReplicas`."""
    head, *rest = name.split("_")
    return head + "".join(part.title() for part in rest)


@dataclass(frozen=True)
class ScalingSettings:
    """`spec.scaling` of an `OutboxDispatcher`; the field defaults are the CRD's defaults (the
    API server fills them in; a test compares)."""

    min_replicas: int = 0
    """Never fewer workers than this (0 lets an idle table scale to zero)."""

    max_replicas: int = 10
    """Never more workers than this."""

    target_oldest_ready_age_seconds: float = 30.0
    """The age the oldest claimable message should stay under (the delivery SLO)."""

    poll_interval_seconds: float = 5.0
    """How often the operator reads the stats and asks the policy (it reads no clock)."""

    scale_down_stabilization_seconds: float = 300.0
    """How long a lower arrival rate must last before workers are removed, and how long the
    queue must stay idle before scaling to zero."""

    @classmethod
    def from_spec(cls, scaling: Mapping[str, Any] | None) -> ScalingSettings:
        """Read the CRD's camelCase keys; missing keys take the defaults above."""
        known = {camel(f.name): f.name for f in fields(cls)}
        given = dict(scaling or {})
        unknown = sorted(set(given) - set(known))
        if unknown:
            raise ValueError(f"scaling: unknown key {unknown[0]!r}")
        values = {known[key]: value for key, value in given.items()}
        settings = cls(**values)
        settings._check()
        return settings

    def to_spec(self) -> dict[str, float]:
        """The settings as `spec.scaling` (camelCase keys)."""
        return {camel(f.name): getattr(self, f.name) for f in fields(self)}

    def _check(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            low, high = SCALING_RANGES[f.name]
            number = not isinstance(value, bool) and isinstance(value, int | float)
            if not number or not low <= value <= high:
                raise ValueError(
                    f"scaling.{camel(f.name)} must be a number from {low:g} to {high:g}, "
                    f"not {value!r}"
                )
        if self.min_replicas > self.max_replicas:
            raise ValueError("scaling.minReplicas must not exceed scaling.maxReplicas")


def parse_table(text: str) -> Table:
    try:
        return Table.parse(text)
    except SettingError as exc:
        raise Problem("InvalidTable", str(exc)) from None


def parse_retention(text: str | None) -> timedelta | None:
    """spec.retention, None when absent (done rows are kept). Zero or less is refused as the
    CRD refuses it (a CRD from an older release admitted `0s`): it would delete every done
    row as soon as it is done, the recent history people read in an incident."""
    if text is None:
        return None
    try:
        retention = parse_duration(text)
    except ValueError as exc:
        raise Problem("InvalidRetention", f"spec.retention {text!r}: {exc}") from None
    if retention <= timedelta(0):
        raise Problem(
            "InvalidRetention",
            f"spec.retention {text!r} must be more than zero: it would purge every done row "
            "at once; set a period (7d, 12h) or remove it to keep them",
        )
    return retention


PUBLISHER_UNAVAILABLE = "PublisherUnavailable"


def publisher_name(publisher: Mapping[str, Any]) -> str:
    """The worker's publisher a resource's `spec.publisher` names: its type, or the plugin's
    name for `type: plugin`."""
    kind = str(publisher["type"])
    return str((publisher.get(PLUGIN) or {}).get("name", "")) if kind == PLUGIN else kind


def described(publisher: Mapping[str, Any]) -> tuple[Description, str, Mapping[str, Any]]:
    """The description of the publisher `spec.publisher` names (its class, as installed
    beside the operator: the workers' image is the operator's), the name of its block in the
    resource (its type), and that block; PublisherUnavailable when it cannot be loaded."""
    parsed = PublisherSpec.parse(publisher)
    return parsed.description(), parsed.kind, parsed.block


def plugin_block_errors(description: Description, block: Mapping[str, Any]) -> list[str]:
    """What of `spec.publisher.plugin` the plugin's description refuses, a line each: an
    option it does not have, a secret given as a plain value (anyone who may read the
    resource would read it: a secret comes from a Secret), an option given twice, a required
    one missing."""
    where = f"spec.publisher.{PLUGIN}"
    options: Mapping[str, Any] = block.get("options") or {}
    refs: Mapping[str, Any] = block.get("secretRefs") or {}
    errors = []
    for part, given in (("options", options), ("secretRefs", refs)):
        for key in sorted(given):
            option = description.option(key)
            if option is None:
                errors.append(f"{where}.{part}.{key}: {description.name} has no option --{key}")
            elif part == "options" and option.secret:
                errors.append(
                    f"{where}.options.{key}: --{key} is a secret: give it in secretRefs "
                    "(a Secret key), never in the resource"
                )
            elif part == "options" and key in refs:
                errors.append(f"{where}: give options.{key} or secretRefs.{key}, not both")
    for option in description.options:
        if option.required and option.key not in options and option.key not in refs:
            errors.append(f"{where}: {description.name} requires --{option.key}")
    return errors


def check_publisher(publisher: Mapping[str, Any]) -> None:
    """A Problem unless the installed publisher takes the resource's publisher block: for a
    plugin, its generic block read against its description (the CRD checks the built-ins'
    blocks, whose fields it knows)."""
    description, kind, block = described(publisher)
    if kind != PLUGIN:
        return
    errors = plugin_block_errors(description, block)
    if errors:
        raise Problem(INVALID_PUBLISHER_OPTIONS, "; ".join(errors))


@dataclass(frozen=True)
class PublisherSpec:
    """`spec.publisher`, read once: the worker's publisher and what the renderers set of it.
    None is an absent field: the worker's default (or the admin's, `with_defaults`)."""

    name: str  # the worker's publisher: the type, or a plugin's name
    kind: str  # spec.publisher.type, the block that sets its options
    block: Mapping[str, Any]  # that block as written; its fields are the description's
    format: str | None = None
    cloudevents_source: str | None = None
    rate_limit: str | None = None
    breaker: Mapping[str, Any] = field(default_factory=dict)  # failures, window, probeDelayMax

    @property
    def timeout(self) -> str | None:
        """The block's publish timeout (null and log have none)."""
        timeout = self.block.get("timeout")
        return None if timeout is None else str(timeout)

    @classmethod
    def parse(cls, publisher: Mapping[str, Any]) -> PublisherSpec:
        kind = str(publisher["type"])
        optional = {key: publisher.get(key) for key in ("format", "cloudEventsSource", "rateLimit")}
        shown = {key: None if value is None else str(value) for key, value in optional.items()}
        return cls(
            name=publisher_name(publisher),
            kind=kind,
            block=publisher.get(kind) or {},
            format=shown["format"],
            cloudevents_source=shown["cloudEventsSource"],
            rate_limit=shown["rateLimit"],
            breaker=publisher.get("breaker") or {},
        )

    def given(self, path: str) -> Any:
        """The value of the block's field at a dotted path (`secretRefs.sqs-token`), None
        when absent."""
        node: Any = self.block
        for part in path.split("."):
            if not isinstance(node, Mapping) or part not in node:
                return None
            node = node[part]
        return node

    def secret_keys(self) -> list[tuple[Option, SecretKeyRef]]:
        """Each option the block sets from a Secret key (its value the worker's variable),
        with that key, in the description's order; PublisherUnavailable as `description`."""
        bindings = self.description().bindings(self.kind)
        found = ((option, f, self.given(f.path)) for option, f in bindings)
        return [
            (option, SecretKeyRef(str(ref["name"]), str(ref["key"])))
            for option, f, ref in found
            if f.carried is Carried.SECRET_KEY and ref is not None
        ]

    def description(self) -> Description:
        """The installed publisher's description; PublisherUnavailable when it cannot be
        loaded."""
        try:
            return installed(self.name)
        except SettingError as exc:
            raise Problem(PUBLISHER_UNAVAILABLE, str(exc)) from None

    def with_defaults(self, defaults: Mapping[str, Any]) -> PublisherSpec:
        """With the admin's --publisher-defaults (the wire format and the CloudEvents source)
        for the fields the resource omits; the resource's own value wins."""
        return replace(
            self,
            format=self.format or defaults.get("format"),
            cloudevents_source=self.cloudevents_source or defaults.get("cloudEventsSource"),
        )


@dataclass(frozen=True)
class SecretKeyRef:
    """A key of a Secret of the resource's namespace."""

    name: str
    key: str


@dataclass(frozen=True)
class DispatcherSpec:
    """One body of an OutboxDispatcher, parsed (see the module)."""

    body: Mapping[str, Any]  # the resource as written, for the renderers and the pod policy
    namespace: str
    name: str
    uid: str | None
    generation: int
    created: str  # metadata.creationTimestamp: the older resource keeps a shared table
    deleting: bool  # metadata.deletionTimestamp is set
    publisher_type: str  # the worker's publisher: the type, or a plugin's name
    dsn_secret: SecretKeyRef
    table: Table | None  # None: it does not parse (in `problems`)
    table_name: str  # spec.database.table as written
    publisher: PublisherSpec
    ordered: bool  # spec.ordering aggregate
    retention: timedelta | None  # None: absent, or unusable (in `problems`)
    paused: bool
    pinned: int | None  # spec.replicas
    scaling: ScalingSettings
    # The worker's settings the spec gives (None: absent, the worker's default; the API
    # server fills in the CRD's defaults) and spec.worker, the pod's fields as written.
    lease: str | None = None
    batch_size: int | None = None
    concurrency: int | None = None
    max_attempts: int | None = None
    ordering: str | None = None
    worker: Mapping[str, Any] = field(default_factory=dict)
    status: Mapping[str, Any] = field(default_factory=dict)  # as stored with this body
    problems: tuple[Problem, ...] = ()  # what the schema admits and the operator cannot use

    @property
    def poll_interval(self) -> float:
        return float(self.scaling.poll_interval_seconds)

    @property
    def reference(self) -> Mapping[str, Any]:
        """The resource as an Event names it (`involvedObject`): its name, namespace, uid."""
        return {"metadata": {"name": self.name, "namespace": self.namespace, "uid": self.uid}}

    @property
    def raw(self) -> Mapping[str, Any]:
        """`spec` as written (the pod policy and the renderers read it whole)."""
        spec: Mapping[str, Any] = self.body["spec"]
        return spec

    @classmethod
    def parse(cls, body: Mapping[str, Any]) -> DispatcherSpec:
        """The body's spec with its defaults; ValueError only for a `spec.scaling` that the
        CRD refuses (its ranges), which no stored resource holds."""
        meta, spec = body["metadata"], body["spec"]
        database = spec["database"]
        ref = database["dsnSecretRef"]
        problems: list[Problem] = []
        table = retention = None
        table_name = str(database.get("table", "outbox"))
        try:
            table = parse_table(table_name)
        except Problem as exc:
            problems.append(exc)
        try:
            retention = parse_retention(spec.get("retention"))
        except Problem as exc:
            problems.append(exc)
        try:
            check_publisher(spec["publisher"])
        except Problem as exc:
            problems.append(exc)
        pinned = spec.get("replicas")
        uid = meta.get("uid")
        return cls(
            body=body,
            namespace=str(meta["namespace"]),
            name=str(meta["name"]),
            uid=None if uid is None else str(uid),
            generation=int(meta.get("generation") or 0),
            created=str(meta.get("creationTimestamp") or ""),
            deleting=bool(meta.get("deletionTimestamp")),
            publisher_type=publisher_name(spec["publisher"]),
            dsn_secret=SecretKeyRef(str(ref["name"]), str(ref.get("key", "dsn"))),
            table=table,
            table_name=table_name,
            publisher=PublisherSpec.parse(spec["publisher"]),
            ordered=spec.get("ordering") == "aggregate",
            retention=retention,
            paused=bool(spec.get("paused")),
            pinned=None if pinned is None else int(pinned),
            scaling=ScalingSettings.from_spec(spec.get("scaling")),
            lease=_text(spec.get("lease")),
            batch_size=_number(spec.get("batchSize")),
            concurrency=_number(spec.get("concurrency")),
            max_attempts=_number(spec.get("maxAttempts")),
            ordering=_text(spec.get("ordering")),
            worker=spec.get("worker") or {},
            status=body.get("status") or {},
            problems=tuple(problems),
        )


def _text(value: Any) -> str | None:
    return None if value is None else str(value)


def _number(value: Any) -> int | None:
    return None if value is None else int(value)
