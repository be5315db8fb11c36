"""`outbox demo`: the whole system on an embedded PostgreSQL, with faults, and a report.

Enqueues events across many aggregates, starts a local HTTP API that fails some requests and
is slow on others, runs several `outbox-worker` processes, kills one with SIGKILL midway,
and reports from the database and the API what was delivered, duplicated (and why), dead
and lost. The API applies each event through an inbox in its own database, so the report
also shows the other half: one effect per event, every duplicate absorbed.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import zlib
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import psycopg
from psycopg import sql

from outbox.demo.effects import EffectCounts, InboxEffects
from outbox.demo.embedded import EmbeddedPostgres
from outbox.demo.sink import Reply, Request, Sink
from outbox.models import Event
from outbox.producer import enqueue_many
from outbox.schema import migrate
from outbox.table import Table

AGGREGATES = 200
LEASE_SECONDS = 4
PUBLISH_TIMEOUT = 1.0
INVALID_EVENT = "InvalidAddressChanged"  # the API rejects these with 422: they go dead
API_DATABASE = "api"  # the receiving API's own database, beside the outbox's on the server


@dataclass(frozen=True)
class Faults:
    """What the demo's API does to the first request of a message, chosen by its id."""

    unavailable: float = 0.08  # 503
    # 429 with Retry-After: 1. Rare: a Retry-After pauses the whole API (every worker) for
    # that long, as a throttling API asks.
    rate_limited: float = 0.003
    too_slow: float = 0.03  # answers 200 after the publish timeout: the worker retries
    slow: float = 0.05  # answers 200 after 300 ms

    def reply(self, body: dict[str, Any], nth: int) -> Reply:
        if body.get("event_type") == INVALID_EVENT:
            return Reply(422)
        if nth > 1:
            return Reply(200)
        roll = (zlib.crc32(str(body.get("id")).encode()) % 10_000) / 10_000
        for share, reply in (
            (self.unavailable, Reply(503)),
            (self.rate_limited, Reply(429, {"Retry-After": "1"})),
            (self.too_slow, Reply(200, delay=PUBLISH_TIMEOUT * 1.5)),
            (self.slow, Reply(200, delay=0.3)),
        ):
            if roll < share:
                return reply
            roll -= share
        return Reply(200)


class Progress:
    """A one-line progress bar on a terminal; a line every few seconds otherwise."""

    def __init__(self, total: int, stream: TextIO = sys.stdout) -> None:
        self.total, self.stream = total, stream
        self.tty = stream.isatty()
        self._last_line = 0.0

    def show(self, done: int, dead: int, note: str = "") -> None:
        finished = done + dead
        width = 30
        filled = int(width * finished / max(self.total, 1))
        text = (
            f"[{'#' * filled}{'.' * (width - filled)}] {finished}/{self.total} "
            f"(done {done}, dead {dead}) {note}"
        )
        if self.tty:
            self.stream.write("\r" + text.ljust(100))
            self.stream.flush()
        elif time.monotonic() - self._last_line > 2 or finished == self.total:
            self.stream.write(text + "\n")
            self._last_line = time.monotonic()

    def end(self) -> None:
        if self.tty:
            self.stream.write("\n")


def _worker(dsn: str, url: str, owner: str, log_dir: Path) -> subprocess.Popen[bytes]:
    log = open(log_dir / f"{owner}.log", "wb")  # noqa: SIM115 - the child keeps it
    return subprocess.Popen(
        [sys.executable, "-m", "outbox.worker", "--dsn", dsn, "--publisher", "http",
         "--http-url", url, "--owner", owner, "--lease", f"{LEASE_SECONDS}s", "--publish-timeout",
         f"{PUBLISH_TIMEOUT:g}s", "--batch", "50", "--concurrency", "32", "--max-attempts", "8",
         "--backoff-base", "100ms", "--backoff-cap", "2s", "--poll-interval", "250ms",
         "--log-format", "json"],
        stdout=log, stderr=log,
    )  # fmt: skip


def _counts(conn: psycopg.Connection[Any]) -> dict[str, int]:
    rows = conn.execute("SELECT status, count(*) FROM outbox GROUP BY status").fetchall()
    return {str(status): int(n) for status, n in rows}


def _timed_out(conn: psycopg.Connection[Any]) -> set[tuple[int, int]]:
    """(message id, attempt) of every try whose publish timeout passed, by the workers' own
    record (`errors`, kept after a message is done)."""
    rows = conn.execute(
        "SELECT o.id, (e->>'attempt')::int FROM outbox AS o, jsonb_array_elements(o.errors) AS e "
        "WHERE e->>'error' LIKE '%publish timed out%'"
    )
    return {(int(message_id), int(attempt)) for message_id, attempt in rows}


def _explain_duplicates(
    requests: list[Request], killed: str | None, timed_out: set[tuple[int, int]]
) -> tuple[int, Counter[str], list[int]]:
    """Every delivery after a message's first, with the reason it happened. The API's clock
    tells a late answer; the worker's record tells one that came in time by the API's clock
    but after the publish timeout by the worker's (a busy machine delays both ends)."""
    by_id: dict[int, list[Request]] = {}
    for request in requests:
        if 200 <= request.status < 300:
            by_id.setdefault(int(request.body["id"]), []).append(request)
    reasons: Counter[str] = Counter()
    unexplained: list[int] = []
    duplicates = 0
    for message_id, deliveries in by_id.items():
        deliveries.sort(key=lambda r: r.received)
        for earlier in deliveries[:-1]:
            duplicates += 1
            late = earlier.answered - earlier.received >= PUBLISH_TIMEOUT
            if late or (message_id, earlier.attempt) in timed_out:
                reasons["the API answered after the publish timeout, so it was retried"] += 1
            elif earlier.worker == killed:
                reasons["sent by the SIGKILLed worker, which died before finalizing"] += 1
            else:
                unexplained.append(message_id)
    return duplicates, reasons, unexplained


def _exit_on_signal(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)  # unwinds through the `finally`s that stop every process


def run_demo(events: int = 3000, workers: int = 4, keep: bool = False) -> int:
    # Stopped by a supervisor or a closed terminal as by Ctrl-C: workers, the API and
    # PostgreSQL are stopped and the data directory removed, never left behind.
    for stop in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(stop, _exit_on_signal)
    print(f"outbox demo: {events} events, {AGGREGATES} aggregates, {workers} worker processes")
    server = EmbeddedPostgres()
    server.start()
    try:
        return _demo_on(server, events, workers)
    finally:
        if keep:
            dsn, pid = server.dsn(), server.pid
            server.detach()
            print(f"\nPostgreSQL keeps running (pid {pid}), data in {server.data_dir}")
            print(f"  connect:  psql '{dsn}'")
            print(f"  effects:  psql '{server.dsn(API_DATABASE)}' (tables effects, outbox_inbox)")
            print(f"  state:    outbox stats --dsn '{dsn}'")
            print(f"  watch:    outbox-tui --dsn '{dsn}'")
            print(f"  stop:     kill -INT {pid}")
        else:
            server.stop()


def _demo_on(server: EmbeddedPostgres, events: int, workers: int) -> int:
    dsn = server.dsn()
    log_dir = server.data_dir / "logs"
    log_dir.mkdir()
    print(f"  PostgreSQL 18 (embedded) at {dsn}")
    faults = Faults()
    with psycopg.connect(dsn, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(API_DATABASE)))
    effects = InboxEffects(server.dsn(API_DATABASE))
    sink = Sink(faults.reply, apply=effects.apply).start()
    print(
        f"  HTTP API at {sink.url}: first tries fail with 503 ({faults.unavailable:.0%}) or 429 "
        f"({faults.rate_limited:.1%}), answer late ({faults.too_slow:.0%}) or slowly "
        f"({faults.slow:.0%}); {INVALID_EVENT} is rejected with 422"
    )
    print(
        f"  the API applies each event through an inbox in its own database ({API_DATABASE}), "
        "in the transaction of its effect"
    )
    procs: list[subprocess.Popen[bytes]] = []
    killed: str | None = None
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            migrate(conn, Table.default())
            batch = [
                Event(
                    "customer",
                    f"customer-{i % AGGREGATES}",
                    INVALID_EVENT if i % 500 == 250 else "CustomerUpdated",
                    {"customer": i % AGGREGATES, "version": i // AGGREGATES, "note": "x" * 120},
                )
                for i in range(events)
            ]
            started = time.monotonic()
            with conn.transaction():
                committed = enqueue_many(conn, batch)
            owners = [f"demo-worker-{n + 1}" for n in range(workers)]
            procs = [_worker(dsn, sink.url, owner, log_dir) for owner in owners]
            progress = Progress(events)
            deadline = time.monotonic() + 300
            while True:
                counts = _counts(conn)
                n_done, n_dead = counts.get("done", 0), counts.get("dead", 0)
                if killed is None and n_done >= events * 0.4 and workers > 1:
                    procs[0].send_signal(signal.SIGKILL)
                    procs[0].wait()
                    killed = owners[0]
                note = f"- killed {killed} (SIGKILL)" if killed else ""
                progress.show(n_done, n_dead, note)
                if n_done + n_dead == events or time.monotonic() > deadline:
                    break
                time.sleep(0.2)
            elapsed = time.monotonic() - started
            progress.end()
            codes = [_stop(p) for p in procs]
            # A late answer may still be on its way, its effect applied and its retry already
            # absorbed: the report reads the API's records once every request is answered.
            sink.wait_idle()
            counts = _counts(conn)
            dead_rows = conn.execute("SELECT id, last_error FROM outbox WHERE status = 'dead'")
            dead = {int(message_id): str(error) for message_id, error in dead_rows}
            timed_out = _timed_out(conn)
        applied = effects.counts()
        return _report(
            committed, sink, counts, dead, killed, timed_out, elapsed, codes, owners, log_dir,
            applied,
        )  # fmt: skip
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
        sink.stop()
        effects.close()


def _stop(proc: subprocess.Popen[bytes]) -> int | None:
    if proc.poll() is not None:
        return proc.returncode
    proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        return None


def _lost_leases(log_dir: Path) -> int:
    count = 0
    for path in log_dir.glob("*.log"):
        for line in path.read_text(errors="replace").splitlines():
            if line.startswith("{") and "lost lease" in json.loads(line).get("message", ""):
                count += 1
    return count


def _report(
    committed: list[int],
    sink: Sink,
    counts: dict[str, int],
    dead: dict[int, str],
    killed: str | None,
    timed_out: set[tuple[int, int]],
    elapsed: float,
    codes: list[int | None],
    owners: list[str],
    log_dir: Path,
    applied: EffectCounts,
) -> int:
    requests = list(sink.requests)
    delivered = {int(r.body["id"]) for r in requests if 200 <= r.status < 300}
    lost = set(committed) - delivered - set(dead)
    unexpected = delivered - set(committed)
    duplicates, reasons, unexplained = _explain_duplicates(requests, killed, timed_out)
    failures = Counter(r.status for r in requests if not 200 <= r.status < 300)
    absorbed = sum(1 for r in requests if r.applied is False)
    print("\nReport (from the database and the HTTP API's own records)")
    rows = [
        ("events committed", str(len(committed))),
        ("delivered (unique ids, 2xx)", str(len(delivered))),
        ("dead", f"{len(dead)}" + "".join(
            f"\n{'':32}{n} x {e}" for e, n in Counter(dead.values()).most_common())),
        ("lost", str(len(lost))),
        ("unexpected ids at the API", str(len(unexpected))),
        ("requests to the API", f"{len(requests)} (" + ", ".join(
            f"{n} x HTTP {s}" for s, n in sorted(failures.items())) + " refused)"),
        ("duplicates", f"{duplicates} (unexplained: {len(unexplained)})"
         + "".join(f"\n{'':32}{n} x {why}" for why, n in reasons.most_common())),
        ("lost leases (worker logs)", str(_lost_leases(log_dir))),
        ("still pending/processing", str(counts.get("pending", 0) + counts.get("processing", 0))),
        ("worker exits", ", ".join(
            f"{o}: {'SIGKILL' if o == killed else c}" for o, c in zip(owners, codes, strict=True))),
        ("throughput", f"{len(delivered) / elapsed:,.0f} messages/s ({elapsed:.1f}s)"),
        # The receiving end, from the API's own database: what the inbox made of all that.
        ("effects applied", str(applied.effects)),
        ("duplicate deliveries absorbed", f"{absorbed} (the API's inbox had the id: "
         "answered 2xx, not applied again)"),
        ("double effects", str(applied.double)),
    ]  # fmt: skip
    for name, value in rows:
        print(f"  {name:<30}{value}")
    once = applied.double == 0 and applied.effects == len(delivered) and absorbed == duplicates
    ok = not lost and not unexpected and not unexplained and once
    print(
        "\nResult: "
        + ("OK - nothing lost, every duplicate explained, one effect per event" if ok else "FAILED")
    )
    return 0 if ok else 1
