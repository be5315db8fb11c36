"""Running dispatchers for tests: in this process, or as real `outbox-worker` processes."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import replace
from datetime import timedelta
from typing import Any

from helpers import RUNNING

from outbox.table import Table
from outbox.worker.publishers.base import Publisher
from outbox.worker.replica import Replica
from outbox.worker.settings import WorkerSettings


def settings(dsn: str, **overrides: Any) -> WorkerSettings:
    base = WorkerSettings(
        dsn=dsn,
        table=Table.parse("outbox"),
        lease=timedelta(seconds=30),
        batch=50,
        concurrency=16,
        publish_timeout=timedelta(seconds=5),
        poll_interval=timedelta(milliseconds=200),
        backoff_base=timedelta(milliseconds=10),
        backoff_cap=timedelta(milliseconds=50),
        owner="test-worker",
    )
    return replace(base, **overrides)


@asynccontextmanager
async def dispatching(settings: WorkerSettings, publisher: Publisher) -> AsyncIterator[Replica]:
    """A dispatcher running in this event loop; stopped (cleanly) on exit."""
    dispatcher = Replica(settings, publisher)
    stop = asyncio.Event()
    await publisher.start()
    task = asyncio.create_task(dispatcher.run(stop), name=f"replica {settings.owner}")
    RUNNING.add(task)
    try:
        yield dispatcher
    finally:
        RUNNING.discard(task)
        stop.set()
        await asyncio.wait_for(task, timeout=60)
        await publisher.close()


def spawn_worker(
    dsn: str, *args: str, owner: str, log_path: str | None = None
) -> subprocess.Popen[bytes]:
    """A real `outbox-worker` process (python -m worker) with JSON logs to a file."""
    env = {**os.environ, "OUTBOX_DSN": dsn, "OUTBOX_LOG_FORMAT": "json"}
    log = open(log_path, "ab") if log_path else subprocess.DEVNULL  # noqa: SIM115
    return subprocess.Popen(
        [sys.executable, "-m", "outbox.worker", "--owner", owner, *args],
        env=env,
        stdout=log,
        stderr=log,
    )


def listening(conn: Any, owners: Sequence[str]) -> int:
    """Workers whose LISTEN connection is open (the worker names it "<owner> listener"): up
    and ready to claim."""
    names = [f"{owner} listener" for owner in owners]
    query = "SELECT count(*) FROM pg_stat_activity WHERE application_name = ANY(%s)"
    return int(conn.execute(query, (names,)).fetchone()[0])


def stop_worker(
    proc: subprocess.Popen[bytes], sig: signal.Signals = signal.SIGTERM, timeout: float = 60
) -> int:
    if proc.poll() is None:
        proc.send_signal(sig)
    return proc.wait(timeout=timeout)
