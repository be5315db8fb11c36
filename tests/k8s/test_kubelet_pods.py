"""The local kubelet beyond Deployments: Pods made by others (a `helm test` hook) run to their
end with a phase, Services reach ready pods by their cluster DNS name, and a pod's service
account token (a TokenRequest) is what it talks to the API with, under RBAC."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from .cluster import ADMIN_TOKEN, LocalCluster
from .kubelet import Kubelet

pytestmark = pytest.mark.slow
PYTHON = Path(sys.executable).name  # found in the kubelet's bin directory, as `python` is


def eventually(check: Callable[[], Any], what: str, timeout: float = 30) -> Any:
    deadline = time.monotonic() + timeout
    while not (result := check()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)
    return result


def pod(name: str, script: str, restart: str = "Never", **spec: Any) -> str:
    return json.dumps(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "labels": {"app": name}},
            "spec": {
                "restartPolicy": restart,
                "containers": [
                    {"name": "main", "image": "python:3", "command": [PYTHON, "-c", script]}
                ],
                **spec,
            },
        }
    )


def status(k8s: LocalCluster, name: str, namespace: str = "default") -> dict[str, Any]:
    found = k8s.objects("v1", "pods", namespace, name)
    return found[0].get("status", {}) if found else {}


def phase(k8s: LocalCluster, name: str, wanted: str) -> Callable[[], bool]:
    return lambda: status(k8s, name).get("phase") == wanted


def test_a_pod_of_its_own_runs_to_its_end_and_reports_its_phase(
    k8s: LocalCluster, kubelet: Kubelet
) -> None:
    k8s.kubectl("apply", "-f", "-", input=pod("ok", "print('all good')"))
    k8s.kubectl("apply", "-f", "-", input=pod("bad", "import sys; sys.exit(3)"))
    eventually(phase(k8s, "ok", "Succeeded"), "ok to succeed")
    eventually(phase(k8s, "bad", "Failed"), "bad to fail")
    [state] = status(k8s, "bad")["containerStatuses"]
    assert state["state"]["terminated"]["exitCode"] == 3
    assert state["restartCount"] == 0  # restartPolicy Never
    assert "all good" in k8s.kubectl("logs", "ok").stdout
    # OnFailure restarts it until it succeeds.
    script = "import pathlib, sys; p = pathlib.Path('tries'); p.write_text(p.read_text() + 'x' if p.exists() else 'x'); sys.exit(0 if len(p.read_text()) >= 2 else 1)"  # noqa: E501
    k8s.kubectl("apply", "-f", "-", input=pod("again", script, restart="OnFailure"))
    eventually(phase(k8s, "again", "Succeeded"), "again to succeed", timeout=60)
    assert status(k8s, "again")["containerStatuses"][0]["restartCount"] == 1
    # Deleting a running pod stops its process.
    k8s.kubectl("apply", "-f", "-", input=pod("sleeper", "import time; time.sleep(600)"))
    eventually(phase(k8s, "sleeper", "Running"), "sleeper to run")
    k8s.kubectl("delete", "pod", "sleeper", "--wait=false")
    record = eventually(
        lambda: next(
            (r for r in kubelet.records if r.name == "sleeper" and r.returncode is not None), None
        ),
        "the sleeper stopped",
    )
    assert record.signals == ["SIGTERM"]


def test_a_service_name_leads_to_a_ready_pod_it_selects(
    k8s: LocalCluster, kubelet: Kubelet
) -> None:
    server = (
        "import http.server, os\n"
        "class H(http.server.BaseHTTPRequestHandler):\n"
        "    def do_GET(self):\n"
        "        body = os.environ['HOSTNAME'].encode()\n"
        "        self.send_response(200); self.end_headers(); self.wfile.write(body)\n"
        "    def log_message(self, *a): pass\n"
        "http.server.HTTPServer(('127.0.0.1', int(os.environ['PORT'])), H).serve_forever()\n"
    )
    web = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "web"},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": "web"}},
            "template": {
                "metadata": {"labels": {"app": "web"}},
                "spec": {
                    "containers": [
                        {
                            "name": "web",
                            "image": "web:1",
                            "command": [PYTHON, "-c", server],
                            "env": [{"name": "PORT", "value": "8000"}],
                            "ports": [{"name": "http", "containerPort": 8000}],
                            "readinessProbe": {"httpGet": {"path": "/", "port": "http"}},
                        }
                    ]
                },
            },
        },
    }
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "web"},
        "spec": {"selector": {"app": "web"}, "ports": [{"port": 80, "targetPort": "http"}]},
    }
    k8s.kubectl("apply", "-f", "-", input=json.dumps(web))
    k8s.kubectl("apply", "-f", "-", input=json.dumps(service))
    eventually(lambda: [p for p in kubelet.pods("default", "web") if p.ready], "web ready")
    client = (
        "import urllib.request\n"
        "for url in ('http://web.default.svc/', 'http://web.default.svc.cluster.local:80/'):\n"
        "    print('reached', urllib.request.urlopen(url, timeout=5).read().decode())\n"
    )
    k8s.kubectl("apply", "-f", "-", input=pod("client", client))
    eventually(phase(k8s, "client", "Succeeded"), "the client to reach web")
    [web_pod] = kubelet.pods("default", "web")
    assert k8s.kubectl("logs", "client").stdout.count(f"reached {web_pod.name}") == 2
    # A name that is no Service is left alone: it does not resolve.
    k8s.kubectl("apply", "-f", "-", input=pod("lost", client.replace("web.", "nowhere.")))
    eventually(phase(k8s, "lost", "Failed"), "the lost client to fail")


@pytest.fixture
def secured(tmp_path: Path) -> Iterator[tuple[LocalCluster, Kubelet]]:
    workdir = tmp_path / "k8s"
    workdir.mkdir()
    cluster = LocalCluster(workdir, tokens={}, rbac=[]).start()
    node = Kubelet(cluster.url, ADMIN_TOKEN, tmp_path / "kubelet", ca_path=cluster.ca_path)
    cluster.emulator.pod_logs = node.log
    node.start()
    try:
        yield cluster, node
    finally:
        node.stop()
        cluster.stop()
    assert not cluster.emulator.failures, cluster.emulator.failures
    assert not node.failures, node.failures


def test_a_pod_talks_to_the_api_as_its_service_account(
    secured: tuple[LocalCluster, Kubelet],
) -> None:
    k8s, _ = secured
    rbac = [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "reader"}},
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": {"name": "pod-reader"},
            "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list"]}],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": "reader"},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "Role",
                "name": "pod-reader",
            },
            "subjects": [{"kind": "ServiceAccount", "name": "reader", "namespace": "default"}],
        },
    ]
    k8s.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(rbac))
    script = (
        "import subprocess\n"
        "for what in ('pods', 'secrets'):\n"
        "    done = subprocess.run(['kubectl', 'get', what], capture_output=True, text=True)\n"
        "    print(what, done.returncode, done.stderr.strip())\n"
    )
    k8s.kubectl("apply", "-f", "-", input=pod("asker", script, serviceAccountName="reader"))
    eventually(phase(k8s, "asker", "Succeeded"), "the asker to finish")
    log = k8s.kubectl("logs", "asker").stdout
    assert "pods 0" in log, log
    assert 'User "system:serviceaccount:default:reader" cannot list resource "secrets"' in log
    # No token where the pod turns it off; an account that does not exist holds it back.
    off = pod("silent", script, serviceAccountName="reader", automountServiceAccountToken=False)
    k8s.kubectl("apply", "-f", "-", input=off)
    eventually(phase(k8s, "silent", "Succeeded"), "the silent one to finish")
    assert "pods 0" not in k8s.kubectl("logs", "silent").stdout
    k8s.kubectl("apply", "-f", "-", input=pod("orphan", script, serviceAccountName="nobody"))
    _, node = secured
    eventually(
        lambda: 'serviceaccount "nobody" not found' in node.errors.get(("default", "orphan"), ""),
        "the orphan held back",
    )


def test_variable_references_expand_as_a_real_kubelet_expands_them(
    k8s: LocalCluster, kubelet: Kubelet
) -> None:
    """`$(VAR)` in env values (from the variables declared before), command and args; `$$`
    is one literal `$`, so `$$(SECRET)` reaches the process as the text `$(SECRET)`."""
    script = "import json, os, sys; print(json.dumps({'argv': sys.argv[1:], 'env': {k: os.environ.get(k) for k in 'ABCDEFG'}}))"  # noqa: E501
    manifest = json.loads(pod("expands", script))
    container = manifest["spec"]["containers"][0]
    container["command"] += ["$(SECRET)", "$$(SECRET)", "$$$(SECRET)", "$(PATH)", "$", "$$"]
    container["env"] = [
        {"name": "B", "value": "$(SECRET)"},  # not declared yet: as written
        {"name": "SECRET", "value": "s3cr3t"},
        {"name": "A", "value": "$(SECRET)"},
        {"name": "C", "value": "$$(SECRET)"},
        {"name": "D", "value": "$$$(SECRET)"},
        {"name": "E", "value": "cost: 5$ $(SECRET"},
        {"name": "F", "value": "$(UNKNOWN) $() $$$$"},
        {"name": "G", "value": "$(PATH)"},  # the node's PATH is no variable of the container
    ]
    k8s.kubectl("apply", "-f", "-", input=json.dumps(manifest))
    eventually(phase(k8s, "expands", "Succeeded"), "the pod to succeed")
    seen = json.loads(k8s.kubectl("logs", "expands").stdout)
    assert seen["argv"] == ["s3cr3t", "$(SECRET)", "$s3cr3t", "$(PATH)", "$", "$"]
    assert seen["env"] == {
        "A": "s3cr3t",
        "B": "$(SECRET)",
        "C": "$(SECRET)",
        "D": "$s3cr3t",
        "E": "cost: 5$ $(SECRET",
        "F": "$(UNKNOWN) $() $$",
        "G": "$(PATH)",
    }
