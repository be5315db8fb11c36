"""The chart rendered by Helm's engine for its defaults and for real-world values: every object
valid for Kubernetes, least-privilege RBAC, the operator's pod as the image and the operator
need it, the CRD, the alerts and the dashboard from their one source each."""

from __future__ import annotations

import json
import re
from typing import Any

import helm_python as helm
import pytest
import yaml
from monitoring import monitoring as m

from chart import chart as c
from outbox.controller.resource import labels as worker_labels
from outbox.controller.spec import DispatcherSpec

FULLNAME = f"{c.RELEASE}-outbox-dispatcher"

# Values platform teams set, each case a different install.
MATRIX: dict[str, dict[str, Any]] = {
    "defaults": {},
    "namespaced": {"watch": {"namespaces": ["shop", "billing"]}},
    "monitoring": {
        "metrics": {
            "serviceMonitor": {"enabled": True, "labels": {"release": "kube-prometheus-stack"}},
            "workerPodMonitor": {"enabled": True, "interval": "15s"},
        },
        "prometheusRule": {
            "enabled": True,
            "labels": {"release": "kube-prometheus-stack"},
            "oldestMessageSLOSeconds": 120,
            "disabledAlerts": ["OutboxOperatorNotLeading"],
            "additionalRules": [
                {
                    "alert": "OutboxOrdersBacklogHigh",
                    "expr": (
                        "outbox_controller_backlog_messages"
                        '{dispatcher="orders", state="ready"} > 10000'
                    ),
                    "for": "10m",
                    "labels": {"severity": "warning"},
                }
            ],
        },
        "grafanaDashboard": {
            "enabled": True,
            "namespace": "monitoring",
            "annotations": {"grafana_folder": "Outbox"},
        },
    },
    "pod-monitors-namespaced": {
        "watch": {"namespaces": ["shop"]},
        "metrics": {"podMonitor": {"enabled": True}, "workerPodMonitor": {"enabled": True}},
    },
    "single-replica": {"replicaCount": 1},
    "placement-and-private-registry": {
        "image": {
            "repository": "registry.example/platform/outbox-dispatcher",
            "digest": "sha256:" + "ab" * 32,
            "pullPolicy": "Always",
        },
        "imagePullSecrets": [{"name": "registry-credentials"}],
        "priorityClassName": "system-cluster-critical",
        "nodeSelector": {"kubernetes.io/os": "linux", "node-role.example/platform": "true"},
        "tolerations": [
            {"key": "platform", "operator": "Equal", "value": "true", "effect": "NoSchedule"}
        ],
        "topologySpreadConstraints": [
            {
                "maxSkew": 1,
                "topologyKey": "topology.kubernetes.io/zone",
                "whenUnsatisfiable": "ScheduleAnyway",
            }
        ],
        "resources": {"requests": {"cpu": "100m", "memory": "192Mi"}, "limits": {"memory": "1Gi"}},
        "podAnnotations": {"example.com/team": "platform"},
        "podLabels": {"team": "platform"},
    },
    "own-affinity": {
        "affinity": {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["ops"]}]}
                    ]
                }
            }
        }
    },
    "existing-account-no-rbac-no-crd": {
        "serviceAccount": {"create": False, "name": "outbox-operator"},
        "rbac": {"create": False},
        "crds": {"install": False},
        "service": {"enabled": False},
    },
    "tuned": {
        "fullnameOverride": "outbox-operator",
        "healthPort": 9090,
        "service": {"port": 9090},
        "leaderElection": {
            "id": "outbox-leader",
            "leaseDuration": "30s",
            "renewDeadline": "20s",
            "retryPeriod": "4s",
        },
        "logging": {"level": "DEBUG"},
        "extraArgs": ["--worker-publishers=http,nats"],
        "extraEnv": [{"name": "TZ", "value": "UTC"}],
        "crds": {"keep": False},
    },
}


@pytest.fixture(scope="module", params=sorted(MATRIX), ids=str)
def case(request: pytest.FixtureRequest) -> tuple[str, c.Rendered]:
    name = request.param
    return name, c.render(MATRIX[name])


def test_every_rendered_object_is_valid_for_kubernetes(case: tuple[str, c.Rendered]) -> None:
    _, rendered = case
    assert rendered.objects
    errors = [error for obj in rendered.objects for error in c.object_errors(obj)]
    assert errors == []


def test_lint_is_clean_for_every_case(case: tuple[str, c.Rendered]) -> None:
    name, _ = case
    report = helm.lint(c.CHART, MATRIX[name], strict=True, namespace=c.NAMESPACE)
    problems = [msg for msg in report["messages"] if msg["severity"] >= 2]
    assert report["errors"] == [] and problems == [], report


def test_objects_carry_the_release_namespace_and_the_chart_labels(
    case: tuple[str, c.Rendered],
) -> None:
    name, rendered = case
    dashboard_namespace = MATRIX[name].get("grafanaDashboard", {}).get("namespace")
    cluster_scoped = {"CustomResourceDefinition", "ClusterRole", "ClusterRoleBinding"}
    for obj in rendered.objects:
        meta = obj["metadata"]
        if obj["kind"] in cluster_scoped:
            assert "namespace" not in meta
        elif obj["kind"] == "ConfigMap" and dashboard_namespace:
            assert meta["namespace"] == dashboard_namespace
        elif obj["kind"] in ("Role", "RoleBinding") and not meta["name"].endswith(
            "leader-election"
        ):
            assert meta["namespace"] in MATRIX[name]["watch"]["namespaces"]
        else:
            assert meta["namespace"] == c.NAMESPACE, (obj["kind"], meta)
        if obj["kind"] != "CustomResourceDefinition":
            assert meta["labels"]["app.kubernetes.io/managed-by"] == "Helm", obj["kind"]
            assert meta["labels"]["app.kubernetes.io/part-of"] == "outbox-dispatcher"


# -- the operator's pod ---------------------------------------------------------------------


def operator(rendered: c.Rendered) -> dict[str, Any]:
    [deployment] = rendered.of_kind("Deployment")
    return deployment


def test_the_operator_runs_non_root_read_only_without_privileges() -> None:
    pod = operator(c.render())["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] == 65532  # the image's user
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    [container] = pod["containers"]
    security = container["securityContext"]
    assert security["readOnlyRootFilesystem"] is True
    assert security["allowPrivilegeEscalation"] is False
    assert security["capabilities"] == {"drop": ["ALL"]}
    assert container["resources"]["requests"] and container["resources"]["limits"]["memory"]


def test_the_operator_command_probes_and_leader_election() -> None:
    deployment = operator(c.render(MATRIX["tuned"]))
    assert deployment["metadata"]["name"] == "outbox-operator"
    pod = deployment["spec"]["template"]["spec"]
    [container] = pod["containers"]
    assert container["command"] == ["outbox-controller"]
    args = container["args"]
    assert "--health-port=9090" in args
    assert "--leader-election-id=outbox-leader" in args
    assert "--lease-duration=30s" in args and "--renew-deadline=20s" in args
    assert "--worker-publishers=http,nats" in args
    assert not [a for a in args if a.startswith("--namespace")]  # every namespace
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http-metrics"}
    assert container["ports"] == [
        {"name": "http-metrics", "containerPort": 9090, "protocol": "TCP"}
    ]
    env = {e["name"]: e for e in container["env"]}
    assert env["POD_NAMESPACE"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.namespace"}}
    assert env["POD_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    assert env["TZ"] == {"name": "TZ", "value": "UTC"}


def test_the_operator_settings_the_chart_passes_are_accepted_by_the_operator() -> None:
    """The rendered arguments and environment, given to the real settings parser."""
    from outbox.controller.settings import load_settings

    for name in ("defaults", "namespaced", "tuned"):
        [container] = operator(c.render(MATRIX[name]))["spec"]["template"]["spec"]["containers"]
        env = {e["name"]: e.get("value", "from-the-pod") for e in container["env"]}
        settings = load_settings(container["args"], env)  # type: ignore[call-arg]
        assert settings.leader_election_namespace == "from-the-pod", name
        assert list(settings.namespaces) == MATRIX[name].get("watch", {}).get("namespaces", [])


def test_the_workers_run_the_operators_image() -> None:
    for name in ("defaults", "placement-and-private-registry"):
        [container] = operator(c.render(MATRIX[name]))["spec"]["template"]["spec"]["containers"]
        assert f"--worker-image={container['image']}" in container["args"]
    [container] = operator(c.render(MATRIX["placement-and-private-registry"]))["spec"]["template"][
        "spec"
    ]["containers"]
    assert container["image"] == "registry.example/platform/outbox-dispatcher@sha256:" + "ab" * 32
    [default] = operator(c.render())["spec"]["template"]["spec"]["containers"]
    assert (
        default["image"]
        == f"outbox-dispatcher:{yaml.safe_load((c.CHART / 'Chart.yaml').read_text())['appVersion']}"
    )


def test_two_replicas_spread_over_nodes_roll_one_at_a_time_and_survive_drains() -> None:
    rendered = c.render()
    deployment = operator(rendered)
    assert deployment["spec"]["replicas"] == 2
    assert deployment["spec"]["strategy"]["rollingUpdate"] == {"maxSurge": 1, "maxUnavailable": 0}
    anti = deployment["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"]
    [term] = anti["preferredDuringSchedulingIgnoredDuringExecution"]
    assert (
        term["podAffinityTerm"]["labelSelector"]["matchLabels"]
        == deployment["spec"]["selector"]["matchLabels"]
    )
    pdb = rendered.one("PodDisruptionBudget")
    assert pdb["spec"] == {"minAvailable": 1, "selector": deployment["spec"]["selector"]}
    assert c.render(MATRIX["single-replica"]).of_kind("PodDisruptionBudget") == []


def test_placement_values_reach_the_pod() -> None:
    values = MATRIX["placement-and-private-registry"]
    pod = operator(c.render(values))["spec"]["template"]
    spec = pod["spec"]
    assert spec["priorityClassName"] == "system-cluster-critical"
    assert spec["nodeSelector"] == values["nodeSelector"]
    assert spec["tolerations"] == values["tolerations"]
    assert spec["imagePullSecrets"] == [{"name": "registry-credentials"}]
    [spread] = spec["topologySpreadConstraints"]
    assert spread["labelSelector"]["matchLabels"]["app.kubernetes.io/component"] == "controller"
    assert pod["metadata"]["annotations"] == {"example.com/team": "platform"}
    assert pod["metadata"]["labels"]["team"] == "platform"
    own = operator(c.render(MATRIX["own-affinity"]))["spec"]["template"]["spec"]["affinity"]
    assert own == MATRIX["own-affinity"]["affinity"]


def test_the_operator_selector_never_selects_the_worker_pods_it_creates() -> None:
    """The workers' labels come from the operator itself (outbox.controller.resource)."""
    selector = operator(c.render())["spec"]["selector"]["matchLabels"]
    for dispatcher in (c.RELEASE, "orders"):
        pod_labels = worker_labels(dispatcher)
        assert not all(pod_labels.get(k) == v for k, v in selector.items()), dispatcher


def test_the_worker_pod_monitor_selects_every_worker_pod_and_labels_its_dispatcher() -> None:
    rendered = c.render(MATRIX["pod-monitors-namespaced"])
    monitor = rendered.one("PodMonitor", f"{FULLNAME}-workers")
    selector = monitor["spec"]["selector"]["matchLabels"]
    assert all(worker_labels("orders").get(k) == v for k, v in selector.items())
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": ["shop"]}
    [endpoint] = monitor["spec"]["podMetricsEndpoints"]
    assert endpoint["port"] == "metrics"  # the worker container's port name
    [relabel] = endpoint["relabelings"]
    assert relabel["sourceLabels"] == ["__meta_kubernetes_pod_label_app_kubernetes_io_instance"]
    assert relabel["targetLabel"] == "dispatcher"
    cluster_wide = c.render(MATRIX["monitoring"]).one("PodMonitor", f"{FULLNAME}-workers")
    assert cluster_wide["spec"]["namespaceSelector"] == {"any": True}


def test_operator_monitors_keep_the_dispatchers_namespace_label() -> None:
    for name, kind in (("monitoring", "ServiceMonitor"), ("pod-monitors-namespaced", "PodMonitor")):
        monitor = c.render(MATRIX[name]).one(kind, FULLNAME)
        endpoints = monitor["spec"].get("endpoints") or monitor["spec"]["podMetricsEndpoints"]
        assert [e["honorLabels"] for e in endpoints] == [True], name
        assert endpoints[0]["port"] == "http-metrics"


# -- RBAC -----------------------------------------------------------------------------------

# Exactly what the operator calls (controller/kube.py, controller/leader.py, kopf's watch),
# with kopf's posting and namespace/CRD scanning off (controller/handlers.py).
SERVED_RULES = [
    {"apiGroups": ["outbox.dev"], "resources": ["outboxdispatchers"], "verbs": ["list", "watch"]},
    {"apiGroups": ["outbox.dev"], "resources": ["outboxdispatchers/status"], "verbs": ["patch"]},
    # list and watch: the informer of the operator's own Deployments (controller/informer.py).
    {
        "apiGroups": ["apps"],
        "resources": ["deployments"],
        "verbs": ["get", "list", "watch", "create", "update"],
    },
    # Resizing: the scale subresource only, never a patch of the whole Deployment.
    {"apiGroups": ["apps"], "resources": ["deployments/scale"], "verbs": ["patch"]},
    # The worker pods' NetworkPolicy (networkPolicy.workers, on by default).
    {
        "apiGroups": ["networking.k8s.io"],
        "resources": ["networkpolicies"],
        "verbs": ["get", "create", "update"],
    },
    # The worker pods' PodDisruptionBudget (spec.worker.disruptionBudget); never deleted.
    {
        "apiGroups": ["policy"],
        "resources": ["poddisruptionbudgets"],
        "verbs": ["get", "create", "update"],
    },
    {"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"]},
    # The worker pods' states (a crash loop, an image that cannot be pulled).
    {"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]},
    {"apiGroups": [""], "resources": ["events"], "verbs": ["create"]},
]
LEASE_RULES = [
    {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create"]},
    {
        "apiGroups": ["coordination.k8s.io"],
        "resources": ["leases"],
        "resourceNames": ["outbox-controller"],
        "verbs": ["get", "update"],
    },
]


def test_cluster_wide_rbac_is_one_cluster_role_and_the_lease_role() -> None:
    rendered = c.render()
    role = rendered.one("ClusterRole")
    assert role["rules"] == SERVED_RULES
    binding = rendered.one("ClusterRoleBinding")
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "ClusterRole",
        "name": FULLNAME,
    }
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": FULLNAME, "namespace": c.NAMESPACE}
    ]
    lease = rendered.one("Role")
    assert lease["metadata"] == {**lease["metadata"], "namespace": c.NAMESPACE}
    assert lease["rules"] == LEASE_RULES
    assert rendered.one("RoleBinding")["subjects"] == binding["subjects"]


def test_namespaced_rbac_is_a_role_in_each_watched_namespace_and_no_cluster_role() -> None:
    rendered = c.render(MATRIX["namespaced"])
    assert rendered.of_kind("ClusterRole") == rendered.of_kind("ClusterRoleBinding") == []
    served = {
        r["metadata"]["namespace"]: r
        for r in rendered.of_kind("Role")
        if r["rules"] == SERVED_RULES
    }
    assert sorted(served) == ["billing", "shop"]
    bindings = {b["metadata"]["namespace"]: b for b in rendered.of_kind("RoleBinding")}
    for namespace in ("shop", "billing"):
        assert bindings[namespace]["roleRef"]["name"] == served[namespace]["metadata"]["name"]
        assert bindings[namespace]["subjects"][0]["namespace"] == c.NAMESPACE
    [container] = operator(rendered)["spec"]["template"]["spec"]["containers"]
    assert [a for a in container["args"] if a.startswith("--namespace")] == [
        "--namespace=shop",
        "--namespace=billing",
    ]


def test_no_rule_grants_more_than_the_operator_uses() -> None:
    """No wildcard, no list/watch on Secrets, no delete anywhere (owner references delete
    the workers), in any case of the matrix."""
    for name in MATRIX:
        for role in [
            *c.render(MATRIX[name]).of_kind("ClusterRole"),
            *c.render(MATRIX[name]).of_kind("Role"),
        ]:
            for rule in role["rules"]:
                assert "*" not in rule["verbs"] + rule["resources"] + rule["apiGroups"], name
                assert "delete" not in rule["verbs"] and "deletecollection" not in rule["verbs"]
                if "secrets" in rule["resources"]:
                    assert rule["verbs"] == ["get"]


def test_the_worker_network_policy_off_takes_its_permission_away_too() -> None:
    rendered = c.render({"networkPolicy": {"workers": {"enabled": False}}})
    rules = rendered.one("ClusterRole")["rules"]
    assert rules == [r for r in SERVED_RULES if r["resources"] != ["networkpolicies"]]
    [container] = operator(rendered)["spec"]["template"]["spec"]["containers"]
    assert "--worker-network-policy=off" in container["args"]
    assert not any(a.startswith("--worker-metrics-from") for a in container["args"])


# -- network defaults -----------------------------------------------------------------------

MONITORING = [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}]


def test_the_operators_metrics_are_open_to_the_monitoring_namespace_and_the_helm_test_only():
    policy = c.render().one("NetworkPolicy")
    assert policy["spec"]["policyTypes"] == ["Ingress"]  # egress open: API server, databases
    [rule] = policy["spec"]["ingress"]
    assert rule["ports"] == [{"port": "http-metrics", "protocol": "TCP"}]
    test_pod = {"app.kubernetes.io/instance": c.RELEASE, "app.kubernetes.io/component": "test"}
    assert rule["from"] == [*MONITORING, {"podSelector": {"matchLabels": test_pod}}]
    [hook] = c.render().hooks()
    assert test_pod.items() <= hook["metadata"]["labels"].items()
    own = c.render({"networkPolicy": {"metricsFrom": [{"ipBlock": {"cidr": "10.0.0.0/8"}}]}})
    assert own.one("NetworkPolicy")["spec"]["ingress"][0]["from"][0] == {
        "ipBlock": {"cidr": "10.0.0.0/8"}
    }


def test_the_operator_gives_the_workers_a_network_policy_from_the_same_peers() -> None:
    """On by default: the operator renders it per dispatcher (controller/network.py) with the
    peers the chart passes, which its own parser takes."""
    from outbox.controller.network import render_network_policy
    from outbox.controller.settings import load_settings

    [container] = operator(c.render())["spec"]["template"]["spec"]["containers"]
    settings = load_settings(container["args"], {"POD_NAMESPACE": c.NAMESPACE})
    assert settings.worker_network_policy is True
    assert list(settings.worker_metrics_from) == MONITORING
    body = {
        "metadata": {"name": "orders", "namespace": "shop", "uid": "u-1"},
        "spec": {"database": {"dsnSecretRef": {"name": "db"}}, "publisher": {"type": "log"}},
    }
    policy = render_network_policy(DispatcherSpec.parse(body), settings.worker_metrics_from)
    assert policy["spec"] == {
        "podSelector": {"matchLabels": {k: v for k, v in worker_labels("orders").items()
                                        if k != "app.kubernetes.io/managed-by"}},
        "policyTypes": ["Ingress"],
        "ingress": [{"ports": [{"port": "metrics", "protocol": "TCP"}], "from": MONITORING}],
    }  # fmt: skip
    assert policy["metadata"]["ownerReferences"][0]["uid"] == "u-1"
    assert c.object_errors(policy) == []  # valid for Kubernetes' schema


def test_without_rbac_or_account_creation_only_the_named_account_is_used() -> None:
    rendered = c.render(MATRIX["existing-account-no-rbac-no-crd"])
    kinds = {obj["kind"] for obj in rendered.objects}
    assert not kinds & {
        "ServiceAccount",
        "Role",
        "RoleBinding",
        "ClusterRole",
        "ClusterRoleBinding",
    }
    assert "CustomResourceDefinition" not in kinds and "Service" not in kinds
    assert operator(rendered)["spec"]["template"]["spec"]["serviceAccountName"] == "outbox-operator"
    assert "crds.install is false" in rendered.notes


# -- the CRD --------------------------------------------------------------------------------


def test_the_charts_crd_is_a_byte_identical_copy_of_crds() -> None:
    assert c.CRD_COPY.read_bytes() == c.CRD_SOURCE.read_bytes(), (
        "charts/outbox-dispatcher/files/crds/ differs from crds/: "
        "cp crds/outboxdispatchers.yaml charts/outbox-dispatcher/files/crds/"
    )


def test_the_crd_is_a_template_upgraded_with_the_release_and_kept_on_uninstall() -> None:
    source = yaml.safe_load(c.CRD_SOURCE.read_text())
    rendered = c.render().one("CustomResourceDefinition")
    assert rendered["metadata"].pop("annotations") == {"helm.sh/resource-policy": "keep"}
    assert rendered == source
    assert not (c.CHART / "crds").exists(), "a crds/ folder is installed once and never upgraded"
    unkept = c.render(MATRIX["tuned"]).one("CustomResourceDefinition")
    assert "annotations" not in unkept["metadata"]


# -- monitoring -----------------------------------------------------------------------------


def test_the_prometheus_rule_is_the_rules_file_with_the_values_applied() -> None:
    values = MATRIX["monitoring"]["prometheusRule"]
    rule = c.render(MATRIX["monitoring"]).one("PrometheusRule")
    assert rule["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    [group] = rule["spec"]["groups"]
    expected = [r for r in m.rules() if r["alert"] not in values["disabledAlerts"]]
    for r in expected:
        if r["alert"] == "OutboxOldestMessageOverSLO":
            r["expr"] = r["expr"].replace("> 300", "> 120")
    assert group["rules"] == expected + values["additionalRules"]
    [slo] = [r for r in group["rules"] if r["alert"] == "OutboxOldestMessageOverSLO"]
    assert slo["expr"].endswith("> 120")
    # Prometheus' own templates reach the rule untouched by Helm's.
    assert "{{ $labels.dispatcher }}" in slo["annotations"]["summary"]


def test_the_unfinished_age_slo_is_a_value_of_its_own() -> None:
    values = {"prometheusRule": {"enabled": True, "oldestUnfinishedSLOSeconds": 900}}
    [group] = c.render(values).one("PrometheusRule")["spec"]["groups"]
    rules = {r["alert"]: r for r in group["rules"]}
    assert rules["OutboxOldestUnfinishedOverSLO"]["expr"].endswith(
        "(outbox_controller_oldest_unfinished_age_seconds) > 900"
    )
    assert rules["OutboxOldestMessageOverSLO"]["expr"].endswith("> 300")  # the default


def test_the_rule_values_name_only_alerts_that_exist() -> None:
    schema = json.loads((c.CHART / "values.schema.json").read_text())
    names = schema["properties"]["prometheusRule"]["properties"]["disabledAlerts"]["items"]["enum"]
    assert sorted(names) == sorted(r["alert"] for r in m.rules())


def test_the_dashboard_config_map_holds_the_dashboard_file() -> None:
    config_map = c.render(MATRIX["monitoring"]).one("ConfigMap", f"{FULLNAME}-dashboard")
    assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert config_map["metadata"]["annotations"] == {"grafana_folder": "Outbox"}
    assert json.loads(config_map["data"]["outbox-dispatcher.json"]) == m.dashboard()


def test_monitoring_objects_are_off_by_default() -> None:
    kinds = {obj["kind"] for obj in c.render().objects}
    assert not kinds & {"ServiceMonitor", "PodMonitor", "PrometheusRule", "ConfigMap"}


# -- helm test and NOTES --------------------------------------------------------------------


def test_the_helm_test_hook_checks_the_operator_service_with_the_charts_image() -> None:
    rendered = c.render()
    [hook] = rendered.hooks()
    assert hook["kind"] == "Pod" and hook["metadata"]["annotations"]["helm.sh/hook"] == "test"
    [container] = hook["spec"]["containers"]
    [operator_container] = operator(rendered)["spec"]["template"]["spec"]["containers"]
    assert container["image"] == operator_container["image"]
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    service = rendered.one("Service")
    url = f"http://{service['metadata']['name']}.{c.NAMESPACE}.svc:{service['spec']['ports'][0]['port']}"
    assert url in container["args"][0]
    compile(container["args"][0], "helm-test", "exec")  # the script is valid Python
    assert service["spec"]["selector"] == operator(rendered)["spec"]["selector"]["matchLabels"]


def test_the_notes_sample_is_an_outbox_dispatcher_the_crd_accepts() -> None:
    for name in ("defaults", "namespaced"):
        notes = c.render(MATRIX[name]).notes
        [sample] = re.findall(r"<<'YAML'\n(.*?)\n\s*YAML\n", notes, re.DOTALL)
        resource = yaml.safe_load(sample)
        assert resource["kind"] == "OutboxDispatcher"
        assert c.custom_resource_errors(resource) == []
    assert "kubectl -n shop apply" in c.render(MATRIX["namespaced"]).notes
