"""Server-side apply in the emulator, checked against what the Kubernetes documentation says
it does (https://kubernetes.io/docs/reference/using-api/server-side-apply/), with the real
`kubectl apply --server-side` where kubectl can say it:

- every write records its field manager in `managedFields` (Apply or Update);
- a field set to the same value by two appliers is owned by both; a different value is a
  409 conflict naming the other manager and the field, unless forced, which takes it over;
- updates (kubectl scale, patch) never conflict: they take the fields they change;
- a field an applier stops applying is removed, unless another manager owns it too;
- associative lists are merged item by item (containers and env by name), sets value by
  value, atomic lists replaced whole; status is not applied through the main resource.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
import yaml

from .cluster import LocalCluster
from .test_emulator import WIDGETS, http

Manifest = dict[str, Any]


def deployment(**spec: Any) -> Manifest:
    labels = {"app": "web"}
    container: Manifest = {"name": "main", "image": "example/web:1"}
    container.update(spec.pop("container", {}))
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "web"},
        "spec": {
            "selector": {"matchLabels": labels},
            "template": {"metadata": {"labels": labels}, "spec": {"containers": [container]}},
            **spec,
        },
    }


def apply(
    k8s: LocalCluster, obj: Manifest, manager: str, *extra: str, check: bool = True
) -> tuple[int, str]:
    result = k8s.kubectl(
        "apply",
        "--server-side",
        f"--field-manager={manager}",
        *extra,
        "-f",
        "-",
        input=yaml.safe_dump(obj),
        check=check,
    )
    return result.returncode, result.stdout + result.stderr


def stored(k8s: LocalCluster, api: str = "apps/v1", plural: str = "deployments") -> Manifest:
    [obj] = k8s.objects(api, plural, "default")
    return obj


def owners(obj: Manifest) -> dict[tuple[str, str], Manifest]:
    """(manager, operation) -> the fields it owns (FieldsV1)."""
    return {(e["manager"], e["operation"]): e["fieldsV1"] for e in obj["metadata"]["managedFields"]}


def test_an_apply_creates_and_names_its_manager(k8s: LocalCluster) -> None:
    _, out = apply(k8s, deployment(replicas=2), "deployer")
    assert "deployment.apps/web serverside-applied" in out
    obj = stored(k8s)
    [entry] = obj["metadata"]["managedFields"]
    assert (entry["manager"], entry["operation"], entry["apiVersion"]) == (
        "deployer",
        "Apply",
        "apps/v1",
    )
    assert entry["fieldsType"] == "FieldsV1"
    # Exactly what was applied: the defaults the server added (strategy, ...) belong to no one;
    # the selector is an atomic map; a container is an item of a list keyed by name.
    assert entry["fieldsV1"]["f:spec"] == {
        "f:replicas": {},
        "f:selector": {},
        "f:template": {
            "f:metadata": {"f:labels": {"f:app": {}}},
            "f:spec": {
                "f:containers": {
                    'k:{"name":"main"}': {".": {}, "f:image": {}, "f:name": {}},
                }
            },
        },
    }
    assert obj["spec"]["strategy"]["type"] == "RollingUpdate"  # defaulted all the same
    # The same configuration again changes nothing, not even the resourceVersion.
    apply(k8s, deployment(replicas=2), "deployer")
    assert stored(k8s)["metadata"]["resourceVersion"] == obj["metadata"]["resourceVersion"]


def test_two_appliers_of_the_same_value_share_it_and_a_different_value_conflicts(
    k8s: LocalCluster,
) -> None:
    apply(k8s, deployment(replicas=2), "deployer")
    shared = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web"},
              "spec": {"replicas": 2}}  # fmt: skip
    apply(k8s, shared, "autoscaler")
    both = owners(stored(k8s))
    assert "f:replicas" in both[("deployer", "Apply")]["f:spec"]
    assert both[("autoscaler", "Apply")]["f:spec"] == {"f:replicas": {}}
    # A different value of a field the other owns: 409, naming the manager and the field.
    code, out = apply(k8s, {**shared, "spec": {"replicas": 5}}, "autoscaler", check=False)
    assert code != 0
    assert 'Apply failed with 1 conflict: conflict with "deployer": .spec.replicas' in out, out
    assert stored(k8s)["spec"]["replicas"] == 2
    status, body = http(
        k8s,
        "PATCH",
        "/apis/apps/v1/namespaces/default/deployments/web?fieldManager=autoscaler",
        {**shared, "spec": {"replicas": 5}},
        content_type="application/apply-patch+yaml",
    )
    assert (status, body["reason"]) == (409, "Conflict")
    assert body["details"]["causes"] == [
        {
            "type": "FieldManagerConflict",
            "message": 'conflict with "deployer"',
            "field": ".spec.replicas",
        }
    ]


def test_force_takes_the_field_over(k8s: LocalCluster) -> None:
    apply(k8s, deployment(replicas=2), "deployer")
    scaled = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web"},
              "spec": {"replicas": 5}}  # fmt: skip
    code, out = apply(k8s, scaled, "autoscaler", "--force-conflicts")
    assert code == 0, out
    obj = stored(k8s)
    assert obj["spec"]["replicas"] == 5
    fields = owners(obj)
    assert "f:replicas" not in fields[("deployer", "Apply")]["f:spec"]
    assert fields[("autoscaler", "Apply")]["f:spec"] == {"f:replicas": {}}
    # Now the deployer is the one that conflicts on it.
    code, out = apply(k8s, deployment(replicas=2), "deployer", check=False)
    assert 'conflict with "autoscaler": .spec.replicas' in out, out
    # And without the field in its configuration, it no longer cares: no conflict, 5 stays.
    apply(k8s, deployment(), "deployer")
    assert stored(k8s)["spec"]["replicas"] == 5


def test_updates_take_fields_without_conflict_and_appliers_then_conflict_with_them(
    k8s: LocalCluster,
) -> None:
    apply(k8s, deployment(replicas=2), "deployer")
    k8s.kubectl("scale", "deployment", "web", "--replicas=4")
    obj = stored(k8s)
    assert obj["spec"]["replicas"] == 4
    scale = next(e for e in obj["metadata"]["managedFields"] if e["operation"] == "Update")
    assert scale["subresource"] == "scale"
    assert scale["fieldsV1"] == {"f:spec": {"f:replicas": {}}}
    assert "f:replicas" not in owners(obj)[("deployer", "Apply")]["f:spec"]
    code, out = apply(k8s, deployment(replicas=2), "deployer", check=False)
    assert code != 0
    assert (
        f'conflict with "{scale["manager"]}" with subresource "scale" using apps/v1: '
        ".spec.replicas" in out
    ), out
    # A merge patch is an update too: it takes the image from the applier.
    k8s.kubectl("patch", "deployment", "web", "--type=merge", "-p",
                json.dumps({"spec": {"template": {"spec": {"containers": [
                    {"name": "main", "image": "example/web:2"}]}}}}))  # fmt: skip
    patched = owners(stored(k8s))
    assert ("kubectl-patch", "Update") in patched, sorted(patched)


def test_a_field_no_longer_applied_is_removed_unless_another_manager_owns_it(
    k8s: LocalCluster,
) -> None:
    env = [{"name": "A", "value": "1"}, {"name": "B", "value": "2"}]
    apply(
        k8s,
        deployment(minReadySeconds=5, container={"env": env, "args": ["--x", "--y"]}),
        "deployer",
    )
    # Another applier manages env B (the same value: shared) and the atomic args list.
    other = deployment(container={"env": [{"name": "B", "value": "2"}], "args": ["--x", "--y"]})
    del other["spec"]["selector"], other["spec"]["template"]["metadata"]
    apply(k8s, other, "sidecar-injector")
    # The deployer drops minReadySeconds, env A and B, and the args.
    apply(k8s, deployment(), "deployer")
    obj = stored(k8s)
    [container] = obj["spec"]["template"]["spec"]["containers"]
    assert "minReadySeconds" not in obj["spec"]  # owned by no one else: removed
    assert container["env"] == [{"name": "B", "value": "2"}]  # A removed, B still owned
    assert container["args"] == ["--x", "--y"]  # owned by the other applier too
    assert container["image"] == "example/web:1"
    # The other applier lets go as well: now they go.
    apply(k8s, {**other, "spec": {"template": {"spec": {"containers": [{"name": "main"}]}}}},
          "sidecar-injector")  # fmt: skip
    [container] = stored(k8s)["spec"]["template"]["spec"]["containers"]
    assert "env" not in container and "args" not in container


def test_associative_lists_merge_item_by_item_in_the_applied_order(k8s: LocalCluster) -> None:
    first = deployment(container={"env": [{"name": "A", "value": "1"}]})
    apply(k8s, first, "deployer")
    sidecar = deployment()
    sidecar["spec"]["template"]["spec"]["containers"] = [
        {"name": "proxy", "image": "example/proxy:1", "ports": [{"containerPort": 15001}]}
    ]
    del sidecar["spec"]["selector"], sidecar["spec"]["template"]["metadata"]
    apply(k8s, sidecar, "injector")
    containers = stored(k8s)["spec"]["template"]["spec"]["containers"]
    assert [c["name"] for c in containers] == ["main", "proxy"]
    assert containers[1]["ports"] == [{"containerPort": 15001, "protocol": "TCP"}]
    fields = owners(stored(k8s))
    assert list(
        fields[("injector", "Apply")]["f:spec"]["f:template"]["f:spec"]["f:containers"]
    ) == ['k:{"name":"proxy"}']
    # A port is keyed by containerPort and protocol, the protocol defaulting to TCP.
    proxy = fields[("injector", "Apply")]["f:spec"]["f:template"]["f:spec"]["f:containers"]
    assert 'k:{"containerPort":15001,"protocol":"TCP"}' in proxy['k:{"name":"proxy"}']["f:ports"]
    # The deployer's next configuration changes its container only.
    apply(k8s, deployment(container={"image": "example/web:2"}), "deployer")
    containers = stored(k8s)["spec"]["template"]["spec"]["containers"]
    assert [(c["name"], c["image"]) for c in containers] == [
        ("main", "example/web:2"),
        ("proxy", "example/proxy:1"),
    ]
    assert "env" not in containers[0]


@pytest.fixture
def widget_crd(k8s: LocalCluster) -> LocalCluster:
    k8s.kubectl("apply", "--server-side", "-f", str(WIDGETS))
    return k8s


def widget(**spec: Any) -> Manifest:
    return {"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w"},
            "spec": {"size": 1, **spec}}  # fmt: skip


def test_a_custom_resources_sets_maps_and_atomic_lists_follow_its_schema(
    widget_crd: LocalCluster,
) -> None:
    k8s = widget_crd
    apply(k8s, widget(tags=["a", "b"], labels={"team": "x"}), "one")
    apply(k8s, widget(tags=["c"], labels={"tier": "web"}), "two")
    obj = stored(k8s, "example.com/v1", "widgets")
    # x-kubernetes-list-type: set merges value by value; a map merges key by key.
    assert obj["spec"]["tags"] == ["a", "b", "c"]
    assert obj["spec"]["labels"] == {"team": "x", "tier": "web"}
    fields = owners(obj)
    assert fields[("two", "Apply")]["f:spec"]["f:tags"] == {'v:"c"': {}}
    # `size` has the same value for both: shared, no conflict.
    assert "f:size" in fields[("one", "Apply")]["f:spec"]
    assert "f:size" in fields[("two", "Apply")]["f:spec"]
    # `one` gives up `a`: it goes; `b` too; `c` stays (two's).
    apply(k8s, widget(labels={"team": "x"}), "one")
    assert stored(k8s, "example.com/v1", "widgets")["spec"]["tags"] == ["c"]
    # Status is not applied through the main resource.
    apply(k8s, {**widget(), "status": {"replicas": 3}}, "one")
    assert "status" not in stored(k8s, "example.com/v1", "widgets")


def test_apply_refusals(widget_crd: LocalCluster) -> None:
    k8s = widget_crd
    path = "/apis/example.com/v1/namespaces/default/widgets/w"
    status, body = http(k8s, "PATCH", path, widget(), content_type="application/apply-patch+yaml")
    assert (status, body["reason"]) == (422, "Invalid")
    assert "fieldManager: Required value: is required for apply patch" in body["message"]
    status, body = http(
        k8s,
        "PATCH",
        path + "?fieldManager=me",
        {**widget(), "metadata": {"name": "w", "managedFields": [{"manager": "x"}]}},
        content_type="application/apply-patch+yaml",
    )
    assert (status, body["message"]) == (400, "metadata.managedFields must be nil")
    status, body = http(
        k8s,
        "PATCH",
        "/apis/example.com/v1/namespaces/nowhere/widgets/w?fieldManager=me",
        widget(),
        content_type="application/apply-patch+yaml",
    )
    assert (status, body["reason"]) == (404, "NotFound")
    status, _ = http(
        k8s, "PATCH", path + "?fieldManager=me", widget(),
        content_type="application/apply-patch+yaml",
    )  # fmt: skip
    assert status == 201
    stale = {**widget(size=2), "metadata": {"name": "w", "resourceVersion": "1"}}
    status, body = http(
        k8s, "PATCH", path + "?fieldManager=me", stale, content_type="application/apply-patch+yaml"
    )
    assert (status, body["reason"]) == (409, "Conflict")  # a stale resourceVersion
    # The CRD's schema still decides: an invalid applied value is refused like any write.
    status, body = http(
        k8s,
        "PATCH",
        path + "?fieldManager=me",
        widget(size=11),
        content_type="application/apply-patch+yaml",
    )
    assert (status, body["reason"]) == (422, "Invalid")
    assert "force: Forbidden" in http(
        k8s, "PATCH", path + "?force=true", {"spec": {"size": 2}},
        content_type="application/merge-patch+json",
    )[1]["message"]  # fmt: skip
