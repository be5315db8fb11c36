"""Each dispatcher's worker pods get a NetworkPolicy of their own, as a pure function.

The operator makes the worker pods, in whatever namespaces it serves (all of them, in the
cluster-wide mode), so it is the one that can fence them in: beside each worker Deployment
it keeps a NetworkPolicy selecting the same pods, owned by the resource (deleted with it).
Ingress is their metrics port only (/metrics, /healthz, /readyz), from the peers the cluster
admin allows (`--worker-metrics-from`; the chart's `networkPolicy.metricsFrom`, by default
the `monitoring` namespace). Nothing else may connect to a worker: it serves nothing else.
Egress is left open: the workers reach their database and their destinations, wherever
those are. The kubelet's probes come from the node, which NetworkPolicy always admits.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from outbox.controller.render import METRICS_PORT_NAME
from outbox.controller.resource import deployment_name, labels, owner_reference, selector_labels
from outbox.controller.spec import DispatcherSpec

Body = Mapping[str, Any]


def network_policy_name(resource_name: str) -> str:
    return deployment_name(resource_name)  # the Deployment's name: one pair per resource


def render_network_policy(
    spec: DispatcherSpec, metrics_from: Sequence[Mapping[str, Any]]
) -> dict[str, Any]:
    """The worker pods' NetworkPolicy for the resource `spec`; `metrics_from` empty: any
    source may reach the metrics port (and still nothing else)."""
    name = spec.name
    rule: dict[str, Any] = {"ports": [{"port": METRICS_PORT_NAME, "protocol": "TCP"}]}
    if metrics_from:
        rule["from"] = [dict(peer) for peer in metrics_from]
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {
            "name": network_policy_name(name),
            "namespace": spec.namespace,
            "labels": labels(name),
            "ownerReferences": [owner_reference(name, spec.uid)],
        },
        "spec": {
            "podSelector": {"matchLabels": selector_labels(name)},
            "policyTypes": ["Ingress"],
            "ingress": [rule],
        },
    }


def differs(current: Body, rendered: Body) -> bool:
    """Whether the policy in the cluster is not the one rendered (someone edited it, or the
    settings changed): its spec, labels and owner."""
    meta, want = current.get("metadata") or {}, rendered["metadata"]
    return (
        current.get("spec") != rendered["spec"]
        or {**(meta.get("labels") or {}), **want["labels"]} != (meta.get("labels") or {})
        or [r.get("uid") for r in meta.get("ownerReferences") or []]
        != [r["uid"] for r in want["ownerReferences"]]
    )
