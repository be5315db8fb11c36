"""Nothing a resource's author writes is expanded by Kubernetes: `$(OUTBOX_DSN)` written into
the URL the messages go to, or into a variable of `worker.env`, reaches the worker process a
kubelet starts as that text, never as the database's connection string.

The local kubelet expands `$(VAR)` and reads `$$` as a real one does (expansion.py), so the
worker's environment here is the one a node would give it.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from outbox.demo.sink import Sink

from .cluster import LocalCluster
from .kubelet import Kubelet
from .test_operator import (
    NS,
    Operator,
    apply,
    dispatcher_manifest,
    enqueue,
    secret_manifest,
    wait_for,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]
REF = "$(OUTBOX_DSN)"


def environ(pid: int) -> dict[str, str]:
    """The environment a process started with."""
    raw = Path(f"/proc/{pid}/environ").read_bytes().decode()
    return dict(item.split("=", 1) for item in raw.split("\0") if "=" in item)


def test_a_reference_to_the_dsn_reaches_the_worker_as_text(
    dsn: str, k8s: LocalCluster, kubelet: Kubelet, operator: Operator
) -> None:
    with Sink() as listener:
        url = f"{listener.url}?d={REF}"
        apply(
            k8s,
            secret_manifest("orders-db", dsn=dsn),
            dispatcher_manifest(
                publisher={"type": "http", "http": {"url": url, "timeout": "5s"}},
                worker={"env": [{"name": "NOTE", "value": f"dsn={REF}; cost 5$$"}]},
            ),
        )
        enqueue(dsn, 3)
        # The worker posts to the URL as written, and the listener gets each message.
        assert listener.wait_for(lambda s: len(s.delivered()) >= 3, timeout=120), (
            kubelet.errors,
            [kubelet.logs(NS, p.name) for p in kubelet.pods(NS, "orders-worker")],
        )
    pod = wait_for("a worker pod", lambda: kubelet.pods(NS, "orders-worker"))[0]
    seen = environ(pod.process.pid)
    assert seen["OUTBOX_HTTP_URL"] == url
    assert seen["NOTE"] == f"dsn={REF}; cost 5$$"
    assert seen["OUTBOX_DSN"] == dsn  # from the Secret, as ever
    assert [name for name, value in seen.items() if dsn in value] == ["OUTBOX_DSN"]
