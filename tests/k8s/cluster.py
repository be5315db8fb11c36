"""A running emulator for a test: its URL, a kubeconfig, the real kubectl, a client.

The emulator runs in a thread with its own event loop, so synchronous tests (kubectl) and
asynchronous ones (kopf in the test's loop) can both use it, and a test that blocks its own
loop never stalls the server.

It listens on plain HTTP unless `tls=True`; with an authorizer it always uses TLS (a
self-signed certificate for 127.0.0.1, `ca_path`), because kubectl sends no bearer token to a
plain-HTTP server.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import os
import shutil
import ssl
import subprocess
import threading
from collections.abc import Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any, TypeVar

import aiohttp.web
import kubernetes.client
import kubernetes.config
import pytest
import yaml

from outbox.plumbing.waiting import first_of

from .emulator import Emulator
from .loops import close_unwound
from .rbac import ADMIN, Authorizer, Identity

KUBECTL = "/usr/bin/kubectl"
# The token the harness itself (kubectl, the kubelet, `api_client()`) presents.
ADMIN_TOKEN = "emulator-admin-token"
T = TypeVar("T")


class KubectlError(subprocess.CalledProcessError):
    def __str__(self) -> str:
        return f"{super().__str__()}\nstdout: {self.stdout}\nstderr: {self.stderr}"


class LocalCluster:
    def __init__(
        self,
        workdir: Path,
        *,
        tokens: dict[str, Identity] | None = None,
        rbac: list[dict[str, Any]] | None = None,
        tls: bool = False,
    ) -> None:
        """`tokens`/`rbac` switch the authorizer on (the harness's own token stays admin)."""
        self.workdir = workdir
        self._authorizer = None
        if tokens is not None or rbac is not None:
            self._authorizer = Authorizer({ADMIN_TOKEN: ADMIN, **(tokens or {})}, rbac or [])
        self.ca_path: Path | None = None
        if tls or self._authorizer is not None:
            self.ca_path = self._certificate()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, name="k8s-emulator", daemon=True)
        self._started = threading.Event()
        self._stop: asyncio.Event | None = None
        self._failure: BaseException | None = None
        # Tasks still pending on the emulator's loop once it stopped (none, unless a request
        # would not unwind).
        self.unfinished: list[asyncio.Task[object]] = []
        self.emulator: Emulator
        self.url = ""

    # ---- lifecycle -----------------------------------------------------------------------

    def start(self) -> LocalCluster:
        self._thread.start()
        if not self._started.wait(30) or self._failure is not None:
            raise RuntimeError("the Kubernetes emulator did not start") from self._failure
        self.kubeconfig = self.write_kubeconfig(self.workdir / "kubeconfig", ADMIN_TOKEN)
        return self

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self._loop.run_until_complete(self._serve())
        except BaseException as exc:
            self._failure = exc
            self._started.set()
            raise
        finally:
            # Stopping cancels the open requests, which unwind only when the loop next runs.
            self.unfinished = close_unwound(self._loop)

    def _certificate(self) -> Path:
        if shutil.which("openssl") is None:
            pytest.skip("openssl is not installed (needed for the emulator's TLS certificate)")
        cert, key = self.workdir / "tls.crt", self.workdir / "tls.key"
        subprocess.run(
            [
                "openssl",
                "req",
                "-x509",
                "-newkey",
                "ec",
                "-pkeyopt",
                "ec_paramgen_curve:prime256v1",
                "-nodes",
                "-keyout",
                str(key),
                "-out",
                str(cert),
                "-days",
                "2",
                "-subj",
                "/CN=emulator",
                "-addext",
                "subjectAltName=IP:127.0.0.1,DNS:localhost",
            ],
            check=True,
            capture_output=True,
        )
        return cert

    async def _serve(self) -> None:
        self._stop = asyncio.Event()
        # An outage: asked for (`_down`, `_up`), and done (`_closed`, `_listening`).
        self._down, self._up = asyncio.Event(), asyncio.Event()
        self._closed, self._listening = asyncio.Event(), asyncio.Event()
        self.emulator = Emulator(authorizer=self._authorizer)
        context = None
        if self.ca_path is not None:
            context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            context.load_cert_chain(self.ca_path, self.workdir / "tls.key")
        scheme = "https" if context else "http"
        port = 0
        async with self.emulator:
            while not self._stop.is_set():
                # The emulator served by aiohttp's low-level server directly: `kmock.Server`
                # would also patch aiohttp's resolver for the whole process, which two
                # emulators at once cannot share. Stopping cuts open watches at once, as an
                # API server going away does, instead of waiting for them to end.
                runner = aiohttp.web.ServerRunner(
                    aiohttp.web.Server(self.emulator, handler_cancellation=True),
                    shutdown_timeout=0.1,
                )
                await runner.setup()
                try:
                    site = aiohttp.web.TCPSite(
                        runner, "127.0.0.1", port, ssl_context=context, reuse_address=True
                    )
                    await site.start()
                    port = runner.addresses[0][1]  # back on the same address after an outage
                    self.url = f"{scheme}://127.0.0.1:{port}"
                    self._started.set()
                    self._listening.set()
                    await first_of(self._stop.wait(), self._down.wait())
                    self._listening.clear()
                finally:
                    await runner.cleanup()
                self._closed.set()
                await first_of(self._stop.wait(), self._up.wait())
                for event in (self._down, self._up, self._closed):
                    event.clear()

    def stop(self) -> None:
        if self._stop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(30)

    @contextlib.contextmanager
    def outage(self) -> Iterator[None]:
        """The API server goes away: its socket closes, open watches and requests are cut,
        connections are refused; on leaving, it is back on the same address with every
        object as it was (an API server restart, or a network partition healing)."""

        async def down() -> None:
            self._down.set()
            await self._closed.wait()

        async def up() -> None:
            self._up.set()
            await self._listening.wait()

        self.call(down())
        try:
            yield
        finally:
            self.call(up())

    def on_loop(self, function: Callable[[Emulator], T], timeout: float = 30) -> T:
        """Run `function(emulator)` on the emulator's loop, e.g. to add a kmock reaction:
        `k8s.on_loop(lambda e: e["patch", kmock.resource("apps", "v1", "deployments")][:1] << 503)`.
        """

        async def run() -> T:
            return function(self.emulator)

        return self.call(run(), timeout)

    def call(self, coroutine: Coroutine[Any, Any, T], timeout: float = 30) -> T:
        """Run a coroutine on the emulator's loop (e.g. `emulator.snapshot(...)`)."""
        future: concurrent.futures.Future[T] = asyncio.run_coroutine_threadsafe(
            coroutine, self._loop
        )
        return future.result(timeout)

    # ---- clients -------------------------------------------------------------------------

    def write_kubeconfig(self, path: Path, token: str) -> Path:
        """A kubeconfig for this emulator that presents `token` (one per identity)."""
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "current-context": "emulator",
            "clusters": [
                {
                    "name": "emulator",
                    "cluster": {
                        "server": self.url,
                        **({"certificate-authority": str(self.ca_path)} if self.ca_path else {}),
                    },
                }
            ],
            "users": [{"name": "user", "user": {"token": token}}],
            "contexts": [
                {
                    "name": "emulator",
                    "context": {"cluster": "emulator", "user": "user", "namespace": "default"},
                }
            ],
        }
        path.write_text(yaml.safe_dump(config))
        return path

    def kubectl(
        self,
        *args: str,
        input: str | None = None,
        check: bool = True,
        kubeconfig: Path | None = None,
        timeout: float = 60,
    ) -> subprocess.CompletedProcess[str]:
        """The real kubectl against this emulator; a failure raises with its stderr."""
        if not os.access(KUBECTL, os.X_OK):
            pytest.skip(f"kubectl is not installed at {KUBECTL} (Debian package kubectl)")
        # One discovery cache per emulator, as a user's: kubectl rediscovers by itself when a
        # kind is missing from it (a CRD installed since), and it saves a third of each call.
        cache = self.workdir / "kubectl-cache"
        env = {
            **os.environ,
            "HOME": str(self.workdir),
            "KUBECACHEDIR": str(cache),
            "KUBECONFIG": str(kubeconfig or self.kubeconfig),
        }
        result = subprocess.run(
            [KUBECTL, *args],
            input=input,
            capture_output=True,
            text=True,
            env=env,
            timeout=timeout,
            check=False,
        )
        if check and result.returncode != 0:
            raise KubectlError(result.returncode, result.args, result.stdout, result.stderr)
        return result

    def api_client(self, token: str = ADMIN_TOKEN) -> kubernetes.client.ApiClient:
        configuration = kubernetes.client.Configuration()
        configuration.host = self.url
        configuration.api_key = {"authorization": token}
        configuration.api_key_prefix = {"authorization": "Bearer"}
        if self.ca_path is not None:
            configuration.ssl_ca_cert = str(self.ca_path)
        return kubernetes.client.ApiClient(configuration)

    def install_crd(self, path: str | Path) -> None:
        """Install a CRD file (its resources are served as soon as this returns)."""
        for document in yaml.safe_load_all(Path(path).read_text()):
            if document:
                self.call(self.emulator.install(document))

    def objects(
        self, api_version: str, plural: str, namespace: str | None = None, name: str | None = None
    ) -> list[dict[str, Any]]:
        """The stored objects, read directly (no HTTP), for assertions."""
        return self.call(self.emulator.snapshot(api_version, plural, namespace, name))
