"""Fixtures of the Kubernetes tier: a running emulator (`k8s`) and a local kubelet (`kubelet`).

See README.md in this folder for what the emulator and the kubelet do and do not do.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from .cluster import ADMIN_TOKEN, LocalCluster
from .kubelet import Kubelet

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
