"""Which optional extra brings which component, and the entry points that say so.

The plain install is the protocol and the producer API (psycopg only). The components and
their heavy dependencies come as extras (pyproject's optional-dependencies, the one list of
them); a command whose extra is not installed exits 2 with one line naming the extra, instead
of an ImportError traceback.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import re
from collections.abc import Callable

from outbox.plumbing.cliutil import fail

PACKAGE = "outbox-dispatcher"
_REQUIREMENT = re.compile(r"\s*([A-Za-z0-9._-]+)\s*(?:\[([^\]]*)\])?[^;]*(?:;\s*(.*))?$")
_EXTRA_MARKER = re.compile(r"""^extra\s*==\s*["']([^"']+)["']$""")


class MissingExtra(Exception):
    """A component was asked for whose optional dependencies are not installed."""

    def __init__(self, extra: str, missing: str) -> None:
        super().__init__(
            f"needs the [{extra}] extra ({missing} is not installed): "
            f"pip install '{PACKAGE}[{extra}]'"
        )
        self.extra = extra


def _installed(distribution: str) -> bool:
    try:
        importlib.metadata.distribution(distribution)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def missing_requirement(extra: str) -> str | None:
    """The first distribution `extra` needs that is not installed, or None.

    Read from this package's own metadata, so the extras are listed once (pyproject). A
    requirement with a platform condition (uvloop) is optional here.
    """
    try:
        requirements = importlib.metadata.requires(PACKAGE) or []
    except importlib.metadata.PackageNotFoundError:  # running from a source tree
        return None
    for line in requirements:
        match = _REQUIREMENT.match(line)
        marker = _EXTRA_MARKER.match((match.group(3) or "").strip()) if match else None
        if match is None or marker is None or marker.group(1) != extra:
            continue
        name, inner = match.group(1), match.group(2)
        if name == PACKAGE:
            for included in (inner or "").split(","):
                missing = missing_requirement(included.strip())
                if missing:
                    return missing
        elif not _installed(name):
            return name
    return None


def require(extra: str) -> None:
    """Raise MissingExtra unless everything `extra` brings is installed."""
    missing = missing_requirement(extra)
    if missing:
        raise MissingExtra(extra, missing)


def load(module: str, extra: str) -> object:
    """Import a component's `module` once its `extra` is known to be installed."""
    require(extra)
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:  # installed by other means than the extra
        missing = exc.name or "?"
        if missing.split(".")[0] == "outbox":
            raise  # a module of this package itself is missing: a bug, keep the traceback
        raise MissingExtra(extra, missing) from None


def component(prog: str, module: str, extra: str) -> Callable[[], None]:
    """The main of the command `prog` (outbox.entry): `module`'s, or one line naming the
    missing `extra`, exit 2."""
    try:
        loaded = load(module, extra)
    except MissingExtra as exc:
        fail(prog, str(exc))
    return loaded.main  # type: ignore[attr-defined, no-any-return]
