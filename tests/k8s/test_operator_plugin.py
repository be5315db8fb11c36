"""A plugin publisher through the real operator (kopf) and the API server: installed beside
the operator (tests/publisher_plugin, on its path with its entry point), set by the
resource's generic block, its Secret held to consent, its options checked against its
description, and its workers rendered from it. The CRD is not changed for it."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from .cluster import LocalCluster
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
PLUGIN_DIR = Path(__file__).resolve().parent.parent / "publisher_plugin"
SEAL = {"name": "owl-seal", "key": "seal"}


def plugin(**block: Any) -> dict[str, Any]:
    return {
        "type": "plugin",
        "plugin": {
            "name": "owlpost",
            "options": {"owlpost-roost": "/var/roost"},
            "secretRefs": {"owlpost-seal": SEAL},
            **block,
        },
    }


def seal_secret(shared_with: str | None) -> dict[str, Any]:
    secret = secret_manifest("owl-seal", seal="s3al-value")
    if shared_with is None:
        del secret["metadata"]["annotations"]
    else:
        secret["metadata"]["annotations"] = {"outbox.dev/dispatchers": shared_with}
    return secret


def ready_reason(cluster: LocalCluster, reason: str) -> dict[str, Any]:
    return wait_for(
        f"Ready=False with {reason}",
        lambda: (c := condition(cluster, "orders", "Ready")).get("reason") == reason and c,
    )


def test_the_operator_serves_a_plugin_from_its_description(
    cluster: LocalCluster,
    operators: Callable[..., Operator],
    dsn: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("PYTHONPATH", str(PLUGIN_DIR))  # installed beside the operator
    operators()
    apply(
        cluster,
        secret_manifest("orders-db", dsn=dsn),
        seal_secret(shared_with=None),
        dispatcher_manifest(publisher=plugin()),
    )
    # Its Secret is held to consent like any other, named by where the block names it.
    refused = ready_reason(cluster, "SecretNotShared")
    assert "spec.publisher.plugin.secretRefs.owlpost-seal" in refused["message"]
    assert deployment_of(cluster) is None

    apply(cluster, seal_secret(shared_with="orders"))
    deployment = wait_for("the workers' Deployment", lambda: deployment_of(cluster))
    [container] = deployment["spec"]["template"]["spec"]["containers"]
    env = {item["name"]: item.get("value", item.get("valueFrom")) for item in container["env"]}
    assert env["OUTBOX_PUBLISHER"] == "owlpost"
    assert env["OUTBOX_OWLPOST_ROOST"] == "/var/roost"
    assert env["OUTBOX_OWLPOST_SEAL"] == {"secretKeyRef": SEAL}

    # A secret written into the resource is refused by the plugin's own description.
    apply(cluster, dispatcher_manifest(publisher=plugin(options={"owlpost-seal": "hunter2"})))
    invalid = ready_reason(cluster, "InvalidPublisherOptions")
    assert (
        "spec.publisher.plugin.options.owlpost-seal: --owlpost-seal is a secret"
        in (invalid["message"])
    )
    assert "hunter2" not in invalid["message"]


def test_a_plugin_not_installed_beside_the_operator_is_unavailable(
    cluster: LocalCluster, operators: Callable[..., Operator], dsn: str
) -> None:
    operators()
    apply(cluster, secret_manifest("orders-db", dsn=dsn), seal_secret(shared_with="*"))
    apply(cluster, dispatcher_manifest(publisher=plugin()))
    unavailable = ready_reason(cluster, "PublisherUnavailable")
    assert "the worker image has no 'owlpost' publisher" in unavailable["message"]
    assert deployment_of(cluster) is None
