"""The chart used as a user uses it: `helm` (Helm 4's own library, see helm_cli.py) and the
real `kubectl`, typed into a shell in a checkout of the repository, against the API emulator
with RBAC enforced, the operator's pods run by the local kubelet under the service account
the chart gives them.

One story, as docs/deploy.md tells it: install (adopting a CRD applied earlier with kubectl),
roll out, `helm test`, an `OutboxDispatcher` from examples/ delivering rows; the next release
of the chart (a new CRD schema, a new image tag) with `--reuse-values`; a production values
file (digest, served namespaces, monitors, alerts, dashboard); `helm test` again; `helm
rollback`; `helm uninstall`, after which the CRD, the resources and their workers stay and
still deliver; then the resources and the CRD deleted by hand. Every `helm` and `kubectl`
command of docs/deploy.md is run as written (the kubectl install path in its own test).
"""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import psycopg
import pytest
import yaml
from helpers import seed, statuses
from k8s.cluster import ADMIN_TOKEN, KUBECTL, LocalCluster
from k8s.kubelet import Kubelet
from k8s.test_operator import wait_for

from chart import chart as c
from chart.helm_cli import install_helm
from outbox.demo.sink import Sink

DOCS = c.ROOT / "docs" / "deploy.md"
PRODUCTION = Path(__file__).with_name("release") / "production.yaml"
RELEASE, NAMESPACE = "outbox-dispatcher", "outbox-system"
CRD_NAME = "outboxdispatchers.outbox.dev"
T = TypeVar("T")

# Which test runs which of the docs' commands (by their first words); together, all of them.
HELM_STORY = (
    "kubectl apply --server-side -f crds/outboxdispatchers.yaml",
    "kubectl label crd",
    "kubectl annotate crd",
    "helm install",
    "kubectl -n outbox-system rollout status",
    "helm test",
    "outbox migrate --table public.outbox",
    "kubectl create namespace shop",
    "kubectl -n shop apply -f examples/http.yaml",
    "kubectl -n shop get obd",
    "helm upgrade",
    "helm uninstall",
    "kubectl delete obd --all --all-namespaces",
    "kubectl delete crd",
    "kubectl -n outbox-system delete lease",
)
KUBECTL_STORY = (
    "kubectl create namespace outbox-system",
    "kubectl apply --server-side -f crds/outboxdispatchers.yaml",
    "kubectl apply -f examples/kubectl/outbox-dispatcher.yaml",
    "helm template",
    "kubectl apply -f outbox-dispatcher.yaml",
    "kubectl delete -f examples/kubectl/outbox-dispatcher.yaml",
)


def documented() -> list[str]:
    """The `helm`, `kubectl` and `outbox` commands of docs/deploy.md: each line of its sh
    blocks (continuations joined, comments dropped) and each `inline` command of its prose."""
    text = DOCS.read_text()
    commands: list[str] = []
    for block in re.findall(r"```sh\n(.*?)```", text, flags=re.S):
        for line in block.replace("\\\n", " ").splitlines():
            line = re.sub(r"\s+#.*$", "", line.strip())
            line = re.sub(r"\s+", " ", line)
            if line.split(" ", 1)[0] in ("helm", "kubectl", "outbox"):
                commands.append(line)
    for inline in re.findall(r"`((?:helm|kubectl) [^`]+)`", text):
        if len(inline.split()) >= 3:  # a command, not the name of a tool's verb
            commands.append(re.sub(r"\s+", " ", inline))
    return list(dict.fromkeys(commands))


def test_every_helm_and_kubectl_command_of_the_deploy_docs_is_run_by_a_story() -> None:
    commands = documented()
    assert len(commands) >= 15, commands
    stories = (*HELM_STORY, *KUBECTL_STORY)
    unrun = [cmd for cmd in commands if not any(cmd.startswith(s) for s in stories)]
    assert unrun == [], f"docs/deploy.md commands no test runs: {unrun}"
    for start in stories:
        assert any(cmd.startswith(start) for cmd in commands), f"no longer in the docs: {start}"


def pasted(notes: str) -> list[str]:
    """The commands release notes print, each as a user pastes it into a shell: an indented
    line and its `\\` continuations, and a here-document's lines up to its end, which a shell
    finds only in a line that is exactly the delimiter."""
    lines, commands, at = notes.splitlines(), [], 0
    while at < len(lines):
        line = lines[at].strip()
        at += 1
        if not lines[at - 1].startswith("  ") or not line or line.startswith("#"):
            continue
        while line.endswith("\\") and at < len(lines):
            line, at = line[:-1] + " " + lines[at].strip(), at + 1
        heredoc = re.search(r"<<-?'?(\w+)'?", line)
        if heredoc:
            end = next((i for i in range(at, len(lines)) if lines[i] == heredoc[1]), None)
            assert end is not None, f"the here-document of `{line}` never ends"
            line, at = "\n".join([line, *lines[at:end], heredoc[1]]), end + 1
        commands.append(line)
    return commands


def test_the_notes_commands_paste_into_a_shell() -> None:
    commands = pasted(c.render().notes)
    assert any("create secret generic orders-db" in cmd for cmd in commands), commands
    [applied] = [cmd for cmd in commands if "<<'YAML'" in cmd]
    sample = yaml.safe_load(applied.split("\n", 1)[1].rsplit("\n", 1)[0])
    assert sample["kind"] == "OutboxDispatcher"
    assert commands[-1].startswith("kubectl -n default describe obd orders")


def test_the_test_hook_says_its_component_once_and_is_no_endpoint_of_the_operator() -> None:
    rendered = c.render()
    text = next(t for path, t in rendered.manifests.items() if path.endswith("test-health.yaml"))
    # A key written twice is no YAML (the loaders here keep the last one silently).
    assert text.count("app.kubernetes.io/component:") == 1, text
    [hook] = rendered.hooks()
    assert hook["metadata"]["labels"]["app.kubernetes.io/component"] == "test"
    selector = rendered.one("Service")["spec"]["selector"]
    assert selector.items() - hook["metadata"]["labels"].items(), "the Service selects it"


class User:
    """A shell in a checkout of the repository (a copy of the chart, so that it can move to
    its next release; crds/ and examples/ as they are), with `helm` and kubectl on PATH and
    the cluster's admin kubeconfig."""

    def __init__(self, tmp_path: Path, cluster: LocalCluster) -> None:
        self.home = tmp_path / "checkout"
        shutil.copytree(c.CHART, self.home / "charts" / "outbox-dispatcher")
        for name in ("crds", "examples"):
            (self.home / name).symlink_to(c.ROOT / name)
        bin_dir = tmp_path / "bin"
        install_helm(bin_dir)
        self.env = {
            # `outbox` (the project's CLI) where pip puts it: beside this Python.
            "PATH": f"{bin_dir}:{Path(KUBECTL).parent}:{Path(sys.executable).parent}:/bin",
            "HOME": str(tmp_path),
            "KUBECONFIG": str(cluster.kubeconfig),
            "KUBECACHEDIR": str(tmp_path / "kubectl-cache"),
        }
        self.ran: list[str] = []

    def sh(self, command: str, timeout: float = 180, **env: str) -> str:
        """Run a command line as typed; what it printed (stdout, then stderr, where warnings
        go); a failure raises with everything said."""
        result = subprocess.run(
            ["bash", "-c", command],
            cwd=self.home,
            env={**self.env, **env},
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        self.ran.append(command)
        if result.returncode != 0:
            raise AssertionError(
                f"{command}\nexit {result.returncode}\n{result.stdout}\n{result.stderr}"
            )
        return result.stdout + result.stderr

    def docs(self, start: str, timeout: float = 180, *, having: str = "", lacking: str = "",
             fails: bool = False, **env: str) -> str:  # fmt: skip
        """Run the docs' command that starts with `start` (and has `having`, lacks
        `lacking`), exactly as written there; with `fails`, what it said when it failed."""
        [command] = [
            cmd
            for cmd in documented()
            if cmd.startswith(start) and having in cmd and not (lacking and lacking in cmd)
        ]
        if not fails:
            return self.sh(command, timeout, **env)
        with pytest.raises(AssertionError) as failed:
            self.sh(command, timeout, **env)
        return str(failed.value)

    def documented_run(self, stories: tuple[str, ...]) -> list[str]:
        """The story's docs commands that were not run."""
        return [s for s in stories if not any(cmd.startswith(s) for cmd in self.ran)]

    def next_release(self) -> None:
        """The checkout moves to the chart's next release: version 0.2.0, whose CRD gains
        an optional field (the CRD template renders it from files/crds/)."""
        chart = self.home / "charts" / "outbox-dispatcher"
        meta = (chart / "Chart.yaml").read_text()
        (chart / "Chart.yaml").write_text(
            meta.replace("version: 0.1.0", "version: 0.2.0").replace(
                'appVersion: "0.1.0"', 'appVersion: "0.2.0"'
            )
        )
        crd_path = chart / "files" / "crds" / "outboxdispatchers.yaml"
        crd = yaml.safe_load(crd_path.read_text())
        [version] = crd["spec"]["versions"]
        version["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]["note"] = {
            "type": "string",
            "maxLength": 200,
            "description": "A note for people (added in 0.2.0).",
        }
        crd_path.write_text(yaml.safe_dump(crd, sort_keys=False))


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    """An emulator whose authorizer is on: only the harness's admin token to begin with;
    the kubelet's TokenRequests add the pods' service accounts."""
    workdir = tmp_path / "k8s"
    workdir.mkdir()
    running = LocalCluster(workdir, tokens={}, rbac=[]).start()
    try:
        yield running
    finally:
        running.stop()
    assert not running.emulator.failures, running.emulator.failures


@pytest.fixture
def node(cluster: LocalCluster, tmp_path: Path) -> Iterator[Kubelet]:
    kubelet = Kubelet(cluster.url, ADMIN_TOKEN, tmp_path / "kubelet", ca_path=cluster.ca_path)
    cluster.emulator.pod_logs = kubelet.log
    kubelet.start()
    try:
        yield kubelet
    finally:
        kubelet.stop()
    assert not kubelet.failures, kubelet.failures
    assert not [r for r in kubelet.records if r.returncode is None]


def _crd(cluster: LocalCluster) -> list[dict[str, Any]]:
    return cluster.objects("apiextensions.k8s.io/v1", "customresourcedefinitions", None, CRD_NAME)


def _operator_pods(node: Kubelet) -> list[Any]:
    return node.pods(NAMESPACE, RELEASE)


def _rolled_to(node: Kubelet, needle: str) -> Callable[[], bool]:
    """All operator pods run a template whose text has `needle`, and they are ready."""

    def check() -> bool:
        pods = _operator_pods(node)
        return (
            len(pods) == 2
            and all(p.ready for p in pods)
            and all(needle in str(p.manifest["spec"]) for p in pods)
        )

    return check


def _explain(cluster: LocalCluster, node: Kubelet) -> str:
    """What to look at when the story stops: the kubelet's reasons and the pods' last logs."""
    lines = [f"kubelet errors: {node.errors}"]
    for record in node.records[-8:]:
        log = node.logs(record.namespace, record.name)[-1500:]
        lines.append(f"--- {record.namespace}/{record.name} rc={record.returncode}\n{log}")
    return "\n".join(lines)


def _wait(what: str, probe: Callable[[], T | None], cluster: LocalCluster, node: Kubelet,
          timeout: float = 90) -> T:  # fmt: skip
    try:
        return wait_for(what, probe, timeout=timeout)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{_explain(cluster, node)}") from None


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_install_serve_upgrade_test_rollback_uninstall(
    dsn: str, cluster: LocalCluster, node: Kubelet, tmp_path: Path
) -> None:
    user = User(tmp_path, cluster)
    # Before the chart: a CRD applied with kubectl, which the release adopts (the docs' steps).
    user.docs("kubectl apply --server-side -f crds/outboxdispatchers.yaml")
    user.docs("kubectl label crd")
    user.docs("kubectl annotate crd")
    user.docs("kubectl create namespace shop")  # made early: the production values serve it
    user.sh("kubectl create namespace billing")

    installed = user.docs("helm install")
    assert "STATUS: deployed" in installed and "REVISION: 1" in installed, installed
    user.docs("kubectl -n outbox-system rollout status", timeout=120)
    # The operator talks to the API as its service account, under the chart's RBAC: one
    # replica leads (ready comes first: standbys answer /healthz too).
    leader = _wait(
        "a leader",
        lambda: [
            lease["spec"].get("holderIdentity")
            for lease in cluster.objects("coordination.k8s.io/v1", "leases", NAMESPACE)
            if lease["spec"].get("holderIdentity")
        ],
        cluster,
        node,
    )
    assert leader[0].startswith(f"{RELEASE}-"), leader
    # The release notes' commands, pasted as printed: the sample dispatcher is accepted.
    printed = [user.sh(command) for command in pasted(installed.split("NOTES:\n", 1)[1])]
    assert printed[1].strip() == leader[0], printed[1]  # the lease's holder
    assert "Name:         orders" in printed[-1], printed[-1]  # kubectl describe
    [sample] = cluster.objects("outbox.dev/v1alpha1", "outboxdispatchers", "default", "orders")
    assert sample["spec"]["database"]["dsnSecretRef"] == {"name": "orders-db", "key": "dsn"}
    [secret] = cluster.objects("v1", "secrets", "default", "orders-db")
    assert secret["metadata"]["annotations"]["outbox.dev/dispatchers"] == "orders"
    user.sh("kubectl -n default delete obd orders && kubectl -n default delete secret orders-db")
    assert _rolled_to(node, "registry.example/outbox-dispatcher:0.1.0")()
    [crd] = _crd(cluster)
    assert crd["metadata"]["annotations"]["meta.helm.sh/release-name"] == RELEASE
    assert crd["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    assert {e["manager"] for e in crd["metadata"]["managedFields"]} >= {"kubectl", "helm"}

    tested = user.docs("helm test")
    assert "STATUS: deployed" in tested, tested
    test_pods = [r for r in node.records if r.deployment.endswith("-test-health")]
    assert [r.returncode for r in test_pods] == [0], _explain(cluster, node)
    assert "operator healthy, metrics served" in node.logs(NAMESPACE, test_pods[0].name)
    assert not cluster.objects("v1", "pods", NAMESPACE, test_pods[0].name)  # hook-succeeded

    with Sink() as sink, psycopg.connect(dsn, autocommit=True) as conn:

        def dispatch() -> None:
            """The table the example names made (here: found up to date), the example as it
            is, then what its CHANGE-MEs stand for: this database (kept out of the command
            line) and this API."""
            user.docs("outbox migrate", OUTBOX_DSN=dsn)
            user.docs("kubectl -n shop apply -f examples/http.yaml")
            secret = '{\\"stringData\\":{\\"dsn\\":\\"$DSN\\"}}'
            user.sh(f'kubectl -n shop patch secret orders-db -p "{secret}"', DSN=dsn)
            user.sh(
                "kubectl -n shop patch obd orders --type=merge -p "
                + shlex.quote(f'{{"spec":{{"publisher":{{"http":{{"url":"{sink.url}"}}}}}}}}')
            )

        dispatch()
        delivered: set[int] = set()

        def serves(batch: int, during: Callable[[], Any] | None = None) -> None:
            """`batch` more rows are delivered, each exactly where it should be, and none
            is lost or dead, while `during` happens."""
            ids = seed(conn, batch)
            if during is not None:
                during()
            _wait(
                f"{batch} more rows delivered",
                lambda: statuses(conn) == {"done": len(delivered) + batch},
                cluster,
                node,
                timeout=120,
            )
            delivered.update(ids)
            assert sink.wait_idle()  # a reply is recorded after it is sent
            assert set(sink.delivered_ids()) == delivered

        serves(50)
        table = user.docs("kubectl -n shop get obd")
        assert re.search(r"^orders\s", table, re.M), table

        # The chart's next release: `--reuse-values` keeps the image repository, the tag
        # moves; the new CRD schema is applied; the operator and the workers roll.
        note = 'kubectl -n shop patch obd orders --type=merge -p \'{"spec":{"note":"x"}}\''
        assert 'unknown field "spec.note"' in user.sh(note)  # pruned, with a warning
        user.next_release()
        # Adopted from kubectl, the CRD's fields are kubectl's too: the plain upgrade is
        # refused, and the docs' forced one goes through.
        refused = user.docs("helm upgrade", lacking="--force-conflicts", fails=True)
        assert 'conflict with "kubectl": .spec.versions' in refused, refused
        serves(100, during=lambda: user.docs("helm upgrade", having="--force-conflicts"))
        user.docs("kubectl -n outbox-system rollout status", timeout=120)
        _wait("the operator on 0.2.0", _rolled_to(node, "outbox-dispatcher:0.2.0"), cluster, node)
        assert "unknown field" not in user.sh(note)
        [orders] = cluster.objects("outbox.dev/v1alpha1", "outboxdispatchers", "shop", "orders")
        assert orders["spec"]["note"] == "x"
        _wait(
            "the workers on 0.2.0",
            lambda: (
                (p := node.pods("shop", "orders-worker"))
                and all("outbox-dispatcher:0.2.0" in str(w.manifest["spec"]) for w in p)
            ),
            cluster,
            node,
        )

        # A production values file: served namespaces, monitors, alerts, dashboard, digest.
        for path in sorted(c.FOREIGN_CRDS.glob("monitoring.coreos.com_*.yaml")):
            user.sh(f"kubectl apply --server-side -f {shlex.quote(str(path))}")
        shutil.copy(PRODUCTION, user.home / "production.yaml")
        serves(
            100,
            during=lambda: user.sh(
                "helm upgrade outbox-dispatcher charts/outbox-dispatcher -n outbox-system "
                "-f production.yaml"
            ),
        )
        user.sh("kubectl -n outbox-system rollout status deployment/outbox-dispatcher")
        _wait("the operator by digest", _rolled_to(node, "@sha256:4b9a1d1e"), cluster, node)
        monitors = user.sh(
            "kubectl -n outbox-system get servicemonitors,podmonitors,prometheusrules,"
            "configmaps -o name"
        )
        for name in ("servicemonitor", "podmonitor", "prometheusrule"):
            assert f"{name}.monitoring.coreos.com/{RELEASE}" in monitors, monitors
        assert not cluster.objects("rbac.authorization.k8s.io/v1", "clusterrolebindings")
        assert {r["metadata"]["namespace"] for r in cluster.objects(
            "rbac.authorization.k8s.io/v1", "roles")} == {"shop", "billing", NAMESPACE}  # fmt: skip
        tested = user.docs("helm test")
        assert "STATUS: deployed" in tested, tested
        serves(50)

        # Rollback: to the previous revision (cluster-wide, no monitors), the CRD as is.
        serves(50, during=lambda: user.sh("helm rollback outbox-dispatcher -n outbox-system"))
        _wait("the operator rolled back", _rolled_to(node, "outbox-dispatcher:0.2.0"), cluster,
              node)  # fmt: skip
        history = user.sh("helm history outbox-dispatcher -n outbox-system").splitlines()[1:]
        assert history[-1].split("\t")[:2] == [str(len(history)), "deployed"], history
        assert not user.sh("kubectl -n outbox-system get servicemonitors -o name").strip()
        assert cluster.objects("rbac.authorization.k8s.io/v1", "clusterrolebindings")
        serves(50)

        # Uninstall: the operator and its RBAC go; the CRD, the resource and its workers stay
        # and deliver on without an operator.
        out = user.docs("helm uninstall")
        assert "outboxdispatchers.outbox.dev" in out, out  # kept by its resource policy
        _wait("the operator gone", lambda: not _operator_pods(node), cluster, node)
        assert not cluster.objects("apps/v1", "deployments", NAMESPACE)
        assert not cluster.objects("rbac.authorization.k8s.io/v1", "clusterroles")
        assert _crd(cluster)
        assert cluster.objects("outbox.dev/v1alpha1", "outboxdispatchers", "shop", "orders")
        assert node.pods("shop", "orders-worker")
        # The Lease is the operator's own: it stays (unreleased: the operator's RBAC went
        # with it).
        assert cluster.objects("coordination.k8s.io/v1", "leases", NAMESPACE)
        serves(50)

        # Removing everything, as the docs say: the resources (their workers go with them),
        # then the CRD. The rows stay.
        user.docs("kubectl delete obd --all --all-namespaces")
        _wait("the workers gone", lambda: not node.pods("shop", "orders-worker"), cluster, node)
        assert not cluster.objects("apps/v1", "deployments", "shop")
        user.docs("kubectl delete crd")
        assert not _crd(cluster)
        user.docs("kubectl -n outbox-system delete lease")
        assert not cluster.objects("coordination.k8s.io/v1", "leases", NAMESPACE)
        assert statuses(conn) == {"done": len(delivered)}

        # A fresh install from the production values file alone (the release's history went
        # with the uninstall), serving the example again.
        out = user.sh(
            "helm install outbox-dispatcher charts/outbox-dispatcher -n outbox-system "
            "-f production.yaml"
        )
        assert "REVISION: 1" in out and "It serves OutboxDispatchers in shop, billing" in out, out
        user.docs("kubectl -n outbox-system rollout status", timeout=120)
        _wait("the operator by digest", _rolled_to(node, "@sha256:4b9a1d1e"), cluster, node)
        dispatch()
        serves(50)
        tested = user.docs("helm test")
        assert "STATUS: deployed" in tested, tested
        user.docs("helm uninstall")
    assert user.documented_run(HELM_STORY) == []


@pytest.mark.slow
def test_the_kubectl_install_path(cluster: LocalCluster, tmp_path: Path) -> None:
    """Install with kubectl apply, render one's own values with `helm template`, and remove
    the install with `kubectl delete -f`, as docs/deploy.md says."""
    user = User(tmp_path, cluster)
    user.docs("kubectl create namespace outbox-system")
    user.docs("kubectl apply --server-side -f crds/outboxdispatchers.yaml")
    applied = user.docs("kubectl apply -f examples/kubectl/outbox-dispatcher.yaml")
    assert "deployment.apps/outbox-dispatcher created" in applied, applied
    [deployment] = cluster.objects("apps/v1", "deployments", NAMESPACE)
    assert deployment["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "kubectl"
    # A user's own values rendered for kubectl and applied instead: the served namespaces
    # become Roles; like the example, no CRD (applied from crds/) and no `helm test` hook,
    # whose Pod kubectl would run as a stray test.
    (user.home / "my-values.yaml").write_text("watch:\n  namespaces: [shop]\n")
    user.sh("kubectl create namespace shop")
    user.docs("helm template")
    rendered = yaml.safe_load_all((user.home / "outbox-dispatcher.yaml").read_text())
    kinds = [o["kind"] for o in rendered if o]
    assert "ClusterRoleBinding" not in kinds and "RoleBinding" in kinds, kinds
    assert "CustomResourceDefinition" not in kinds and "Pod" not in kinds, kinds
    user.docs("kubectl apply -f outbox-dispatcher.yaml")
    [deployment] = cluster.objects("apps/v1", "deployments", NAMESPACE)
    assert "--namespace=shop" in deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    assert cluster.objects("rbac.authorization.k8s.io/v1", "roles", "shop")
    assert not cluster.objects("v1", "pods", NAMESPACE)
    user.docs("kubectl delete -f examples/kubectl/outbox-dispatcher.yaml")
    assert not cluster.objects("apps/v1", "deployments", NAMESPACE)
    assert not cluster.objects("rbac.authorization.k8s.io/v1", "clusterroles")
    # The CRD was applied on its own and stays.
    assert _crd(cluster)
    assert user.documented_run(KUBECTL_STORY) == []
