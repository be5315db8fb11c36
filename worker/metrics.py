"""Prometheus metrics and the /metrics, /healthz, /readyz endpoints."""

from __future__ import annotations

import bisect
import itertools
import logging
import math
from collections.abc import Collection, Iterator, Sequence

from aiohttp import web
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from prometheus_client.core import HistogramMetricFamily
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

log = logging.getLogger("outbox.worker")

OUTCOMES = ("done", "retried", "deferred", "released", "dead", "error")
# A message's age at publish: a millisecond on an idle worker, up to a minute of backlog
# (longer waits are the oldest-age alerts' to report).
AGE_BUCKETS = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60,
)  # fmt: skip


class Metrics:
    """One registry per dispatcher, so that several can live in one process (tests)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.messages = Counter(
            "outbox_messages",
            "Messages finalized, by outcome (error = publisher bug, row left to its lease)",
            ["outcome"],
            registry=r,
        )
        for outcome in OUTCOMES:
            self.messages.labels(outcome)
        self.lost_leases = Counter(
            "outbox_lost_leases",
            "Finalizes rejected by the fence: the lease expired and was taken over or reaped",
            registry=r,
        )
        self.publish_seconds = LoopHistogram(
            "outbox_publish_duration_seconds",
            "Time spent in one publish, whatever its outcome",
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
            registry=r,
        )
        self.age_at_publish = LoopHistogram(
            "outbox_message_age_at_publish_seconds",
            "Age of a message as its publish starts: from its created_at, on the database's "
            "clock (its age at the claim, the claim's now(), and the time held since)",
            buckets=AGE_BUCKETS,
            registry=r,
        )
        self.claim_batch = Histogram(
            "outbox_claim_batch_size",
            "Messages returned by one claim",
            buckets=(0, 1, 2, 5, 10, 20, 50, 100, 200, 500, 1000),
            registry=r,
        )
        self.in_flight = Gauge(
            "outbox_in_flight_messages", "Messages claimed by this worker and not finalized yet",
            registry=r,
        )  # fmt: skip
        self.broker_duplicates = Counter(
            "outbox_broker_duplicates",
            "Publishes the broker acknowledged as duplicates and dropped (de-duplication at work)",
            registry=r,
        )
        self.db_errors = Counter(
            "outbox_database_errors", "Failed database operations", ["operation"], registry=r
        )
        self.destination_state = Gauge(
            "outbox_destination_state",
            "1 for the breaker state of each destination this worker serves, as it last "
            "read it (closed, open, paused)",
            ["destination", "state"],
            registry=r,
        )
        self.destination_failures = Counter(
            "outbox_destination_failures",
            "Retryable publish failures by destination (a timeout, a refused connection, 5xx, 429)",
            ["destination"],
            registry=r,
        )
        self.held_back = Counter(
            "outbox_destination_held_back_messages",
            "Messages given back unsent, attempt refunded, because their destination's breaker "
            "was open or the destination paused",
            ["destination"],
            registry=r,
        )
        # A partitioned table's (outbox.partitions); neither is set for a plain table.
        self.partition_ids_ahead = Gauge(
            "outbox_partition_ids_ahead",
            "Ids the partitions made ahead still take before an insert finds no partition",
            registry=r,
        )
        self.partition_ids_target = Gauge(
            "outbox_partition_ids_ahead_target",
            "Ids kept made ahead when maintenance keeps up (partition size x partitions ahead)",
            registry=r,
        )
        self.ready = False


class LoopHistogram(Collector):
    """A histogram observed and collected on one event loop's thread (the worker's: the
    metrics endpoint runs on it too), so an observation takes no lock. It is made once per
    message: prometheus_client's Histogram, with a lock for the sum and one for the bucket,
    cost several times as much, a tenth of the worker's time with a fast publisher."""

    def __init__(
        self, name: str, documentation: str, buckets: Sequence[float], registry: CollectorRegistry
    ) -> None:
        self._name, self._documentation = name, documentation
        self._bounds = [*buckets, math.inf]
        # Spelled as prometheus_client spells its own histograms' bounds ("1.0", "+Inf").
        self._labels = [floatToGoString(b) for b in self._bounds]  # type: ignore[no-untyped-call]
        self._counts = [0] * len(self._bounds)
        self._sum = 0.0
        registry.register(self)

    def observe(self, amount: float) -> None:
        self._counts[bisect.bisect_left(self._bounds, amount)] += 1  # le: bound >= amount
        self._sum += amount

    def observe_many(self, amount: float, count: int) -> None:
        """`count` observations of the same `amount` (a batch's messages, which share its
        publish time) at the cost of one."""
        self._counts[bisect.bisect_left(self._bounds, amount)] += count
        self._sum += amount * count

    def observe_all(self, amounts: Collection[float]) -> None:
        """One observation of each amount (a batch's messages, each its own). Sorted once
        in C, the amounts up to each bound are found by bisection: no step per amount in
        Python, which cost more than the observation of one amount at a time."""
        ordered = sorted(amounts)
        counts, total = self._counts, len(ordered)
        counted = 0
        for index, bound in enumerate(self._bounds):
            upto = bisect.bisect_right(ordered, bound)  # le: bound >= amount
            counts[index] += upto - counted
            counted = upto
            if counted == total:
                break
        self._sum += sum(ordered)

    def collect(self) -> Iterator[HistogramMetricFamily]:
        family = HistogramMetricFamily(self._name, self._documentation)
        cumulative = itertools.accumulate(self._counts)
        family.add_metric(
            [],
            list(zip(self._labels, cumulative, strict=True)),
            self._sum,
        )
        yield family


class HealthServer:
    """/healthz: the process is alive. /readyz: it reaches the database and claims."""

    def __init__(self, metrics: Metrics, port: int, address: str) -> None:
        self._metrics = metrics
        self._port = port
        self._address = address  # --metrics-address
        self._runner: web.AppRunner | None = None
        self.port: int | None = None

    async def start(self) -> None:
        app = web.Application()
        app.router.add_get("/metrics", self._serve_metrics)
        app.router.add_get("/healthz", self._healthz)
        app.router.add_get("/readyz", self._readyz)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self._address, self._port)
        await site.start()
        # The port bound, from the runner's public addresses (port 0 picks a free one).
        addresses = self._runner.addresses
        self.port = int(addresses[0][1]) if addresses else self._port
        log.info("metrics and health on port %s (address %s)", self.port, self._address)

    async def _serve_metrics(self, request: web.Request) -> web.Response:
        body = generate_latest(self._metrics.registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def _healthz(self, request: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    async def _readyz(self, request: web.Request) -> web.Response:
        if self._metrics.ready:
            return web.Response(text="ready\n")
        return web.Response(status=503, text="not ready: database unreachable or not checked\n")

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
