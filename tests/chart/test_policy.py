"""The chart's `policy` values: what the cluster admin sets reaches the operator as the
settings it means, the defaults are the narrowest, and a bad entry is refused by Helm."""

from __future__ import annotations

from typing import Any

import helm_python as helm
import pytest

from chart import chart as c
from outbox.controller.images import allowed_images
from outbox.controller.settings import ControllerSettings, load_settings

DIGEST = "sha256:" + "e" * 64


def operator_settings(values: dict[str, Any]) -> ControllerSettings:
    """The rendered operator container's arguments, given to the operator's own parser."""
    [container] = c.render(values).one("Deployment")["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e.get("value", "from-the-pod") for e in container["env"]}
    return load_settings(container["args"], env)


def test_the_defaults_are_the_narrowest_policy() -> None:
    settings = operator_settings({})
    assert settings.secret_consent is True and settings.allow_affinity is False
    assert settings.allowed_service_accounts == settings.allowed_tolerations == ()
    assert settings.allowed_node_selectors == settings.allowed_priority_classes == ()
    assert settings.allowed_pod_labels == settings.allowed_pod_annotations == ()
    # The workers may run the operator's own repository, which the chart's image names.
    assert settings.allowed_images == ()
    assert allowed_images(settings) == ("docker.io/library/outbox-dispatcher",)
    pinned = operator_settings(
        {"image": {"repository": "registry.example/platform/outbox-dispatcher", "digest": DIGEST}}
    )
    assert allowed_images(pinned) == ("registry.example/platform/outbox-dispatcher",)


def test_every_policy_value_reaches_the_operator() -> None:
    settings = operator_settings(
        {
            "policy": {
                "secretConsent": False,
                "images": ["registry.example/platform/*", f"ghcr.io/acme/outbox@{DIGEST}"],
                "serviceAccounts": ["outbox-worker"],
                "tolerations": ["dedicated=outbox", "spot"],
                "nodeSelectors": ["pool=workers"],
                "priorityClasses": ["batch-low"],
                "podLabels": ["team", "example.com/*"],
                "podAnnotations": ["team.example.com/*"],
                "affinity": True,
            }
        }
    )
    assert settings.secret_consent is False and settings.allow_affinity is True
    assert settings.allowed_images == (
        "registry.example/platform/*",
        f"ghcr.io/acme/outbox@{DIGEST}",
    )
    assert settings.allowed_service_accounts == ("outbox-worker",)
    assert settings.allowed_tolerations == ("dedicated=outbox", "spot")
    assert settings.allowed_node_selectors == ("pool=workers",)
    assert settings.allowed_priority_classes == ("batch-low",)
    assert settings.allowed_pod_labels == ("team", "example.com/*")
    assert settings.allowed_pod_annotations == ("team.example.com/*",)


@pytest.mark.parametrize(
    ("values", "says"),
    [
        ({"policy": {"secretConsent": "yes"}}, "at '/policy/secretConsent'"),
        ({"policy": {"images": ["a,b"]}}, "at '/policy/images/0'"),
        ({"policy": {"serviceAccounts": ["Admin"]}}, "at '/policy/serviceAccounts/0'"),
        ({"policy": {"priorityClasses": ["a b"]}}, "at '/policy/priorityClasses/0'"),
        ({"policy": {"secretsByConsent": True}}, "additional properties 'secretsByConsent'"),
    ],
)
def test_bad_policy_values_are_refused_by_helm(values: dict[str, Any], says: str) -> None:
    with pytest.raises(helm.HelmValuesError) as refused:
        c.render(values)
    assert says in str(refused.value), str(refused.value)


def test_the_notes_say_how_to_share_the_secret_when_consent_is_on() -> None:
    annotate = "annotate secret orders-db outbox.dev/dispatchers=orders"
    assert annotate in c.render().notes
    assert annotate not in c.render({"policy": {"secretConsent": False}}).notes
