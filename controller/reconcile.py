"""One resource's loop: check what it needs, keep its Deployment in line, size it, report.

A `Dispatcher` runs for each OutboxDispatcher resource while this replica leads (it is the
resource's reconcile loop; the workers dispatch the messages). Every `pollIntervalSeconds`
(and at once when the spec changes) it reconciles from scratch, in four steps:

1. read: the Secret, the table's check and backlog, the Deployment if it is ours (`Reading`);
2. decide: the worker count and why (`decision.decide`, pure);
3. apply: create, replace or resize the Deployment; purge done rows (`Applied`);
4. report: metrics, Events, the status (its content from `status`, pure).

Nothing is remembered that the cluster does not hold, except the scaling policy's window and
the last backlog reading (for rates), so a restarted operator converges on its first pass.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from kubernetes.aio.client.exceptions import ApiException

from outbox.controller import status as st
from outbox.controller.budget import keep_disruption_budget
from outbox.controller.database import (
    TableIdentity,
    parse_dsn,
    parse_retention,
    parse_signing_secret,
    parse_table,
    purge,
    read_table,
)
from outbox.controller.decision import Decision, Limits, Observed, SizingPolicy, decide
from outbox.controller.drift import template_drift
from outbox.controller.kube import UNREACHABLE, Kube, api_reason, secret_key
from outbox.controller.leader import LeadershipLost
from outbox.controller.metrics import Metrics
from outbox.controller.network import differs as network_differs
from outbox.controller.network import render_network_policy
from outbox.controller.policy import admit, secret_uses
from outbox.controller.problem import Problem
from outbox.controller.render import TEMPLATE_HASH, render_deployment
from outbox.controller.resource import deployment_name, selector_string
from outbox.controller.scaling import ScalingPolicy
from outbox.controller.settings import ControllerSettings
from outbox.controller.tables import Tables
from outbox.durations import format_duration, parse_duration
from outbox.stats import QueueStats

log = logging.getLogger("outbox.controller")

# Purge at most this often, however long the retention (each purge is a few index scans).
MAX_PURGE_INTERVAL = timedelta(minutes=10)
API_RETRY_SECONDS = 5.0
API_ERROR = "ApiError"  # Ready's reason while the API server refuses what a pass does
DRIFT_CORRECTED = "DriftCorrected"  # the Event when a hand-changed template is put back


@dataclass
class Context:
    """What every Dispatcher shares: the settings, the writer, the metrics and which
    resource serves which table."""

    settings: ControllerSettings
    kube: Kube
    metrics: Metrics
    tables: Tables = field(default_factory=Tables)


@dataclass(frozen=True)
class Reading:
    """What one pass read, before anything is decided or written."""

    body: Mapping[str, Any]  # the resource as this pass saw it (newer events may arrive)
    now: datetime
    status_before: Mapping[str, Any]
    dsn: str  # "" when the inputs are unusable
    stats: QueueStats | None
    problem: Problem | None
    deployment: Mapping[str, Any] | None  # ours; None when there is none of ours
    pods: list[dict[str, Any]] | None = None  # its pods; None when they could not be read

    @property
    def spec(self) -> Mapping[str, Any]:
        spec: Mapping[str, Any] = self.body["spec"]
        return spec

    @property
    def generation(self) -> int:
        return int(self.body["metadata"].get("generation") or 0)

    @property
    def replicas(self) -> int:
        return int(self.deployment["spec"].get("replicas", 0)) if self.deployment else 0

    @property
    def observed(self) -> Observed:
        ready = int(((self.deployment or {}).get("status") or {}).get("readyReplicas") or 0)
        down = self.stats.unreachable if self.stats is not None else ()
        return Observed(self.stats, self.problem, self.replicas, ready, down)


@dataclass(frozen=True)
class Applied:
    """What one pass changed."""

    deployment: Mapping[str, Any] | None  # as it stands after the pass
    scaled: bool  # the Deployment's replica count was changed
    purged: int | None  # done rows deleted; None when no purge ran (or it failed)
    drift: tuple[str, ...] = ()  # what was put back of a template changed by someone else


@dataclass
class Dispatcher:
    """The reconcile loop of one OutboxDispatcher resource (see the module)."""

    context: Context
    body: Mapping[str, Any]
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    # Builds the resource's policy from spec.scaling (another policy can be measured in its place).
    new_policy: Callable[[Mapping[str, Any]], SizingPolicy] = ScalingPolicy
    _policy: SizingPolicy | None = None
    _policy_spec: Mapping[str, Any] | None = None
    _previous: QueueStats | None = None
    _last_purge: datetime | None = None
    _reconciled_generation: int | None = None
    _last_status: Mapping[str, Any] | None = None
    _secret_version: str = ""  # of the DSN's Secret: a new one rolls the workers
    # Every Secret's the spec names, by name: one changing rolls the workers (render.py).
    _secret_versions: Mapping[str, str] = field(default_factory=dict)
    _server_made: frozenset[str] = frozenset()  # template changes the server makes itself
    _pods_forbidden: bool = False  # said once: RBAC does not let the operator list pods
    _step: str = "reconciling"  # what the pass is doing, for the message of an API error

    @property
    def namespace(self) -> str:
        return str(self.body["metadata"]["namespace"])

    @property
    def name(self) -> str:
        return str(self.body["metadata"]["name"])

    def update(self, body: Mapping[str, Any]) -> None:
        """A watch event: keep the newest body; a new generation is reconciled at once."""
        self.body = body
        if body["metadata"].get("generation") != self._reconciled_generation:
            self.wake.set()

    async def run(self) -> None:
        """Reconcile until cancelled; only a lost leadership ends it otherwise."""
        while True:
            self.wake.clear()
            interval = float(self.body["spec"]["scaling"]["pollIntervalSeconds"])
            try:
                await self.reconcile()
            except LeadershipLost:
                raise
            except ApiException as exc:
                message = f"{self._step}: {api_reason(exc)}"
                log.warning("%s/%s: API error: %s; retrying", self.namespace, self.name, message)
                self.context.metrics.reconcile_errors.labels(
                    self.namespace, self.name, API_ERROR
                ).inc()
                if exc.status != 409:  # a conflict is a stale read: the next pass reads anew
                    await self._report_api_error(message)
                interval = min(interval, API_RETRY_SECONDS)
            except UNREACHABLE as exc:
                reason = str(exc) or type(exc).__name__
                log.warning("%s/%s: cannot reach the API: %s", self.namespace, self.name, reason)
                interval = min(interval, API_RETRY_SECONDS)
            except Exception:
                # A bug: say so with its traceback, keep serving the other resources.
                log.exception("%s/%s: reconcile failed", self.namespace, self.name)
                self.context.metrics.reconcile_errors.labels(
                    self.namespace, self.name, "InternalError"
                ).inc()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.wake.wait(), timeout=interval)

    # -- one pass: read, decide, apply, report --------------------------------------------------

    async def reconcile(self) -> None:
        if self.body["metadata"].get("deletionTimestamp"):
            # Being deleted (e.g. foreground: it waits for its Deployment to go); recreating
            # the Deployment now would hold the deletion up for ever.
            self.context.tables.read(self.namespace, self.name)  # none waits for it
            return
        reading = await self._read()
        spec = reading.spec
        decision = decide(
            reading.observed, Limits.from_spec(spec), lambda: self._policy_for(spec["scaling"])
        )
        applied = await self._apply(reading, decision)
        await self._report(reading, decision, applied)

    # -- read -----------------------------------------------------------------------------------

    def _check_publisher(self, spec: Mapping[str, Any]) -> None:
        kind = spec["publisher"]["type"]
        available = self.context.settings.worker_publishers
        if kind not in available:
            raise Problem(
                "PublisherUnavailable",
                f"the worker image has no {kind!r} publisher (it has: {', '.join(available)})",
            )

    async def _backlog(self, spec: Mapping[str, Any]) -> tuple[str, QueueStats, TableIdentity]:
        """(dsn, backlog, which table it is), or a Problem saying which of the resource's
        inputs is unusable."""
        self._check_publisher(spec)
        # The cluster admin's pod policy and every Secret's consent, before anything is used.
        context = self.context
        secrets = await admit(context.kube, context.settings, self.namespace, self.name, spec)
        database = spec["database"]
        table = parse_table(database.get("table", "outbox"))
        parse_retention(spec.get("retention"))  # refused before anything is purged
        ref = database["dsnSecretRef"]
        name, key = ref["name"], ref.get("key", "dsn")
        text, self._secret_version = secrets[name].value(key), secrets[name].version
        uses = (use.name for use in secret_uses(spec))
        self._secret_versions = await context.kube.secret_versions(self.namespace, uses, secrets)
        dsn = parse_dsn(text, secret_key(self.namespace, name, key))
        signing = (spec["publisher"].get("http") or {}).get("signingSecretRef")
        if signing is not None:  # checked as the worker does: a new worker would exit 2
            where = secret_key(self.namespace, signing["name"], signing["key"])
            secret = secrets.get(signing["name"]) or await context.kube.secret(
                self.namespace, signing["name"]
            )
            try:
                signing_text = secret.value(signing["key"])
            except Problem as exc:  # not UTF-8: the Secret's value's problem, named so
                if exc.reason != "InvalidDsn":
                    raise
                raise Problem("InvalidSigningSecret", f"{where} is not UTF-8 text") from None
            parse_signing_secret(signing_text, where)
        ordered = spec.get("ordering") == "aggregate"
        stats, identity = await read_table(dsn, table, ordered=ordered)
        return dsn, stats, identity

    def _listing(self) -> Awaitable[set[tuple[str, str]]]:
        """The resources this replica serves (`Tables.start`)."""
        return self.context.kube.served(self.context.settings.namespaces)

    def _table_conflict(self, identity: TableIdentity) -> Problem | None:
        """One table, one resource (`Tables`): workers of two resources on one table would
        finalize each other's rows, and each would size for the other's backlog."""
        meta = self.body["metadata"]
        created = str(meta.get("creationTimestamp") or "")
        first = self.context.tables.first(self.namespace, self.name, created, identity)
        if first is None:
            return None
        return Problem(
            "TableConflict",
            f"{identity.text} is already served by OutboxDispatcher {first[0]}/{first[1]} "
            "(the older resource): this one runs no workers until it serves another table "
            "or that one is deleted",
            stops_workers=True,
        )

    async def _read(self) -> Reading:
        body = self.body
        # What this replica wrote last is newer than a body whose watch event is still on its way.
        status_before: Mapping[str, Any] = self._last_status or body.get("status") or {}
        now = datetime.now(UTC)
        problem: Problem | None = None
        stats: QueueStats | None = None
        dsn = ""
        tables = self.context.tables
        try:
            await tables.start(self._listing)
            dsn, stats, identity = await self._backlog(body["spec"])
            self._table_conflict(identity)  # its table recorded before the others are awaited
            tables.read(self.namespace, self.name)
            # No workers until the others' tables are known (an older one may read later).
            await tables.settled(self.namespace, self.name, self._listing)
            problem = self._table_conflict(identity)
        except Problem as exc:
            problem = exc
        finally:
            tables.read(self.namespace, self.name)  # read, or failed to: none waits for it
        name = deployment_name(self.name)
        self._step = f"reading Deployment {self.namespace}/{name}"
        deployment = await self.context.kube.deployment(self.namespace, name)
        if deployment is not None and not _owned_by(deployment, body["metadata"].get("uid")):
            # Someone else's Deployment (or a deleted namesake's, about to be collected):
            # never taken over, never resized.
            problem = Problem(
                "DeploymentNotOwned",
                f"Deployment {self.namespace}/{name} exists and does not belong to this "
                "resource; delete or rename it",
            )
            deployment = None
        pods = None
        if deployment is not None:
            self._step = f"listing the worker pods of {self.namespace}/{name}"
            pods = await self.context.kube.pods(self.namespace, selector_string(self.name))
            if pods is None and not self._pods_forbidden:
                self._pods_forbidden = True
                log.warning(
                    "%s/%s: forbidden to list pods: the workers' states (crash loops, image "
                    "pull errors) are not reported; grant list on pods (docs/operator.md)",
                    self.namespace,
                    self.name,
                )
        return Reading(body, now, status_before, dsn, stats, problem, deployment, pods)

    # -- decide ---------------------------------------------------------------------------------

    def _policy_for(self, scaling: Mapping[str, Any]) -> SizingPolicy:
        # One policy per resource, kept between passes (it holds the stabilization window and
        # what it learned), given the new settings when spec.scaling changes.
        if self._policy is None:
            self._policy = self.new_policy(dict(scaling))
        elif self._policy_spec != scaling:
            self._policy.reconfigure(dict(scaling))
        self._policy_spec = dict(scaling)
        return self._policy

    # -- apply ----------------------------------------------------------------------------------

    async def _apply(self, reading: Reading, decision: Decision) -> Applied:
        deployment = reading.deployment
        drift: tuple[str, ...] = ()
        if reading.problem is None:
            deployment, drift = await self._apply_deployment(
                reading.body, deployment, decision.replicas
            )
            if self.context.settings.worker_network_policy:
                await self._apply_network_policy(reading.body)
            self._step = f"writing PodDisruptionBudget {self.namespace}/{self.name}-worker"
            await keep_disruption_budget(
                self.context.kube, reading.body, decision.replicas, reading.pods
            )
        elif deployment is not None and decision.replicas != reading.replicas:
            # Paused or pinned while the inputs are broken: resize, keep the last good template.
            name = deployment_name(self.name)
            self._step = f"resizing Deployment {self.namespace}/{name}"
            await self.context.kube.scale_deployment(self.namespace, name, decision.replicas)
        purged = None
        if reading.problem is None and reading.spec.get("retention"):
            purged = await self._retention(reading)
        scaled = deployment is not None and decision.replicas != reading.replicas
        return Applied(deployment, scaled, purged, drift)

    async def _apply_deployment(
        self, body: Mapping[str, Any], deployment: Mapping[str, Any] | None, replicas: int
    ) -> tuple[dict[str, Any], tuple[str, ...]]:
        """Create the Deployment, or replace it if its template changed (our spec's or by
        someone else's hand: the drift, which it also returns), or just resize it."""
        kube = self.context.kube
        rendered = render_deployment(
            body,
            replicas=replicas,
            default_image=self.context.settings.worker_image,
            secret_version=self._secret_version,
            secret_versions=self._secret_versions,
            defaults=self.context.settings.worker_defaults,
            publisher_defaults=self.context.settings.publisher_defaults,
        )
        name = f"{self.namespace}/{rendered['metadata']['name']}"
        if deployment is None:
            log.info("%s/%s: creating Deployment %s", self.namespace, self.name, name)
            self._step = f"creating Deployment {name}"
            return self._stored(rendered, await kube.create_deployment(rendered)), ()
        annotations = deployment["metadata"].get("annotations") or {}
        version = deployment["metadata"]["resourceVersion"]
        if annotations.get(TEMPLATE_HASH) != rendered["metadata"]["annotations"][TEMPLATE_HASH]:
            log.info(
                "%s/%s: the worker template changed: rolling the workers", self.namespace, self.name
            )
            self._step = f"replacing Deployment {name}"
            return self._stored(rendered, await kube.replace_deployment(rendered, version)), ()
        drift = tuple(
            change
            for change in template_drift(
                rendered["spec"]["template"], deployment["spec"]["template"]
            )
            if change not in self._server_made
        )
        if drift:
            # Same hash, another template: changed by hand (`kubectl set image`, `kubectl
            # edit`). Put back as rendered; the replica count is the policy's as always.
            self._step = f"restoring Deployment {name}"
            stored = await kube.replace_deployment(rendered, version)
            return self._stored(rendered, stored), drift
        if int(deployment["spec"].get("replicas", 0)) != replicas:
            self._step = f"resizing Deployment {name}"
            await kube.scale_deployment(self.namespace, rendered["metadata"]["name"], replicas)
            return {**deployment, "spec": {**deployment["spec"], "replicas": replicas}}, ()
        return dict(deployment), ()

    def _stored(self, rendered: Mapping[str, Any], stored: dict[str, Any]) -> dict[str, Any]:
        """Remember what the server itself changed of the template we wrote (a value it
        normalizes some way `template_drift` does not know): never drift, never put back in
        a loop."""
        made = template_drift(rendered["spec"]["template"], stored["spec"]["template"])
        if made:
            log.info(
                "%s/%s: the API server stored the template otherwise: %s",
                self.namespace, self.name, "; ".join(made),
            )  # fmt: skip
        self._server_made = frozenset(made)
        return stored

    async def _apply_network_policy(self, body: Mapping[str, Any]) -> None:
        """The worker pods' NetworkPolicy (outbox.controller.network), kept as rendered."""
        kube = self.context.kube
        rendered = render_network_policy(body, self.context.settings.worker_metrics_from)
        current = await kube.network_policy(self.namespace, rendered["metadata"]["name"])
        if current is None or network_differs(current, rendered):
            log.info(
                "%s/%s: %s NetworkPolicy %s", self.namespace, self.name,
                "creating" if current is None else "restoring", rendered["metadata"]["name"],
            )  # fmt: skip
            self._step = f"writing NetworkPolicy {self.namespace}/{rendered['metadata']['name']}"
            await kube.apply_network_policy(rendered, current)

    async def _retention(self, reading: Reading) -> int | None:
        """Purge done rows past spec.retention when a purge is due; how many went."""
        spec = reading.spec
        retention = parse_duration(spec["retention"])
        poll = timedelta(seconds=float(spec["scaling"]["pollIntervalSeconds"]))
        every = max(poll, min(retention, MAX_PURGE_INTERVAL))
        if self._last_purge is not None and reading.now - self._last_purge < every:
            return None
        table = parse_table(spec["database"].get("table", "outbox"))
        try:
            purged = await purge(reading.dsn, table, retention)
        except Problem as exc:
            log.warning("%s/%s: purge failed: %s", self.namespace, self.name, exc.message)
            return None
        self._last_purge = reading.now
        return purged

    # -- report ---------------------------------------------------------------------------------

    async def _report(self, reading: Reading, decision: Decision, applied: Applied) -> None:
        """Metrics, Events and the status: what this pass saw, decided and did."""
        status = self._status(reading, decision, applied)
        self._measure(reading, decision, applied)
        for event in self._events(reading, decision, applied, status):
            await self._post(event)
        self._step = "writing the status"
        await self.context.kube.patch_status(self.namespace, self.name, status)
        self._last_status = {**reading.status_before, **status}
        self._reconciled_generation = reading.generation
        if reading.stats is not None:
            self._previous = reading.stats

    def _status(self, reading: Reading, decision: Decision, applied: Applied) -> dict[str, Any]:
        before = reading.status_before
        status = st.resource_status(
            name=self.name,
            generation=reading.generation,
            now=reading.now,
            before=before,
            found=st.conditions(
                reading.spec,
                decision,
                applied.deployment,
                reading.stats,
                reading.problem,
                reading.pods,
            ),
            decision=decision,
            deployment=applied.deployment,
            stats=reading.stats,
            previous=self._previous,
        )
        if applied.purged is not None:
            status["lastPurgeTime"] = st.timestamp(reading.now)
            status["purgedTotal"] = int(before.get("purgedTotal") or 0) + applied.purged
        if applied.scaled:
            status["lastScaleTime"] = st.timestamp(reading.now)
        return status

    def _events(
        self, reading: Reading, decision: Decision, applied: Applied, status: Mapping[str, Any]
    ) -> list[st.Event]:
        events = []
        scaled = st.scale_event(reading.replicas, decision) if applied.scaled else None
        if scaled is not None:
            events.append(scaled)
        if applied.drift:
            message = "put back as rendered: " + "; ".join(applied.drift)
            events.append(st.Event("Warning", DRIFT_CORRECTED, message))
        if applied.purged:
            older = format_duration(parse_duration(reading.spec["retention"]))
            message = f"deleted {applied.purged} done messages older than {older}"
            events.append(st.Event("Normal", "Purged", message))
        before = reading.status_before.get("conditions")
        return [*events, *st.change_events(before, status["conditions"])]

    async def _post(self, event: st.Event) -> None:
        level = logging.WARNING if event.type == "Warning" else logging.INFO
        log.log(level, "%s/%s: %s: %s", self.namespace, self.name, event.reason, event.message)
        self._step = f"posting a {event.reason} Event"
        await self.context.kube.event(self.body, event.type, event.reason, event.message)

    async def _report_api_error(self, message: str) -> None:
        """An API error in status (Ready=False, `ApiError`, the server's own words) and, when
        Ready changes to it, a Warning Event; best effort, as the API may refuse these too."""
        before = (self._last_status or self.body.get("status") or {}).get("conditions")
        conditions = st.merge_conditions(
            before,
            [st.Condition(st.READY, False, API_ERROR, message)],
            generation=int(self.body["metadata"].get("generation") or 0),
            now=datetime.now(UTC),
        )
        try:
            for event in st.change_events(before, conditions):
                await self._post(event)
            await self.context.kube.patch_status(
                self.namespace, self.name, {"conditions": conditions}
            )
        except ApiException as exc:
            log.warning(
                "%s/%s: cannot report the API error either: %s",
                self.namespace,
                self.name,
                api_reason(exc),
            )
            return
        self._last_status = {**(self._last_status or self.body.get("status") or {}),
                             "conditions": conditions}  # fmt: skip

    def _measure(self, reading: Reading, decision: Decision, applied: Applied) -> None:
        metrics, labels = self.context.metrics, (self.namespace, self.name)
        if reading.problem is not None:  # counted on every pass that could not serve it
            metrics.reconcile_errors.labels(*labels, reading.problem.reason).inc()
        if applied.scaled:
            direction = "up" if decision.replicas > reading.replicas else "down"
            metrics.scale_decisions.labels(*labels, direction).inc()
        ready = int(((applied.deployment or {}).get("status") or {}).get("readyReplicas") or 0)
        metrics.observe_replicas(*labels, decision.replicas, ready)
        if reading.stats is not None:
            metrics.observe_backlog(*labels, reading.stats)


def _owned_by(deployment: Mapping[str, Any], uid: object) -> bool:
    owners = deployment["metadata"].get("ownerReferences") or ()
    return any(owner.get("uid") == uid and owner.get("controller") for owner in owners)
