"""An API server that accepts a request and never answers it holds up one pass, not for ever.

Every request the operator makes outside kopf has kopf's request timeout
(`controller.kube.REQUEST_SECONDS`); a pass whose request met it says so as any other API
failure does (Ready=False, `ApiError`, a Warning Event naming the step), and the next pass,
answered, goes on. The other dispatchers' passes never wait for it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from outbox.controller.kube import REQUEST_SECONDS

from .cluster import LocalCluster
from .test_operator import (
    NS,
    Operator,
    apply,
    condition,
    dispatcher_manifest,
    events,
    get,
    own_table,
    secret_manifest,
    wait_for,
)

POLICY = f"/apis/networking.k8s.io/v1/namespaces/{NS}/networkpolicies/orders-worker"


def _dispatcher(name: str, dsn: str) -> dict[str, Any]:
    return dispatcher_manifest(
        name,
        database=own_table(dsn, name),
        scaling={"minReplicas": 0, "maxReplicas": 1, "pollIntervalSeconds": 1},
    )


def test_a_request_never_answered_ends_at_the_timeout_and_says_so(
    cluster: LocalCluster, operators: Callable[..., Operator], dsn: str
) -> None:
    async def hang() -> None:  # on the emulator's loop: the connection accepted, no answer
        await asyncio.Event().wait()

    def hang_the_next_read(emulator: Any) -> None:
        # kmock's slices count every matching request since the emulator started (earlier
        # tests on this cluster may have read a policy of the same name): the next one.
        reads = emulator[f"GET {POLICY}"]
        done = len(list(reads))
        reads[done : done + 1] << hang

    # The next read of orders' NetworkPolicy never answers; billing's passes are not held.
    cluster.on_loop(hang_the_next_read)
    apply(
        cluster,
        secret_manifest("orders-db", dsn=dsn),
        _dispatcher("orders", dsn),
        _dispatcher("billing", dsn),
    )
    operators("--worker-network-policy", "on")
    wait_for(
        "billing's NetworkPolicy, while orders' pass waits",
        lambda: cluster.objects("networking.k8s.io/v1", "networkpolicies", NS, "billing-worker"),
    )
    assert condition(cluster, "orders", "Ready").get("reason") != "ApiError"

    expected = (
        f"writing NetworkPolicy {NS}/orders-worker: no answer from the API server within "
        f"{REQUEST_SECONDS} s"
    )
    # The pass that timed out says so in a Warning Event; its status lasts until the next
    # pass, which goes at once and is answered (tens of milliseconds: too short to poll), and
    # says it recovered from it.
    warned = wait_for(
        "orders' pass ended by the timeout, in a Warning Event",
        lambda: [e for e in events(cluster, "orders") if e["reason"] == "ApiError"],
        timeout=REQUEST_SECONDS + 60,
    )
    assert [e["message"] for e in warned] == [expected]
    assert warned[0]["type"] == "Warning"
    recovered = wait_for(
        "orders recovered, in an Event",
        lambda: [e for e in events(cluster, "orders") if e["reason"] == "Recovered"],
    )
    assert "recovered from ApiError" in recovered[0]["message"], recovered

    # Answered, the next pass writes the policy and recovers.
    wait_for(
        "orders' NetworkPolicy",
        lambda: cluster.objects("networking.k8s.io/v1", "networkpolicies", NS, "orders-worker"),
    )
    wait_for(
        "orders recovered",
        lambda: condition(cluster, "orders", "Ready").get("reason") not in (None, "ApiError"),
    )
    assert (get(cluster, "outboxdispatchers", "orders") or {}).get("status")
