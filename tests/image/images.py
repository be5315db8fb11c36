"""Build and run the project's image with Debian's buildah and podman, as CI and developers can.

No container registry is reachable from these machines, so the base image is made from
Debian's own packages with debootstrap: the same distribution and release as the Dockerfile's
official default (bookworm, Python 3.11), so the Dockerfile's steps run unchanged. The base
is cached as a tarball under `build/image/` and imported when podman's storage lacks it;
buildah's layer cache then makes a rebuild after a source change quick.

Also a command: `python tests/image/images.py lock` rewrites `constraints.txt` by resolving
`.[all]` inside that same base image, so the pins are the ones the image's platform gets.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import tomllib
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
WORK = ROOT / "build" / "image"
BASE_TAR = WORK / "debian-bookworm-minbase.tar"
BASE_IMAGE = "localhost/outbox-test-base:bookworm"
IMAGE = "localhost/outbox-dispatcher:test"
TOOLS = ("buildah", "podman", "runc", "debootstrap")
CA_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"
BASE_PACKAGES = "python3,python3-venv,ca-certificates"

# crun (podman's default runtime) fails on these kernels' cgroup layout and the default
# ulimits cannot be raised here: runc, cgroupfs and no default ulimits, in a file of our own.
# The host's network and CA bundle by default too (the package indexes are reached through a
# proxy only the host's bundle trusts), so that the docs' commands run here as a user types
# them, with no flag for this machine: buildah, `podman build` and `podman run` read this file.
CONTAINERS_CONF = f"""\
[containers]
default_ulimits = []
netns = "host"
volumes = ["{CA_BUNDLE}:{CA_BUNDLE}:ro"]

[engine]
cgroup_manager = "cgroupfs"
runtime = "runc"
"""


def missing_tools() -> list[str]:
    return [tool for tool in TOOLS if shutil.which(tool) is None]


def why_not_runnable() -> str | None:
    """None when images can be built and run here, else the reason (for a skip)."""
    missing = missing_tools()
    if missing:
        return (
            f"needs {', '.join(missing)} (Debian packages podman buildah runc debootstrap; "
            ".ci/run installs them)"
        )
    if os.geteuid() != 0:
        return "debootstrap and rootful podman need root"
    return None


def env() -> dict[str, str]:
    WORK.mkdir(parents=True, exist_ok=True)
    conf = WORK / "containers.conf"
    if not conf.exists() or conf.read_text() != CONTAINERS_CONF:
        conf.write_text(CONTAINERS_CONF)
    return {**os.environ, "CONTAINERS_CONF": str(conf)}


def run(
    *command: str, check: bool = True, timeout: float = 600
) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        command, env=env(), capture_output=True, text=True, timeout=timeout, check=False
    )
    if check and result.returncode != 0:
        raise RuntimeError(
            f"{' '.join(command[:3])} ... exited {result.returncode}:\n"
            f"{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
        )
    return result


def _debian_mirror() -> str:
    sources = Path("/etc/apt/sources.list.d/debian.sources")
    if sources.exists():
        for line in sources.read_text().splitlines():
            if line.startswith("URIs:"):
                return line.split()[1]
    return "http://deb.debian.org/debian"


def ensure_base_image() -> str:
    """A bookworm minbase with python3 and its venv module, made once and cached."""
    if run("podman", "image", "exists", BASE_IMAGE, check=False).returncode == 0:
        return BASE_IMAGE
    if not BASE_TAR.exists():
        with tempfile.TemporaryDirectory(dir=WORK) as rootfs:
            run(
                "debootstrap",
                "--variant=minbase",
                f"--include={BASE_PACKAGES}",
                "bookworm",
                rootfs,
                _debian_mirror(),
                timeout=900,
            )
            os.chmod(rootfs, 0o755)  # the image's / (mkdtemp made it private)
            partial = BASE_TAR.with_suffix(".partial")
            run("tar", "-C", rootfs, "-cf", str(partial), ".")
            partial.rename(BASE_TAR)
    run("podman", "import", str(BASE_TAR), BASE_IMAGE)
    return BASE_IMAGE


def project_version() -> str:
    return str(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"])


def revision() -> str:
    result = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=False
    )
    return result.stdout.strip() or "unknown"


class Shell:
    """bash in a checkout, as a user of this machine has it: `docker` is podman (no Docker
    engine runs here; Debian's `podman-docker` makes it so the same way, `exec podman "$@"`),
    this virtualenv's `python`, `BASE_IMAGE` exported as the debootstrapped bookworm (Docker Hub
    is out of reach), and this machine's containers.conf."""

    def __init__(self, bin_dir: Path, home: Path = ROOT, **variables: str) -> None:
        bin_dir.mkdir(parents=True, exist_ok=True)
        docker = bin_dir / "docker"
        docker.write_text(f'#!/bin/sh\nexec {shutil.which("podman")} "$@"\n')
        docker.chmod(0o755)
        path = [
            str(bin_dir),
            str(Path(sys.executable).parent),
            *["/usr/sbin", "/usr/bin", "/sbin", "/bin"],
        ]
        self.home = home
        self.env = {
            **env(),
            "PATH": os.pathsep.join(map(str, path)),
            "BASE_IMAGE": BASE_IMAGE,
            **variables,
        }
        self.ran: list[str] = []

    def popen(self, command: str, **variables: str) -> subprocess.Popen[str]:
        """A command line as typed, its output (stdout and stderr) in a pipe."""
        self.ran.append(command)
        return subprocess.Popen(
            ["bash", "-c", command],
            cwd=self.home,
            env={**self.env, **variables},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )

    def sh(self, command: str, timeout: float = 1800, **variables: str) -> str:
        process = self.popen(command, **variables)
        try:
            out, _ = process.communicate(timeout=timeout)
        finally:
            if process.poll() is None:
                process.kill()
                process.communicate()
        if process.returncode != 0:
            raise RuntimeError(f"{command}\nexited {process.returncode}:\n{out[-4000:]}")
        return out


@dataclass(frozen=True)
class ImageFacts:
    size_bytes: int
    base_size_bytes: int
    user: str
    labels: dict[str, str]
    # What `git rev-parse HEAD` said as the build began and as it ended (others may commit
    # meanwhile): the revision label is one of them.
    heads: frozenset[str] = frozenset()


def inspect(
    tag: str = IMAGE, base: str = BASE_IMAGE, heads: frozenset[str] = frozenset()
) -> ImageFacts:
    [image] = json.loads(run("podman", "image", "inspect", tag).stdout)
    [base_image] = json.loads(run("podman", "image", "inspect", base).stdout)
    return ImageFacts(
        size_bytes=int(image["Size"]),
        base_size_bytes=int(base_image["Size"]),
        user=str(image["Config"].get("User", "")),
        labels=dict(image.get("Labels") or {}),
        heads=heads,
    )


def podman_run(*args: str) -> list[str]:
    """The start of a `podman run` command line with this machine's runtime."""
    return ["podman", "--runtime", "runc", "run", "--rm", *args]


LOCK_HEADER = """\
# Every dependency of outbox-dispatcher[all], pinned; the image is built from exactly these.
# Resolved on the image's platform (Debian bookworm, CPython 3.11); regenerate after changing
# pyproject.toml's dependencies with:  python tests/image/images.py lock
"""


def lock() -> None:
    """Resolve `.[all]` in a fresh venv inside the base image and write constraints.txt."""
    base = ensure_base_image()
    script = (
        "set -eu; python3 -m venv /tmp/lock; "
        "/tmp/lock/bin/pip install --quiet --upgrade pip setuptools; "
        "mkdir /tmp/src; cd /src; cp -r pyproject.toml README.md outbox worker controller tui demo "
        "receiver /tmp/src; /tmp/lock/bin/pip install --quiet '/tmp/src[all]'; "
        "/tmp/lock/bin/pip freeze --all --exclude outbox-dispatcher --exclude pip"
    )
    result = run(
        *podman_run(
            "--network",
            "host",
            "--volume",
            f"{CA_BUNDLE}:{CA_BUNDLE}:ro",
            "--volume",
            f"{ROOT}:/src:ro",
            base,
            "sh",
            "-c",
            script,
        ),
        timeout=1800,
    )
    pins = sorted((line for line in result.stdout.splitlines() if "==" in line), key=str.lower)
    (ROOT / "constraints.txt").write_text(LOCK_HEADER + "\n".join(pins) + "\n")
    print(f"constraints.txt: {len(pins)} pins")


if __name__ == "__main__":
    if sys.argv[1:] != ["lock"]:
        sys.exit("usage: python tests/image/images.py lock")
    reason = why_not_runnable()
    if reason:
        sys.exit(f"cannot lock: {reason}")
    lock()
