"""A leader whose event loop is busy keeps its Lease: the renewals run on a thread and loop of
their own (controller/leader.py `LeaseThread`), so no amount of reconcile work delays them."""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
from datetime import datetime

import kubernetes
import pytest
from kubernetes.aio.client import Configuration
from kubernetes.aio.config import load_kube_config

from outbox.controller.leader import LeaseThread
from outbox.controller.settings import load_settings

from .cluster import LocalCluster
from .test_operator import FAST_LEADER

RETRY_PERIOD = 0.25  # FAST_LEADER's --retry-period
RENEW_DEADLINE = 5.0  # FAST_LEADER's --renew-deadline
BUSY_FOR = 2 * RENEW_DEADLINE


class Renewals:
    """Reads the Lease's renewTime until stopped: the times of the renewals it saw."""

    def __init__(self, k8s: LocalCluster, name: str) -> None:
        self._leases = kubernetes.client.CoordinationV1Api(k8s.api_client())
        self._name = name
        self.times: list[datetime] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.05):
            spec = self._leases.read_namespaced_lease(self._name, "default").spec
            renewed = spec.renew_time
            if renewed is not None and (not self.times or renewed != self.times[-1]):
                self.times.append(renewed)

    def stop(self) -> list[datetime]:
        self._stop.set()
        self._thread.join(10)
        return self.times


def busy(seconds: float) -> None:
    """What a fleet's reconciles do to the loop that runs them: hold it, on the CPU."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        sum(range(1000))


@pytest.mark.slow
def test_a_leader_whose_loop_is_busy_past_its_renew_deadline_keeps_renewing(
    k8s: LocalCluster,
) -> None:
    settings = load_settings(
        ["--leader-identity", "busy", "--leader-election-namespace", "default", *FAST_LEADER]
    )

    async def lead_while_busy() -> tuple[bool, bool, list[datetime]]:
        configuration = Configuration()
        await load_kube_config(str(k8s.kubeconfig), client_configuration=configuration)
        elector = LeaseThread(configuration, settings)
        try:
            assert await elector.acquire(asyncio.Event())
            holding = asyncio.create_task(elector.hold())  # not started: the loop is busy
            renewals = Renewals(k8s, settings.leader_election_id)
            busy(BUSY_FOR)  # the operator's loop does nothing else for twice the deadline
            seen = renewals.stop()
            await asyncio.sleep(0)  # the loop's first turn after the work: did hold() end?
            lost = holding.done()
            leading = elector.leading
            holding.cancel()
            return lost, leading, seen
        finally:
            await elector.close()

    lost, leading, seen = asyncio.run(lead_while_busy())
    assert not lost and leading, seen
    gaps = [(b - a).total_seconds() for a, b in itertools.pairwise(seen)]
    # Every retry period a renewal: a loaded machine (a test suite on two cores) stretches
    # some, never to the deadline; a renewal on the busy loop would make none at all.
    assert len(seen) >= BUSY_FOR / RETRY_PERIOD / 8, seen
    assert max(gaps) < RENEW_DEADLINE * 0.8, gaps
    lease = kubernetes.client.CoordinationV1Api(k8s.api_client()).read_namespaced_lease(
        settings.leader_election_id, "default"
    )
    # closed: handed over at once, as on SIGTERM
    assert lease.spec.holder_identity in ("", None)
