"""Rotating a Secret the workers use, other than the DSN's, with the real operator against the
emulator and kubectl: the pod template's hash of every Secret's version changes, so the
workers roll and start with the new value (a Standard Webhooks signing key dropped from the
Secret is no longer used by any worker)."""

from __future__ import annotations

import base64
from collections.abc import Callable

import pytest

from .cluster import LocalCluster
from .kubelet import Kubelet
from .test_operator import (
    Operator,
    apply,
    condition,
    deployment_of,
    dispatcher_manifest,
    secret_manifest,
    wait_for,
)

pytestmark = pytest.mark.slow
SECRETS_HASH = "outbox.dev/secrets-hash"
# A rotated Secret is read at the next pass, not after the default minute (docs/operator.md).
QUICK_RECHECK = ("--secret-recheck", "1s")


def _key(seed: int) -> str:
    return "whsec_" + base64.b64encode(bytes(range(seed, seed + 32))).decode()


def _hash(k8s: LocalCluster) -> str:
    d = deployment_of(k8s)
    if d is None:
        return ""
    return str(d["spec"]["template"]["metadata"].get("annotations", {}).get(SECRETS_HASH, ""))


# `dsn` first: the database outlives the workers at teardown.
def test_a_rotated_signing_secret_rolls_the_workers(
    dsn: str, cluster: LocalCluster, kubelet: Kubelet, operators: Callable[..., Operator]
) -> None:
    operators(*QUICK_RECHECK)
    old, new = _key(1), _key(101)
    publisher = {
        "type": "http",
        "http": {
            "url": "http://127.0.0.1:9/in",
            "signingSecretRef": {"name": "signing", "key": "secrets"},
        },
    }
    apply(
        cluster,
        secret_manifest("orders-db", dsn=dsn),
        secret_manifest("signing", secrets=old),
        dispatcher_manifest(publisher=publisher),
    )
    wait_for(
        "a ready worker", lambda: condition(cluster, "orders", "Ready").get("status") == "True"
    )
    [pod] = kubelet.pods("default", "orders-worker")
    before = _hash(cluster)
    assert before, deployment_of(cluster)

    # Standard Webhooks rotation: add the new key, later drop the old one; a value the worker
    # would refuse in between rolls nothing (the last validated template holds).
    for step, value in (("added", f"{new}\n{old}"), ("mistyped", "whsec_?"), ("dropped", new)):
        if step == "mistyped":
            apply(cluster, secret_manifest("signing", secrets=value))
            wait_for(
                "InvalidSigningSecret",
                lambda: (
                    condition(cluster, "orders", "Ready").get("reason") == "InvalidSigningSecret"
                ),
            )
            assert _hash(cluster) == before
            assert [p.record.pid for p in kubelet.pods("default", "orders-worker")] == [
                pod.record.pid
            ]
            continue
        apply(cluster, secret_manifest("signing", secrets=value))
        after = wait_for(
            f"the template's hash after the key is {step}",
            lambda b=before: (h := _hash(cluster)) != b and h,
        )
        pid = pod.record.pid
        rolled = wait_for(
            f"the workers rolled after the key is {step}",
            lambda p=pid: (
                (pods := kubelet.pods("default", "orders-worker"))
                and all(q.record.pid != p and q.ready for q in pods)
                and pods
            ),
        )
        [pod] = rolled
        before = after
    # Versions only: no key is copied into the Deployment.
    d = deployment_of(cluster)
    assert d is not None
    assert old not in str(d) and new not in str(d)
