"""The `outbox` command's entry point: it imports the command, and a Ctrl-C while that
import runs ends the command as one once running does (one line, exit 130), not with a
traceback. Kept tiny, and the package's `__init__` loads nothing, so that this runs first."""

from __future__ import annotations

import signal
import sys

# 128 + SIGINT: what shells report for a command a Ctrl-C ended.
INTERRUPTED = 128 + signal.SIGINT
# What a Ctrl-C before the command began says (outbox.cli says it too, before it connects).
NOTHING_STARTED = "outbox: interrupted; nothing was started"


def main() -> None:
    try:
        from outbox.cli import main as run
    except KeyboardInterrupt:
        interrupted()
    run()


def interrupted() -> None:
    """The one line, exit INTERRUPTED; a second Ctrl-C while it is said is ignored."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    print(NOTHING_STARTED, file=sys.stderr)
    raise SystemExit(INTERRUPTED)
