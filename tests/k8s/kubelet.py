"""A local kubelet (and deployment controller, and kube-proxy) for the tests: Deployments
and Pods become processes.

It watches the emulator's Deployments and keeps, for each, `spec.replicas` real processes
running from the pod template's first container:

- the command: `command` (else `default_command`, the image's entrypoint: images are not
  run) plus `args`; the executable is looked up in the test environment's bin directory
  (`outbox-worker` is the project's own console script), then in /usr/bin and /bin, with
  `$(VAR)` references to the container's variables expanded and `$$` read as one `$`, as a
  real kubelet reads them (expansion.py);
- the environment: `env` values (`$(VAR)` expanded from the variables declared before, the
  same way), `valueFrom.secretKeyRef` and `configMapKeyRef` read from the
  emulator (a missing Secret or key holds the pod back, as CreateContainerConfigError does),
  `fieldRef` for `metadata.name`, `metadata.namespace` and `spec.nodeName`, and `envFrom`;
  nothing is inherited from the test process except PATH;
- ports: every pod gets its own free local port for each declared `containerPort` N; any env
  value or argument equal to N (or ending in `:N` or `=N`) is rewritten to it, and probes on
  N (by number or by port name) go to it. So `OUTBOX_METRICS_PORT=9090` with containerPort
  9090 and a `/readyz` probe on 9090 works with many pods on one machine;
- probes (`httpGet` on 127.0.0.1; exec and tcpSocket probes pass), every `probe_interval`
  seconds rather than `periodSeconds` (tests should not wait), `initialDelaySeconds` not
  waited for: first the startup probe (a container that does not pass it within
  `failureThreshold` x `periodSeconds` is restarted); then readiness (ready after
  `successThreshold` successes, unready after `failureThreshold` failures; no probe: ready
  once started) and liveness, which starts once the startup probe, or else the readiness
  probe, passed, and restarts the container after `failureThreshold` failures (SIGTERM, then
  SIGKILL after the grace period: a SIGSTOPped worker is killed and restarted);
- status: `replicas`, `readyReplicas`, `availableReplicas`, `updatedReplicas`,
  `unavailableReplicas`, `observedGeneration` and the Available/Progressing conditions are
  written to the Deployment's status subresource (zero counts omitted, as the real
  controller does);
- rollouts: a changed pod template starts pods of the new template and stops old ones within
  `maxSurge`/`maxUnavailable` (RollingUpdate) or stops all first (Recreate); a pod counts as
  available `minReadySeconds` after it became ready; `paused: true` holds the template back;
- stopping (scale-down, rollout, deletion, kubelet stop): SIGTERM, then SIGKILL after the pod's
  `terminationGracePeriodSeconds`; scale-down picks unready pods first, then the newest;
- a process that exits on its own is restarted (restartPolicy Always) after a short backoff;
  meanwhile its Pod's container waits in `CrashLoopBackOff` with the exit as `lastState`
  (the end of its log as the message with `terminationMessagePolicy: FallbackToLogsOnError`);
- images: the image is not pulled; an image a test registered in `Kubelet.images` (reference
  -> a directory) has its commands looked up there first; one in `Kubelet.unpullable`
  (reference -> the registry's error) never starts: its Pod waits in `ErrImagePull`, then
  `ImagePullBackOff`, and is never ready.

- Pod objects: each process is published as a Pod (owned by its Deployment, since there are
  no ReplicaSets here) whose status says Running and Ready; `kubectl get pods` lists them,
  `kubectl delete pod` stops the process, which the Deployment then replaces, and
  `kubectl logs` shows the process's output.

- Pods made by others (not of a Deployment: a `helm test` hook) run the same way, once: by
  their restartPolicy (Never, OnFailure, Always) an exit ends them with phase Succeeded or
  Failed and the container's exit code in their status, or restarts them; deleting one
  stops its process.
- Services: a Service's cluster DNS name in a pod's arguments or environment,
  `<service>.<namespace>.svc[.cluster.local][:port]`, is rewritten to a local proxy of that
  Service port (started on first use), which forwards each connection to a ready pod the
  Service selects, at its `targetPort` (a number or a container port's name).
- Service accounts: a pod that mounts its account's token (`automountServiceAccountToken`
  not false, and the account named, or `default` if it exists) gets one from a TokenRequest,
  as a kubeconfig in `KUBECONFIG` (clients fall back to it without the in-cluster files,
  which cannot be written here); an account named but missing holds the pod back.

Not emulated: ReplicaSets, resources, volumes,
nodeSelector/affinity/tolerations (one local node), the image itself, cluster DNS itself.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import json
import math
import os
import re
import secrets
import shutil
import signal
import socket
import ssl
import sys
import threading
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from .expansion import expand
from .loops import close_unwound

JSON = dict[str, Any]


class ConfigError(Exception):
    """The pod cannot start yet (a Secret or key missing, no such executable)."""


@dataclass
class PodRecord:
    """What became of a process, for assertions."""

    name: str
    namespace: str
    deployment: str
    pid: int
    returncode: int | None = None
    signals: list[str] = field(default_factory=list)  # what the kubelet sent, in order
    reason: str = ""  # why it was stopped: scale-down, rollout, deleted, kubelet-stop


@dataclass
class Pod:
    manifest: JSON  # the Pod object the kubelet publishes for it
    name: str
    namespace: str
    deployment: str
    template_hash: str
    process: asyncio.subprocess.Process
    ports: dict[int, int]  # declared containerPort -> local port
    probe: JSON | None
    grace: float
    record: PodRecord
    started: float = field(default_factory=time.monotonic)
    ready: bool = False
    ready_since: float | None = None  # when it last became ready (for minReadySeconds)
    successes: int = 0
    failures: int = 0
    stopping: asyncio.Future[None] | None = None
    restarts: int = 0
    # (ready, restarts, exited, waiting on a pull) last written to the Pod
    reported: tuple[bool, int, bool, str] | None = None
    liveness: JSON | None = None
    startup: JSON | None = None
    started_ok: bool = False  # the startup probe (else the readiness probe) passed once
    liveness_failures: int = 0
    killing: asyncio.Future[None] | None = None  # a liveness or startup failure's restart
    phase: tuple[str, bool, int] | None = None  # a bare pod's (phase, ready, restarts) reported
    # The container's previous run, as a real kubelet reports it in `lastState.terminated`.
    last_termination: JSON | None = None
    pull_error: str = ""  # the image could not be pulled: no container ever runs


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def template_hash(template: JSON) -> str:
    return hashlib.sha256(json.dumps(template, sort_keys=True).encode()).hexdigest()[:10]


def _count(value: Any, replicas: int, round_up: bool) -> int:
    if isinstance(value, str) and value.endswith("%"):
        exact = replicas * int(value[:-1]) / 100
        return math.ceil(exact) if round_up else math.floor(exact)
    return int(value or 0)


class Kubelet:
    def __init__(
        self,
        url: str,
        token: str,
        workdir: Path,
        *,
        bin_dir: Path | None = None,
        default_command: tuple[str, ...] = ("outbox-worker",),
        probe_interval: float = 0.2,
        ca_path: Path | None = None,
    ) -> None:
        self.url = url
        self.workdir = workdir
        self.bin_dir = bin_dir or Path(sys.executable).parent
        self.default_command = default_command
        # Images with a filesystem of their own: image reference -> the directory its commands
        # are found in first (a test "builds" an image there); any other image runs the test
        # environment's scripts.
        self.images: dict[str, Path] = {}
        # Images the registry does not serve: image reference -> the pull error. Their pods
        # never start a container (a placeholder process holds the pod's place) and wait in
        # ErrImagePull, then ImagePullBackOff.
        self.unpullable: dict[str, str] = {}
        self.probe_interval = probe_interval
        self._headers = {"Authorization": f"Bearer {token}"}
        self._ssl = ssl.create_default_context(cafile=str(ca_path)) if ca_path else None
        self._ca_path = ca_path
        self._deployments: dict[tuple[str, str], JSON] = {}
        self._pods: dict[tuple[str, str], list[Pod]] = {}
        self._written: dict[tuple[str, str], JSON] = {}
        self.records: list[PodRecord] = []
        # Why a Deployment's pod is held back, e.g. a missing Secret (the latest reason).
        self.errors: dict[tuple[str, str], str] = {}
        self.failures: list[str] = []  # the kubelet's own errors (tracebacks)
        self.unfinished: list[asyncio.Task[object]] = []  # pending when its loop stopped
        self._terminations: set[asyncio.Future[None]] = set()
        # Pods made by others (`helm test` hooks): (namespace, name) -> the running pod.
        self._bare: dict[tuple[str, str], Pod] = {}
        # The local proxy of each Service port: (namespace, service, port) -> its server.
        self._proxies: dict[tuple[str, str, int], asyncio.Server] = {}
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, name="kubelet", daemon=True)
        self._stop = threading.Event()
        self._wake: asyncio.Event | None = None
        self._session: aiohttp.ClientSession | None = None

    # ---- lifecycle -----------------------------------------------------------------------

    def start(self) -> Kubelet:
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop every pod (SIGTERM, then SIGKILL after its grace period) and the kubelet."""
        self._stop.set()
        if self._wake is not None:
            self._loop.call_soon_threadsafe(self._wake.set)
        self._thread.join(120)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self._loop.run_until_complete(self._main())
        finally:
            self.unfinished = close_unwound(self._loop)

    async def _main(self) -> None:
        self._wake = asyncio.Event()
        connector = aiohttp.TCPConnector(ssl=self._ssl) if self._ssl else None
        async with aiohttp.ClientSession(
            self.url, headers=self._headers, connector=connector
        ) as session:
            self._session = session
            watcher = asyncio.create_task(self._watch(session))
            try:
                while not self._stop.is_set():
                    try:
                        await self._tick(session)
                    except aiohttp.ClientError:
                        pass  # the API server went away for a moment: the next tick retries
                    except Exception:
                        # A kubelet bug: kept (the fixture fails the test) but never fatal, so
                        # the pods are still stopped at the end.
                        self.failures.append(traceback.format_exc())
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._wake.wait(), self.probe_interval)
                    self._wake.clear()
            finally:
                watcher.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await watcher
                for pods in [*self._pods.values(), list(self._bare.values())]:
                    for pod in pods:
                        self._stop_pod(pod, "kubelet-stop")
                await asyncio.gather(*self._terminations)
                for server in self._proxies.values():
                    server.close()
                    await server.wait_closed()

    async def _watch(self, session: aiohttp.ClientSession) -> None:
        """List, then watch from the list's resourceVersion; relist on 410 or a dropped stream."""
        while True:
            try:
                async with session.get("/apis/apps/v1/deployments") as response:
                    listing = await response.json()
                self._deployments = {
                    (d["metadata"]["namespace"], d["metadata"]["name"]): d
                    for d in listing.get("items", [])
                }
                version = listing["metadata"]["resourceVersion"]
                params = {"watch": "true", "resourceVersion": version, "timeoutSeconds": "300"}
                assert self._wake is not None
                self._wake.set()
                async with session.get(
                    "/apis/apps/v1/deployments",
                    params=params,
                    timeout=aiohttp.ClientTimeout(total=None),
                ) as stream:
                    async for line in stream.content:
                        event = json.loads(line)
                        if event["type"] == "ERROR":
                            break
                        obj = event["object"]
                        key = (obj["metadata"]["namespace"], obj["metadata"]["name"])
                        if event["type"] == "DELETED":
                            self._deployments.pop(key, None)
                        else:
                            self._deployments[key] = obj
                        self._wake.set()
            except (aiohttp.ClientError, json.JSONDecodeError, KeyError):
                await asyncio.sleep(0.2)

    # ---- reconciling ---------------------------------------------------------------------

    async def _tick(self, session: aiohttp.ClientSession) -> None:
        for key in list(self._pods):
            if key not in self._deployments:
                for pod in self._pods.pop(key):
                    self._stop_pod(pod, "deleted")
        async with session.get("/api/v1/pods") as response:
            listing = await response.json() if response.status == 200 else {"items": []}
        existing = {
            (p["metadata"]["namespace"], p["metadata"]["name"])
            for p in listing["items"]
            if not p["metadata"].get("deletionTimestamp")
        }
        await self._run_bare_pods(session, listing["items"])
        for key, deployment in list(self._deployments.items()):
            pods = self._pods.setdefault(key, [])
            for pod in pods:
                if pod.reported is not None and (pod.namespace, pod.name) not in existing:
                    self._stop_pod(pod, "pod-deleted")  # `kubectl delete pod`: a replacement
            await self._restart_exited(session, deployment, pods)
            await asyncio.gather(*(self._probe(session, p) for p in pods if not p.stopping))
            for pod in pods:
                if not pod.ready:
                    pod.ready_since = None
                elif pod.ready_since is None:
                    pod.ready_since = time.monotonic()
            await asyncio.gather(*(self._report(session, p) for p in pods if not p.stopping))
            await self._converge(session, deployment, pods)
            pods[:] = [p for p in pods if not (p.stopping and p.stopping.done())]
            await self._write_status(session, deployment, pods)

    async def _converge(
        self, session: aiohttp.ClientSession, deployment: JSON, pods: list[Pod]
    ) -> None:
        spec = deployment.get("spec", {})
        desired = int(spec.get("replicas", 1))
        current_hash = _current_hash(deployment, pods)
        live = [p for p in pods if not p.stopping]
        new = [p for p in live if p.template_hash == current_hash]
        old = [p for p in live if p.template_hash != current_hash]
        strategy = spec.get("strategy", {})
        if strategy.get("type") == "Recreate":
            surge, unavailable = 0, desired
        else:
            rolling = strategy.get("rollingUpdate", {})
            surge = _count(rolling.get("maxSurge", "25%"), desired, round_up=True)
            unavailable = _count(rolling.get("maxUnavailable", "25%"), desired, round_up=False)
            if surge == 0 and unavailable == 0:
                unavailable = 1
        # Start pods of the current template, within the surge.
        room = desired + surge - len(live) - sum(1 for p in pods if p.stopping)
        if strategy.get("type") == "Recreate" and (old or any(p.stopping for p in pods)):
            room = 0
        for _ in range(max(0, min(desired - len(new), room))):
            pod = await self._start_pod(session, deployment, current_hash)
            if pod is None:
                break
            pods.append(pod)
            live.append(pod)
            new.append(pod)
        # Stop old pods while enough stay ready; then surplus new pods.
        min_ready = float(spec.get("minReadySeconds", 0))
        available = sum(1 for p in live if _available(p, min_ready))
        floor = desired - unavailable
        for pod in sorted(old, key=lambda p: (_available(p, min_ready), -p.started)):
            if _available(pod, min_ready) and available - 1 < floor:
                break
            available -= _available(pod, min_ready)
            self._stop_pod(pod, "rollout")
        surplus = len(new) - desired
        if surplus > 0 and not old:
            for pod in sorted(new, key=lambda p: (p.ready, -p.started))[:surplus]:
                self._stop_pod(pod, "scale-down")

    async def _restart_exited(
        self, session: aiohttp.ClientSession, deployment: JSON, pods: list[Pod]
    ) -> None:
        for index, pod in enumerate(pods):
            if pod.stopping or pod.process.returncode is None:
                continue
            if pod.killing is not None and not pod.killing.done():
                continue
            pod.record.returncode = pod.process.returncode
            pod.ready = False
            backoff = min(10.0, 0.5 * 2**pod.restarts)
            if time.monotonic() - pod.started < backoff:
                continue
            replacement = await self._start_pod(
                session, deployment, pod.template_hash, name=pod.name
            )
            if replacement is not None:
                replacement.restarts = pod.restarts + 1
                replacement.reported = (False, -1, False, "") if pod.reported is not None else None
                replacement.last_termination = self._termination(pod)
                pods[index] = replacement

    async def _start_pod(
        self, session: aiohttp.ClientSession, deployment: JSON, hash_: str, name: str | None = None
    ) -> Pod | None:
        meta = deployment["metadata"]
        namespace, deployment_name = meta["namespace"], meta["name"]
        pod_name = name or f"{deployment_name}-{hash_[:8]}-" + "".join(
            secrets.choice("bcdfghjklmnpqrstvwxz2456789") for _ in range(5)
        )
        template = deployment["spec"]["template"]
        manifest = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": pod_name,
                "namespace": namespace,
                "labels": {
                    **template.get("metadata", {}).get("labels", {}),
                    "pod-template-hash": hash_,
                },
                "annotations": template.get("metadata", {}).get("annotations", {}),
                # The real owner is a ReplicaSet; there are none here.
                "ownerReferences": [
                    {
                        "apiVersion": "apps/v1",
                        "kind": "Deployment",
                        "name": deployment_name,
                        "uid": meta["uid"],
                        "controller": True,
                        "blockOwnerDeletion": True,
                    }
                ],
            },
            "spec": {**template.get("spec", {}), "nodeName": "local"},
        }
        return await self._launch(session, manifest, deployment_name, hash_)

    async def _launch(
        self, session: aiohttp.ClientSession, manifest: JSON, owner: str, hash_: str
    ) -> Pod | None:
        """Start the process of a pod's first container; None (and the reason in `errors`,
        under the owner's name) if it cannot start yet."""
        namespace, pod_name = manifest["metadata"]["namespace"], manifest["metadata"]["name"]
        pod_spec = manifest["spec"]
        container = pod_spec["containers"][0]
        ports = {int(p["containerPort"]): _free_port() for p in container.get("ports", [])}
        try:
            declared = await self._environment(session, namespace, pod_name, container, ports)
            # What the node adds to every process (not variables `$(VAR)` may refer to),
            # under the container's own.
            env = {
                "PATH": f"{self.bin_dir}{os.pathsep}/usr/bin:/bin",
                "HOSTNAME": pod_name,
                "HOME": str(self.workdir / namespace),
                **declared,
            }
            env.update(await self._service_account(session, namespace, pod_name, pod_spec))
            pull_error = self.unpullable.get(str(container.get("image", "")), "")
            if pull_error:
                # No container: a placeholder process stands for the pod until it goes.
                placeholder = shutil.which("sleep", path="/usr/bin:/bin")
                assert placeholder is not None
                command = [placeholder, "86400"]
            else:
                command = self._command(container, declared, env, ports)
            # Service names become their local proxies (no cluster DNS here).
            env = {k: await self._services_in(session, v) for k, v in env.items()}
            command = [await self._services_in(session, part) for part in command]
        except ConfigError as exc:
            self.errors[(namespace, owner)] = str(exc)
            return None
        self.errors.pop((namespace, owner), None)
        log_dir = self.workdir / namespace
        log_dir.mkdir(parents=True, exist_ok=True)
        with open(log_dir / f"{pod_name}.log", "ab") as log:  # noqa: ASYNC230 - local, once per pod
            process = await asyncio.create_subprocess_exec(
                *command,
                env=env,
                stdout=log,
                stderr=log,
                stdin=asyncio.subprocess.DEVNULL,
                cwd=log_dir,
                start_new_session=True,
            )
        record = PodRecord(pod_name, namespace, owner, process.pid)
        self.records.append(record)
        probes = {
            kind: {**probe, "port": self._probe_port(probe, container, ports)}
            for kind in ("readinessProbe", "livenessProbe", "startupProbe")
            if isinstance(probe := container.get(kind), dict)
        }
        started = Pod(
            manifest,
            pod_name,
            namespace,
            owner,
            hash_,
            process,
            ports,
            probes.get("readinessProbe"),
            float(pod_spec.get("terminationGracePeriodSeconds", 30)),
            record,
        )
        started.liveness = probes.get("livenessProbe")
        started.startup = probes.get("startupProbe")
        started.pull_error = pull_error
        return started

    # ---- pods made by others ----------------------------------------------------------------

    async def _run_bare_pods(self, session: aiohttp.ClientSession, listed: list[JSON]) -> None:
        """Pods not of a Deployment (a `helm test` hook): run each once, restart it as its
        restartPolicy says, report its phase and container state; a deleted pod is stopped."""
        seen = set()
        for obj in listed:
            meta = obj["metadata"]
            if any(r.get("kind") == "Deployment" for r in meta.get("ownerReferences") or []):
                continue  # one of this kubelet's own
            key = (meta["namespace"], meta["name"])
            if meta.get("deletionTimestamp"):
                continue
            seen.add((key, meta["uid"]))
            pod = self._bare.get(key)
            if pod is not None and pod.manifest["metadata"]["uid"] == meta["uid"]:
                continue
            if obj.get("status", {}).get("phase") in ("Succeeded", "Failed"):
                continue  # finished before this kubelet saw it
            if pod is not None:
                self._stop_pod(pod, "pod-deleted")
            started = await self._launch(session, obj, meta["name"], "")
            if started is not None:
                self._bare[key] = started
        for key, pod in list(self._bare.items()):
            if (key, pod.manifest["metadata"]["uid"]) not in seen:
                self._stop_pod(self._bare.pop(key), "pod-deleted")
                continue
            if pod.stopping:
                continue
            await self._probe(session, pod)
            await self._bare_status(session, pod)

    async def _bare_status(self, session: aiohttp.ClientSession, pod: Pod) -> None:
        code = pod.process.returncode
        policy = pod.manifest["spec"].get("restartPolicy", "Always")
        if code is not None and (policy == "Always" or (policy == "OnFailure" and code)):
            pod.record.returncode = code
            if time.monotonic() - pod.started >= min(10.0, 0.5 * 2**pod.restarts):
                again = await self._launch(session, pod.manifest, pod.name, "")
                if again is not None:
                    again.restarts, again.phase = pod.restarts + 1, pod.phase
                    self._bare[(pod.namespace, pod.name)] = again
            return
        if code is not None:
            pod.record.returncode = code
        phase = "Running" if code is None else "Succeeded" if code == 0 else "Failed"
        state = (phase, pod.ready, pod.restarts)
        if pod.phase == state:
            return
        container = pod.manifest["spec"]["containers"][0]
        ready = "True" if pod.ready and code is None else "False"
        running: JSON = {"running": {"startedAt": _timestamp(pod.started)}}
        terminated: JSON = {
            "terminated": {
                "exitCode": code,
                "reason": "Completed" if code == 0 else "Error",
                "startedAt": _timestamp(pod.started),
                "finishedAt": _timestamp(time.monotonic()),
            }
        }
        status = _pod_status(
            phase, container, ready, pod.restarts, code is None,
            running if code is None else terminated, start_time=_timestamp(pod.started),
        )  # fmt: skip
        path = f"/api/v1/namespaces/{pod.namespace}/pods/{pod.name}/status"
        async with session.patch(
            path, data=json.dumps(status), headers={"Content-Type": "application/merge-patch+json"}
        ) as response:
            if response.status == 200:
                pod.phase = state

    # ---- service accounts and services -------------------------------------------------------

    async def _service_account(
        self, session: aiohttp.ClientSession, namespace: str, pod: str, spec: JSON
    ) -> dict[str, str]:
        """The pod's service account token (a TokenRequest), as a kubeconfig in KUBECONFIG:
        clients that find no in-cluster files fall back to it. Nothing when the pod or its
        account turns automounting off, or names no account and `default` does not exist
        (the emulator makes no default accounts); an account named but missing holds the
        pod back, as on a real node."""
        automount = spec.get("automountServiceAccountToken")
        if automount is False:
            return {}
        named = spec.get("serviceAccountName") or spec.get("serviceAccount")
        account = named or "default"
        path = f"/api/v1/namespaces/{namespace}/serviceaccounts/{account}"
        async with session.get(path) as response:
            if response.status == 404:
                if named:
                    raise ConfigError(f'serviceaccount "{account}" not found')
                return {}
            found = await response.json()
        if automount is None and found.get("automountServiceAccountToken") is False:
            return {}
        request = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {}}
        async with session.post(f"{path}/token", json=request) as response:
            if response.status != 201:
                raise ConfigError(f"token request for {account} answered {response.status}")
            token = (await response.json())["status"]["token"]
        cluster: JSON = {"server": self.url}
        if self._ca_path is not None:
            cluster["certificate-authority"] = str(self._ca_path)
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "current-context": "pod",
            "clusters": [{"name": "cluster", "cluster": cluster}],
            "users": [{"name": account, "user": {"token": token}}],
            "contexts": [
                {
                    "name": "pod",
                    "context": {"cluster": "cluster", "user": account, "namespace": namespace},
                }
            ],
        }
        folder = self.workdir / namespace
        folder.mkdir(parents=True, exist_ok=True)
        kubeconfig = folder / f"{pod}.kubeconfig"
        kubeconfig.touch(mode=0o600)
        kubeconfig.write_text(json.dumps(config))
        return {"KUBECONFIG": str(kubeconfig)}

    async def _services_in(self, session: aiohttp.ClientSession, value: str) -> str:
        """`value` with each `<service>.<namespace>.svc[.cluster.local][:port]` replaced by
        the Service's local proxy, `127.0.0.1:<port>` (left alone if there is no such
        Service or port)."""
        parts, last = [], 0
        for match in _SERVICE_HOST.finditer(value):
            name, namespace, port = match.group(1), match.group(2), match.group(3)
            local = await self._service_proxy(session, namespace, name, port)
            parts += [value[last : match.start()], f"127.0.0.1:{local}" if local else match[0]]
            last = match.end()
        return "".join(parts) + value[last:]

    async def _service_proxy(
        self, session: aiohttp.ClientSession, namespace: str, name: str, port: str | None
    ) -> int | None:
        """The local port of a Service port's proxy, started on first use (kube-proxy's part:
        each connection goes to a ready pod the Service selects, at its target port)."""
        async with session.get(f"/api/v1/namespaces/{namespace}/services/{name}") as response:
            if response.status != 200:
                return None
            service = await response.json()
        spec = service.get("spec", {})
        listed = spec.get("ports") or []
        wanted = int(port) if port else 80
        chosen = next((p for p in listed if p.get("port") == wanted), None)
        if chosen is None and port is None and len(listed) == 1:
            chosen = listed[0]
        if chosen is None:
            return None
        key = (namespace, name, int(chosen["port"]))
        server = self._proxies.get(key)
        if server is None:
            selector = dict(spec.get("selector") or {})
            target = chosen.get("targetPort", chosen["port"])

            async def connect(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
                await self._forward(reader, writer, namespace, selector, target)

            server = await asyncio.start_server(connect, "127.0.0.1", 0)
            self._proxies[key] = server
        return int(server.sockets[0].getsockname()[1])

    async def _forward(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        namespace: str,
        selector: dict[str, str],
        target: int | str,
    ) -> None:
        pods = [*(p for ps in self._pods.values() for p in ps), *self._bare.values()]
        endpoints = [
            local
            for pod in pods
            if pod.namespace == namespace and pod.ready and not pod.stopping and selector
            and all(pod.manifest["metadata"].get("labels", {}).get(k) == v
                    for k, v in selector.items())
            and (local := _target_port(pod, target)) is not None
        ]  # fmt: skip
        if not endpoints:
            writer.close()  # no ready endpoint: the connection is refused, in effect
            return
        try:
            upstream_reader, upstream_writer = await asyncio.open_connection(
                "127.0.0.1", secrets.choice(endpoints)
            )
        except OSError:
            writer.close()
            return

        async def pipe(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
            try:
                while data := await source.read(65536):
                    sink.write(data)
                    await sink.drain()
            except (ConnectionError, asyncio.CancelledError):
                pass
            finally:
                sink.close()

        await asyncio.gather(pipe(reader, upstream_writer), pipe(upstream_reader, writer))

    def _stop_pod(self, pod: Pod, reason: str) -> None:
        if pod.stopping is None:
            pod.stopping = asyncio.ensure_future(self._terminate(pod, reason))
            self._terminations.add(pod.stopping)
            pod.stopping.add_done_callback(self._terminations.discard)

    async def _terminate(self, pod: Pod, reason: str) -> None:
        pod.ready = False
        pod.record.reason = pod.record.reason or reason
        if pod.killing is not None:
            await pod.killing
        await self._signal(pod)
        if self._session is not None and not self._session.closed and pod.reported is not None:
            path = f"/api/v1/namespaces/{pod.namespace}/pods/{pod.name}"
            async with self._session.delete(path):
                pass  # gone already (the Deployment's deletion took it along) is fine

    def _termination(self, pod: Pod) -> JSON:
        """An exited container's `terminated` state. With `terminationMessagePolicy:
        FallbackToLogsOnError` a failed container's message is the end of its log (the
        last 80 lines, at most 2048 bytes), as the real kubelet takes it."""
        code = pod.process.returncode
        container = pod.manifest["spec"]["containers"][0]
        terminated: JSON = {
            "exitCode": code,
            "reason": "Completed" if code == 0 else "Error",
            "startedAt": _timestamp(pod.started),
            "finishedAt": _timestamp(time.monotonic()),
        }
        if code and container.get("terminationMessagePolicy") == "FallbackToLogsOnError":
            tail = "".join(self.logs(pod.namespace, pod.name).splitlines(True)[-80:])
            terminated["message"] = tail.encode()[-2048:].decode(errors="replace")
        return {"terminated": terminated}

    async def _report(self, session: aiohttp.ClientSession, pod: Pod) -> None:
        """Create the Pod object, then keep its status in line with the process: a container
        that exited waits in `CrashLoopBackOff` for its restart, with its exit as
        `lastState`, and the restarted one keeps that `lastState`."""
        exited = pod.process.returncode is not None
        # The first pull fails with ErrImagePull; the kubelet then backs off between pulls.
        pulling = ""
        if pod.pull_error:
            pulling = "ErrImagePull" if time.monotonic() - pod.started < 1 else "ImagePullBackOff"
        state = (pod.ready, pod.restarts, exited, pulling)
        if pod.reported == state:
            return
        path = f"/api/v1/namespaces/{pod.namespace}/pods"
        if pod.reported is None:
            async with session.post(
                path, data=json.dumps(pod.manifest), headers={"Content-Type": "application/json"}
            ) as response:
                if response.status not in (201, 409):
                    return
        ready = "True" if pod.ready and not exited else "False"
        container = pod.manifest["spec"]["containers"][0]
        current: JSON = {"running": {"startedAt": _timestamp(pod.started)}}
        last = pod.last_termination
        if pulling:
            image = container.get("image", "")
            message = (
                pod.pull_error if pulling == "ErrImagePull" else f'Back-off pulling image "{image}"'
            )
            current = {"waiting": {"reason": pulling, "message": message}}
        elif exited:
            backoff = int(min(10.0, 0.5 * 2**pod.restarts))
            message = f"back-off {backoff}s restarting failed container={container['name']}"
            current = {"waiting": {"reason": "CrashLoopBackOff", "message": message}}
            last = self._termination(pod)
        status = _pod_status(
            "Running", container, ready, pod.restarts, not exited and not pulling, current,
            last=last,
        )  # fmt: skip
        async with session.patch(
            f"{path}/{pod.name}/status",
            data=json.dumps(status),
            headers={"Content-Type": "application/merge-patch+json"},
        ) as r:
            if r.status == 200:
                pod.reported = state

    # ---- pod configuration -----------------------------------------------------------------

    async def _environment(
        self,
        session: aiohttp.ClientSession,
        namespace: str,
        pod: str,
        container: JSON,
        ports: dict[int, int],
    ) -> dict[str, str]:
        """The container's own variables (envFrom, then env), which `$(VAR)` may refer to."""
        env: dict[str, str] = {}
        for source in container.get("envFrom", []):
            prefix = source.get("prefix", "")
            for kind, ref in (
                ("secrets", source.get("secretRef")),
                ("configmaps", source.get("configMapRef")),
            ):
                if ref:
                    data = await self._data(
                        session, kind, namespace, ref["name"], ref.get("optional", False)
                    )
                    env.update({prefix + k: v for k, v in data.items()})
        for item in container.get("env", []):
            if "value" in item:
                # As the kubelet does: references to the variables declared before this one
                # (and envFrom's) are expanded, `$$` is a literal `$`.
                env[item["name"]] = expand(str(item["value"]), env)
                continue
            source = item.get("valueFrom", {})
            value = await self._value_from(session, namespace, pod, source)
            if value is not None:
                env[item["name"]] = value
        return {k: _rewrite_port(v, ports) for k, v in env.items()}

    async def _value_from(
        self, session: aiohttp.ClientSession, namespace: str, pod: str, source: JSON
    ) -> str | None:
        if "fieldRef" in source:
            path = source["fieldRef"]["fieldPath"]
            values = {
                "metadata.name": pod,
                "metadata.namespace": namespace,
                "spec.nodeName": "local",
                "status.podIP": "127.0.0.1",
                "status.hostIP": "127.0.0.1",
            }
            if path not in values:
                raise ConfigError(f"fieldRef {path} is not supported by the local kubelet")
            return values[path]
        for kind, key in (("secrets", "secretKeyRef"), ("configmaps", "configMapKeyRef")):
            if key in source:
                ref = source[key]
                data = await self._data(
                    session, kind, namespace, ref["name"], ref.get("optional", False)
                )
                if ref["key"] not in data:
                    if ref.get("optional"):
                        return None
                    raise ConfigError(
                        f"couldn't find key {ref['key']} in {kind[:-1]} {namespace}/{ref['name']}"
                    )
                return data[ref["key"]]
        raise ConfigError(f"unsupported valueFrom: {sorted(source)}")

    async def _data(
        self, session: aiohttp.ClientSession, kind: str, namespace: str, name: str, optional: bool
    ) -> dict[str, str]:
        async with session.get(f"/api/v1/namespaces/{namespace}/{kind}/{name}") as response:
            if response.status == 404:
                if optional:
                    return {}
                raise ConfigError(f'{kind[:-1]} "{name}" not found')
            obj = await response.json()
        data = dict(obj.get("data") or {})
        if kind == "secrets":
            data = {k: base64.b64decode(v).decode() for k, v in data.items()}
        return data

    def _command(
        self, container: JSON, declared: dict[str, str], env: dict[str, str], ports: dict[int, int]
    ) -> list[str]:
        """The command and args, `$(VAR)` expanded from the container's own variables
        (`declared`), the executable found in the process environment's (`env`) PATH."""
        search = env["PATH"]
        command = [*container.get("command", self.default_command), *container.get("args", [])]
        if not command:
            raise ConfigError("no command: the local kubelet does not run images")
        command = [_rewrite_port(expand(str(part), declared), ports) for part in command]
        # The image's own commands, if the test gave it some; then the test environment's
        # scripts (outbox-worker), then the system's PATH.
        image = self.images.get(str(container.get("image", "")))
        path = search if image is None else f"{image}{os.pathsep}{search}"
        found = shutil.which(command[0], path=path)
        if found is None:
            raise ConfigError(f"executable {command[0]!r} not found in {search}")
        command[0] = found
        return command

    @staticmethod
    def _probe_port(probe: JSON, container: JSON, ports: dict[int, int]) -> int | None:
        http = probe.get("httpGet")
        if not http:
            return None
        port = http.get("port")
        if isinstance(port, str) and not port.isdigit():
            named = [p for p in container.get("ports", []) if p.get("name") == port]
            port = named[0]["containerPort"] if named else None
        return ports.get(int(port), int(port)) if port is not None else None

    # ---- readiness and status --------------------------------------------------------------

    async def _probe(self, session: aiohttp.ClientSession, pod: Pod) -> None:
        """Startup, then readiness and liveness, as a kubelet orders them."""
        if pod.process.returncode is not None or pod.killing is not None or pod.pull_error:
            pod.ready = False
            return
        if not pod.started_ok and pod.startup is not None:
            if await _http_probe(pod.startup):
                pod.started_ok = True
            else:
                budget = float(pod.startup.get("failureThreshold", 3)) * float(
                    pod.startup.get("periodSeconds", 10)
                ) + float(pod.startup.get("initialDelaySeconds", 0))
                if time.monotonic() - pod.started > budget:
                    self._restart_unhealthy(pod, "startup")
                return
        if pod.probe is None:
            pod.ready = pod.started_ok = True
        elif await _http_probe(pod.probe):
            pod.successes, pod.failures = pod.successes + 1, 0
            if pod.successes >= int(pod.probe.get("successThreshold", 1)):
                pod.ready = pod.started_ok = True
        else:
            pod.failures, pod.successes = pod.failures + 1, 0
            if pod.failures >= int(pod.probe.get("failureThreshold", 3)):
                pod.ready = False
        if pod.started_ok and pod.liveness is not None:
            if await _http_probe(pod.liveness):
                pod.liveness_failures = 0
            else:
                pod.liveness_failures += 1
                if pod.liveness_failures >= int(pod.liveness.get("failureThreshold", 3)):
                    self._restart_unhealthy(pod, "liveness")

    def _restart_unhealthy(self, pod: Pod, reason: str) -> None:
        """Kill the container (SIGTERM, then SIGKILL after the grace period); the pod stays and
        its container is restarted once the process is gone."""
        pod.ready = False
        pod.record.reason = reason
        pod.killing = asyncio.ensure_future(self._signal(pod))

    async def _signal(self, pod: Pod) -> None:
        process = pod.process
        if process.returncode is None:
            pod.record.signals.append("SIGTERM")
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGTERM)
            try:
                await asyncio.wait_for(process.wait(), pod.grace)
            except TimeoutError:
                pod.record.signals.append("SIGKILL")
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                await process.wait()
        pod.record.returncode = process.returncode

    async def _write_status(
        self, session: aiohttp.ClientSession, deployment: JSON, pods: list[Pod]
    ) -> None:
        meta, spec = deployment["metadata"], deployment.get("spec", {})
        current = _current_hash(deployment, pods)
        desired = int(spec.get("replicas", 1))
        live = [p for p in pods if not p.stopping]
        ready = sum(1 for p in live if p.ready)
        available = sum(1 for p in live if _available(p, float(spec.get("minReadySeconds", 0))))
        updated = sum(1 for p in live if p.template_hash == current)
        counts = {
            "replicas": len(live),
            "readyReplicas": ready,
            "availableReplicas": available,
            "updatedReplicas": updated,
            "unavailableReplicas": max(0, desired - available),
        }
        status: JSON = {k: v for k, v in counts.items() if v}
        status["observedGeneration"] = meta.get("generation", 1)
        complete = updated == desired == len(live) and available == desired
        max_unavailable = (
            spec.get("strategy", {}).get("rollingUpdate", {}).get("maxUnavailable", "25%")
        )
        enough = available >= desired - _count(max_unavailable, desired, round_up=False)
        status["conditions"] = [
            {
                "type": "Available",
                "status": "True" if enough else "False",
                "reason": "MinimumReplicasAvailable" if enough else "MinimumReplicasUnavailable",
            },
            {
                "type": "Progressing",
                "status": "True",
                "reason": "NewReplicaSetAvailable" if complete else "ReplicaSetUpdated",
            },
        ]
        key = (meta["namespace"], meta["name"])
        if (
            self._written.get(key) == status
            and deployment.get("status", {}).get("observedGeneration")
            == status["observedGeneration"]
        ):
            return
        body = {"status": {**{k: None for k in counts}, **status}}
        path = f"/apis/apps/v1/namespaces/{key[0]}/deployments/{key[1]}/status"
        async with session.patch(
            path, data=json.dumps(body), headers={"Content-Type": "application/merge-patch+json"}
        ) as response:
            if response.status == 200:
                self._written[key] = status

    # ---- for tests -------------------------------------------------------------------------

    def pods(self, namespace: str, deployment: str) -> list[Pod]:
        """The running (not stopping) pods of a Deployment, as the kubelet sees them now."""
        return [p for p in self._pods.get((namespace, deployment), []) if not p.stopping]

    def logs(self, namespace: str, pod: str) -> str:
        """What a pod's process wrote to stdout and stderr ("" if none)."""
        return self.log(namespace, pod) or ""

    def log(self, namespace: str, pod: str) -> str | None:
        path = self.workdir / namespace / f"{pod}.log"
        return path.read_text(errors="replace") if path.exists() else None


async def _http_probe(probe: JSON) -> bool:
    """One `httpGet` probe on 127.0.0.1; other kinds (exec, tcpSocket) pass (not emulated)."""
    http = probe.get("httpGet")
    if not http or probe.get("port") is None:
        return True
    url = f"http://127.0.0.1:{probe['port']}{http.get('path', '/')}"
    timeout = aiohttp.ClientTimeout(total=float(probe.get("timeoutSeconds", 1)))
    try:
        async with aiohttp.ClientSession() as session, session.get(url, timeout=timeout) as r:
            return 200 <= r.status < 400
    except (aiohttp.ClientError, TimeoutError, OSError):
        return False


# A Service's cluster DNS name in a pod's arguments or environment (and its port, if given).
_SERVICE_HOST = re.compile(
    r"(?<![\w.-])([a-z0-9](?:[-a-z0-9]*[a-z0-9])?)\.([a-z0-9](?:[-a-z0-9]*[a-z0-9])?)"
    r"\.svc(?:\.cluster\.local)?(?::(\d+))?(?![\w.-])"
)


def _target_port(pod: Pod, target: int | str) -> int | None:
    """A pod's local port for a Service's targetPort (a number, or a container port's name)."""
    if isinstance(target, str) and not target.isdigit():
        container = pod.manifest["spec"]["containers"][0]
        named = [p for p in container.get("ports", []) if p.get("name") == target]
        if not named:
            return None
        target = named[0]["containerPort"]
    return pod.ports.get(int(target))


def _available(pod: Pod, min_ready_seconds: float) -> bool:
    return pod.ready_since is not None and time.monotonic() - pod.ready_since >= min_ready_seconds


def _current_hash(deployment: JSON, pods: list[Pod]) -> str:
    """The template the pods should run: the spec's, or the running one while paused."""
    spec = deployment.get("spec", {})
    running = [p.template_hash for p in pods if not p.stopping]
    if spec.get("paused") and running:
        return max(set(running), key=running.count)
    return template_hash(spec.get("template", {}))


def _pod_status(
    phase: str,
    container: JSON,
    ready: str,
    restarts: int,
    started: bool,
    state: JSON,
    *,
    last: JSON | None = None,
    start_time: str | None = None,
) -> JSON:
    """A merge patch of a one-container pod's status, as a kubelet reports it."""
    return {
        "status": {
            "phase": phase,
            "podIP": "127.0.0.1",
            "hostIP": "127.0.0.1",
            **({"startTime": start_time} if start_time else {}),
            "conditions": [
                {"type": "Ready", "status": ready},
                {"type": "ContainersReady", "status": ready},
            ],
            "containerStatuses": [
                {
                    "name": container["name"],
                    "ready": ready == "True",
                    "restartCount": restarts,
                    "image": container.get("image", ""),
                    "imageID": "",
                    "started": started,
                    "state": state,
                    **({"lastState": last} if last else {}),
                }
            ],
        }
    }


def _timestamp(monotonic: float) -> str:
    wall = time.time() - (time.monotonic() - monotonic)
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(wall))


def _rewrite_port(value: str, ports: dict[int, int]) -> str:
    for declared, local in ports.items():
        if value == str(declared):
            return str(local)
        for separator in (":", "="):
            if value.endswith(f"{separator}{declared}"):
                return value[: -len(str(declared))] + str(local)
    return value
