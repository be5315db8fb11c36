"""The read step: everything a pass needs before it decides, read once, nothing written.

`read` checks the resource's inputs in a fixed order (the publisher the image has, the
cluster admin's pod policy and every Secret's consent, what the spec could not parse, the
DSN, the publisher's options set from Secret keys, the table and its backlog, one table for
one resource) and reads its Deployment and worker pods. What it found is a `Reading`: a
failed input is its `problem`, never an exception, so that the decide step sees every pass
alike.
"""

from __future__ import annotations

from collections.abc import Awaitable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from outbox.controller.consent import admit, secret_uses
from outbox.controller.database import TableReading, Target, parse_dsn
from outbox.controller.decision import Limits, Observed
from outbox.controller.kube import Secret, secret_key
from outbox.controller.problem import Problem
from outbox.controller.reconcile.context import Context, step
from outbox.controller.resource import deployment_name, selector_string
from outbox.controller.spec import DispatcherSpec
from outbox.operator_reads import TableIdentity
from outbox.stats import QueueStats


@dataclass(frozen=True)
class Reading:
    """What one pass read, before anything is decided or written."""

    spec: DispatcherSpec  # the resource as this pass saw it (newer events may arrive)
    now: datetime
    status_before: Mapping[str, Any]
    dsn: str  # "" when the inputs are unusable
    stats: QueueStats | None
    problem: Problem | None
    deployment: Mapping[str, Any] | None  # ours; None when there is none of ours
    pods: list[dict[str, Any]] | None = None  # its pods; None when they could not be read
    # Of the DSN's Secret, and of every Secret the spec names by name: a new one rolls the
    # workers (render.py).
    secret_version: str = ""
    secret_versions: Mapping[str, str] = field(default_factory=dict)

    @property
    def replicas(self) -> int:
        return int(self.deployment["spec"].get("replicas", 0)) if self.deployment else 0

    @property
    def observed(self) -> Observed:
        ready = int(((self.deployment or {}).get("status") or {}).get("readyReplicas") or 0)
        down = self.stats.unreachable if self.stats is not None else ()
        return Observed(self.stats, self.problem, self.replicas, ready, down)

    @property
    def limits(self) -> Limits:
        spec = self.spec
        return Limits.of(spec.scaling, paused=spec.paused, pinned=spec.pinned)


@dataclass(frozen=True)
class _Inputs:
    dsn: str
    table: TableReading
    secret_version: str
    secret_versions: Mapping[str, str]


def _check_publisher(context: Context, spec: DispatcherSpec) -> None:
    available = context.settings.worker_publishers
    if spec.publisher_type not in available:
        raise Problem(
            "PublisherUnavailable",
            f"the worker image has no {spec.publisher_type!r} publisher "
            f"(it has: {', '.join(available)})",
        )


async def _check_secret_options(
    context: Context, spec: DispatcherSpec, secrets: Mapping[str, Secret]
) -> None:
    """Each publisher option the resource sets from a Secret key, its value read by the
    option's own description as the worker reads its variable (`Option.from_secret`, the
    option's converter: a built-in's or an installed plugin's alike). A value a new worker
    would refuse at start (exit 2) is a Problem under the option's reason
    (`InvalidSigningSecret` for the HTTP signing keys), naming the key and the line, never
    the value."""
    namespace = spec.namespace
    for option, ref in spec.publisher.secret_keys():
        where = secret_key(namespace, ref.name, ref.key)
        secret = secrets.get(ref.name) or await context.kube.secret(namespace, ref.name)
        text = secret.value(ref.key, refused_as=option.refused_as)
        try:
            option.from_secret(text)
        except ValueError as exc:
            raise Problem(option.refused_as, f"{where}: {exc}") from None


def secret_names(spec: Mapping[str, Any]) -> set[str]:
    """The Secrets a resource's `spec` names, as far as it parses (the DSN's at least)."""
    try:
        names = {use.name for use in secret_uses(spec)}
    except (Problem, LookupError, TypeError, ValueError):  # a spec that does not parse
        names = set()
    ref = (spec.get("database") or {}).get("dsnSecretRef") or {}
    if isinstance(ref, Mapping) and isinstance(ref.get("name"), str):
        names.add(ref["name"])
    return names


def reread_secrets(context: Context, spec: DispatcherSpec) -> None:
    """The resource's next pass reads every Secret it names from the server, not the cache
    (controller/secret_cache.py): its inputs were unusable, or its spec changed."""
    context.kube.forget_secrets(spec.namespace, secret_names(spec.raw))


async def _inputs(context: Context, spec: DispatcherSpec) -> _Inputs:
    """The DSN, the table's reading and the Secrets' versions, or a Problem saying which of
    the resource's inputs is unusable (its Secrets are read anew by the next pass)."""
    try:
        return await _usable_inputs(context, spec)
    except Problem:
        reread_secrets(context, spec)
        raise


async def _usable_inputs(context: Context, spec: DispatcherSpec) -> _Inputs:
    _check_publisher(context, spec)
    # The cluster admin's pod policy and every Secret's consent, before anything is used.
    kube, namespace = context.kube, spec.namespace
    secrets = await admit(kube, context.settings, namespace, spec.name, spec.raw)
    if spec.problems:  # refused before anything is read or purged
        raise spec.problems[0]
    assert spec.table is not None  # it parsed: no problem
    ref = spec.dsn_secret
    dsn_secret = secrets[ref.name]
    text, version = dsn_secret.value(ref.key, refused_as="InvalidDsn"), dsn_secret.version
    uses = (use.name for use in secret_uses(spec.raw))
    versions = await kube.secret_versions(namespace, uses, secrets)
    dsn = parse_dsn(text, secret_key(namespace, ref.name, ref.key))
    await _check_secret_options(context, spec, secrets)
    target = Target(dsn, version)
    table = await context.database.read(
        (namespace, spec.name), target, spec.table, ordered=spec.ordered
    )
    return _Inputs(dsn, table, version, versions)


def _listing(context: Context) -> Awaitable[set[tuple[str, str]]]:
    """The resources this replica serves (`Tables.start`)."""
    return context.kube.served(context.settings.namespaces)


def _table_conflict(
    context: Context, spec: DispatcherSpec, identity: TableIdentity
) -> Problem | None:
    """One table, one resource (`Tables`): workers of two resources on one table would
    finalize each other's rows, and each would size for the other's backlog."""
    first = context.tables.first(spec.namespace, spec.name, spec.created, identity)
    if first is None:
        return None
    return Problem(
        "TableConflict",
        f"{identity.text} is already served by OutboxDispatcher {first[0]}/{first[1]} "
        "(the older resource): this one runs no workers until it serves another table "
        "or that one is deleted",
        stops_workers=True,
    )


def _all_ready(deployment: Mapping[str, Any]) -> bool:
    """Every pod of the Deployment is ready (none at all included): no pod has a state to
    report (status.workers_condition skips ready containers), so its pods are not listed."""
    status = deployment.get("status") or {}
    pods = int(status.get("replicas") or 0)
    return pods == int(status.get("readyReplicas") or 0) == int(status.get("updatedReplicas") or 0)


def _owned_by(deployment: Mapping[str, Any], uid: object) -> bool:
    owners = deployment["metadata"].get("ownerReferences") or ()
    return any(owner.get("uid") == uid and owner.get("controller") for owner in owners)


async def read(context: Context, spec: DispatcherSpec, status_before: Mapping[str, Any]) -> Reading:
    """One pass's read (see the module); `status_before` is the status as last written."""
    now = datetime.now(UTC)
    problem: Problem | None = None
    inputs: _Inputs | None = None
    tables, namespace = context.tables, spec.namespace
    try:
        await tables.start(lambda: _listing(context))
        inputs = await _inputs(context, spec)
        identity = inputs.table.identity
        _table_conflict(context, spec, identity)  # its table recorded before the others are awaited
        tables.read(namespace, spec.name)
        # No workers until the others' tables are known (an older one may read later).
        await tables.settled(namespace, spec.name, lambda: _listing(context))
        problem = _table_conflict(context, spec, identity)
    except Problem as exc:
        problem = exc
    finally:
        tables.read(namespace, spec.name)  # read, or failed to: none waits for it
    name = deployment_name(spec.name)
    with step(f"reading Deployment {namespace}/{name}"):
        deployment = await context.kube.deployment(namespace, name)
    if deployment is not None and not _owned_by(deployment, spec.uid):
        # Someone else's Deployment (or a deleted namesake's, about to be collected):
        # never taken over, never resized.
        problem = Problem(
            "DeploymentNotOwned",
            f"Deployment {namespace}/{name} exists and does not belong to this "
            "resource; delete or rename it",
        )
        deployment = None
    pods: list[dict[str, Any]] | None = []
    if deployment is not None and not _all_ready(deployment):
        with step(f"listing the worker pods of {namespace}/{name}"):
            pods = await context.kube.pods(namespace, selector_string(spec.name))
    return Reading(
        spec=spec,
        now=now,
        status_before=status_before,
        dsn=inputs.dsn if inputs is not None else "",
        stats=inputs.table.stats if inputs is not None else None,
        problem=problem,
        deployment=deployment,
        pods=pods,
        secret_version=inputs.secret_version if inputs is not None else "",
        secret_versions=inputs.secret_versions if inputs is not None else {},
    )
