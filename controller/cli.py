"""`outbox-controller`: the OutboxDispatcher operator process.

It serves /healthz and /metrics at once, then waits to lead (see `leader.py`). While it
leads, kopf watches the resources and one loop per resource reconciles it. Losing the Lease
stops every loop and exits with status 1, so the pod restarts as a follower, as client-go
controllers do; SIGTERM stops cleanly and hands the Lease over.
"""

from __future__ import annotations

import asyncio
import copy
import logging
import os
import signal
import sys
from collections.abc import Sequence
from urllib.parse import urlsplit

import kopf
from kubernetes.aio.client import ApiClient, Configuration
from kubernetes.aio.config import ConfigException, load_incluster_config, load_kube_config

from outbox.controller.database import Pools
from outbox.controller.handlers import Supervisor, build_kopf_settings, build_registry
from outbox.controller.informer import Deployments
from outbox.controller.kube import Kube, Secret
from outbox.controller.leader import LeaseThread
from outbox.controller.metrics import HealthServer, Metrics
from outbox.controller.reconcile import Context
from outbox.controller.secret_cache import SecretCache
from outbox.controller.settings import ControllerSettings, load_settings
from outbox.plumbing import logs
from outbox.plumbing.cliutil import fail
from outbox.plumbing.errors import SettingError
from outbox.plumbing.waiting import cancel_and_wait

log = logging.getLogger("outbox.controller")
PROG = "outbox-controller"
LOST_LEADERSHIP = 1
PROXY_VARIABLES = ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy")


async def cluster_configuration(requests_in_flight: int) -> Configuration:
    """In-cluster credentials inside a pod, else the kubeconfig (KUBECONFIG or ~/.kube);
    at most `requests_in_flight` requests at once (--api-requests-in-flight)."""
    configuration = Configuration()
    if os.environ.get("KUBERNETES_SERVICE_HOST"):
        load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
    else:
        await load_kube_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
    configuration.connection_pool_maxsize = requests_in_flight
    # aiohttp's trust_env, which the client sets, also reads ~/.netrc on every request (a
    # fleet's passes spent a fifth of their time there); it is kept only for a proxy.
    configuration.client_session_kwargs = {
        "trust_env": any(os.environ.get(name) for name in PROXY_VARIABLES)
    }
    server = urlsplit(configuration.host)
    if (server.username or server.password) and (configuration.api_key or configuration.username):
        # aiohttp refuses both on every request (a traceback per call); the server's user-info
        # is not shown: it is a password.
        raise ConfigException(
            "the cluster's server URL holds a user name or password and the kubeconfig's user "
            "has a token or password too: remove the user-info from the server URL"
        )
    return configuration


async def run(settings: ControllerSettings) -> int:
    """Serve until stopped (0) or until the leadership is lost (1)."""
    metrics = Metrics()
    health = HealthServer(metrics, settings.health_port, settings.health_address)
    await health.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        configuration = await cluster_configuration(settings.api_requests_in_flight)
    except (ConfigException, OSError) as exc:
        await health.close()
        fail(PROG, f"no cluster credentials (in-cluster or KUBECONFIG): {exc}")
    api = ApiClient(configuration)
    # The informer's watches hold their connections for minutes: a client of their own, one
    # connection per watch, so that they never take one of the passes' requests in flight.
    watching = copy.copy(configuration)
    watching.connection_pool_maxsize = max(1, len(settings.namespaces))
    watch_api = ApiClient(watching)
    elector = LeaseThread(configuration, settings)
    # Read at each scrape: a leader frozen past its renew deadline shows 0 as soon as it wakes.
    metrics.leader.set_function(lambda: 1.0 if elector.leading else 0.0)
    try:
        if not await elector.acquire(stop):
            return 0
        return await _lead(settings, api, watch_api, elector, metrics, health, stop)
    finally:
        await elector.close()
        await api.close()  # type: ignore[no-untyped-call]
        await watch_api.close()  # type: ignore[no-untyped-call]
        await health.close()


async def _lead(
    settings: ControllerSettings,
    api: ApiClient,
    watch_api: ApiClient,
    elector: LeaseThread,
    metrics: Metrics,
    health: HealthServer,
    stop: asyncio.Event,
) -> int:
    deployments = Deployments(watch_api, settings.namespaces)
    secrets = SecretCache[Secret](settings.secret_recheck.total_seconds())
    kube = Kube(api, elector.check, elector.identity, deployments=deployments, secrets=secrets)
    database = Pools(settings.database_connections)
    supervisor = Supervisor(Context(settings, kube, metrics, database=database))
    informer = asyncio.create_task(deployments.run(), name="Deployments informer")
    kopf_stop = asyncio.Event()
    watching = asyncio.create_task(
        kopf.operator(
            registry=build_registry(supervisor, kopf_stop, health.close),
            settings=build_kopf_settings(settings.log_level),
            standalone=True,  # the Lease elects the leader, not kopf's peering
            clusterwide=not settings.namespaces,
            namespaces=list(settings.namespaces),
            stop_flag=kopf_stop,
        ),
        name="kopf",
    )
    holding = asyncio.create_task(elector.hold(), name="lease renewal")
    stopping = asyncio.create_task(stop.wait(), name="stop")
    lost = asyncio.create_task(supervisor.lost.wait(), name="write refused")
    done, _ = await asyncio.wait(
        {watching, holding, stopping, lost}, return_when=asyncio.FIRST_COMPLETED
    )
    code = 0
    if holding in done or lost in done:
        log.error("no longer the leader: stopping all work and exiting so the pod restarts")
        code = LOST_LEADERSHIP
    elif watching in done and watching.exception() is not None:
        log.error("the watcher failed: %s", watching.exception())
        code = LOST_LEADERSHIP
    # kopf takes over SIGTERM while it runs: its normal return is a requested stop.
    kopf_stop.set()
    await supervisor.close()
    # The informer watches until cancelled: cancelled again should a client under it drop the
    # cancellation (Python 3.11's asyncio.wait_for), or the exit would wait for it for ever.
    await cancel_and_wait([holding, stopping, lost, informer])
    await asyncio.gather(watching, holding, stopping, lost, informer, return_exceptions=True)
    return code


def main(argv: Sequence[str] | None = None) -> None:
    try:
        settings = load_settings(argv)
    except SettingError as exc:
        fail(PROG, str(exc))
    # kopf narrates every watch event at INFO; its warnings and errors still show.
    # The pool retries a connection in the background and logs each failure: the status
    # says it once, with the reason (controller/database.py).
    quiet = {"kopf": logging.WARNING, "psycopg.pool": logging.ERROR}
    logs.configure(settings.log_format, settings.log_level, quiet)
    namespaces = ", ".join(settings.namespaces) or "all namespaces"
    log.info("outbox-controller serving %s as %s", namespaces, settings.leader_identity)
    sys.exit(asyncio.run(run(settings)))
