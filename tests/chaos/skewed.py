"""`outbox-worker` with its wall clock shifted: `python -m chaos.skewed SECONDS ARGS...`.

time-machine moves time.time() and datetime.now() (so the log's timestamps show the skew)
but not the monotonic clock the event loop runs on, which is what a badly set host clock
looks like. Nothing may change: every lease comparison is the database's now().
"""

from __future__ import annotations

import sys
from datetime import UTC, datetime, timedelta

import time_machine

from outbox.worker.cli import main

if __name__ == "__main__":
    skew = float(sys.argv[1])
    with time_machine.travel(datetime.now(UTC) + timedelta(seconds=skew), tick=True):
        main(sys.argv[2:])
