"""One resource's loop: check what it needs, keep its Deployment in line, size it, report.

A `Dispatcher` runs for each OutboxDispatcher while this replica leads. Every
`pollIntervalSeconds` (and at once when the spec changes) it reconciles from scratch: read
the Secret, check the table and read the backlog, render the Deployment and create or replace
it when its template changed, ask the scaling policy for a size, write the status. Nothing is
remembered that the cluster does not hold, except the scaling policy's window and the last
backlog reading (for rates), so a restarted operator converges on its first pass.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from kubernetes.aio.client.exceptions import ApiException

from outbox.controller import status as st
from outbox.controller.database import parse_dsn, parse_table, purge, read_backlog
from outbox.controller.decision import Decision, Limits, Observed, SizingPolicy, decide
from outbox.controller.kube import Kube
from outbox.controller.leader import LeadershipLost
from outbox.controller.metrics import Metrics
from outbox.controller.render import TEMPLATE_HASH, render_deployment
from outbox.controller.resource import deployment_name, selector_string
from outbox.controller.scaling import ScalingPolicy
from outbox.controller.settings import ControllerSettings
from outbox.settings import format_duration, parse_duration
from outbox.stats import QueueStats, rates

log = logging.getLogger("outbox.controller")

# Purge at most this often, however long the retention (each purge is a few index scans).
MAX_PURGE_INTERVAL = timedelta(minutes=10)
API_RETRY_SECONDS = 5.0


@dataclass
class Context:
    """What every Dispatcher shares: the settings, the writer and the metrics."""

    settings: ControllerSettings
    kube: Kube
    metrics: Metrics


@dataclass
class Dispatcher:
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
                log.warning(
                    "%s/%s: API error %s %s; retrying",
                    self.namespace,
                    self.name,
                    exc.status,
                    exc.reason,
                )
                self.context.metrics.reconcile_errors.labels(
                    self.namespace, self.name, "ApiError"
                ).inc()
                interval = min(interval, API_RETRY_SECONDS)
            except (OSError, TimeoutError) as exc:
                log.warning("%s/%s: cannot reach the API: %s", self.namespace, self.name, exc)
                interval = min(interval, API_RETRY_SECONDS)
            except Exception:
                # A bug: say so with its traceback, keep serving the other resources.
                log.exception("%s/%s: reconcile failed", self.namespace, self.name)
                self.context.metrics.reconcile_errors.labels(
                    self.namespace, self.name, "InternalError"
                ).inc()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.wake.wait(), timeout=interval)

    # -- one pass -------------------------------------------------------------------------------

    def _check_publisher(self, spec: Mapping[str, Any]) -> None:
        kind = spec["publisher"]["type"]
        available = self.context.settings.worker_publishers
        if kind not in available:
            raise st.Problem(
                "PublisherUnavailable",
                f"the worker image has no {kind!r} publisher (it has: {', '.join(available)})",
            )

    async def _backlog(self, spec: Mapping[str, Any]) -> tuple[str, QueueStats]:
        """(dsn, backlog), or a Problem saying which of the resource's inputs is unusable."""
        self._check_publisher(spec)
        database = spec["database"]
        table = parse_table(database.get("table", "outbox"))
        ref = database["dsnSecretRef"]
        text, self._secret_version = await self.context.kube.secret_value(
            self.namespace, ref["name"], ref.get("key", "dsn")
        )
        dsn = parse_dsn(text)
        ordered = spec.get("ordering") == "aggregate"
        return dsn, await read_backlog(dsn, table, ordered=ordered)

    def _policy_for(self, scaling: Mapping[str, Any]) -> SizingPolicy:
        # One policy per resource, kept between passes (it holds the stabilization window and
        # what it learned), given the new settings when spec.scaling changes.
        if self._policy is None:
            self._policy = self.new_policy(dict(scaling))
        elif self._policy_spec != scaling:
            self._policy.reconfigure(dict(scaling))
        self._policy_spec = dict(scaling)
        return self._policy

    async def reconcile(self) -> None:
        body = self.body
        kube = self.context.kube
        spec = body["spec"]
        meta = body["metadata"]
        if meta.get("deletionTimestamp"):
            # Being deleted (e.g. foreground: it waits for its Deployment to go); recreating
            # the Deployment now would hold the deletion up for ever.
            return
        generation = int(meta.get("generation") or 0)
        # What this replica wrote last is newer than a body whose watch event is still on its way.
        status_before: Mapping[str, Any] = self._last_status or body.get("status") or {}
        now = datetime.now(UTC)

        problem: st.Problem | None = None
        stats: QueueStats | None = None
        dsn = ""
        try:
            dsn, stats = await self._backlog(spec)
        except st.Problem as exc:
            problem = exc

        name = deployment_name(self.name)
        deployment = await kube.deployment(self.namespace, name)
        if deployment is not None and not _owned_by(deployment, meta.get("uid")):
            # Someone else's Deployment (or a deleted namesake's, about to be collected):
            # never taken over, never resized.
            problem = st.Problem(
                "DeploymentNotOwned",
                f"Deployment {self.namespace}/{name} exists and does not belong to this "
                "resource; delete or rename it",
            )
            deployment = None
        current = int(deployment["spec"].get("replicas", 0)) if deployment else 0
        decision = decide(
            Observed(stats, problem, current, _ready(deployment)),
            Limits.from_spec(spec),
            lambda: self._policy_for(spec["scaling"]),
        )

        if problem is None:
            deployment = await self._apply(body, deployment, decision.replicas)
        elif deployment is not None and decision.replicas != current:
            # Paused or pinned while the inputs are broken: resize, keep the last good template.
            await kube.scale_deployment(self.namespace, name, decision.replicas)
        scaled = deployment is not None and decision.replicas != current
        if scaled:
            direction = "up" if decision.replicas > current else "down"
            self.context.metrics.scale_decisions.labels(self.namespace, self.name, direction).inc()
            log.info("%s/%s: %d -> %d workers (%s): %s", self.namespace, self.name, current,
                     decision.replicas, decision.reason, decision.message)  # fmt: skip
            await kube.event(
                body,
                "Normal",
                "ScaledUp" if direction == "up" else "ScaledDown",
                f"{current} -> {decision.replicas} workers: {decision.message}",
            )

        purge_status: dict[str, Any] = {}
        if problem is None and spec.get("retention"):
            purge_status = await self._retention(body, dsn, now, status_before)

        status = self._status(
            body, status_before, deployment, decision, stats, problem, generation, now
        )
        status.update(purge_status)
        if scaled:
            status["lastScaleTime"] = st.timestamp(now)
        await self._report(body, status_before, status, problem)
        await kube.patch_status(self.namespace, self.name, status)
        self._last_status = {**status_before, **status}
        self._reconciled_generation = generation
        if stats is not None:
            self._previous = stats

    async def _apply(
        self, body: Mapping[str, Any], deployment: Mapping[str, Any] | None, replicas: int
    ) -> dict[str, Any]:
        """Create the Deployment, or replace it if its template changed, or just resize it."""
        kube = self.context.kube
        rendered = render_deployment(
            body,
            replicas=replicas,
            default_image=self.context.settings.worker_image,
            secret_version=self._secret_version,
        )
        if deployment is None:
            log.info(
                "%s/%s: creating Deployment %s",
                self.namespace,
                self.name,
                rendered["metadata"]["name"],
            )
            return await kube.create_deployment(rendered)
        annotations = deployment["metadata"].get("annotations") or {}
        if annotations.get(TEMPLATE_HASH) != rendered["metadata"]["annotations"][TEMPLATE_HASH]:
            log.info(
                "%s/%s: the worker template changed: rolling the workers", self.namespace, self.name
            )
            return await kube.replace_deployment(
                rendered, deployment["metadata"]["resourceVersion"]
            )
        if int(deployment["spec"].get("replicas", 0)) != replicas:
            await kube.scale_deployment(self.namespace, rendered["metadata"]["name"], replicas)
            return {**deployment, "spec": {**deployment["spec"], "replicas": replicas}}
        return dict(deployment)

    async def _retention(
        self, body: Mapping[str, Any], dsn: str, now: datetime, before: Mapping[str, Any]
    ) -> dict[str, Any]:
        spec = body["spec"]
        retention = parse_duration(spec["retention"])
        poll = timedelta(seconds=float(spec["scaling"]["pollIntervalSeconds"]))
        every = max(poll, min(retention, MAX_PURGE_INTERVAL))
        if self._last_purge is not None and now - self._last_purge < every:
            return {}
        table = parse_table(spec["database"].get("table", "outbox"))
        try:
            purged = await purge(dsn, table, retention)
        except st.Problem as exc:
            log.warning("%s/%s: purge failed: %s", self.namespace, self.name, exc.message)
            return {}
        self._last_purge = now
        if purged:
            log.info(
                "%s/%s: purged %d done rows older than %s",
                self.namespace,
                self.name,
                purged,
                spec["retention"],
            )
            await self.context.kube.event(
                body,
                "Normal",
                "Purged",
                f"deleted {purged} done messages older than {format_duration(retention)}",
            )
        return {
            "lastPurgeTime": st.timestamp(now),
            "purgedTotal": int(before.get("purgedTotal") or 0) + purged,
        }

    def _status(
        self,
        body: Mapping[str, Any],
        before: Mapping[str, Any],
        deployment: Mapping[str, Any] | None,
        decision: Decision,
        stats: QueueStats | None,
        problem: st.Problem | None,
        generation: int,
        now: datetime,
    ) -> dict[str, Any]:
        spec = body["spec"]
        dstatus: Mapping[str, Any] = (deployment or {}).get("status") or {}
        ready = int(dstatus.get("readyReplicas") or 0)
        conditions: list[st.Condition] = [
            st.paused_condition(spec),
            st.scaling_condition(
                decision, int(dstatus.get("replicas") or 0) if deployment else None
            ),
        ]
        connected = st.Condition(
            st.DATABASE_REACHABLE, True, "Connected", "the table is a usable outbox table"
        )
        if problem is not None:
            conditions.extend(st.problem_conditions(problem))
            if stats is not None:
                conditions.append(connected)  # the problem lies elsewhere
            elif not problem.database:
                conditions.append(
                    st.Condition(
                        st.DATABASE_REACHABLE,
                        None,
                        "NotChecked",
                        f"not checked: {problem.message}",
                    )
                )
        else:
            conditions.append(connected)
            conditions.append(st.ready_condition(ready, decision.replicas))
        status: dict[str, Any] = {
            "observedGeneration": generation,
            "replicas": int(dstatus.get("replicas") or 0),
            "readyReplicas": ready,
            "desiredReplicas": decision.replicas,
            "selector": selector_string(self.name),
            "conditions": st.merge_conditions(
                before.get("conditions"), conditions, generation=generation, now=now
            ),
        }
        metrics = self.context.metrics
        metrics.observe_replicas(self.namespace, self.name, decision.replicas, ready)
        if stats is not None:
            previous = self._previous
            status["backlog"] = st.backlog_status(
                stats, rates(previous, stats) if previous else None
            )
            metrics.observe_backlog(self.namespace, self.name, stats)
        return status

    async def _report(
        self,
        body: Mapping[str, Any],
        before: Mapping[str, Any],
        after: Mapping[str, Any],
        problem: st.Problem | None,
    ) -> None:
        """An Event and a log line when the Ready reason changes (not on every pass)."""
        if problem is not None:  # counted on every pass that could not serve the resource
            self.context.metrics.reconcile_errors.labels(
                self.namespace, self.name, problem.reason
            ).inc()
        was = st.condition(before.get("conditions"), st.READY)
        now = st.condition(after["conditions"], st.READY)
        if was.get("reason") == now.get("reason") and was.get("status") == now.get("status"):
            return
        if problem is not None:
            log.warning(
                "%s/%s: not ready: %s: %s",
                self.namespace,
                self.name,
                problem.reason,
                problem.message,
            )
            await self.context.kube.event(body, "Warning", problem.reason, problem.message)
        elif was.get("status") == "False" and was.get("reason") not in (None, "WorkersStarting"):
            log.info("%s/%s: recovered from %s", self.namespace, self.name, was.get("reason"))
            await self.context.kube.event(
                body, "Normal", "Recovered", f"recovered from {was.get('reason')}: {now['message']}"
            )


def _owned_by(deployment: Mapping[str, Any], uid: object) -> bool:
    owners = deployment["metadata"].get("ownerReferences") or ()
    return any(owner.get("uid") == uid and owner.get("controller") for owner in owners)


def _ready(deployment: Mapping[str, Any] | None) -> int:
    return int(((deployment or {}).get("status") or {}).get("readyReplicas") or 0)
