"""The image commands of docs/deploy.md, run exactly as written, in a shell in the checkout:
the builds (`docker build`, which makes the tier's image, then `podman build` and `buildah
bud`), the push, the two `docker run`s (a worker draining a backlog, its metrics on the
documented port, stopped by SIGTERM), and the lock.

Each command is looked up in the doc's ```sh blocks (tests/test_docs.py parses them and checks
that some test runs every one), so the doc and these tests cannot drift apart. What these
machines lack comes from their environment, never from the command line:

- no Docker engine runs here: `docker` is podman, as Debian's `podman-docker` package makes it
  (`exec podman "$@"`); so `docker build` and `docker run` are run by podman with the docs'
  arguments, and the real Docker engine is not what is tested;
- Docker Hub is out of reach: the build's `--build-arg BASE_IMAGE` takes the exported
  `BASE_IMAGE`, the debootstrapped bookworm the image tier builds on (as a user without Docker
  Hub would);
- runc, the host's network and its CA bundle come from the tier's containers.conf.

The three builds share one layer cache: the second and third take seconds. The push goes to
Debian's docker-registry, which answers for `registry.example` in the push's own mount
namespace.
"""

from __future__ import annotations

import json
import random
import shlex
import shutil
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from helpers import seed, statuses
from test_docs import command_blocks

from image import images
from image.test_dockerfile import _closure
from outbox.demo.sink import Sink

pytestmark = [
    pytest.mark.container,
    pytest.mark.slow,
    pytest.mark.timeout(2400),
    pytest.mark.xdist_group("image"),
]

TAG = "registry.example/outbox-dispatcher:0.1.0"
SOURCE_URL = "https://git.example/outbox"
METRICS_PORT = 9000  # the docs' --metrics-port
# The docs' commands each test runs (by their first words; tests/test_docs.py checks that
# together with tests/chart/test_release.py's they are every command of docs/deploy.md).
BUILD = ("docker build", "podman build", "buildah bud --layers")
RUN = (
    "docker run --rm --read-only registry.example/outbox-dispatcher:0.1.0 outbox-worker --help",
    "docker run --rm --read-only -e OUTBOX_DSN -e OUTBOX_HTTP_URL",
)
LOCK = ("python tests/image/images.py lock",)
PUSH = ("docker push registry.example/outbox-dispatcher:0.1.0",)
REGISTRY = shutil.which("docker-registry")  # Debian's docker-registry: the CNCF distribution


def documented(start: str) -> str:
    [command] = [c for block in command_blocks() for c in block if c.startswith(start)]
    return command


@pytest.fixture(scope="module")
def built(image: str, tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    """The image each of the docs' builds left under the docs' tag: the first one is the
    session's image (tests/image/conftest.py), the others run here after it."""
    shell = images.Shell(tmp_path_factory.mktemp("bin"))
    results = {}
    for start in BUILD:
        # Others may commit while it builds: the label is what HEAD was at one end or the other.
        before = images.revision()
        if start != BUILD[0]:
            shell.sh(documented(start))
        [facts] = json.loads(images.run("podman", "image", "inspect", TAG).stdout)
        results[start] = {**facts, "heads": {before, images.revision()}}
    return results


def test_the_docs_build_commands_build_the_image(built: dict[str, dict[str, Any]]) -> None:
    for start, facts in built.items():
        labels = facts["Labels"]
        if start != BUILD[0]:  # built before `before` was read; test_image checks its label
            assert labels["org.opencontainers.image.revision"] in facts["heads"], start
        assert labels["org.opencontainers.image.source"] == SOURCE_URL, start
        assert labels["org.opencontainers.image.version"] == images.project_version(), start
        assert facts["Config"]["User"] == "65532:65532", start


@pytest.fixture
def registry(tmp_path: Path) -> Iterator[str]:
    """A registry on this machine, serving plain HTTP on port 80 of a loopback address of its
    own (127.0.0.0/8 is all loopback): the address, for `registry.example` to resolve to."""
    if REGISTRY is None:
        pytest.skip("needs Debian's docker-registry (.ci/run installs it)")
    log_path = tmp_path / "registry.log"
    for _ in range(5):  # another run may hold the address picked
        address = f"127.{random.randint(1, 254)}.{random.randint(0, 255)}.{random.randint(1, 254)}"
        config = tmp_path / "registry.yml"
        config.write_text(
            f"version: 0.1\nlog: {{level: warn}}\n"
            f"storage: {{filesystem: {{rootdirectory: {tmp_path / 'registry'}}}}}\n"
            f"http: {{addr: '{address}:80'}}\n"
        )
        with log_path.open("ab") as log:
            server = subprocess.Popen([REGISTRY, "serve", str(config)], stdout=log, stderr=log)
        try:
            while server.poll() is None and _get(f"http://{address}/v2/") is None:
                time.sleep(0.05)
            if server.poll() is None:
                yield address
                return
        finally:
            if server.poll() is None:
                server.terminate()
                server.wait(timeout=30)
    raise AssertionError(f"the registry never served:\n{log_path.read_text()[-3000:]}")


def test_the_docs_push_command_pushes_the_image(
    built: dict[str, dict[str, Any]], registry: str, tmp_path: Path
) -> None:
    """`registry.example` is the local registry for the push alone: in a mount namespace of
    its own the shell sees an /etc/hosts that says so (the machine's stays as it is), and a
    registries.conf lets it speak plain HTTP there; the command is the docs', as written."""
    hosts = tmp_path / "hosts"
    hosts.write_text(Path("/etc/hosts").read_text() + f"\n{registry} registry.example\n")
    registries = tmp_path / "registries.conf"
    registries.write_text('[[registry]]\nlocation = "registry.example"\ninsecure = true\n')
    shell = images.Shell(tmp_path / "bin", CONTAINERS_REGISTRIES_CONF=str(registries))
    pushed = shlex.quote(documented(PUSH[0]))
    shell.sh(
        "unshare --mount --propagation private sh -c "
        + shlex.quote(f"mount --bind {hosts} /etc/hosts && exec bash -c {pushed}"),
        timeout=600,
    )
    tags = json.loads(_get(f"http://{registry}/v2/outbox-dispatcher/tags/list") or "{}")
    assert tags == {"name": "outbox-dispatcher", "tags": ["0.1.0"]}, tags
    accept = "application/vnd.oci.image.manifest.v1+json"
    manifest = json.loads(
        _get(f"http://{registry}/v2/outbox-dispatcher/manifests/0.1.0", accept) or "{}"
    )
    [facts] = json.loads(images.run("podman", "image", "inspect", TAG).stdout)
    # The image's id is its configuration's digest: the registry holds this very image.
    assert manifest["config"]["digest"] == "sha256:" + facts["Id"], manifest
    assert len(manifest["layers"]) == len(facts["RootFS"]["Layers"]), manifest


def _get(url: str, accept: str = "*/*") -> str | None:
    """The body of a 200 answer, None while nothing answers."""
    request = urllib.request.Request(url, headers={"Accept": accept})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return str(response.read().decode())
    except (urllib.error.URLError, ConnectionError):
        return None


def test_the_docs_run_commands_run_the_image(
    built: dict[str, dict[str, Any]], dsn: str, sink: Sink, tmp_path: Path
) -> None:
    shell = images.Shell(tmp_path / "bin")
    helped = shell.sh(documented(RUN[0]), timeout=120)
    assert helped.startswith("usage: outbox-worker"), helped

    with socket.socket() as probe:  # the worker would fail to listen, saying less
        taken = probe.connect_ex(("127.0.0.1", METRICS_PORT)) == 0
    assert not taken, f"port {METRICS_PORT}, the docs' metrics port, is taken on this machine"
    with psycopg.connect(dsn, autocommit=True) as conn:
        ids = seed(conn, 200, aggregates=10)
        # The variables the docs export; their values never appear on the command line.
        worker = shell.popen(documented(RUN[1]), OUTBOX_DSN=dsn, OUTBOX_HTTP_URL=sink.url)
        try:
            _wait_for(lambda: statuses(conn) == {"done": len(ids)}, worker, "the backlog done")
            assert sink.wait_idle()  # a reply is recorded after it is sent
            assert sorted(set(sink.delivered_ids())) == ids
            url = f"http://127.0.0.1:{METRICS_PORT}/metrics"
            metrics = urllib.request.urlopen(url, timeout=10).read().decode()
            assert 'outbox_messages_total{outcome="done"} 200.0' in metrics, metrics[-2000:]
            # bash ran the one command in its own place: the signal reaches `docker run`,
            # which hands it to the container.
            assert Path(f"/proc/{worker.pid}/comm").read_text().strip() == "podman"
            worker.send_signal(signal.SIGTERM)
            out, _ = worker.communicate(timeout=120)
        finally:
            if worker.poll() is None:
                worker.kill()
                worker.communicate(timeout=60)
    assert worker.returncode == 0, out[-4000:]
    messages = [json.loads(line)["message"] for line in out.splitlines() if line.startswith("{")]
    assert any("SIGTERM" in str(message) for message in messages), messages[-5:]


def test_the_docs_lock_command_writes_the_lock(image: str, tmp_path: Path) -> None:
    """In a copy of the checkout (the repository's own lock stays as committed)."""
    checkout = tmp_path / "checkout"
    tracked = subprocess.run(
        ["git", "ls-files", "-z"], cwd=images.ROOT, capture_output=True, check=True
    ).stdout.decode()
    for name in filter(None, tracked.split("\0")):
        source = images.ROOT / name
        if source.is_file():
            (checkout / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, checkout / name)
    (checkout / "constraints.txt").unlink()
    out = images.Shell(tmp_path / "bin", home=checkout).sh(documented(LOCK[0]))
    written = (checkout / "constraints.txt").read_text()
    assert written.startswith(images.LOCK_HEADER), written[:500]
    pins = written.removeprefix(images.LOCK_HEADER).splitlines()
    assert out.strip() == f"constraints.txt: {len(pins)} pins", out
    assert all(line.count("==") == 1 for line in pins), pins
    assert pins == sorted(pins, key=str.lower)
    locked = {line.split("==")[0].lower().replace("_", "-") for line in pins}
    needed = _closure("outbox-dispatcher", {"all"}) - {"outbox-dispatcher"}
    assert needed <= locked, f"not in the new lock: {sorted(needed - locked)}"
    assert "setuptools" in locked


def _wait_for(predicate: Any, process: subprocess.Popen[str], what: str) -> None:
    deadline = time.monotonic() + 120
    while not predicate():
        if process.poll() is not None:
            raise AssertionError(f"exited {process.returncode} before {what}")
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)
