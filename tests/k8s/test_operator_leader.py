"""Two operator processes, one Lease: only one ever acts, a frozen leader is replaced, and
when it wakes it exits without writing anything."""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from .cluster import LocalCluster
from .rbac import MASTERS, Identity
from .test_operator import (
    CRD,
    FAST_LEADER,
    STEADY_LEADER,
    Operator,
    apply,
    deployment_of,
    dispatcher_manifest,
    get,
    own_table,
    secret_manifest,
    wait_for,
)

pytestmark = pytest.mark.slow
TOKENS = {
    "token-a": Identity("operator-a", (MASTERS,)),
    "token-b": Identity("operator-b", (MASTERS,)),
}
WRITES = {"POST", "PUT", "PATCH", "DELETE"}


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    """An emulator that tells the two operators apart by their tokens."""
    workdir = tmp_path / "k8s"
    workdir.mkdir()
    k8s = LocalCluster(workdir, tokens=TOKENS).start()
    try:
        k8s.install_crd(CRD)
        yield k8s
    finally:
        k8s.stop()
    assert not k8s.emulator.failures, k8s.emulator.failures


def writes(k8s: LocalCluster) -> list[tuple[int, str, str, str]]:
    """(request id, writer, method, path) of every write the operators attempted, in order."""
    found = []
    for request in list(k8s.emulator):
        headers = {k.lower(): v for k, v in request.headers.items()}
        token = headers.get("authorization", "").removeprefix("Bearer ").strip()
        if token in TOKENS and str(request.method).upper().split(".")[-1] in WRITES:
            method = str(request.method).upper().split(".")[-1]
            found.append((request.id, TOKENS[token].user, method, request.url.path))
    return found


class BothLeading:
    """Samples both operators' leader gauge until stopped; remembers any moment both say 1."""

    def __init__(self, a: Operator, b: Operator) -> None:
        self.a, self.b = a, b
        self.seen_both = 0
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.02):
            self.samples += 1
            if self.a.leading() and self.b.leading():
                self.seen_both += 1

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)


def test_two_replicas_never_both_act(cluster: LocalCluster, tmp_path: Path, dsn: str) -> None:
    kubeconfigs = {
        name: cluster.write_kubeconfig(tmp_path / f"kubeconfig-{name}", f"token-{name}")
        for name in ("a", "b")
    }
    a = Operator(
        cluster, tmp_path, name="a", kubeconfig=kubeconfigs["a"], leader=FAST_LEADER
    ).start()
    b: Operator | None = None
    watcher: BothLeading | None = None
    try:
        wait_for("a to lead", a.leading)
        # b waits out a's recorded lease whatever its own timings; leading, it must not stall
        # out of the Lease.
        b = Operator(
            cluster, tmp_path, name="b", kubeconfig=kubeconfigs["b"], leader=STEADY_LEADER
        ).start()
        watcher = BothLeading(a, b)
        apply(cluster, secret_manifest("orders-db", dsn=dsn), dispatcher_manifest("first"))
        wait_for("a to serve the first resource", lambda: deployment_of(cluster, "first"))
        # b follows while a renews: several renewals go by with b standing by.
        renewals = set()
        wait_for(
            "three renewals by a",
            lambda: (
                renewals.add(
                    (get(cluster, "leases", "outbox-controller") or {})["spec"]["renewTime"]
                )
                or len(renewals) >= 3
            ),
        )
        assert not b.leading()

        a.signal(signal.SIGSTOP)  # frozen, still holding the Lease
        wait_for("b to take over after the lease duration", b.leading)
        apply(cluster, dispatcher_manifest("second", database=own_table(dsn, "second")))
        wait_for("b to serve the second resource", lambda: deployment_of(cluster, "second"))
        lease = get(cluster, "leases", "outbox-controller")
        assert lease is not None and lease["spec"]["holderIdentity"] == "b"
        assert lease["spec"]["leaseTransitions"] >= 1

        a.signal(signal.SIGCONT)  # wakes up past its renew deadline
        assert a.wait() == 1
        assert "no longer the leader" in a.log() or "lost lease" in a.log()
        assert b.leading()
        lease = get(cluster, "leases", "outbox-controller")
        assert lease is not None and lease["spec"]["holderIdentity"] == "b"
    finally:
        if watcher is not None:
            watcher.stop()
        a.stop()
        if b is not None:
            b.stop()

    assert watcher is not None and watcher.samples > 10
    assert watcher.seen_both == 0
    history = writes(cluster)
    by_a = [w for w in history if w[1] == "operator-a"]
    by_b = [w for w in history if w[1] == "operator-b"]
    assert by_a and by_b
    # Every write of a came before the first write of b: a woke up and wrote nothing. But
    # a renewal a had sent to its socket as it froze may reach the API after b's writes:
    # its resourceVersion is stale, it is refused (the Lease stayed b's, above).
    late = [w for w in by_a if w[0] > min(w[0] for w in by_b)]
    lease_path = "/apis/coordination.k8s.io/v1/namespaces/default/leases/outbox-controller"
    assert all(method == "PUT" and path == lease_path for _, _, method, path in late), late
