"""`DispatcherLoop`: one resource's reconcile loop, a pass every poll interval.

A pass is the pipeline read → decide → apply → report (this package's modules), each a
function of its inputs. What the loop keeps between passes is `Memory`: the scaling policy
(its window and what it learned), the last backlog reading (for rates), the status as
last written, and what the apply step hands on. Nothing else is remembered that the
cluster does not hold, so a restarted operator converges on its first pass.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from kubernetes.aio.client.exceptions import ApiException

from outbox.controller.database import DatabaseBusy
from outbox.controller.decision import SizingPolicy, decide
from outbox.controller.kube import UNREACHABLE, failure_reason
from outbox.controller.leader import LeadershipLost
from outbox.controller.reconcile.apply import Kept, apply
from outbox.controller.reconcile.context import Context, StepFailed
from outbox.controller.reconcile.read import Reading, read, reread_secrets
from outbox.controller.reconcile.report import API_ERROR, report, report_api_error
from outbox.controller.scaling import ScalingPolicy
from outbox.controller.spec import DispatcherSpec, ScalingSettings
from outbox.stats import QueueStats

log = logging.getLogger("outbox.controller")

API_RETRY_SECONDS = 5.0
BUSY_RETRY_SECONDS = 1.0  # after DatabaseBusy: its turn comes soon, the pool is working
DEFAULT_POLL_SECONDS = ScalingSettings().poll_interval_seconds
JITTER = 0.1  # each wait is the interval +- this fraction, so phases never line up again


def spread(interval: float, passes: int) -> float:
    """The wait after a resource's `passes`-th pass. Resources created together (an
    install, an operator start) would poll in step, every pass of the fleet in the same
    instant: the first wait is anywhere in one interval, which spreads them evenly over it,
    and the waits after it vary a little so that they do not fall in step again."""
    if passes == 1:
        return random.uniform(0.0, interval)
    return interval * random.uniform(1.0 - JITTER, 1.0 + JITTER)


@dataclass
class Memory:
    """What one pass leaves the next."""

    policy: SizingPolicy | None = None
    policy_settings: ScalingSettings | None = None
    previous: QueueStats | None = None  # the last reading's stats, for the rates
    status: Mapping[str, Any] | None = None  # as this replica last wrote it
    status_written_at: datetime | None = None  # when (report.due)
    reconciled_generation: int | None = None
    server_made: frozenset[str] = frozenset()  # template changes the server makes itself
    purged_at: datetime | None = None
    budget: Kept | None = None  # the PodDisruptionBudget as last found or made
    # The NetworkPolicy as last found or made as rendered; None after a pass that failed,
    # so that the next one reads it again (apply.py).
    network_policy: Kept | None = None
    pods_forbidden: bool = False  # said once: RBAC does not let the operator list pods


@dataclass
class DispatcherLoop:
    """The reconcile loop of one OutboxDispatcher resource (see the module)."""

    context: Context
    body: Mapping[str, Any]
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    # Builds the resource's policy from spec.scaling (another policy can be measured in its place).
    new_policy: Callable[[ScalingSettings], SizingPolicy] = ScalingPolicy
    memory: Memory = field(default_factory=Memory)

    @property
    def namespace(self) -> str:
        return str(self.body["metadata"]["namespace"])

    @property
    def name(self) -> str:
        return str(self.body["metadata"]["name"])

    def update(self, body: Mapping[str, Any]) -> None:
        """A watch event: keep the newest body; a new generation is reconciled at once."""
        self.body = body
        if body["metadata"].get("generation") != self.memory.reconciled_generation:
            self.wake.set()

    async def run(self) -> None:
        """Reconcile until cancelled; only a lost leadership ends it otherwise."""
        interval = DEFAULT_POLL_SECONDS
        passes = 0
        while True:
            self.wake.clear()
            spec: DispatcherSpec | None = None
            try:
                spec = DispatcherSpec.parse(self.body)
                interval = spec.poll_interval
                await self.reconcile(spec)
            except LeadershipLost:
                raise
            except (ApiException, StepFailed, TimeoutError) as exc:
                # A request the server refused or never answered (before the other
                # UNREACHABLE errors: a TimeoutError is an OSError): said in status.
                error = exc.error if isinstance(exc, StepFailed) else exc
                doing = exc.step if isinstance(exc, StepFailed) else "reconciling"
                message = f"{doing}: {failure_reason(error)}"
                log.warning("%s/%s: API error: %s; retrying", self.namespace, self.name, message)
                self.context.metrics.reconcile_errors.labels(
                    self.namespace, self.name, API_ERROR
                ).inc()
                conflict = isinstance(error, ApiException) and error.status == 409
                if not conflict and spec is not None:
                    # A conflict is a stale read: the next pass reads anew.
                    await self._report_api_error(spec, message)
                interval = min(interval, API_RETRY_SECONDS)
            except UNREACHABLE as exc:
                reason = str(exc) or type(exc).__name__
                log.warning("%s/%s: cannot reach the API: %s", self.namespace, self.name, reason)
                interval = min(interval, API_RETRY_SECONDS)
            except DatabaseBusy as exc:
                # No new fact: the status stays as the last pass wrote it.
                log.info("%s/%s: %s; trying again", self.namespace, self.name, exc)
                self.context.metrics.reconcile_errors.labels(
                    self.namespace, self.name, "DatabaseBusy"
                ).inc()
                interval = min(interval, BUSY_RETRY_SECONDS)
            except Exception:
                # A bug: say so with its traceback, keep serving the other resources.
                log.exception("%s/%s: reconcile failed", self.namespace, self.name)
                self.context.metrics.reconcile_errors.labels(
                    self.namespace, self.name, "InternalError"
                ).inc()
            passes += 1
            self.context.metrics.passes.labels(self.namespace, self.name).inc()
            # asyncio.timeout, not asyncio.wait_for: on Python 3.11 wait_for drops a
            # cancellation that comes as the wake-up does (gh-86296), and the loop went on.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(spread(interval, passes)):
                    await self.wake.wait()

    def _status_before(self, spec: DispatcherSpec) -> Mapping[str, Any]:
        # What this replica wrote last is newer than a body whose watch event is on its way.
        return self.memory.status or spec.status

    async def reconcile(self, spec: DispatcherSpec) -> None:
        """One pass: read, decide, apply, report."""
        context, memory = self.context, self.memory
        if spec.deleting:
            # Being deleted (e.g. foreground: it waits for its Deployment to go); recreating
            # the Deployment now would hold the deletion up for ever.
            context.tables.read(spec.namespace, spec.name)  # none waits for it
            return
        # Taken for this pass: given back only by a pass that ends well.
        network_policy, memory.network_policy = memory.network_policy, None
        if memory.reconciled_generation not in (None, spec.generation):
            # A changed spec sees its Secrets and its NetworkPolicy as they are now.
            reread_secrets(context, spec)
            network_policy = None
        reading = await read(context, spec, self._status_before(spec))
        self._say_pods_forbidden(reading)
        decision = decide(reading.observed, reading.limits, lambda: self.policy(spec.scaling))
        applied = await apply(
            context,
            reading,
            decision,
            server_made=memory.server_made,
            purged_at=memory.purged_at,
            budget=memory.budget,
            network_policy=network_policy,
        )
        memory.server_made, memory.purged_at = applied.server_made, applied.purged_at
        memory.budget = applied.budget
        memory.status, written = await report(
            context, reading, decision, applied, memory.previous, memory.status_written_at
        )
        if written:
            memory.status_written_at = reading.now
        memory.reconciled_generation = spec.generation
        memory.network_policy = applied.network_policy
        if reading.stats is not None:
            memory.previous = reading.stats

    def policy(self, scaling: ScalingSettings) -> SizingPolicy:
        """The resource's policy: one per resource, kept between passes (it holds the
        stabilization window and what it learned), given the new settings when spec.scaling
        changes."""
        memory = self.memory
        if memory.policy is None:
            memory.policy = self.new_policy(scaling)
        elif memory.policy_settings != scaling:
            memory.policy.reconfigure(scaling)
        memory.policy_settings = scaling
        return memory.policy

    def _say_pods_forbidden(self, reading: Reading) -> None:
        if reading.deployment is None or reading.pods is not None or self.memory.pods_forbidden:
            return
        self.memory.pods_forbidden = True
        log.warning(
            "%s/%s: forbidden to list pods: the workers' states (crash loops, image "
            "pull errors) are not reported; grant list on pods (docs/operator.md)",
            self.namespace,
            self.name,
        )

    async def _report_api_error(self, spec: DispatcherSpec, message: str) -> None:
        # The newest body's generation and status, as the pass that failed may be stale.
        try:
            latest = DispatcherSpec.parse(self.body)
        except ValueError:
            latest = spec
        written = await report_api_error(self.context, latest, self._status_before(latest), message)
        if written is not None:
            self.memory.status = written
