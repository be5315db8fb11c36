"""Image references: parsed as a registry does, and checked against the admin's list
(--allowed-images), with Docker Hub's short names compared in full."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # settings.py checks --allowed-images with this module
    from outbox.controller.settings import ControllerSettings

ANY = "*"  # an entry that allows every image


_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_DOMAIN = (
    r"(?:localhost(?::[0-9]+)?"
    r"|[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?(?:\.[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?)+"
    r"(?::[0-9]+)?"
    r"|[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?:[0-9]+)"
)
_PATH = rf"{_COMPONENT}(?:/{_COMPONENT})*"
_DIGEST = r"sha256:[0-9a-f]{64}|sha512:[0-9a-f]{128}"
_REFERENCE = re.compile(
    rf"^(?:(?P<domain>{_DOMAIN})/)?(?P<path>{_PATH})"
    rf"(?::(?P<tag>[\w][\w.-]{{0,127}}))?(?:@(?P<digest>{_DIGEST}))?$"
)
_PREFIX = re.compile(rf"^(?:(?P<domain>{_DOMAIN})(?:/(?P<path>{_PATH}))?|(?P<bare>{_PATH}))/\*$")


@dataclass(frozen=True)
class Image:
    """An image reference, its repository named in full (`docker.io/library/outbox`)."""

    repository: str
    tag: str | None
    digest: str | None


def _full(domain: str | None, path: str) -> str:
    # Docker's short names: `outbox` is docker.io/library/outbox, `team/outbox`
    # docker.io/team/outbox; so an allowed `outbox` is not dodged by spelling it out.
    if domain is None or domain == "index.docker.io":
        domain = "docker.io"
    if domain == "docker.io" and "/" not in path:
        path = f"library/{path}"
    return f"{domain}/{path}"


def parse_image(text: str) -> Image | None:
    """The reference, or None when it is not one (the grammar of distribution/reference)."""
    match = _REFERENCE.match(text)
    if match is None:
        return None
    return Image(_full(match["domain"], match["path"]), match["tag"], match["digest"])


def check_image_pattern(text: str) -> str:
    """An entry of --allowed-images: `*`, a repository (any tag or digest), a repository
    pinned to one digest (`repo@sha256:…`), or every repository under a prefix (`host/team/*`);
    raises ValueError otherwise."""
    if text == ANY or _PREFIX.match(text):
        return text
    image = parse_image(text)
    if image is None or image.tag is not None:
        raise ValueError(
            f"{text!r} is not *, a repository, repository@sha256:<digest> or prefix/* "
            "(a tag would allow nothing more than its repository)"
        )
    return text


def _under(repository: str, prefix: str) -> bool:
    match = _PREFIX.match(prefix)
    assert match is not None
    if match["bare"]:  # a Docker Hub user or organisation
        base = f"docker.io/{match['bare']}"
    else:
        domain = "docker.io" if match["domain"] == "index.docker.io" else match["domain"]
        base = f"{domain}/{match['path']}" if match["path"] else domain
    return repository.startswith(base + "/")


def image_allowed(text: str, patterns: tuple[str, ...]) -> bool:
    image = parse_image(text)
    if image is None:
        return False
    for pattern in patterns:
        if pattern == ANY:
            return True
        if pattern.endswith("/*"):
            if _under(image.repository, pattern):
                return True
            continue
        allowed = parse_image(pattern)
        if allowed is None or allowed.repository != image.repository:
            continue
        if allowed.digest is None or allowed.digest == image.digest:
            return True
    return False


def allowed_images(settings: ControllerSettings) -> tuple[str, ...]:
    """The admin's list, else the repository of the operator's default worker image."""
    if settings.allowed_images:
        return settings.allowed_images
    image = parse_image(settings.worker_image)
    return (image.repository,) if image is not None else (settings.worker_image,)
