"""The Dockerfile and its lock, checked without building: hadolint, and nothing left out."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from image import images

DOCKERFILE = images.ROOT / "Dockerfile"


def test_hadolint_passes() -> None:
    hadolint = Path(sys.executable).parent / "hadolint"
    result = subprocess.run(
        [str(hadolint), "--failure-threshold", "info", str(DOCKERFILE)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_default_base_image_is_pinned_by_digest() -> None:
    """A tag moves; a digest names one image. Every stage starts from BASE_IMAGE."""
    text = DOCKERFILE.read_text()
    [default] = re.findall(r"^ARG BASE_IMAGE=(\S+)$", text, re.MULTILINE)
    assert re.fullmatch(r"[\w./-]+:[\w.-]+@sha256:[0-9a-f]{64}", default), default
    stages = re.findall(r"^FROM (\S+)", text, re.MULTILINE)
    assert stages and all(stage == "${BASE_IMAGE}" for stage in stages), stages


def test_every_component_folder_is_copied_into_the_build_and_the_context() -> None:
    package_dir = tomllib.loads((images.ROOT / "pyproject.toml").read_text())["tool"]["setuptools"][
        "package-dir"
    ]
    copied = set(re.findall(r"^COPY (\w+)/ \1/$", DOCKERFILE.read_text(), re.MULTILINE))
    allowed = {
        line.removeprefix("!").rstrip("/")
        for line in (images.ROOT / ".dockerignore").read_text().splitlines()
        if line.startswith("!")
    }
    folders = set(package_dir.values())
    assert folders <= copied, f"not copied by the Dockerfile: {sorted(folders - copied)}"
    assert folders <= allowed, f"kept out by .dockerignore: {sorted(folders - allowed)}"


def test_the_lock_pins_every_requirement_of_the_all_extra() -> None:
    """The build installs with --no-index after the lock: a requirement missing from the
    lock fails the build, so this names it earlier, with no container needed."""
    locked = {
        canonicalize_name(line.split("==")[0])
        for line in (images.ROOT / "constraints.txt").read_text().splitlines()
        if "==" in line and not line.startswith("#")
    }
    needed = _closure("outbox-dispatcher", {"all"})
    needed.discard(canonicalize_name("outbox-dispatcher"))
    assert needed <= locked, f"not in constraints.txt: {sorted(needed - locked)}"
    # and the build backend, since the project is built without build isolation
    assert "setuptools" in locked


def _closure(name: str, extras: set[str]) -> set[str]:
    """Every distribution `name[extras]` needs on this platform, from installed metadata."""
    seen: set[tuple[str, str]] = set()
    found: set[str] = set()

    def visit(dist_name: str, wanted: set[str]) -> None:
        for extra in wanted | {""}:
            if (dist_name, extra) in seen:
                continue
            seen.add((dist_name, extra))
            found.add(dist_name)
            for text in metadata.requires(dist_name) or []:
                requirement = Requirement(text)
                marker = requirement.marker
                if marker is not None and not marker.evaluate({"extra": extra}):
                    continue
                if marker is None and extra:
                    continue  # unconditional requirements were visited with extra ""
                visit(canonicalize_name(requirement.name), set(requirement.extras))

    visit(canonicalize_name(name), extras)
    return found
