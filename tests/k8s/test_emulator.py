"""The emulator behaves like an API server where the operator and kubectl can tell."""

from __future__ import annotations

import asyncio
import base64
import json
import ssl
import urllib.error
import urllib.request
from http.client import IncompleteRead
from pathlib import Path
from typing import Any

import kmock
import kubernetes.client
import pytest
import yaml
from kubernetes.client.rest import ApiException

from .cluster import ADMIN_TOKEN, LocalCluster
from .rbac import Identity

WIDGETS = Path(__file__).parent / "manifests" / "widgets.yaml"
GROUP, VERSION, PLURAL = "example.com", "v1", "widgets"


def manifest(kind: str, name: str, **fields: Any) -> str:
    api = {"Widget": "example.com/v1", "Deployment": "apps/v1"}.get(kind, "v1")
    return json.dumps({"apiVersion": api, "kind": kind, "metadata": {"name": name}, **fields})


def deployment(name: str, replicas: int = 1, **extra: Any) -> str:
    labels = {"app": name}
    spec = {
        "replicas": replicas,
        "selector": {"matchLabels": labels},
        "template": {
            "metadata": {"labels": labels},
            "spec": {"containers": [{"name": "main", "image": "example/app:1"}]},
        },
        **extra,
    }
    return manifest("Deployment", name, spec=spec)


def http(
    k8s: LocalCluster,
    method: str,
    path: str,
    body: Any = None,
    content_type: str = "application/json",
    token: str = ADMIN_TOKEN,
) -> tuple[int, Any]:
    request = urllib.request.Request(
        k8s.url + path,
        method=method,
        data=None if body is None else json.dumps(body).encode(),
        headers={"Content-Type": content_type, "Authorization": f"Bearer {token}"},
    )
    context = ssl.create_default_context(cafile=str(k8s.ca_path)) if k8s.ca_path else None
    try:
        with urllib.request.urlopen(request, timeout=10, context=context) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def watch(k8s: LocalCluster, path: str, **params: str) -> list[dict[str, Any]]:
    """A watch that ends by itself (timeoutSeconds), read whole."""
    query = "&".join(
        f"{k}={v}" for k, v in {"watch": "true", "timeoutSeconds": "1", **params}.items()
    )
    request = urllib.request.Request(
        f"{k8s.url}{path}?{query}", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        assert response.headers["Content-Type"].startswith("application/json")
        return [json.loads(line) for line in response.read().splitlines() if line]


@pytest.fixture
def widgets(k8s: LocalCluster) -> kubernetes.client.CustomObjectsApi:
    k8s.install_crd(WIDGETS)
    return kubernetes.client.CustomObjectsApi(k8s.api_client())


def get_widget(api: kubernetes.client.CustomObjectsApi, name: str) -> dict[str, Any]:
    return api.get_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, name)  # type: ignore[no-any-return]


# ---- kubectl ------------------------------------------------------------------------------


def test_kubectl_apply_get_patch_scale_delete_a_deployment(k8s: LocalCluster) -> None:
    assert "created" in k8s.kubectl("apply", "-f", "-", input=deployment("web", 2)).stdout
    again = k8s.kubectl("apply", "-f", "-", input=deployment("web", 2)).stdout
    assert "unchanged" in again
    created = k8s.objects("apps/v1", "deployments", "default", "web")[0]
    meta = created["metadata"]
    assert meta["uid"] and meta["creationTimestamp"] and meta["generation"] == 1
    assert created["spec"]["strategy"]["rollingUpdate"] == {
        "maxUnavailable": "25%",
        "maxSurge": "25%",
    }
    table = k8s.kubectl("get", "deployments").stdout
    assert table.split()[:5] == ["NAME", "READY", "UP-TO-DATE", "AVAILABLE", "AGE"]
    assert "web    0/2" in table
    k8s.kubectl(
        "patch",
        "deployment",
        "web",
        "-p",
        json.dumps(
            {
                "spec": {
                    "template": {
                        "spec": {
                            "containers": [{"name": "main", "env": [{"name": "A", "value": "1"}]}]
                        }
                    }
                }
            }
        ),
    )
    k8s.kubectl("scale", "deployment", "web", "--replicas=4")
    patched = k8s.objects("apps/v1", "deployments", "default", "web")[0]
    container = patched["spec"]["template"]["spec"]["containers"][0]
    assert container["image"] == "example/app:1"  # strategic merge: merged by name
    assert container["env"] == [{"name": "A", "value": "1"}]
    assert patched["spec"]["replicas"] == 4
    assert patched["metadata"]["generation"] == 3
    assert int(patched["metadata"]["resourceVersion"]) > int(meta["resourceVersion"])
    scale = k8s.kubectl("get", "deployment", "web", "--subresource=scale", "-o", "json").stdout
    assert json.loads(scale)["apiVersion"] == "autoscaling/v1"
    assert json.loads(scale)["status"]["selector"] == "app=web"
    k8s.kubectl("delete", "deployment", "web")
    assert not k8s.objects("apps/v1", "deployments", "default", "web")


def test_resource_quantities_are_stored_in_canonical_form(k8s: LocalCluster) -> None:
    sized = json.loads(deployment("web"))
    sized["spec"]["template"]["spec"]["containers"][0]["resources"] = {
        "requests": {"cpu": "0.5", "memory": "2048Mi"},
        "limits": {"cpu": "1000m", "memory": "1.5Gi", "ephemeral-storage": "129e6"},
    }
    k8s.kubectl("apply", "-f", "-", input=json.dumps(sized))
    stored = k8s.objects("apps/v1", "deployments", "default", "web")[0]
    resources = stored["spec"]["template"]["spec"]["containers"][0]["resources"]
    assert resources == {
        "requests": {"cpu": "500m", "memory": "2Gi"},
        "limits": {"cpu": "1", "memory": "1536Mi", "ephemeral-storage": "129e6"},
    }


def test_kubectl_prints_the_printer_columns_of_a_crd(k8s: LocalCluster) -> None:
    k8s.kubectl("apply", "-f", str(WIDGETS))
    k8s.kubectl("wait", "--for=condition=Established", "crd/widgets.example.com")
    k8s.kubectl("apply", "-f", "-", input=manifest("Widget", "w1", spec={"size": 4}))
    k8s.kubectl(
        "patch",
        "widget",
        "w1",
        "--subresource=status",
        "--type=merge",
        "-p",
        json.dumps({"status": {"conditions": [{"type": "Ready", "status": "True"}]}}),
    )
    header, row = k8s.kubectl("get", "wd").stdout.splitlines()
    assert header.split() == ["NAME", "SIZE", "MODE", "READY", "AGE"]
    assert row.split()[:4] == ["w1", "4", "slow", "True"]


def test_kubectl_apply_of_a_bad_resource_prints_the_reasons(k8s: LocalCluster) -> None:
    k8s.kubectl("apply", "-f", str(WIDGETS))
    bad = manifest("Widget", "w1", spec={"size": 30, "mode": "turbo", "color": "Blue"})
    result = k8s.kubectl("apply", "-f", "-", input=bad, check=False)
    assert result.returncode == 1
    assert 'The Widget "w1" is invalid' in result.stderr
    assert 'spec.mode: Unsupported value: "turbo": supported values: "slow", "fast"' in (
        result.stderr
    )
    assert "spec.size: Invalid value: 30: spec.size in body should be less than or equal to 10" in (
        result.stderr
    )
    assert "spec.color in body should match '^[a-z]+$'" in result.stderr
    # A wrong type or value keeps the CEL rules from running, as on a real server.
    assert "some validation rules were not checked because the object was invalid" in (
        result.stderr
    )
    unknown = manifest("Widget", "w1", spec={"size": 3, "sise": 3})
    result = k8s.kubectl("apply", "-f", "-", input=unknown, check=False)
    assert 'strict decoding error: unknown field "spec.sise"' in result.stderr
    # Without strict validation (kubectl patch), the field is pruned with a warning, which
    # kubectl prints (the warn-text quoted and escaped as a real server does).
    k8s.kubectl("apply", "-f", "-", input=manifest("Widget", "w1", spec={"size": 3}))
    patched = k8s.kubectl("patch", "widget", "w1", "--type=merge", "-p", '{"spec":{"sise":3}}')
    assert 'Warning: unknown field "spec.sise"' in patched.stderr, patched.stderr
    k8s.kubectl("delete", "widget", "w1")
    no_selector = manifest(
        "Deployment", "web", spec={"template": {"spec": {"containers": [{"image": "x"}]}}}
    )
    result = k8s.kubectl("apply", "-f", "-", input=no_selector, check=False)
    assert "spec.selector: Required value" in result.stderr
    assert "spec.template.spec.containers[0].name: Required value" in result.stderr
    assert not k8s.objects("example.com/v1", "widgets")
    assert not k8s.objects("apps/v1", "deployments")


def test_labels_and_env_names_are_checked_as_a_real_server_does(k8s: LocalCluster) -> None:
    bad = json.loads(deployment("web"))
    bad["metadata"]["labels"] = {"app.kubernetes.io/instance": "x" * 64, "bad key": "v"}
    bad["spec"]["template"]["spec"]["containers"][0]["env"] = [{"name": "1ST", "value": "v"}]
    result = k8s.kubectl("apply", "-f", "-", input=json.dumps(bad), check=False)
    assert f'metadata.labels: Invalid value: "{"x" * 64}": must be no more than 63 characters' in (
        result.stderr
    )
    assert 'metadata.labels: Invalid value: "bad key": name part must consist of' in result.stderr
    assert 'spec.template.spec.containers[0].env[0].name: Invalid value: "1ST"' in result.stderr
    assert not k8s.objects("apps/v1", "deployments")


def test_cel_rules_refuse_with_their_messages(k8s: LocalCluster) -> None:
    k8s.kubectl("apply", "-f", str(WIDGETS))
    bad = manifest(
        "Widget",
        "w1",
        spec={"size": 1, "minReplicas": 4, "maxReplicas": 2, "mode": "fast", "lease": "500ms"},
    )
    result = k8s.kubectl("apply", "-f", "-", input=bad, check=False)
    assert 'spec: Invalid value: "object": minReplicas must not exceed maxReplicas' in (
        result.stderr
    )
    assert "spec.fast: Invalid value" in result.stderr and "mode fast needs the fast" in (
        result.stderr
    )
    assert 'spec.lease: Invalid value: "500ms": lease must be a duration of at least 1s' in (
        result.stderr
    )
    # A value out of range does not keep them from running.
    out_of_range = manifest("Widget", "w1", spec={"size": 11, "minReplicas": 4, "maxReplicas": 2})
    result = k8s.kubectl("apply", "-f", "-", input=out_of_range, check=False)
    assert "spec.size in body should be less than or equal to 10" in result.stderr
    assert "minReplicas must not exceed maxReplicas" in result.stderr
    # A transition rule judges changes only: any owner at first, never another one later.
    k8s.kubectl(
        "apply", "-f", "-", input=manifest("Widget", "w1", spec={"size": 1, "owner": "alice"})
    )
    result = k8s.kubectl(
        "apply",
        "-f",
        "-",
        check=False,
        input=manifest("Widget", "w1", spec={"size": 1, "owner": "bob"}),
    )
    assert 'spec.owner: Invalid value: "bob": owner is immutable' in result.stderr
    k8s.kubectl(
        "apply", "-f", "-", input=manifest("Widget", "w1", spec={"size": 2, "owner": "alice"})
    )


def test_a_crd_with_a_broken_cel_rule_is_refused(k8s: LocalCluster) -> None:
    crd = yaml.safe_load(WIDGETS.read_text())
    crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"][
        "x-kubernetes-validations"
    ] = [{"rule": "self.minReplicas <="}]
    result = k8s.kubectl("apply", "-f", "-", input=json.dumps(crd), check=False)
    assert "compilation failed" in result.stderr and "self.minReplicas <=" in result.stderr


def test_kubectl_server_dry_run_stores_nothing(k8s: LocalCluster) -> None:
    out = k8s.kubectl("apply", "--dry-run=server", "-f", "-", input=deployment("web")).stdout
    assert "created (server dry run)" in out
    assert not k8s.objects("apps/v1", "deployments")


def test_faults_can_be_injected_with_kmocks_dsl(k8s: LocalCluster) -> None:
    k8s.kubectl("apply", "-f", "-", input=deployment("web"))
    deployments = kmock.resource("apps", "v1", "deployments")
    k8s.on_loop(lambda emulator: emulator["patch", deployments][:1] << 503)
    failed = k8s.kubectl("scale", "deployment", "web", "--replicas=3", check=False)
    assert "ServiceUnavailable" in failed.stderr
    k8s.kubectl("scale", "deployment", "web", "--replicas=3")  # the fault was for one request
    assert k8s.objects("apps/v1", "deployments", "default", "web")[0]["spec"]["replicas"] == 3


def test_protobuf_bodies_are_refused_with_a_hint(k8s: LocalCluster) -> None:
    # kubectl's typed generators speak protobuf; past the few kinds the emulator reads that
    # way (namespaces, secrets, configmaps), it says to use apply instead.
    result = k8s.kubectl("create", "deployment", "team", "--image=team:1", check=False)
    assert "use kubectl apply -f" in result.stderr


def test_kubectl_create_of_a_namespace_a_secret_and_a_configmap(k8s: LocalCluster) -> None:
    # What the docs tell users to run, sent as protobuf by kubectl's generators.
    k8s.kubectl("create", "namespace", "team")
    k8s.kubectl("-n", "team", "create", "secret", "generic", "db", "--from-literal=dsn=x://y")
    k8s.kubectl("-n", "team", "create", "configmap", "cfg", "--from-literal=a=b")
    [namespace] = k8s.objects("v1", "namespaces", None, "team")
    assert namespace["status"]["phase"] == "Active"
    [secret] = k8s.objects("v1", "secrets", "team", "db")
    assert base64.b64decode(secret["data"]["dsn"]) == b"x://y"
    assert secret["type"] == "Opaque"
    [config] = k8s.objects("v1", "configmaps", "team", "cfg")
    assert config["data"] == {"a": "b"}
    # kubectl names itself as their manager.
    assert namespace["metadata"]["managedFields"][0]["manager"] == "kubectl-create"


# ---- server-owned fields and the subresources ---------------------------------------------


def test_generation_moves_with_spec_only_and_status_goes_through_its_subresource(
    k8s: LocalCluster, widgets: kubernetes.client.CustomObjectsApi
) -> None:
    body = {
        "apiVersion": "example.com/v1",
        "kind": "Widget",
        "metadata": {"generateName": "w-"},
        "spec": {"size": 1},
        "status": {"replicas": 7},
    }
    status, created = http(k8s, "POST", "/apis/example.com/v1/namespaces/default/widgets", body)
    assert status == 201
    name = created["metadata"]["name"]
    assert name.startswith("w-") and len(name) == 7
    assert created["metadata"]["generation"] == 1 and "status" not in created
    widgets.patch_namespaced_custom_object(
        GROUP, VERSION, "default", PLURAL, name, {"metadata": {"labels": {"a": "b"}}}
    )
    widgets.patch_namespaced_custom_object_status(
        GROUP, VERSION, "default", PLURAL, name, {"status": {"replicas": 2}, "spec": {"size": 9}}
    )
    current = get_widget(widgets, name)
    assert current["metadata"]["generation"] == 1
    assert current["status"] == {"replicas": 2} and current["spec"]["size"] == 1
    widgets.patch_namespaced_custom_object(
        GROUP, VERSION, "default", PLURAL, name, {"spec": {"size": 3}, "status": {"replicas": 5}}
    )
    current = get_widget(widgets, name)
    assert current["metadata"]["generation"] == 2
    assert current["status"] == {"replicas": 2} and current["spec"]["size"] == 3
    # PUT replaces; a stale resourceVersion is a conflict.
    stale = {**current, "spec": {"size": 4}}
    widgets.replace_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, name, stale)
    with pytest.raises(ApiException) as conflict:
        widgets.replace_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, name, stale)
    assert conflict.value.status == 409
    assert get_widget(widgets, name)["spec"] == {
        "size": 4,
        "mode": "slow",
        "minReplicas": 0,
        "maxReplicas": 3,
        "lease": "60s",
    }


def test_a_failed_json_patch_test_is_a_422_and_changes_nothing(
    k8s: LocalCluster, widgets: kubernetes.client.CustomObjectsApi
) -> None:
    k8s.kubectl("apply", "-f", "-", input=manifest("Widget", "w1", spec={"size": 1}))
    before = get_widget(widgets, "w1")
    path = "/apis/example.com/v1/namespaces/default/widgets/w1"
    status, answer = http(
        k8s,
        "PATCH",
        path,
        [
            {"op": "test", "path": "/metadata/resourceVersion", "value": "1"},
            {"op": "replace", "path": "/spec/size", "value": 2},
        ],
        content_type="application/json-patch+json",
    )
    assert status == 422 and answer["kind"] == "Status" and answer["reason"] == "Invalid"
    assert get_widget(widgets, "w1") == before
    status, answer = http(
        k8s,
        "PATCH",
        path,
        {"spec": {"size": 2}},
        content_type="application/strategic-merge-patch+json",
    )
    assert status == 415  # as on a real server: custom resources take no strategic merge


def test_unknown_fields_are_pruned_and_defaults_applied(
    k8s: LocalCluster, widgets: kubernetes.client.CustomObjectsApi
) -> None:
    widgets.create_namespaced_custom_object(
        GROUP,
        VERSION,
        "default",
        PLURAL,
        {
            "apiVersion": "example.com/v1",
            "kind": "Widget",
            "metadata": {"name": "w1"},
            "spec": {"size": 1, "bogus": True, "fast": {}, "free": {"any": {"thing": 1}}},
            "extra": 1,
        },
    )
    stored = get_widget(widgets, "w1")
    assert "extra" not in stored and "bogus" not in stored["spec"]
    assert stored["spec"]["fast"] == {"boost": 2}  # nested defaults too
    assert stored["spec"]["free"] == {"any": {"thing": 1}}  # preserve-unknown-fields kept


def test_the_scale_subresource_of_a_custom_resource(
    k8s: LocalCluster, widgets: kubernetes.client.CustomObjectsApi
) -> None:
    k8s.kubectl("apply", "-f", "-", input=manifest("Widget", "w1", spec={"size": 1}))
    k8s.kubectl("scale", "widget", "w1", "--replicas=3")
    scale = widgets.get_namespaced_custom_object_scale(GROUP, VERSION, "default", PLURAL, "w1")
    assert scale["kind"] == "Scale" and scale["spec"] == {"replicas": 3}
    widgets.patch_namespaced_custom_object_scale(
        GROUP, VERSION, "default", PLURAL, "w1", {"spec": {"replicas": 5}}
    )
    assert get_widget(widgets, "w1")["spec"]["replicas"] == 5
    assert get_widget(widgets, "w1")["metadata"]["generation"] == 3


# ---- watches --------------------------------------------------------------------------------


def test_a_watch_from_a_lists_version_misses_nothing_and_replays_nothing_stale(
    k8s: LocalCluster, widgets: kubernetes.client.CustomObjectsApi
) -> None:
    k8s.kubectl("apply", "-f", "-", input=manifest("Widget", "before", spec={"size": 1}))
    listing = widgets.list_namespaced_custom_object(GROUP, VERSION, "default", PLURAL)
    assert listing["kind"] == "WidgetList" and listing["apiVersion"] == "example.com/v1"
    version = listing["metadata"]["resourceVersion"]
    # Written between the list and the watch: the watch must still deliver these.
    k8s.kubectl("apply", "-f", "-", input=manifest("Widget", "between", spec={"size": 2}))
    k8s.kubectl("delete", "widget", "before")
    events = watch(k8s, "/apis/example.com/v1/namespaces/default/widgets", resourceVersion=version)
    assert [(e["type"], e["object"]["metadata"]["name"]) for e in events] == [
        ("ADDED", "between"),
        ("DELETED", "before"),
    ]
    # Without a version: the current state, as ADDED, and nothing else.
    events = watch(k8s, "/apis/example.com/v1/namespaces/default/widgets")
    assert [(e["type"], e["object"]["metadata"]["name"]) for e in events] == [("ADDED", "between")]


def test_a_streaming_list_ends_its_initial_events_with_a_bookmark(
    k8s: LocalCluster, widgets: kubernetes.client.CustomObjectsApi
) -> None:
    # client-go's WatchList (Helm 4's waiters): the state, a bookmark saying it ended, then
    # what follows.
    k8s.kubectl("apply", "-f", "-", input=manifest("Widget", "w", spec={"size": 1}))
    events = watch(
        k8s,
        "/apis/example.com/v1/namespaces/default/widgets",
        sendInitialEvents="true",
        resourceVersionMatch="NotOlderThan",
        allowWatchBookmarks="true",
    )
    assert [e["type"] for e in events] == ["ADDED", "BOOKMARK"]
    bookmark = events[1]["object"]
    assert bookmark["metadata"]["annotations"] == {"k8s.io/initial-events-end": "true"}
    assert int(bookmark["metadata"]["resourceVersion"]) >= int(
        events[0]["object"]["metadata"]["resourceVersion"]
    )


def test_a_token_request_answers_for_an_account_that_exists(k8s: LocalCluster) -> None:
    path = "/api/v1/namespaces/default/serviceaccounts/robot/token"
    request = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {}}
    assert http(k8s, "POST", path, request)[0] == 404
    k8s.kubectl("apply", "-f", "-", input=manifest("ServiceAccount", "robot"))
    status, answer = http(k8s, "POST", path, request)
    assert status == 201 and answer["kind"] == "TokenRequest" and answer["status"]["token"]


def test_a_watch_from_a_version_before_the_log_is_gone(
    k8s: LocalCluster, widgets: kubernetes.client.CustomObjectsApi
) -> None:
    events = watch(k8s, "/apis/example.com/v1/widgets", resourceVersion="1")
    assert events[0]["type"] == "ERROR" and events[0]["object"]["code"] == 410


def test_a_watch_with_a_label_selector_sees_objects_leave_it(
    k8s: LocalCluster, widgets: kubernetes.client.CustomObjectsApi
) -> None:
    k8s.kubectl(
        "apply",
        "-f",
        "-",
        input=json.dumps(
            {
                "apiVersion": "example.com/v1",
                "kind": "Widget",
                "metadata": {"name": "w1", "labels": {"team": "a"}},
                "spec": {"size": 1},
            }
        ),
    )
    version = widgets.list_cluster_custom_object(GROUP, VERSION, PLURAL)["metadata"][
        "resourceVersion"
    ]
    k8s.kubectl("label", "widget", "w1", "team=b", "--overwrite")
    events = watch(
        k8s, "/apis/example.com/v1/widgets", resourceVersion=version, labelSelector="team=a"
    )
    assert [e["type"] for e in events] == ["DELETED"]


def test_stopping_cuts_open_watches_and_unwinds_what_was_still_waiting(k8s: LocalCluster) -> None:
    ended: list[str] = []

    async def waiting() -> None:  # a request handler the stop caught mid-wait
        try:
            await asyncio.Event().wait()
        except BaseException as exc:
            ended.append(type(exc).__name__)
            raise

    # Held, as aiohttp holds its handlers' tasks: the loop keeps only a weak reference, and a
    # task nothing holds, waiting on an event nothing else holds, may be collected before the
    # stop (its coroutine then ends in GeneratorExit, as a CI run saw).
    handler = k8s.on_loop(lambda _: asyncio.get_running_loop().create_task(waiting()))
    request = urllib.request.Request(
        f"{k8s.url}/api/v1/namespaces/default/configmaps?watch=true&timeoutSeconds=60",
        headers={"Authorization": f"Bearer {ADMIN_TOKEN}"},
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        assert response.status == 200  # the watch is open, its handler waiting for changes
        k8s.stop()
        with pytest.raises(IncompleteRead):  # cut, not ended by its timeout
            response.read()
    # Unwound on the loop before it closed, not closed later when collected (GeneratorExit).
    assert ended == ["CancelledError"] and handler.cancelled()
    assert k8s.unfinished == []


# ---- deletion -------------------------------------------------------------------------------


def test_finalizers_hold_an_object_until_they_are_removed(
    k8s: LocalCluster, widgets: kubernetes.client.CustomObjectsApi
) -> None:
    widgets.create_namespaced_custom_object(
        GROUP,
        VERSION,
        "default",
        PLURAL,
        {
            "apiVersion": "example.com/v1",
            "kind": "Widget",
            "metadata": {"name": "w1", "finalizers": ["example.com/cleanup"]},
            "spec": {"size": 1},
        },
    )
    k8s.kubectl("delete", "widget", "w1", "--wait=false")
    held = get_widget(widgets, "w1")
    assert held["metadata"]["deletionTimestamp"]
    with pytest.raises(ApiException) as refused:
        widgets.patch_namespaced_custom_object(
            GROUP,
            VERSION,
            "default",
            PLURAL,
            "w1",
            {"metadata": {"finalizers": ["example.com/cleanup", "example.com/more"]}},
        )
    assert refused.value.status == 422
    widgets.patch_namespaced_custom_object(
        GROUP, VERSION, "default", PLURAL, "w1", {"metadata": {"finalizers": None}}
    )
    assert not k8s.objects("example.com/v1", "widgets")


def test_deleting_an_owner_collects_its_dependents_unless_orphaned(
    k8s: LocalCluster, widgets: kubernetes.client.CustomObjectsApi
) -> None:
    for name in ("w1", "w2"):
        k8s.kubectl("apply", "-f", "-", input=manifest("Widget", name, spec={"size": 1}))
    for name in ("w1", "w2"):
        uid = get_widget(widgets, name)["metadata"]["uid"]
        owned = json.loads(deployment(f"{name}-workers"))
        owned["metadata"]["ownerReferences"] = [
            {
                "apiVersion": "example.com/v1",
                "kind": "Widget",
                "name": name,
                "uid": uid,
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ]
        k8s.kubectl("apply", "-f", "-", input=json.dumps(owned))
    k8s.kubectl("delete", "widget", "w1", "--cascade=foreground")
    k8s.kubectl("delete", "widget", "w2", "--cascade=orphan")
    names = [d["metadata"]["name"] for d in k8s.objects("apps/v1", "deployments")]
    assert names == ["w2-workers"]
    assert "ownerReferences" not in k8s.objects("apps/v1", "deployments")[0]["metadata"]


def test_namespaces_scope_objects_and_take_them_along_when_deleted(k8s: LocalCluster) -> None:
    missing = k8s.kubectl("apply", "-n", "team", "-f", "-", input=deployment("web"), check=False)
    assert 'namespaces "team" not found' in missing.stderr
    k8s.kubectl("apply", "-f", "-", input=manifest("Namespace", "team"))
    k8s.kubectl("apply", "-n", "team", "-f", "-", input=deployment("web"))
    assert "web" in k8s.kubectl("get", "deploy", "-n", "team").stdout
    assert "No resources found" in k8s.kubectl("get", "deploy").stderr
    k8s.kubectl("delete", "namespace", "team")
    assert not k8s.objects("apps/v1", "deployments")
    assert not k8s.objects("v1", "namespaces", name="team")


def test_secrets_take_string_data_and_leases_renew(k8s: LocalCluster) -> None:
    k8s.kubectl("apply", "-f", "-", input=manifest("Secret", "db", stringData={"dsn": "x"}))
    assert k8s.objects("v1", "secrets", "default", "db")[0]["data"] == {"dsn": "eA=="}
    leases = kubernetes.client.CoordinationV1Api(k8s.api_client())
    body = {
        "metadata": {"name": "leader"},
        "spec": {"holderIdentity": "a", "leaseDurationSeconds": 15},
    }
    created = leases.create_namespaced_lease("default", body)
    created.spec.holder_identity = "b"
    leases.replace_namespaced_lease("leader", "default", created)
    assert leases.read_namespaced_lease("leader", "default").spec.holder_identity == "b"
    with pytest.raises(ApiException) as conflict:  # the stale copy loses
        leases.replace_namespaced_lease("leader", "default", created)
    assert conflict.value.status == 409


# ---- authorization ------------------------------------------------------------------------------


def test_rbac_allows_what_a_role_grants_and_forbids_the_rest(
    k8s: LocalCluster, tmp_path: Path
) -> None:
    # A second emulator beside the `k8s` fixture's: two at once must not disturb each other.
    role = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": {"name": "reader", "namespace": "default"},
        "rules": [
            {"apiGroups": ["apps"], "resources": ["deployments"], "verbs": ["get", "list", "watch"]}
        ],
    }
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": {"name": "reader", "namespace": "default"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "reader"},
        "subjects": [{"kind": "ServiceAccount", "name": "op", "namespace": "default"}],
    }
    cluster = LocalCluster(
        tmp_path,
        tokens={"op-token": Identity.service_account("default", "op")},
        rbac=[role, binding],
    ).start()
    try:
        cluster.kubectl("apply", "-f", "-", input=deployment("web"))
        reader = cluster.write_kubeconfig(tmp_path / "reader", "op-token")
        assert "web" in cluster.kubectl("get", "deploy", kubeconfig=reader).stdout
        denied = cluster.kubectl("delete", "deploy", "web", kubeconfig=reader, check=False)
        assert (
            'deployments.apps "web" is forbidden: User "system:serviceaccount:default:op" '
            'cannot delete resource "deployments" in API group "apps" in the namespace '
            '"default"'
        ) in denied.stderr
        status, _ = http(cluster, "GET", "/api/v1/namespaces/default/secrets", token="op-token")
        assert status == 403
        # RBAC applied to the server counts as well.
        cluster.kubectl(
            "apply",
            "-f",
            "-",
            input=json.dumps(
                {
                    **role,
                    "metadata": {"name": "secrets", "namespace": "default"},
                    "rules": [{"apiGroups": [""], "resources": ["secrets"], "verbs": ["list"]}],
                }
            ),
        )
        cluster.kubectl(
            "apply",
            "-f",
            "-",
            input=json.dumps(
                {
                    **binding,
                    "metadata": {"name": "secrets", "namespace": "default"},
                    "roleRef": {**binding["roleRef"], "name": "secrets"},
                }
            ),
        )
        status, _ = http(cluster, "GET", "/api/v1/namespaces/default/secrets", token="op-token")
        assert status == 200
        status, _ = http(cluster, "GET", "/api/v1/namespaces", token="nobody")
        assert status == 401
        # The admin can check (or act) as anyone: `kubectl --as` and `kubectl auth can-i`.
        account = "--as=system:serviceaccount:default:op"
        assert cluster.kubectl("auth", "can-i", "list", "secrets", account).stdout == "yes\n"
        cannot = cluster.kubectl("auth", "can-i", "delete", "deployments", account, check=False)
        assert cannot.stdout == "no\n" and cannot.returncode == 1
        denied = cluster.kubectl("delete", "deploy", "web", account, check=False)
        assert "cannot delete resource" in denied.stderr
        assert "web" not in k8s.kubectl("get", "deploy").stdout
    finally:
        cluster.stop()
