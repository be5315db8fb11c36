"""A fleet on one operator: what its passes cost, counted (not timed), and its Lease.

Several dispatchers on one database, each on its own idle table, polled every second: once
each has its steady status, further passes write no status at all (the emulator counts the
PATCHes), open no new database sessions past one pool's bound (PostgreSQL counts them in
`pg_stat_database.sessions`), read no Deployment from the server (the informer serves them)
and read their shared Secret at most as often as its recheck interval says, however many
passes they make. And an operator kept busy by many of them still renews its Lease every
retry period.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from typing import Any

import kmock
import psycopg
import pytest

from outbox.controller.database import POOL_MAX_CONNECTIONS
from outbox.controller.resource import selector_labels
from outbox.models import Event
from outbox.producer import enqueue_many
from outbox.table import Table

from .cluster import LocalCluster
from .test_lease_thread import RENEW_DEADLINE, Renewals
from .test_operator import (
    FAST_LEADER,
    NS,
    Operator,
    apply,
    dispatcher_manifest,
    get,
    own_table,
    secret_manifest,
    wait_for,
)

DISPATCHERS = 6
PASSES = 5  # more passes each than the pool has connections: K x N sessions would show
SECRET_RECHECK_SECONDS = 3  # shorter than the window: the recheck's reads are counted too


def _idle(name: str, dsn: str, table: str | None = None) -> dict[str, Any]:
    return dispatcher_manifest(
        name,
        database=own_table(dsn, table or name),
        scaling={
            "minReplicas": 0,
            "maxReplicas": 2,
            "pollIntervalSeconds": 1,
            "scaleDownStabilizationSeconds": 3,
        },
    )


def _gets(cluster: LocalCluster, plural: str) -> int:
    """The operator's GETs of one object of `plural` (a list or a watch has no name after
    the plural; kubectl's own requests are not the operator's)."""

    def count(emulator: Any) -> int:
        return sum(
            1
            for request in emulator
            if str(request.method).upper().endswith("GET")
            and f"/{plural}/" in request.url.path
            and not request.headers.get("User-Agent", "").startswith("kubectl")
        )

    return cluster.on_loop(count)


def _status_patches(cluster: LocalCluster) -> int:
    def count(emulator: Any) -> int:
        return sum(
            1
            for request in emulator
            if str(request.method).upper().endswith("PATCH")
            and "/outboxdispatchers/" in request.url.path
            and request.url.path.endswith("/status")
        )

    return cluster.on_loop(count)


def _sessions(dsn: str) -> int:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT sessions FROM pg_stat_database WHERE datname = current_database()"
        ).fetchone()
    assert row is not None
    return int(row[0])


def _passes(operator: Operator, names: list[str]) -> list[float]:
    found = [operator.metric("outbox_controller_passes_total", dispatcher=n) for n in names]
    return [value or 0.0 for value in found]


def test_an_idle_fleet_writes_no_status_and_opens_no_session_per_pass(
    cluster: LocalCluster, operators: Callable[..., Operator], dsn: str
) -> None:
    names = [f"idle-{i}" for i in range(DISPATCHERS)]
    apply(cluster, secret_manifest("orders-db", dsn=dsn), *(_idle(n, dsn) for n in names))
    operator = operators("--secret-recheck", f"{SECRET_RECHECK_SECONDS}s")

    def steady() -> bool:
        # A second reading adds the rates, and Idle follows the window: after those writes,
        # nothing changes on an idle table.
        statuses = [(get(cluster, "outboxdispatchers", n) or {}).get("status") for n in names]
        return all(
            s
            and "arrivalRate" in (s.get("backlog") or {})
            and any(c["reason"] == "Idle" for c in s["conditions"])
            for s in statuses
        )

    wait_for("every dispatcher's steady status", steady)
    patches, sessions = _status_patches(cluster), _sessions(dsn)
    deployments, secrets = _gets(cluster, "deployments"), _gets(cluster, "secrets")
    start = _passes(operator, names)
    began = time.monotonic()
    wait_for(
        f"{PASSES} more passes of every dispatcher",
        lambda: all(b - a >= PASSES for a, b in zip(start, _passes(operator, names), strict=True)),
    )
    window = time.monotonic() - began

    assert _status_patches(cluster) - patches == 0
    # Every pass read its Deployment and its Secret: 2 x K x N = 60 GETs without the caches.
    # The informer serves the Deployments; the one Secret is read again once per recheck
    # interval, by one of the passes that need it at that moment.
    assert _gets(cluster, "deployments") - deployments == 0
    assert _gets(cluster, "secrets") - secrets <= window // SECRET_RECHECK_SECONDS + 1
    # Every pass read its table (the sessions would be K x N = 30 with a connection each).
    opened = _sessions(dsn) - sessions - 1  # the count's own session
    assert 0 <= opened <= POOL_MAX_CONNECTIONS, opened
    # The status still shows the table: a new row is written at the next pass that sees it.
    with psycopg.connect(dsn, autocommit=True) as conn:
        enqueue_many(conn, [Event("order", "1", "created", {})], table=Table.parse("idle-0"))
    wait_for(
        "the new row in status.backlog",
        lambda: (
            (get(cluster, "outboxdispatchers", "idle-0") or {})["status"]["backlog"]["pending"] == 1
        ),
    )


LOADED = 40  # dispatchers polled every second: the operator's loop and the API server busy


@pytest.mark.slow
def test_a_loaded_operator_renews_its_lease_every_period(
    cluster: LocalCluster, operators: Callable[..., Operator], dsn: str
) -> None:
    names = [f"busy-{i}" for i in range(LOADED)]
    apply(cluster, secret_manifest("orders-db", dsn=dsn), *(_idle(n, dsn) for n in names))
    operator = operators(leader=FAST_LEADER)
    wait_for(
        "every dispatcher's first status",
        lambda: all((get(cluster, "outboxdispatchers", n) or {}).get("status") for n in names),
    )
    renewals = Renewals(cluster, "outbox-controller")
    start = _passes(operator, names)
    try:
        wait_for(
            f"{PASSES} more passes of every dispatcher",
            lambda: all(
                b - a >= PASSES for a, b in zip(start, _passes(operator, names), strict=True)
            ),
        )
    finally:
        seen = renewals.stop()
    assert operator.leading()
    gaps = [(b - a).total_seconds() for a, b in itertools.pairwise(seen)]
    # Every retry period a renewal, under load as when idle (test_lease_thread.py).
    assert len(seen) >= 2, seen
    assert max(gaps) < RENEW_DEADLINE / 2, gaps


def _in(namespace: str, manifest: dict[str, Any]) -> dict[str, Any]:
    return {**manifest, "metadata": {**manifest["metadata"], "namespace": namespace}}


def _status(cluster: LocalCluster, namespace: str, name: str) -> dict[str, Any] | None:
    found = cluster.objects("outbox.dev/v1alpha1", "outboxdispatchers", namespace, name)
    return found[0].get("status") if found else None


def _holder(cluster: LocalCluster, lease: str) -> str | None:
    found = cluster.objects("coordination.k8s.io/v1", "leases", "default", lease)
    return found[0]["spec"].get("holderIdentity") if found else None


def test_two_operators_on_two_namespaces_each_serve_their_own_with_their_own_lease(
    cluster: LocalCluster, operators: Callable[..., Operator], dsn: str
) -> None:
    """Past one operator (docs/operator.md, "Running a fleet"): one operator per group of
    namespaces, each with its Lease; neither sees nor touches the other's resources."""
    teams = {"team-a": "op-a", "team-b": "op-b"}
    for namespace in teams:
        apply(cluster, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
    started = {}
    for namespace, identity in teams.items():
        lease = ("--leader-election-id", f"outbox-{identity}")
        started[namespace] = operators("--namespace", namespace, *lease, name=identity)
    for namespace in teams:
        table = namespace.replace("-", "_")
        apply(
            cluster,
            _in(namespace, secret_manifest("orders-db", dsn=dsn)),
            _in(namespace, _idle("orders", dsn, table)),
        )
    for namespace, identity in teams.items():
        wait_for(f"{namespace}/orders' status", lambda n=namespace: _status(cluster, n, "orders"))
        assert _holder(cluster, f"outbox-{identity}") == identity
    for namespace, identity in teams.items():
        log = started[namespace].log()
        assert f"{namespace}/orders: serving" in log
        others = [other for other in teams if other != namespace]
        assert not any(f"{other}/" in log for other in others), log
        # Only its own resources' passes are counted by it.
        assert started[namespace].metric("outbox_controller_passes_total", namespace=namespace)
        for other in others:
            assert (
                started[namespace].metric("outbox_controller_passes_total", namespace=other) is None
            )
        assert started[namespace].leading(), identity


def _policy(cluster: LocalCluster, name: str) -> dict[str, Any] | None:
    found = cluster.objects("networking.k8s.io/v1", "networkpolicies", NS, f"{name}-worker")
    return found[0] if found else None


def _fail_the_next_status_write(emulator: Any) -> None:
    """On the emulator's loop: a 503 for the next PATCH of a dispatcher (kmock's slices count
    every matching request since the start)."""
    patches = emulator["patch", kmock.resource("outbox.dev", "v1alpha1", "outboxdispatchers")]
    done = len(list(patches))
    patches[done : done + 1] << 503


def test_an_idle_fleet_reads_its_network_policies_once(
    cluster: LocalCluster, operators: Callable[..., Operator], dsn: str
) -> None:
    """The NetworkPolicy is read (and written) when what it should be changed, not every
    pass; a pass that failed makes the next one read it again, and put back one deleted."""
    names = [f"fenced-{i}" for i in range(3)]
    apply(cluster, secret_manifest("orders-db", dsn=dsn), *(_idle(n, dsn) for n in names))
    operator = operators("--worker-network-policy", "on")
    wait_for("every dispatcher's NetworkPolicy", lambda: all(_policy(cluster, n) for n in names))
    wait_for(
        "every dispatcher's second pass",
        lambda: all(p >= 2 for p in _passes(operator, names)),
    )
    gets = _gets(cluster, "networkpolicies")
    start = _passes(operator, names)
    wait_for(
        f"{PASSES} more passes of every dispatcher",
        lambda: all(b - a >= PASSES for a, b in zip(start, _passes(operator, names), strict=True)),
    )
    assert _gets(cluster, "networkpolicies") - gets == 0

    # Deleted by hand, it is seen by an idle pass at the minute's recheck only (nothing
    # watches it); a pass that fails (here the status write of a new row) leaves the next
    # one to read it again at once, which puts it back.
    cluster.kubectl("delete", "networkpolicy", "fenced-0-worker")
    cluster.on_loop(_fail_the_next_status_write)
    with psycopg.connect(dsn, autocommit=True) as conn:
        enqueue_many(conn, [Event("order", "1", "created", {})], table=Table.parse("fenced-0"))
    restored = wait_for("the NetworkPolicy put back", lambda: _policy(cluster, "fenced-0"))
    assert restored["spec"]["podSelector"] == {"matchLabels": selector_labels("fenced-0")}
