"""The image tier: build the Dockerfile once per session, as docs/deploy.md says, and report
the image's size at the end.

Skipped, with the reason, where buildah, podman, runc or debootstrap are missing or the
session is not root; `.ci/run` installs the Debian packages first, so CI always runs it.
"""

from __future__ import annotations

import pickle
from collections.abc import Iterator
from typing import Any

import pytest

from image import images
from image.test_deploy_docs import BUILD, TAG, documented

_FACTS = pytest.StashKey[images.ImageFacts]()


@pytest.fixture(scope="session")
def image(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    """The image as docs/deploy.md builds it: its first build command, as written."""
    reason = images.why_not_runnable()
    if reason:
        pytest.skip(reason)
    images.ensure_base_image()
    before = images.revision()
    images.Shell(tmp_path_factory.mktemp("bin")).sh(documented(BUILD[0]))
    images.run("podman", "tag", TAG, images.IMAGE)
    heads = frozenset({before, images.revision()})
    request.config.stash[_FACTS] = images.inspect(images.IMAGE, heads=heads)
    yield images.IMAGE


@pytest.fixture(scope="session")
def facts(image: str, request: pytest.FixtureRequest) -> images.ImageFacts:
    return request.config.stash[_FACTS]


def pytest_sessionfinish(session: pytest.Session) -> None:
    """Under pytest-xdist, the worker that built the image hands its facts to the controller."""
    output = getattr(session.config, "workeroutput", None)
    facts = session.config.stash.get(_FACTS, None)
    if output is not None and facts is not None:
        output["image_facts"] = pickle.dumps(facts)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: object) -> None:
    data = getattr(node, "workeroutput", {}).get("image_facts")
    if data:
        node.config.stash[_FACTS] = pickle.loads(data)


def pytest_terminal_summary(
    terminalreporter: pytest.TerminalReporter, config: pytest.Config
) -> None:
    facts = config.stash.get(_FACTS, None)
    if facts is None:
        return
    mib = 1024 * 1024
    terminalreporter.write_sep("-", "image")
    terminalreporter.write_line(
        f"{images.IMAGE}: {facts.size_bytes / mib:.0f} MiB "
        f"(base {facts.base_size_bytes / mib:.0f} MiB, "
        f"added {(facts.size_bytes - facts.base_size_bytes) / mib:.0f} MiB)"
    )
