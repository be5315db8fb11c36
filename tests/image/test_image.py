"""The image, built with buildah and run with podman: non-root, read-only, every entry point,
and a worker container that drains a real backlog and stops cleanly on SIGTERM."""

from __future__ import annotations

import json
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any

import psycopg
import pytest
from helpers import seed, statuses

from image import images
from outbox.demo.sink import Sink

# One worker under pytest-xdist runs every test of the image, so the image is built once.
pytestmark = [
    pytest.mark.container,
    pytest.mark.slow,
    pytest.mark.timeout(2400),
    pytest.mark.xdist_group("image"),
]

# Stricter than Kubernetes' readOnlyRootFilesystem: not even a tmpfs on /tmp or /run.
READ_ONLY = ("--read-only", "--read-only-tmpfs=false")
NON_ROOT = ("--user", "65532:65532")
ENTRY_POINTS = ("outbox", "outbox-worker", "outbox-controller", "outbox-tui")


def in_container(
    image: str, *command: str, extra: tuple[str, ...] = ()
) -> subprocess.CompletedProcess[str]:
    return images.run(*images.podman_run(*READ_ONLY, *extra, image), *command, check=False)


def test_the_image_runs_as_a_non_root_numeric_user(image: str, facts: images.ImageFacts) -> None:
    assert facts.user == "65532:65532"
    result = in_container(image, "id")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("uid=65532(outbox) gid=65532(outbox)"), result.stdout


def test_the_labels_name_version_revision_and_licence(image: str, facts: images.ImageFacts) -> None:
    labels = facts.labels
    assert labels["org.opencontainers.image.version"] == images.project_version()
    assert labels["org.opencontainers.image.revision"] in facts.heads  # HEAD as it was built
    assert labels["org.opencontainers.image.licenses"] == "Apache-2.0"
    assert labels["org.opencontainers.image.title"] == "outbox-dispatcher"


@pytest.mark.parametrize("command", ENTRY_POINTS)
def test_every_entry_point_answers_help_read_only_and_non_root(image: str, command: str) -> None:
    if command == "outbox-controller" and not (images.ROOT / "controller" / "cli.py").exists():
        pytest.skip("the operator's command is not in this tree yet")
    result = in_container(image, command, "--help", extra=NON_ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.startswith("usage:"), result.stdout
    assert "Traceback" not in result.stderr


def test_the_installed_distributions_are_exactly_the_locked_ones(image: str) -> None:
    listing = (
        "import importlib.metadata as m, json; "
        "print(json.dumps({d.metadata['Name']: d.version for d in m.distributions()}))"
    )
    result = in_container(image, "python", "-c", listing)
    assert result.returncode == 0, result.stderr
    installed = {_normal(name): version for name, version in json.loads(result.stdout).items()}
    assert installed.pop("outbox-dispatcher") == images.project_version()
    locked = _locked()
    # pip, setuptools and wheel build the image and are removed from it.
    build_only = {"pip", "setuptools", "wheel"}
    assert installed == {name: v for name, v in locked.items() if name not in build_only}


def test_no_compiler_package_manager_or_cache_in_the_final_image(image: str) -> None:
    probe = (
        "for tool in gcc cc c++ make pip pip3; do command -v $tool; done; "
        "ls -d /root/.cache /tmp/* /src 2>/dev/null; "
        "python -c 'import pip' 2>/dev/null && echo pip-importable; true"
    )
    result = in_container(image, "sh", "-c", probe)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == []


def test_a_worker_container_drains_a_backlog_and_exits_zero_on_sigterm(
    image: str, dsn: str, sink: Sink, tmp_path: Path
) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        ids = seed(conn, 300, aggregates=10)
    name = f"outbox-worker-{uuid.uuid4().hex[:8]}"
    log_path = tmp_path / "worker.log"
    command = [
        *images.podman_run(*READ_ONLY, *NON_ROOT, "--network", "host", "--name", name),
        "--env",
        f"OUTBOX_DSN={dsn}",
        image,
        "outbox-worker",
        "--publisher",
        "http",
        "--http-url",
        sink.url,
        "--owner",
        name,
        "--metrics-port",
        "0",
    ]
    with log_path.open("wb") as log:
        worker = subprocess.Popen(command, env=images.env(), stdout=log, stderr=subprocess.STDOUT)
        try:
            with psycopg.connect(dsn, autocommit=True) as conn:
                _wait_for(lambda: statuses(conn) == {"done": len(ids)}, what="the backlog done")
            assert sink.wait_idle()  # a reply is recorded after it is sent
            assert sorted(set(sink.delivered_ids())) == ids
            images.run("podman", "kill", "--signal", "TERM", name)
            assert worker.wait(timeout=120) == 0, log_path.read_text()
        finally:
            if worker.poll() is None:
                images.run("podman", "kill", name, check=False)
                worker.wait(timeout=60)
    lines = [json.loads(line) for line in log_path.read_text().splitlines() if line.startswith("{")]
    messages = [str(line["message"]) for line in lines]
    assert any("SIGTERM" in message for message in messages), messages[-5:]


def _wait_for(predicate: Any, what: str, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


def _normal(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


def _locked() -> dict[str, str]:
    pins: dict[str, str] = {}
    for line in (images.ROOT / "constraints.txt").read_text().splitlines():
        if line and not line.startswith("#"):
            name, _, version = line.partition("==")
            pins[_normal(name)] = version.strip()
    return pins
