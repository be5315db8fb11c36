"""Small helpers shared by the tests: seeding rows, reading them back, waiting on the database."""

from __future__ import annotations

import asyncio
import json
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import psycopg
from psycopg import sql
from psycopg.types.json import Jsonb

from outbox import Event, enqueue_many
from outbox.schema import migrate
from outbox.table import Table


def seed(
    conn: psycopg.Connection[Any], count: int, *, aggregates: int = 1, event_type: str = "Tested"
) -> list[int]:
    events = [
        Event("order", f"agg-{i % aggregates}", event_type, {"n": i, "text": "x" * 20})
        for i in range(count)
    ]
    with conn.transaction():
        return enqueue_many(conn, events)


def serve_ordering(conn: psycopg.Connection[Any], table: str = "outbox") -> None:
    """What an ordered deployment runs first: `outbox migrate --ordering aggregate`."""
    migrate(conn, Table.parse(table), "aggregate")


def row(conn: psycopg.Connection[Any], message_id: int) -> dict[str, Any]:
    cur = conn.execute("SELECT * FROM outbox WHERE id = %s", (message_id,))
    names = [d.name for d in cur.description or ()]
    values = cur.fetchone()
    assert values is not None, f"no row {message_id}"
    return dict(zip(names, values, strict=True))


def statuses(conn: psycopg.Connection[Any]) -> dict[str, int]:
    return dict(conn.execute("SELECT status, count(*) FROM outbox GROUP BY status").fetchall())  # type: ignore[arg-type]


def wait_until_db(conn: psycopg.Connection[Any], condition_sql: str, timeout: float = 30.0) -> None:
    """Wait until a boolean SQL expression holds, e.g. a lease being past now()."""
    deadline = time.monotonic() + timeout
    while not conn.execute(f"SELECT {condition_sql}").fetchone()[0]:  # type: ignore[index]
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for: {condition_sql}")
        time.sleep(0.02)


# Background tasks a test relies on (a replica in this event loop): a wait fails at once
# with the task's error when one has ended, rather than timing out on what it would have done.
RUNNING: set[asyncio.Task[Any]] = set()


def _check_running() -> None:
    for task in RUNNING:
        if task.done():
            error = "cancelled" if task.cancelled() else repr(task.exception())
            raise AssertionError(f"{task.get_name()} ended while a test waited on it: {error}")


async def wait_until(predicate: Callable[[], Any], timeout: float = 30.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not await _call(predicate):
        _check_running()
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what or predicate}")
        await asyncio.sleep(0.02)


async def _call(predicate: Callable[[], Any]) -> Any:
    result = predicate()
    if asyncio.iscoroutine(result):
        return await result
    return result


def explain_prepared(
    conn: psycopg.Connection[Any], statement: Any, params: dict[str, Any], *, generic: bool
) -> str:
    """EXPLAIN a statement PREPAREd with $n parameters, under a custom or a generic plan.

    A generic plan is what a prepared statement may switch to after five executions.
    """
    names: list[str] = []

    def number(match: re.Match[str]) -> str:
        if match.group(1) not in names:
            names.append(match.group(1))
        return f"${names.index(match.group(1)) + 1}"

    text = re.sub(r"%\((\w+)\)s", number, statement.as_string(conn))
    conn.execute("DEALLOCATE ALL")
    conn.execute("PREPARE explained AS " + text)
    conn.execute(
        f"SET plan_cache_mode = {'force_generic_plan' if generic else 'force_custom_plan'}"
    )
    args = ", ".join(sql.Literal(_as_text(params[n])).as_string(conn) for n in names)
    execute = f"EXECUTE explained({args})" if args else "EXECUTE explained"
    return "\n".join(r[0] for r in conn.execute("EXPLAIN " + execute).fetchall())


def _as_text(value: Any) -> str:
    """A parameter as the text PREPARE's untyped parameters accept."""
    if isinstance(value, Jsonb):
        return json.dumps(value.obj)
    if isinstance(value, list):
        return "{" + ",".join(str(v) for v in value) + "}"
    return str(value)


def outbox_on(dsn: str, *args: str) -> subprocess.CompletedProcess[str]:
    """The `outbox` command with `args`, on the database at `dsn`, as a user runs it."""
    return subprocess.run(
        [sys.executable, "-m", "outbox", *args, "--dsn", dsn],
        capture_output=True,
        text=True,
        timeout=120,
    )


def interruptible() -> None:
    """`preexec_fn` for a child a test will stop with SIGINT: the signal's default action,
    unblocked, whatever the test process inherited. A shell running the suite in the
    background leaves SIGINT ignored, every child inherits that, and Python then leaves it
    ignored: a Ctrl-C test's command would wait on as if none came."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


def interrupt_once_waiting(conn: Any, command: subprocess.Popen[str], query: str = "%") -> None:
    """SIGINT `command` (started with `interruptible`) once a statement of its database
    matching `query` (a LIKE pattern) waits for a lock: a person's Ctrl-C at that moment."""
    wait_until_db(
        conn,
        "EXISTS (SELECT FROM pg_stat_activity WHERE datname = current_database()"
        f" AND wait_event_type = 'Lock' AND query LIKE '{query}')",
    )
    command.send_signal(signal.SIGINT)


def interrupted_on_a_locked_row(
    conn: Any, dsn: str, locked: int, argv: list[str], env: dict[str, str]
) -> tuple[int, str]:
    """`argv` run while row `locked` of the outbox is locked elsewhere, Ctrl-C'd once one of
    its statements waits on that lock (its batch rolled back, those before it done): its
    exit code and what it printed on stderr."""
    with psycopg.connect(dsn) as holder:
        holder.execute("SELECT 1 FROM outbox WHERE id = %s FOR UPDATE", (locked,))
        command = subprocess.Popen(
            argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
            preexec_fn=interruptible,
        )  # fmt: skip
        try:
            interrupt_once_waiting(conn, command)
            _, stderr = command.communicate(timeout=60)  # the lock still held: cancelled
        finally:
            command.kill()
    return command.returncode, stderr


async def dropping_one_cancellation(ticks: list[int] | None = None) -> None:
    """A loop whose first cancellation is dropped and which goes on as if none came, as
    Python 3.11's asyncio.wait_for drops one that came with its result (gh-86296) under a
    service or a client library; the next one ends it. Each round appends to `ticks`."""
    dropped = False
    while True:
        try:
            await asyncio.sleep(0.01)
        except asyncio.CancelledError:
            if dropped:
                raise
            dropped = True
        if ticks is not None:
            ticks.append(1)
