"""One chaos scenario's moving parts: the sink, a producer, real `outbox-worker` processes,
the faults done to them, and at the end the recorded history run through the checker.

The sink is also the receiving end: it applies every delivery it accepts through an inbox in
a database of its own (not the one under fault: a receiver's database is not the outbox's),
so the checker can count the effects that all the duplicates left.

Everything is real: worker processes are signalled for real, leases expire on the
database's clock, the downstream is an HTTP server. Waits poll a condition with a deadline.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from chaos import history
from chaos.checker import Verdict, check
from chaos.downstream import ChaosSink, Script, always_ok
from chaos.history import Config, Fault, History
from chaos.plugins import CRASH_EXIT_CODE
from chaos.report import ScenarioReport
from outbox.demo.effects import InboxEffects
from outbox.models import Event
from outbox.producer import enqueue_many
from outbox.schema import migrate
from outbox.table import Table

REPO = Path(__file__).resolve().parents[2]
TESTS = REPO / "tests"
# Short, so that expiry-driven recovery fits in CI; the shortest the worker does not warn about.
LEASE = "2s"
DRAIN_TIMEOUT = 120.0
# The longest a scripted reply waits before answering is a few leases; this bounds the wait
# for the sink's last answers before the history is read.
SINK_IDLE_TIMEOUT = 60.0


class Producer(threading.Thread):
    """Commits `total` events in small transactions while the faults happen; every
    `rollback_every`-th transaction is rolled back instead (its ids must never be delivered).
    Survives the database going away: a failed batch is tried again on a new connection."""

    def __init__(
        self,
        dsn: str,
        table: Table,
        total: int,
        *,
        aggregates: int,
        per_tx: int,
        pause: float,
        rollback_every: int,
    ) -> None:
        super().__init__(daemon=True, name="producer")
        self.dsn, self.table, self.total = dsn, table, total
        self.aggregates, self.per_tx, self.pause = aggregates, per_tx, pause
        self.rollback_every = rollback_every
        self.rolled_back: list[int] = []
        self.failures = 0
        self.error: BaseException | None = None
        self._halt = threading.Event()

    def run(self) -> None:
        try:
            self._produce()
        except BaseException as exc:  # reported by the test, not lost in a thread
            self.error = exc

    def _produce(self) -> None:
        made, transactions = 0, 0
        conn: psycopg.Connection[Any] | None = None
        while made < self.total and not self._halt.is_set():
            events = [
                Event(
                    "order", f"agg-{n % self.aggregates}", "OrderChanged", {"n": n, "pad": "x" * 40}
                )
                for n in range(made, min(made + self.per_tx, self.total))
            ]
            try:
                if conn is None or conn.closed:
                    conn = psycopg.connect(self.dsn, autocommit=True, connect_timeout=3)
                transactions += 1
                roll_back = transactions % self.rollback_every == 0
                with conn.transaction():
                    ids = enqueue_many(conn, events, table=self.table)
                    if roll_back:
                        self.rolled_back.extend(ids)
                        raise psycopg.Rollback()
                if not roll_back:
                    made += len(events)
            except (psycopg.OperationalError, psycopg.Rollback) as exc:
                # A Rollback escapes its transaction when the ROLLBACK itself failed: a lost
                # connection (nothing was committed), or else a real error, which is raised.
                if isinstance(exc, psycopg.Rollback) and not (conn is not None and conn.broken):
                    raise
                # The server restarted or is unreachable: the batch may or may not have
                # committed. Either way the table says what was committed; try again.
                self.failures += 1
                conn = None
                self._halt.wait(0.2)
                continue
            self._halt.wait(self.pause)  # pacing, so production overlaps the faults
        if conn is not None:
            conn.close()

    def stop(self) -> None:
        self._halt.set()


class Run:
    def __init__(
        self,
        name: str,
        dsn: str,
        log_dir: Path,
        *,
        on_report: Callable[[ScenarioReport], None],
        receiver_dsn: str,
        table: Table | None = None,
        script: Script = always_ok,
        max_attempts: int = 8,
        publish_timeout: float = 1.0,  # at most half the lease, or the worker warns
        ordered: bool = False,
        publisher: str = "http",
        worker_args: tuple[str, ...] = (),
        operators: frozenset[str] = frozenset(),
    ) -> None:
        self.name, self.dsn = name, dsn
        self.table = table or Table.parse("outbox")
        self.log_dir = log_dir
        log_dir.mkdir(parents=True, exist_ok=True)
        self.on_report = on_report
        self.config = Config(max_attempts, publish_timeout, ordered, operators)
        self.publisher = publisher
        self.extra_args = worker_args
        self.started = time.monotonic()
        self.effects = InboxEffects(receiver_dsn, consumer="downstream")
        self.sink = ChaosSink(script, apply=self.effects.apply).start()
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.logs: dict[str, Path] = {}
        self.faults: list[Fault] = []
        self.died: set[str] = set()  # SIGKILLed or crashed: their logs may end mid-step
        self.paused: set[str] = set()
        self.exits: dict[str, int] = {}
        self.problems: list[str] = []  # found by the run itself (exit codes, producer)
        self.producers: list[Producer] = []
        self._spawned = 0
        if ordered:  # as an ordered deployment does first: `outbox migrate --ordering aggregate`
            with psycopg.connect(dsn, autocommit=True) as conn:
                migrate(conn, self.table, "aggregate")
        self.spawned_at: dict[str, float] = {}  # wall clock
        with psycopg.connect(dsn, autocommit=True) as conn:
            history.install(conn, self.table)

    # -- workers ---------------------------------------------------------------------------

    def worker_args(self) -> list[str]:
        return [
            "--table", self.table.ident.as_string(None),
            "--publisher", self.publisher, "--http-url", self.sink.url,
            "--lease", LEASE, "--publish-timeout", f"{self.config.publish_timeout * 1000:g}ms",
            "--batch", "10", "--concurrency", "4",
            "--max-attempts", str(self.config.max_attempts),
            "--ordering", "aggregate" if self.config.ordered else "none",
            "--backoff-base", "50ms", "--backoff-cap", "500ms",
            "--poll-interval", "100ms", "--shutdown-grace", "1s",
            *self.extra_args,
        ]  # fmt: skip

    def spawn(self, *, dsn: str | None = None, skew: float | None = None) -> str:
        """Start one more worker process; returns its owner name (w1, w2, ...)."""
        self._spawned += 1
        owner = f"w{self._spawned}"
        path = self.log_dir / f"{owner}.log"
        module = ["chaos.skewed", f"{skew:g}"] if skew is not None else ["outbox.worker"]
        env = {
            **os.environ,
            "OUTBOX_DSN": dsn or self.dsn,
            "OUTBOX_LOG_FORMAT": "json",
            "OUTBOX_LOG_LEVEL": "DEBUG",  # the claim and finalize lines the checker reads
            # Chaos modules load as `chaos.*` here and in the workers (tests/ on the path).
            "PYTHONPATH": os.pathsep.join(filter(None, [str(TESTS), os.environ.get("PYTHONPATH")])),
        }
        with open(path, "ab") as log:
            self.procs[owner] = subprocess.Popen(
                [sys.executable, "-m", *module, "--owner", owner, *self.worker_args()],
                env=env, cwd=REPO, stdout=log, stderr=log,
            )  # fmt: skip
        self.logs[owner] = path
        self.spawned_at[owner] = time.time()
        return owner

    def pid(self, owner: str) -> int:
        return self.procs[owner].pid

    def live(self) -> list[str]:
        # A copy first: the sink's threads ask while the test thread spawns.
        procs = list(self.procs.items())
        return [o for o, p in procs if p.poll() is None and o not in self.paused]

    def kill(self, owner: str) -> None:
        """SIGKILL: no cleanup, no finalize, no last log line."""
        self.fault("SIGKILL", owner)
        self.died.add(owner)
        self.procs[owner].send_signal(signal.SIGKILL)
        self.procs[owner].wait(timeout=30)

    def pause(self, owner: str) -> None:
        self.fault("SIGSTOP", owner)
        self.paused.add(owner)
        os.kill(self.pid(owner), signal.SIGSTOP)

    def resume(self, owner: str) -> None:
        os.kill(self.pid(owner), signal.SIGCONT)
        self.paused.discard(owner)

    def fault(self, kind: str, worker: str | None = None) -> None:
        self.faults.append(Fault(kind, worker, time.time()))

    def notice_exits(self) -> list[str]:
        """Workers that exited on their own since the last look: crashes are faults (the
        poison plugin's exit code); anything else is a problem."""
        gone = []
        for owner, proc in self.procs.items():
            code = proc.poll()
            if code is None or owner in self.exits or owner in self.died:
                continue
            self.exits[owner] = code
            gone.append(owner)
            if code == CRASH_EXIT_CODE:
                self.fault("crash", owner)
                self.died.add(owner)
            else:
                self.problems.append(f"{owner} exited by itself with {code}: {self._tail(owner)}")
        return gone

    def _tail(self, owner: str) -> str:
        return self.logs[owner].read_text(errors="replace")[-1500:]

    def is_up(self, owner: str) -> bool:
        return "dispatching" in self.logs[owner].read_text(errors="replace")

    def stop_all(self) -> None:
        """SIGTERM every worker still running; each must exit 0 (a clean shutdown)."""
        for owner in list(self.paused):
            self.resume(owner)
        self.notice_exits()
        # A worker still starting up has no signal handler yet; the queue may have drained
        # before the last one got that far.
        self.wait_for(lambda: all(self.is_up(o) for o in self.live()), "workers to start")
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for owner, proc in self.procs.items():
            try:
                code = proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                code = proc.wait()
            if owner not in self.died and owner not in self.exits:
                self.exits[owner] = code
                if code != 0:
                    self.problems.append(
                        f"{owner} exited with {code} on SIGTERM: {self._tail(owner)}"
                    )

    # -- producing and observing -----------------------------------------------------------

    def produce(
        self,
        total: int,
        *,
        aggregates: int = 20,
        per_tx: int = 20,
        pause: float = 0.1,
        rollback_every: int = 4,
        seconds: float | None = None,
    ) -> Producer:
        """Commit `total` events in the background; `seconds` spreads them over that long,
        so that production outlasts the faults the scenario will inject."""
        if seconds is not None:
            transactions = -(-total // per_tx) * rollback_every / (rollback_every - 1)
            pause = seconds / transactions
        producer = Producer(
            self.dsn, self.table, total, aggregates=aggregates, per_tx=per_tx, pause=pause,
            rollback_every=rollback_every,
        )  # fmt: skip
        producer.start()
        self.producers.append(producer)
        return producer

    def enqueue(self, events: list[Event], *, max_payload_bytes: int | None = None) -> list[int]:
        with psycopg.connect(self.dsn, autocommit=True) as conn, conn.transaction():
            return enqueue_many(conn, events, table=self.table, max_payload_bytes=max_payload_bytes)

    def query(self, statement: str, *params: object) -> Any:
        """One value from the database, or None while it is unreachable."""
        try:
            with psycopg.connect(self.dsn, autocommit=True, connect_timeout=2) as conn:
                row = conn.execute(
                    sql.SQL(statement).format(t=self.table.ident), params or None
                ).fetchone()
        except psycopg.OperationalError:
            return None
        return row[0] if row else None

    def count(self, where: str = "true") -> int:
        value = self.query(f"SELECT count(*) FROM {{t}} WHERE {where}")
        return -1 if value is None else int(value)

    def wait_for(
        self,
        predicate: Callable[[], bool],
        what: str,
        timeout: float = 60.0,
        tick: Callable[[], object] | None = None,
    ) -> None:
        """Poll `predicate` until it holds; `tick` runs on every round (e.g. a supervisor
        restarting crashed workers)."""
        deadline = time.monotonic() + timeout
        while not predicate():
            self._raise_producer_errors()  # a producer that died would look like a stall
            if tick is not None:
                tick()
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"{self.name}: timed out after {timeout:g}s waiting for {what}"
                )
            time.sleep(0.05)

    def produced(self) -> bool:
        self._raise_producer_errors()
        return all(not p.is_alive() for p in self.producers)

    def _raise_producer_errors(self) -> None:
        for producer in self.producers:
            if producer.error is not None:
                raise producer.error

    def drained(self) -> bool:
        return self.produced() and self.count("status IN ('pending', 'processing')") == 0

    def wait_drained(self, tick: Callable[[], object] | None = None) -> None:
        self.wait_for(self.drained, "the backlog to drain", DRAIN_TIMEOUT, tick)

    def wait_progress(self, done: int, timeout: float = 60.0) -> None:
        self.wait_for(lambda: self.count("status = 'done'") >= done, f"{done} done", timeout)

    # -- the end ---------------------------------------------------------------------------

    def history(self) -> History:
        # The queue can drain while the sink still sleeps on a delayed reply (a "hang" whose
        # retry was absorbed and finalized done): its effect is applied, its request not yet
        # recorded. Read too soon, the history would hold the absorbed retry without the
        # delivery that applied it, and the effects, read later, would disagree with it.
        if not self.sink.wait_idle(SINK_IDLE_TIMEOUT):
            raise AssertionError(f"the sink still answering after {SINK_IDLE_TIMEOUT}s")
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            committed, final, transitions = history.read_database(conn, self.table)
        return History(
            config=self.config,
            committed=committed,
            final=final,
            transitions=transitions,
            deliveries=history.deliveries(list(self.sink.requests)),
            logs=history.read_logs(self.logs),
            faults=list(self.faults),
            died=frozenset(self.died),
            effects=history.effects(self.effects.per_message()),
        )

    def finish(self) -> Verdict:
        """Stop every worker, check the history, record the report line."""
        self.stop_all()
        for producer in self.producers:
            if producer.error is not None:
                self.problems.append(f"producer failed: {producer.error!r}")
        verdict = check(self.history())
        verdict.violations = self.problems + verdict.violations
        self.on_report(
            ScenarioReport(self.name, verdict, list(self.faults), time.monotonic() - self.started)
        )
        return verdict

    def close(self) -> None:
        for producer in self.producers:
            producer.stop()
        for owner, proc in self.procs.items():
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    if owner in self.paused:
                        os.kill(proc.pid, signal.SIGCONT)
                    proc.kill()
                proc.wait(timeout=30)
        self.sink.stop()
        self.effects.close()


def assert_clean(verdict: Verdict) -> None:
    """The promise: nothing lost, nothing unexplained, no invariant broken, and through the
    receiver's inbox one effect per message delivered, every duplicate absorbed."""
    shown = "\n".join(verdict.violations[:40])
    assert not verdict.violations, f"{len(verdict.violations)} violations:\n{shown}"
    assert verdict.lost == 0 and verdict.unexplained == 0
    assert verdict.effects == verdict.delivered and verdict.double_effects == 0
    assert verdict.absorbed == verdict.duplicates
