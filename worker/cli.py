"""`outbox-worker`: the dispatcher process."""

from __future__ import annotations

import asyncio
import gc
import logging
import signal
import sys
from collections.abc import Callable, Coroutine, Sequence
from typing import Any

from outbox.plumbing import logs
from outbox.plumbing.cliutil import USAGE_ERROR, fail
from outbox.plumbing.errors import SettingError
from outbox.schema import SchemaError
from outbox.worker.metrics import HealthServer, Metrics
from outbox.worker.publishers.base import BatchPublisher, Publisher
from outbox.worker.publishers.formats import default_source
from outbox.worker.publishers.registry import PublisherContext, load_publisher
from outbox.worker.replica import Replica
from outbox.worker.settings import WorkerSettings, load_settings

log = logging.getLogger("outbox.worker")
PROG = "outbox-worker"
# Each is a clean stop: claiming ends, unstarted messages are given back, in-flight ones
# finish within the grace period. SIGHUP too (a closed terminal, or a supervisor's "reload"):
# the worker has no configuration file to reread, and its default action, dying on the
# spot, would leave every held row to its lease.
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
# Allocations (net of frees) between two runs of the cyclic collector's youngest generation;
# Python's own default is 700.
GC_YOUNG_THRESHOLD = 10_000


def make_publisher(settings: WorkerSettings, metrics: Metrics) -> Publisher | BatchPublisher:
    context = PublisherContext(
        owner=settings.owner,
        concurrency=settings.concurrency,
        publish_timeout=settings.publish_timeout.total_seconds(),
        count_broker_duplicate=metrics.broker_duplicates.inc,
        format=settings.format,
        cloudevents_source=settings.cloudevents_source or default_source(str(settings.table)),
    )
    return load_publisher(settings.publisher).create(dict(settings.publisher_options), context)


async def serve(settings: WorkerSettings, stop: asyncio.Event) -> None:
    metrics = Metrics()
    publisher = make_publisher(settings, metrics)
    health = (
        HealthServer(metrics, settings.metrics_port, settings.metrics_address)
        if settings.metrics_port is not None
        else None
    )
    if health is not None:
        await health.start()
    await publisher.start()
    try:
        await Replica(settings, publisher, metrics).run(stop)
    finally:
        await publisher.close()
        if health is not None:
            await health.close()


async def _main(settings: WorkerSettings) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in STOP_SIGNALS:
        loop.add_signal_handler(sig, _request_stop, stop, sig)
    await serve(settings, stop)


def _request_stop(stop: asyncio.Event, sig: signal.Signals) -> None:
    if stop.is_set():
        log.warning("%s again: still shutting down", sig.name)
        return
    log.info("%s received: finishing in-flight messages", sig.name)
    stop.set()


def calm_collector() -> None:
    """Fewer runs of the cyclic garbage collector. The worker's objects (claimed rows,
    outcomes, headers) die young and by reference counting, never in cycles; yet at Python's
    default threshold the collector ran every few hundred of them and walked what survived,
    a share of a busy worker's event loop that bench/results/brokers.md measures. What
    start-up made (modules, settings) is frozen out of the collector's walks; a cycle, should
    one form, is still found at the next run."""
    gc.freeze()
    gc.set_threshold(GC_YOUNG_THRESHOLD, *gc.get_threshold()[1:])


def event_loop_runner(choice: str) -> Callable[[Coroutine[Any, Any, None]], None]:
    """uvloop's loop, when wanted and installed: the worker is bound by its own CPU, and
    uvloop does the sockets' reads and writes (database, HTTP, brokers) in C."""
    if choice != "asyncio":
        try:
            import uvloop
        except ImportError:
            if choice == "uvloop":
                fail(PROG, "--event-loop uvloop: uvloop is not installed", USAGE_ERROR)
        else:
            return uvloop.run
    return asyncio.run


def main(argv: Sequence[str] | None = None) -> None:
    try:
        settings = load_settings(argv)
    except SettingError as exc:
        fail(PROG, str(exc))
    # The dispatcher reports database trouble itself, once per streak; the pool would repeat it.
    logs.configure(settings.log_format, settings.log_level, {"psycopg.pool": logging.ERROR})
    for warning in settings.warnings():
        log.warning("settings: %s", warning)
    calm_collector()
    try:
        event_loop_runner(settings.event_loop)(_main(settings))
    except (SchemaError, SettingError) as exc:  # SettingError: a publisher's create() refused
        fail(PROG, str(exc), USAGE_ERROR)
    except OSError as exc:  # e.g. the metrics port is taken
        fail(PROG, str(exc), 1)
    sys.exit(0)
