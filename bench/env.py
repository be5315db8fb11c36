"""The benchmark's environment: one PostgreSQL with stock settings, fresh databases, records."""

from __future__ import annotations

import asyncio
import json
import os
import platform
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Coroutine, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict

from outbox.demo.embedded import EmbeddedPostgres
from outbox.schema import migrate
from outbox.table import Table

ROOT = Path(__file__).resolve().parent.parent
PAYLOAD_BYTES = 200


def with_dbname(dsn: str, dbname: str) -> str:
    """The same server, another database, as a URL (asyncpg takes only URLs)."""
    p = conninfo_to_dict(dsn)
    return f"postgresql://{p['user']}@{p['host']}:{p['port']}/{dbname}"


T = TypeVar("T")


def uvloop_run(coro: Coroutine[Any, Any, T]) -> T:
    """Run a contender's loop on uvloop when it is installed, as the worker does by default:
    every asyncio contender runs on the same event loop."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    return uvloop.run(coro)


class Bench:
    """The server every scenario of one run uses."""

    def __init__(self) -> None:
        # Stock settings, as a user's first try would have them; only connections are raised
        # so that several worker processes and peers fit.
        self.server = EmbeddedPostgres(settings={"max_connections": "200"})

    def __enter__(self) -> Bench:
        self.server.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.stop()

    @property
    def admin_dsn(self) -> str:
        return self.server.dsn()

    @contextmanager
    def database(self, *, outbox: bool = True, ordering: str | None = None) -> Iterator[str]:
        """A fresh database (with a migrated outbox table, `outbox migrate --ordering`'s way)
        for one measurement."""
        name = f"bench_{uuid.uuid4().hex[:10]}"
        with psycopg.connect(self.admin_dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        dsn = with_dbname(self.admin_dsn, name)
        if outbox:
            with psycopg.connect(dsn, autocommit=True) as conn:
                migrate(conn, Table.parse("outbox"), ordering)
        try:
            yield dsn
        finally:
            with psycopg.connect(self.admin_dsn, autocommit=True) as conn:
                conn.execute(
                    sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
                )

    def environment(self) -> dict[str, Any]:
        with psycopg.connect(self.admin_dsn) as conn:
            version = conn.execute("SHOW server_version").fetchone()[0]  # type: ignore[index]
            settings = dict(
                conn.execute(
                    "SELECT name, setting FROM pg_settings WHERE name IN ('shared_buffers', "
                    "'synchronous_commit', 'fsync', 'wal_level', 'max_connections', "
                    "'work_mem', 'checkpoint_timeout', 'max_wal_size')"
                ).fetchall()
            )
        return {
            "postgresql": version,
            "postgresql_settings": settings,
            "cores": os.cpu_count(),
            "machine": platform.machine(),
            "python": platform.python_version(),
            "event_loop": _event_loop(),
            "commit": _commit(),
            "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "data_file_system": file_system(self.server.data_dir),
        }


def file_system(path: Path) -> str:
    """The file system `path` is on and how it is mounted, as /proc/mounts says (`ext4
    rw,relatime,discard`): what a DROP's or a fsync's time depends on. Unknown elsewhere."""
    try:
        mounts = Path("/proc/self/mounts").read_text().splitlines()
    except OSError:
        return "unknown"
    resolved, best = path.resolve(), ("", "unknown")
    for line in mounts:
        _device, point, kind, options, *_ = line.split()
        point = point.replace("\\040", " ")
        if resolved.is_relative_to(point) and len(point) > len(best[0]):
            best = (point, f"{kind} {options}")
    return best[1]


def _event_loop() -> str:
    try:
        import uvloop
    except ImportError:
        return "asyncio"
    return f"uvloop {uvloop.__version__}"


def _commit() -> str:
    try:
        out = subprocess.run(
            ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
            capture_output=True, text=True, check=True,
        )  # fmt: skip
        dirty = subprocess.run(
            ["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True, text=True,
        ).stdout.strip()  # fmt: skip
        return out.stdout.strip() + ("-dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def seed_outbox(dsn: str, count: int, *, aggregates: int = 1000, status: str = "pending") -> None:
    """`count` rows with ~200-byte payloads, spread over `aggregates` (done ones: history)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, status, "
            "done_at) SELECT 'order', 'order-' || (g %% %(aggregates)s), 'OrderPlaced', "
            "jsonb_build_object('order', g, 'note', repeat('x', %(pad)s)), %(status)s, "
            "CASE WHEN %(status)s = 'done' THEN now() END "
            "FROM generate_series(1, %(count)s) AS g",
            {"count": count, "aggregates": aggregates, "pad": PAYLOAD_BYTES - 40, "status": status},
        )
        conn.execute("VACUUM ANALYZE outbox")


def statement_text(conn: psycopg.Connection[Any], query: Any) -> str:
    """A statement's text however it was run: given to a connection's `execute` (text or
    composed), or by outbox.runner (the rendered bytes its `observe` reports)."""
    if isinstance(query, bytes):
        return query.decode()
    return query if isinstance(query, str) else str(query.as_string(conn))


def python_module(module: str, *args: str, **popen: Any) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-m", module, *args], cwd=ROOT, **popen)


def measure_drain(
    remaining: Callable[[], int], total: int, procs: list[subprocess.Popen[bytes]], timeout: float
) -> float:
    """Messages per second from the last moment nothing was done yet to the last completion.

    Process start-up (imports, connecting) is excluded for every contender alike; a drain
    faster than one poll still measures over that poll.
    """
    deadline = time.monotonic() + timeout
    untouched_at = time.monotonic()
    while True:
        left = remaining()
        now = time.monotonic()
        if left == total:
            untouched_at = now
        elif left == 0:
            return total / max(now - untouched_at, 1e-6)
        if now > deadline:
            raise TimeoutError(f"drain did not finish: {left} of {total} left")
        if any(p.poll() not in (None, 0) for p in procs):
            raise RuntimeError("a worker process failed")
        time.sleep(0.02)


def write_results(out: str | Path, name: str, report: dict[str, Any], text: str) -> None:
    """A benchmark's results as `<out>/<name>.json` (the figures) and `<out>/<name>.md` (the
    report people read, also printed)."""
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{name}.json").write_text(json.dumps(report, indent=2))
    (folder / f"{name}.md").write_text(text)
    print(text)
