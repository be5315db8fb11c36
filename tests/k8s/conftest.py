"""Fixtures of the Kubernetes tier: a running emulator (`k8s`) and a local kubelet (`kubelet`).

See README.md in this folder for what the emulator and the kubelet do and do not do.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from .cluster import ADMIN_TOKEN, LocalCluster
from .kubelet import Kubelet
from .test_operator import CRD, STEADY_LEADER, Operator

HERE = Path(__file__).parent


@pytest.fixture
def k8s(tmp_path: Path) -> Iterator[LocalCluster]:
    """A fresh emulator per test; the test fails if the emulator itself failed."""
    workdir = tmp_path / "k8s"
    workdir.mkdir()
    cluster = LocalCluster(workdir).start()
    try:
        yield cluster
    finally:
        cluster.stop()
    assert not cluster.emulator.failures, cluster.emulator.failures
    assert not cluster.unfinished, cluster.unfinished


@pytest.fixture
def kubelet(k8s: LocalCluster, tmp_path: Path) -> Iterator[Kubelet]:
    """A local kubelet on `k8s`; at teardown every pod's process is stopped."""
    node = Kubelet(k8s.url, ADMIN_TOKEN, tmp_path / "kubelet", ca_path=k8s.ca_path).start()
    k8s.emulator.pod_logs = node.log  # `kubectl logs` reads the processes' output
    try:
        yield node
    finally:
        node.stop()
        k8s.emulator.pod_logs = None
    running = [r for r in node.records if r.returncode is None]
    assert not running, f"processes left running: {running}"
    assert not node.failures, node.failures
    assert not node.unfinished, node.unfinished


# The operator's fixtures, for every test of the real operator (test_operator.py and the rest).
@pytest.fixture
def cluster(k8s: LocalCluster) -> LocalCluster:
    k8s.install_crd(CRD)
    return k8s


@pytest.fixture
def operators(cluster: LocalCluster, tmp_path: Path) -> Iterator[Callable[..., Operator]]:
    started: list[Operator] = []

    def start(*args: str, name: str = "op", leader: tuple[str, ...] = STEADY_LEADER) -> Operator:
        operator = Operator(cluster, tmp_path, *args, name=name, leader=leader).start()
        started.append(operator)
        return operator

    yield start
    for operator in started:
        operator.stop()
    for operator in started:
        assert "Traceback" not in operator.log(), operator.log()


@pytest.fixture
def operator(k8s: LocalCluster, tmp_path: Path) -> Iterator[Operator]:
    """One operator with the default arguments, on `k8s` with the CRD installed."""
    k8s.install_crd(CRD)
    started = Operator(k8s, tmp_path).start()
    try:
        yield started
    finally:
        started.stop()
    assert "Traceback" not in started.log(), started.log()
