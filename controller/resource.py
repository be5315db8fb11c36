"""The OutboxDispatcher resource's names, and the labels of what the operator makes for it."""

from __future__ import annotations

from typing import Any

GROUP = "outbox.dev"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "OutboxDispatcher"
PLURAL = "outboxdispatchers"
MANAGER = "outbox-controller"  # app.kubernetes.io/managed-by, field manager, Event source
# A label value holds at most 63 characters, and the resource's name is one: the value of the
# worker pods' app.kubernetes.io/instance label (and of the selector). The CRD refuses longer
# names at admission (its root CEL rule; tests/test_controller_crd.py keeps the two equal);
# no label value the operator writes adds a suffix to the name.
LABEL_VALUE_MAX = 63
MAX_NAME_LENGTH = LABEL_VALUE_MAX


def deployment_name(resource_name: str) -> str:
    return f"{resource_name}-worker"


def selector_labels(resource_name: str) -> dict[str, str]:
    """The worker pods' selector: fixed for the Deployment's life (selectors are immutable)."""
    return {
        "app.kubernetes.io/name": "outbox-dispatcher",
        "app.kubernetes.io/instance": resource_name,
        "app.kubernetes.io/component": "worker",
    }


def labels(resource_name: str) -> dict[str, str]:
    return {**selector_labels(resource_name), "app.kubernetes.io/managed-by": MANAGER}


def selector_string(resource_name: str) -> str:
    """The selector as the scale subresource reports it (status.selector)."""
    return ",".join(f"{k}={v}" for k, v in sorted(selector_labels(resource_name).items()))


def owner_reference(name: str, uid: str | None) -> dict[str, Any]:
    """Makes the Deployment the resource's: deleting the resource deletes it (and its pods).
    A stored resource always has its uid."""
    if uid is None:
        raise ValueError(f"resource {name} has no uid: it is not one the API server stored")
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "name": name,
        "uid": uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }
