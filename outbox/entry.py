"""The commands' entry points (`outbox`, `outbox-worker`, `outbox-tui`, `outbox-controller`):
each imports its command, and a Ctrl-C while that import runs ends the command as one once
running does (one line, exit 130), not with a traceback. Kept tiny, and the package's
`__init__` loads nothing, so that this runs first."""

from __future__ import annotations

import signal
import sys
from collections.abc import Callable

# 128 + SIGINT: what shells report for a command a Ctrl-C ended.
INTERRUPTED = 128 + signal.SIGINT


def nothing_started(prog: str) -> str:
    """What a Ctrl-C before the command began says."""
    return f"{prog}: interrupted; nothing was started"


# `outbox`'s words (outbox.cli says them too, before it connects).
NOTHING_STARTED = nothing_started("outbox")


def main() -> None:
    def command() -> Callable[[], None]:
        from outbox.cli import main as run

        return run

    _started("outbox", command)


def worker() -> None:
    _started_component("outbox-worker", "outbox.worker.cli", "worker")


def tui() -> None:
    _started_component("outbox-tui", "outbox.tui.app", "tui")


def controller() -> None:
    _started_component("outbox-controller", "outbox.controller.cli", "operator")


def _started_component(prog: str, module: str, extra: str) -> None:
    def command() -> Callable[[], None]:
        from outbox.extras import component

        return component(prog, module, extra)

    _started(prog, command)


def _started(prog: str, command: Callable[[], Callable[[], None]]) -> None:
    """Import the command (`command` returns its main), then run it.

    While the import runs, a Ctrl-C is noted before its KeyboardInterrupt is raised, and a
    second one is ignored: the import machinery may turn the interrupt into another error, or
    lose it and raise one of its own, and a pending signal could otherwise raise a second
    KeyboardInterrupt in this handler itself (exit -2, a traceback)."""
    ctrl_c: list[bool] = []
    # A command started with SIGINT ignored (in the background of a script) keeps it so.
    previous = signal.getsignal(signal.SIGINT) or signal.default_int_handler

    def on_sigint(signum: int, frame: object) -> None:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        ctrl_c.append(True)
        raise KeyboardInterrupt

    if previous is not signal.SIG_IGN:
        signal.signal(signal.SIGINT, on_sigint)
    try:
        run = command()
        signal.signal(signal.SIGINT, previous)
    except BaseException as exc:
        if ctrl_c or _ctrl_c(exc):
            interrupted(prog)
        raise
    if ctrl_c:  # the import swallowed it and went on
        interrupted(prog)
    run()


def _ctrl_c(exc: BaseException | None) -> bool:
    """Whether `exc` is a Ctrl-C, or an error raised while one was under way: an import cut
    short by it can fail with another error (a class's `__set_name__`) whose cause it is."""
    while exc is not None:
        if isinstance(exc, KeyboardInterrupt):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def interrupted(prog: str = "outbox") -> None:
    """The one line, exit INTERRUPTED; a second Ctrl-C while it is said is ignored."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    print(nothing_started(prog), file=sys.stderr)
    raise SystemExit(INTERRUPTED)
