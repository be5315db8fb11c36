"""Real `outbox-worker` processes: signals, crashes, pauses and ordering across replicas."""

from __future__ import annotations

import json
import signal
import threading
from pathlib import Path

import pytest
from helpers import row, seed, serve_ordering, statuses, wait_until
from workers import listening, spawn_worker, stop_worker

from outbox.demo.sink import Reply, Sink

pytestmark = pytest.mark.slow


def _count(conn, where: str) -> int:
    return conn.execute(f"SELECT count(*) FROM outbox WHERE {where}").fetchone()[0]


def _log_lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.startswith("{")]


async def test_sigterm_releases_unstarted_rows_and_finishes_in_flight_ones(conn, dsn, tmp_path):
    seed(conn, 30)
    gate = threading.Event()

    def slow(body, nth):
        gate.wait(30)
        return Reply(200)

    with Sink(slow) as sink:
        proc = spawn_worker(
            dsn, "--publisher", "http", "--http-url", sink.url, "--batch", "10",
            "--concurrency", "2", "--shutdown-grace", "30s", owner="w-term",
            log_path=str(tmp_path / "w.log"),
        )  # fmt: skip
        await wait_until(
            lambda: len(sink._seen) == 2 and _count(conn, "status = 'processing'") >= 10
        )
        proc.send_signal(signal.SIGTERM)
        # Unstarted rows come back at once, while the two publishes are still in flight.
        await wait_until(lambda: _count(conn, "status = 'processing'") == 2, what="release")
        gate.set()
        assert stop_worker(proc) == 0
    assert statuses(conn) == {"done": 2, "pending": 28}
    assert _count(conn, "status = 'pending' AND attempts = 0 AND lease_owner IS NULL") == 28
    assert _count(conn, "lease_owner = 'w-term'") == 0


async def test_sigkilled_worker_rows_are_reclaimed_after_the_lease(conn, dsn, tmp_path):
    ids = seed(conn, 8)
    gate = threading.Event()

    def first_try_hangs(body, nth):
        if nth == 1:
            gate.wait(60)  # the first worker will never hear back
        return Reply(200)

    with Sink(first_try_hangs) as sink:
        # A's publish timeout is past the SIGKILL: its rows must still be leased when it dies.
        a = spawn_worker(dsn, "--publisher", "http", "--http-url", sink.url, "--lease", "3s",
                         "--publish-timeout", "30s", owner="w-a")  # fmt: skip
        await wait_until(lambda: len(sink._seen) == 8)
        a.send_signal(signal.SIGKILL)
        a.wait()
        assert _count(conn, "status = 'processing' AND lease_owner = 'w-a'") == 8
        # How soon B takes over depends on A's lease only; B's own are roomy.
        b = spawn_worker(dsn, "--publisher", "http", "--http-url", sink.url, "--lease", "10s",
                         "--publish-timeout", "5s", owner="w-b")  # fmt: skip
        try:
            await wait_until(lambda: _count(conn, "status = 'done'") == 8, what="takeover")
        finally:
            gate.set()
            assert stop_worker(b) == 0
    for message_id in ids:
        r = row(conn, message_id)
        # Re-claimed: a new generation, and the crash counted as an attempt. (On a loaded
        # machine the survivor may itself retry once, so more generations are allowed.)
        assert r["lease_version"] >= 2 and r["attempts"] == r["lease_version"], r
        assert r["status"] == "done", r
    taken_over = {r.body["id"] for r in sink.delivered() if r.worker == "w-b"}
    assert sorted(taken_over) == ids  # each at least once (its own retry allowed, as above)


async def test_paused_worker_loses_its_leases_and_is_fenced_when_it_resumes(conn, dsn, tmp_path):
    ids = seed(conn, 5)
    answered = threading.Event()

    def first_try_slow(body, nth):
        if nth == 1:
            answered.wait(30)
        return Reply(200)

    log_a = tmp_path / "a.log"
    with Sink(first_try_slow) as sink:
        a = spawn_worker(dsn, "--publisher", "http", "--http-url", sink.url, "--lease", "2s",
                         "--publish-timeout", "30s", owner="w-a", log_path=str(log_a))  # fmt: skip
        await wait_until(lambda: len(sink._seen) == 5)
        a.send_signal(signal.SIGSTOP)  # a "GC pause" in the middle of publishing
        answered.set()  # the downstream accepted A's requests; A does not know yet
        b = spawn_worker(dsn, "--publisher", "http", "--http-url", sink.url, "--lease", "10s",
                         "--publish-timeout", "5s", owner="w-b")  # fmt: skip
        await wait_until(lambda: _count(conn, "status = 'done'") == 5, what="takeover")
        assert stop_worker(b) == 0
        a.send_signal(signal.SIGCONT)
        await wait_until(lambda: sum("lost lease" in e["message"] for e in _log_lines(log_a)) == 5)
        assert stop_worker(a) == 0
    for message_id in ids:
        r = row(conn, message_id)
        assert (r["status"], r["lease_version"], r["lease_owner"]) == ("done", 2, None)
    lost = [e for e in _log_lines(log_a) if "lost lease" in e["message"]]
    assert sorted(e["outbox_id"] for e in lost) == ids
    assert all(e["lease_version"] == 1 for e in lost)
    # Each message reached the downstream twice, with the same Idempotency-Key.
    assert sorted(sink.delivered_ids()) == sorted(ids * 2)


async def test_ordered_mode_with_four_workers_delivers_one_aggregate_in_id_order(conn, dsn):
    serve_ordering(conn)
    # A downstream slow enough (20 ms a message) that the drain is still under way when its
    # worker is stopped.
    with Sink(lambda body, nth: Reply(delay=0.02)) as sink:
        workers = [
            spawn_worker(
                dsn,
                "--publisher",
                "http",
                "--http-url",
                sink.url,
                "--ordering",
                "aggregate",
                "--poll-interval",
                "50ms",
                owner=f"w-{i}",
            )
            for i in range(4)
        ]
        holder, stopped = -1, None
        try:
            # Seeded once all four listen, so the first one up cannot drain it alone.
            await wait_until(
                lambda: listening(conn, [f"w-{i}" for i in range(4)]) == 4,
                what="four listening workers",
            )
            ids = seed(conn, 30, aggregates=1)
            # A finalize wakes its own claimer, so the worker holding the aggregate keeps it
            # while it runs: stop it part-way, and another must take the aggregate over.
            await wait_until(lambda: len(sink.delivered()) >= 10, timeout=60)
            holder = int(sink.delivered()[0].worker.removeprefix("w-"))
            stopped = stop_worker(workers[holder])
            await wait_until(lambda: _count(conn, "status = 'done'") == 30, timeout=60)
        finally:
            codes = [stop_worker(w) for i, w in enumerate(workers) if i != holder]
    assert [stopped, *codes] == [0, 0, 0, 0]
    assert sink.delivered_ids() == ids  # arrival order at the downstream
    done_order = [r[0] for r in conn.execute("SELECT id FROM outbox ORDER BY done_at, id")]
    assert done_order == ids
    assert len({r.worker for r in sink.delivered()}) >= 2, "work should have moved between workers"
