"""Which optional extra brings which component, and the entry points that say so.

The plain install is the protocol and the producer API (psycopg only). The components and
their heavy dependencies come as extras; a command whose extra is missing exits 2 with one
line naming the extra to install instead of an ImportError traceback.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable
from typing import NoReturn

from outbox.cliutil import USAGE_ERROR

PACKAGE = "outbox-dispatcher"


class MissingExtra(Exception):
    """A component was asked for whose optional dependencies are not installed."""

    def __init__(self, extra: str, missing: str) -> None:
        super().__init__(
            f"needs the [{extra}] extra (module {missing!r} is not installed): "
            f"pip install '{PACKAGE}[{extra}]'"
        )
        self.extra = extra


def load(module: str, extra: str) -> object:
    """Import `module`, or raise MissingExtra naming `extra` when a dependency is absent.

    Only a missing third-party module counts: a missing module of this package is a bug and
    keeps its traceback.
    """
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        missing = exc.name or "?"
        if missing.split(".")[0] == "outbox":
            raise
        raise MissingExtra(extra, missing) from None


def _fail(prog: str, exc: MissingExtra) -> NoReturn:
    sys.stderr.write(f"{prog}: error: {exc}\n")
    sys.exit(USAGE_ERROR)


def _entry(prog: str, module: str, extra: str) -> Callable[[], None]:
    def main() -> None:
        try:
            component = load(module, extra)
        except MissingExtra as exc:
            _fail(prog, exc)
        component.main()  # type: ignore[attr-defined]

    main.__doc__ = f"`{prog}`: runs {module}.main, or names the [{extra}] extra if missing."
    return main


worker = _entry("outbox-worker", "outbox.worker.cli", "worker")
tui = _entry("outbox-tui", "outbox.tui.app", "tui")
controller = _entry("outbox-controller", "outbox.controller.cli", "operator")
