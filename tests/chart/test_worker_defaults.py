"""The chart's `workerDefaults`: what the cluster admin sets reaches the operator as the
defaults it applies to every dispatcher's worker pods, the default requests are the operator's
own (one source), each value is one the CRD would admit in spec.worker, and a bad one is
refused by Helm."""

from __future__ import annotations

import copy
from typing import Any

import helm_python as helm
import pytest
import yaml

from chart import chart as c
from outbox.controller.defaults import WORKER_DEFAULT_FIELDS
from outbox.controller.render import render_deployment
from outbox.controller.settings import DEFAULT_WORKER_RESOURCES, ControllerSettings, load_settings
from outbox.controller.spec import DispatcherSpec

VALUES = yaml.safe_load((c.CHART / "values.yaml").read_text())


def operator_settings(values: dict[str, Any]) -> ControllerSettings:
    [container] = c.render(values).one("Deployment")["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e.get("value", "from-the-pod") for e in container["env"]}
    return load_settings(container["args"], env)


def dispatcher(worker: dict[str, Any] | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {
        "apiVersion": "outbox.dev/v1alpha1",
        "kind": "OutboxDispatcher",
        "metadata": {"name": "orders", "namespace": "shop", "uid": "u-1"},
        "spec": {"database": {"dsnSecretRef": {"name": "db"}}, "publisher": {"type": "log"}},
    }
    if worker is not None:
        body["spec"]["worker"] = worker
    c.crd_schema().default(body)
    return body


def test_the_chart_passes_the_operators_own_default_requests() -> None:
    assert VALUES["workerDefaults"]["resources"] == DEFAULT_WORKER_RESOURCES
    assert set(VALUES["workerDefaults"]) == set(WORKER_DEFAULT_FIELDS)
    settings = operator_settings({})
    assert settings.worker_defaults == {"resources": DEFAULT_WORKER_RESOURCES}


ADMIN = {
    "resources": {"requests": {"cpu": "50m", "memory": "96Mi"}, "limits": {"memory": "512Mi"}},
    "imagePullSecrets": [{"name": "regcred"}],
    "nodeSelector": {"pool": "outbox"},
    "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "outbox",
                     "effect": "NoSchedule"}],
    "affinity": {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
        {"weight": 50, "podAffinityTerm": {"topologyKey": "kubernetes.io/hostname"}}]}},
    "topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": "topology.kubernetes.io/zone",
                                   "whenUnsatisfiable": "ScheduleAnyway"}],
    "priorityClassName": "outbox-workers",
}  # fmt: skip


def test_every_default_reaches_the_worker_pods_of_a_resource_that_omits_it() -> None:
    settings = operator_settings({"workerDefaults": copy.deepcopy(ADMIN)})
    assert settings.worker_defaults == ADMIN
    # What the admin may default, a resource author may write: the CRD admits each value.
    assert c.custom_resource_errors(dispatcher(copy.deepcopy(ADMIN))) == []
    deployment = render_deployment(
        DispatcherSpec.parse(dispatcher()),
        replicas=1,
        default_image="i:1",
        defaults=settings.worker_defaults,
    )
    pod = deployment["spec"]["template"]["spec"]
    assert pod["containers"][0]["resources"] == ADMIN["resources"]
    for field in ("imagePullSecrets", "nodeSelector", "tolerations", "affinity",
                  "priorityClassName"):  # fmt: skip
        assert pod[field] == ADMIN[field], field
    [spread] = pod["topologySpreadConstraints"]
    assert spread["labelSelector"] == deployment["spec"]["selector"]
    assert c.object_errors(deployment) == []
    # The resource's own field wins.
    own = render_deployment(
        DispatcherSpec.parse(dispatcher({"nodeSelector": {"pool": "mine"}})),
        replicas=1,
        default_image="i:1",
        defaults=settings.worker_defaults,
    )
    assert own["spec"]["template"]["spec"]["nodeSelector"] == {"pool": "mine"}


def test_empty_defaults_are_left_out() -> None:
    # Helm merges maps: null removes the default requests (an empty map would keep them).
    settings = operator_settings({"workerDefaults": {"resources": None, "priorityClassName": ""}})
    assert settings.worker_defaults == {}
    pod = render_deployment(
        DispatcherSpec.parse(dispatcher()), replicas=1, default_image="i:1", defaults={}
    )
    assert "resources" not in pod["spec"]["template"]["spec"]["containers"][0]


@pytest.mark.parametrize(
    ("values", "says"),
    [
        ({"resources": {"requests": {"cpu": "lots"}}}, "/workerDefaults/resources/requests/cpu"),
        ({"resources": {"claims": []}}, "at '/workerDefaults/resources'"),
        ({"imagePullSecrets": ["regcred"]}, "at '/workerDefaults/imagePullSecrets/0'"),
        ({"priorityClassName": "High"}, "at '/workerDefaults/priorityClassName'"),
        ({"serviceAccountName": "admin"}, "at '/workerDefaults'"),
        ({"topologySpreadConstraints": [{"maxSkew": 0}]}, "/topologySpreadConstraints/0"),
    ],
)  # fmt: skip
def test_bad_defaults_are_refused_by_helm(values: dict[str, Any], says: str) -> None:
    with pytest.raises(helm.HelmValuesError) as refused:
        c.render({"workerDefaults": values})
    assert says in str(refused.value), str(refused.value)


@pytest.mark.parametrize(
    "text",
    ['{"serviceAccountName": "admin"}', "[]", "{", '{"tolerations": {}}',
     '{"nodeSelector": {"a": 1}}', '{"resources": {"claims": []}}',
     '{"priorityClassName": "High"}', '{"resources": {"requests": {"cpu": "lots"}}}',
     '{"resources": {"limits": {"memory": -1}}}', '{"resources": {"limits": {"cpu": true}}}',
     '{"resources": {"limits": "1Gi"}}'],
)  # fmt: skip
def test_the_operator_refuses_bad_defaults_naming_the_flag(text: str) -> None:
    from outbox.plumbing.errors import SettingError

    with pytest.raises(SettingError, match="--worker-defaults"):
        load_settings([f"--worker-defaults={text}"], {"POD_NAMESPACE": "ns"})
