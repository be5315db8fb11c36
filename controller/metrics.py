"""The operator's Prometheus metrics and its /healthz and /metrics endpoints (one port)."""

from __future__ import annotations

import contextlib
import logging

from aiohttp import web
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    generate_latest,
)

from outbox.destinations import SHOWN_STATES as DESTINATION_STATES
from outbox.stats import QueueStats

log = logging.getLogger("outbox.controller")

# `retrying` is part of `pending`, `expired_leases` of `processing`: what an alert asks about.
BACKLOG_STATES = ("pending", "ready", "processing", "dead", "expired_leases", "retrying")
RESOURCE = ["namespace", "dispatcher"]


class Metrics:
    """One registry per operator, so several can live in one process (tests)."""

    def __init__(self) -> None:
        self.registry = r = CollectorRegistry()
        self.leader = Gauge(
            "outbox_controller_leader",
            "1 while this replica holds the leader Lease and acts, else 0",
            registry=r,
        )
        self.backlog = Gauge(
            "outbox_controller_backlog_messages",
            "Messages of a dispatcher's table by state, as last read",
            [*RESOURCE, "state"],
            registry=r,
        )
        self.oldest_ready_age = Gauge(
            "outbox_controller_oldest_ready_age_seconds",
            "Seconds the longest-waiting ready message has been claimable (0 when none)",
            RESOURCE,
            registry=r,
        )
        self.oldest_unfinished_age = Gauge(
            "outbox_controller_oldest_unfinished_age_seconds",
            "Seconds since the oldest pending or processing message was created, backoff "
            "included (0 when none)",
            RESOURCE,
            registry=r,
        )
        self.destination_state = Gauge(
            "outbox_controller_destination_state",
            "1 for each destination's state (closed, open, paused; idle when no worker has "
            "served it lately, whatever its row says) as last read from the table's "
            "destinations, 0 for the other states",
            [*RESOURCE, "destination", "state"],
            registry=r,
        )
        # The destinations each resource's series were last set for, so that one whose row
        # went away loses its series.
        self._destinations: dict[tuple[str, str], set[str]] = {}
        self.desired_replicas = Gauge(
            "outbox_controller_desired_replicas",
            "Worker replicas the operator asks for",
            RESOURCE,
            registry=r,
        )
        self.ready_replicas = Gauge(
            "outbox_controller_ready_replicas",
            "Worker pods passing their readiness probe",
            RESOURCE,
            registry=r,
        )
        self.scale_decisions = Counter(
            "outbox_controller_scale_decisions",
            "Changes of a Deployment's replica count, by direction",
            [*RESOURCE, "direction"],
            registry=r,
        )
        self.passes = Counter(
            "outbox_controller_passes",
            "Reconcile passes run (each reads the table and the cluster once)",
            RESOURCE,
            registry=r,
        )
        self.reconcile_errors = Counter(
            "outbox_controller_reconcile_errors",
            "Reconciles that could not serve a resource, by reason",
            [*RESOURCE, "reason"],
            registry=r,
        )

    def observe_backlog(self, namespace: str, name: str, stats: QueueStats) -> None:
        for state in BACKLOG_STATES:
            self.backlog.labels(namespace, name, state).set(getattr(stats, state))
        self.oldest_ready_age.labels(namespace, name).set(stats.oldest_ready_age or 0.0)
        self.oldest_unfinished_age.labels(namespace, name).set(stats.oldest_unfinished_age or 0.0)
        shown = set()
        for found in stats.destinations:
            shown.add(found.destination)
            for state in DESTINATION_STATES:
                self.destination_state.labels(namespace, name, found.destination, state).set(
                    1 if found.shown_state == state else 0
                )
        gone = self._destinations.get((namespace, name), set()) - shown
        self._forget_destinations(namespace, name, gone)
        self._destinations[(namespace, name)] = shown

    def _forget_destinations(self, namespace: str, name: str, destinations: set[str]) -> None:
        for destination in destinations:
            for state in DESTINATION_STATES:
                _remove(self.destination_state, namespace, name, destination, state)

    def observe_replicas(self, namespace: str, name: str, desired: int, ready: int) -> None:
        self.desired_replicas.labels(namespace, name).set(desired)
        self.ready_replicas.labels(namespace, name).set(ready)

    def forget(self, namespace: str, name: str) -> None:
        """A deleted resource's series go, instead of reporting its last values for ever."""
        for state in BACKLOG_STATES:
            _remove(self.backlog, namespace, name, state)
        for gauge in (
            self.oldest_ready_age,
            self.oldest_unfinished_age,
            self.desired_replicas,
            self.ready_replicas,
        ):
            _remove(gauge, namespace, name)
        self._forget_destinations(namespace, name, self._destinations.pop((namespace, name), set()))
        with contextlib.suppress(KeyError):
            self.passes.remove(namespace, name)


def _remove(gauge: Gauge, *labels: str) -> None:
    with contextlib.suppress(KeyError):
        gauge.remove(*labels)


class HealthServer:
    """The operator's HTTP endpoint: /healthz says the process is alive (leader or standby;
    the liveness probe's, not a destination's health, which is `DestinationReachable`), and
    /metrics serves the registry above."""

    def __init__(self, metrics: Metrics, port: int, address: str) -> None:
        self._metrics = metrics
        self._wanted_port = port
        self._address = address  # --health-address
        self._runner: web.AppRunner | None = None
        self.port: int | None = None

    async def start(self) -> None:
        app = web.Application()
        app.router.add_get("/metrics", self._serve_metrics)
        app.router.add_get("/healthz", self._healthz)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self._address, self._wanted_port)
        await site.start()
        # The runner's public addresses: with port 0 the one the system picked.
        addresses = self._runner.addresses
        self.port = int(addresses[0][1]) if addresses else self._wanted_port
        log.info("health and metrics on port %s (address %s)", self.port, self._address)

    async def _serve_metrics(self, request: web.Request) -> web.Response:
        body = generate_latest(self._metrics.registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def _healthz(self, request: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    async def close(self) -> None:
        """Stop serving and end every open connection; again, nothing."""
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()
