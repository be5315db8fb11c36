"""Where /metrics and /healthz listen: a setting of the worker (--metrics-address) and of the
operator (--health-address), every IPv4 interface by default (a pod's IP, for kubelet's
probes and Prometheus), loopback when asked; and the operator's peers for the workers'
NetworkPolicy, refused when they are not peers."""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
from helpers import wait_until

from outbox.controller.metrics import HealthServer as OperatorHealth
from outbox.controller.metrics import Metrics as OperatorMetrics
from outbox.controller.settings import load_settings as operator_settings
from outbox.plumbing.errors import SettingError
from outbox.worker.metrics import HealthServer as WorkerHealth
from outbox.worker.metrics import Metrics as WorkerMetrics
from outbox.worker.settings import load_settings as worker_settings

OPERATOR_ENV = {"POD_NAMESPACE": "outbox-system"}


def _get(port: int, path: str) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as response:
        return response.read().decode()


@pytest.mark.parametrize(
    ("server", "address"),
    [
        (lambda a: WorkerHealth(WorkerMetrics(), 0, a), "127.0.0.1"),
        (lambda a: WorkerHealth(WorkerMetrics(), 0, a), "0.0.0.0"),
        (lambda a: OperatorHealth(OperatorMetrics(), 0, a), "127.0.0.1"),
        (lambda a: OperatorHealth(OperatorMetrics(), 0, a), "0.0.0.0"),
    ],
    ids=["worker-loopback", "worker-any", "operator-loopback", "operator-any"],
)
async def test_the_health_server_listens_on_the_address_given(server, address):
    health = server(address)
    await health.start()
    try:
        assert health._runner is not None
        assert [a[0] for a in health._runner.addresses] == [address]
        assert await asyncio.to_thread(_get, health.port, "/healthz") == "ok\n"
    finally:
        await health.close()


def test_the_worker_listens_on_every_ipv4_interface_unless_told():
    assert worker_settings(["--dsn", ""], {}).metrics_address == "0.0.0.0"
    assert worker_settings([], {"OUTBOX_METRICS_ADDRESS": "::1"}).metrics_address == "::1"
    assert worker_settings(["--metrics-address", " 127.0.0.1"], {}).metrics_address == "127.0.0.1"
    with pytest.raises(SettingError, match=r"--metrics-address: 'localhost' is not an IP"):
        worker_settings(["--metrics-address", "localhost"], {})


def test_the_operator_listens_on_every_ipv4_interface_unless_told():
    assert operator_settings([], OPERATOR_ENV).health_address == "0.0.0.0"
    settings = operator_settings(["--health-address", "127.0.0.1"], OPERATOR_ENV)
    assert settings.health_address == "127.0.0.1"
    with pytest.raises(SettingError, match="--health-address"):
        operator_settings(["--health-address", "0.0.0.0:8080"], OPERATOR_ENV)


def test_the_operator_takes_network_policy_peers_and_refuses_anything_else():
    default = operator_settings([], OPERATOR_ENV)
    assert (default.worker_network_policy, default.worker_metrics_from) == (False, ())
    peers = [{"namespaceSelector": {"matchLabels": {"team": "observability"}}},
             {"ipBlock": {"cidr": "10.0.0.0/8"}}]  # fmt: skip
    settings = operator_settings(
        ["--worker-network-policy", "on", "--worker-metrics-from", json.dumps(peers)],
        OPERATOR_ENV,
    )
    assert settings.worker_network_policy and list(settings.worker_metrics_from) == peers
    for bad in ("{not json", '{"namespaceSelector": {}}', '[{"ports": []}]', "[{}]"):
        with pytest.raises(SettingError, match="--worker-metrics-from"):
            operator_settings(["--worker-metrics-from", bad], OPERATOR_ENV)


def _listening(pid: int, port: int) -> set[str]:
    """The local addresses process `pid` listens on at `port`, from /proc/PID/net/tcp{,6}."""
    found = set()
    for name in ("tcp", "tcp6"):
        table = Path(f"/proc/{pid}/net/{name}")
        for line in table.read_text().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            address, hex_port = local.split(":")
            if state == "0A" and int(hex_port, 16) == port:  # LISTEN
                found.add(address)
    return found


@pytest.mark.slow
async def test_a_worker_process_keeps_its_metrics_on_loopback_when_asked(dsn, tmp_path):
    log = tmp_path / "worker.log"
    with log.open("ab") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "outbox.worker", "--owner", "w-local", "--publisher", "null",
             "--metrics-port", "0", "--metrics-address", "127.0.0.1"],
            env={**os.environ, "OUTBOX_DSN": dsn, "OUTBOX_LOG_FORMAT": "json"},
            stdout=out, stderr=out,
        )  # fmt: skip
    try:
        await wait_until(lambda: "metrics and health on port" in log.read_text(), what="start")
        port = int(re.search(r"on port (\d+) \(address 127\.0\.0\.1\)", log.read_text())[1])
        assert _listening(proc.pid, port) == {"0100007F"}  # 127.0.0.1, and nothing else
        assert _get(port, "/healthz") == "ok\n"
    finally:
        proc.terminate()
        assert proc.wait(timeout=30) == 0
