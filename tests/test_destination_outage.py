"""A downstream that is down, slow or refusing, with real worker processes: nothing goes
dead, few requests reach it while it is down, no attempt is spent while its breaker is
open, everyone sees the state, and the backlog drains once a probe finds it back."""

from __future__ import annotations

import json
import math
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

import pytest
from helpers import seed, wait_until
from kafka_mock import mock_cluster
from workers import dispatching, listening, settings, spawn_worker, stop_worker

from outbox.demo.sink import Reply, Sink
from outbox.models import Message
from outbox.worker.publishers.base import RetryableError
from outbox.worker.publishers.http import HttpPublisher
from outbox.worker.rate_limit import TOKEN_CHUNK_SECONDS

pytestmark = pytest.mark.slow

CONCURRENCY = 8
WORKER_FLAGS = (
    "--publisher", "http", "--concurrency", str(CONCURRENCY), "--batch", "20",
    "--publish-timeout", "1s", "--lease", "10s", "--backoff-base", "200ms",
    "--backoff-cap", "2s", "--poll-interval", "200ms", "--probe-delay-max", "2s",
)  # fmt: skip


class Downstream:
    """A real HTTP server whose health the test switches: up, 503, slow past the publish
    timeout, or stopped (connections refused), always on the same port."""

    def __init__(self) -> None:
        self.mode = "up"
        self.sink = Sink(self._answer).start()
        self.port = int(self.sink.url.split(":")[2].split("/")[0])
        self.url = self.sink.url
        self.requests: list[Any] = []

    def _answer(self, body: dict[str, Any], nth: int) -> Reply:
        if self.mode == "refused":
            # A keep-alive connection made before the stop outlives the listening socket:
            # drop it, as a server that went away would.
            raise ConnectionAbortedError
        if self.mode == "503":
            return Reply(503)
        if self.mode == "slow":
            return Reply(200, delay=3.0)  # the publish timeout (1s) gives up first
        return Reply(200)

    def set(self, mode: str) -> None:
        if mode == "refused":
            self._retire()
        elif self.mode == "refused":
            self.sink = Sink(self._answer, port=self.port).start()
        self.mode = mode

    def _retire(self) -> None:
        self.sink.stop()
        self.requests.extend(self.sink.requests)

    def all_requests(self) -> list[Any]:
        return [*self.requests, *([] if self.mode == "refused" else self.sink.requests)]

    def close(self) -> None:
        if self.mode != "refused":
            self._retire()


@contextmanager
def downstream() -> Iterator[Downstream]:
    d = Downstream()
    try:
        yield d
    finally:
        d.close()


def destinations(dsn: str) -> list[dict[str, Any]]:
    """What `outbox destinations --json` says, as a person would read it."""
    result = subprocess.run(
        [sys.executable, "-m", "outbox", "destinations", "--json", "--dsn", dsn],
        capture_output=True, text=True, check=True, timeout=60,
    )  # fmt: skip
    return list(json.loads(result.stdout)["destinations"])


def _state(dsn: str) -> str | None:
    rows = destinations(dsn)
    return rows[0]["state"] if rows else None


def _count(conn, where: str) -> int:
    return conn.execute(f"SELECT count(*) FROM outbox WHERE {where}").fetchone()[0]


@pytest.mark.parametrize("outage", ["503", "refused", "slow"])
async def test_an_outage_leaves_nothing_dead_and_drains_after_a_probe(conn, dsn, tmp_path, outage):
    with downstream() as api:
        workers = [
            spawn_worker(
                dsn,
                *WORKER_FLAGS,
                "--http-url",
                api.url,
                owner=f"w{i}",
                log_path=str(tmp_path / f"w{i}.log"),
            )
            for i in range(2)
        ]
        try:
            before = seed(conn, 20)
            await wait_until(lambda: _count(conn, "status = 'done'") == 20, what="warm-up")
            api.set(outage)
            during = seed(conn, 100)
            await wait_until(lambda: _state(dsn) == "open", what="the breaker open")
            [row] = destinations(dsn)
            assert row["destination"] == api.url.removesuffix("/events")
            assert row["last_error"], row
            opened_at = time.monotonic()
            # Two probes fail (each a single request, one replica at a time) while the
            # breaker holds everything else back.
            opened_failures = row["failures"]
            await wait_until(
                lambda: destinations(dsn)[0]["failures"] >= opened_failures + 2,
                timeout=60,
                what="two failed probes",
            )
            # By arrival: a request sent before it opened may be answered after.
            probes = sum(1 for r in api.all_requests() if r.received > opened_at)
            # While open: only probes, one at a time. Only a probe's failure counts while it is
            # open, so every request since is a failed probe, or the one still in flight.
            failed_probes = destinations(dsn)[0]["failures"] - opened_failures
            assert failed_probes >= 2 and probes <= failed_probes + 1, (probes, failed_probes)
            # And no attempt spent on anything.
            assert _count(conn, "status = 'dead'") == 0
            assert _count(conn, "attempts > 2") == 0
            api.set("up")
            await wait_until(lambda: _count(conn, "status = 'done'") == 120, timeout=90,
                             what="the backlog drained")  # fmt: skip
            assert _state(dsn) == "closed"
        finally:
            for worker in workers:
                assert stop_worker(worker) == 0
    delivered = {r.body["id"] for r in api.all_requests() if r.status == 200}
    assert set(before) | set(during) <= delivered
    # Before it opened, at most what the replicas had in flight met the outage.
    assert _count(conn, "attempts > 2") == 0


async def test_one_poison_message_never_opens_the_breaker(conn, dsn):
    ids = seed(conn, 30)
    poison = ids[0]

    def answer(body: dict[str, Any], nth: int) -> Reply:
        return Reply(500) if body["id"] == poison else Reply(200)

    with Sink(answer) as sink:
        async with dispatching(settings(dsn, max_attempts=100), HttpPublisher(sink.url, owner="t")):
            await wait_until(lambda: _count(conn, "status = 'done'") == 29)
            # Far more failures than the threshold, all of one message.
            await wait_until(lambda: _count(conn, f"id = {poison} AND attempts >= 8"), timeout=60)
            ids = seed(conn, 10)
            await wait_until(lambda: _count(conn, "status = 'done'") == 39)
    [(state, failing)] = conn.execute(
        "SELECT state, failing_ids FROM outbox_destinations"
    ).fetchall()
    assert state == "closed" and failing == [poison]


async def test_a_replica_killed_mid_probe_leaves_nothing_stuck(conn, dsn, tmp_path):
    hang = {"on": False}

    def answer(body: dict[str, Any], nth: int) -> Reply:
        if hang["on"]:
            return Reply(200, delay=30.0)  # the probe hangs until its worker dies
        return Reply(503)

    with Sink(answer) as sink:
        flags = (*WORKER_FLAGS, "--http-url", sink.url, "--publish-timeout", "5s",
                 "--lease", "15s", "--probe-delay-max", "2s")  # fmt: skip
        a = spawn_worker(dsn, *flags, owner="a", log_path=str(tmp_path / "a.log"))
        b = spawn_worker(dsn, *flags, owner="b", log_path=str(tmp_path / "b.log"))
        try:
            seed(conn, 30)
            await wait_until(lambda: _state(dsn) == "open", what="the breaker open")
            hang["on"] = True
            await wait_until(lambda: destinations(dsn)[0]["probing"] is not None,
                             what="a probe out")  # fmt: skip
            prober = destinations(dsn)[0]["probing"]
            killed, survivor = (a, b) if prober == "a" else (b, a)
            killed.send_signal(signal.SIGKILL)
            killed.wait(timeout=10)
            hang["on"] = False
            sink.behaviour = lambda body, nth: Reply(200)
            # The dead replica's probe lease runs out; the survivor probes, closes, drains.
            # The probe's own message waits for its lease (15s) to be claimed again.
            await wait_until(lambda: _count(conn, "status = 'done'") >= 29, timeout=60)
            assert _state(dsn) == "closed"
            await wait_until(lambda: _count(conn, "status = 'done'") == 30, timeout=90)
        finally:
            for worker in (a, b):
                if worker.poll() is None:
                    assert stop_worker(worker) == 0
    assert _count(conn, "status = 'dead'") == 0
    assert survivor.returncode == 0


async def test_kafka_brokers_down_and_up_again(conn, dsn, tmp_path):
    with mock_cluster(3) as cluster:
        cluster.create_topic("orders", partitions=2)
        flags = ("--publisher", "kafka", "--kafka-bootstrap-servers", cluster.bootstraps,
                 "--kafka-topic", "orders", "--publish-timeout", "2s", "--lease", "20s",
                 "--backoff-base", "200ms", "--backoff-cap", "2s",
                 "--probe-delay-max", "3s")  # fmt: skip
        workers = [
            spawn_worker(dsn, *flags, owner=f"k{i}", log_path=str(tmp_path / f"k{i}.log"))
            for i in range(2)
        ]
        try:
            seed(conn, 10)
            await wait_until(lambda: _count(conn, "status = 'done'") == 10, what="warm-up")
            cluster.set_brokers(up=False)
            seed(conn, 40)
            await wait_until(lambda: _state(dsn) == "open", timeout=60, what="the breaker open")
            [row] = destinations(dsn)
            assert row["destination"] == f"kafka {cluster.bootstraps}"
            await wait_until(
                lambda: destinations(dsn)[0]["failures"] >= row["failures"] + 1,
                timeout=60, what="a failed probe",
            )  # fmt: skip
            assert _count(conn, "status = 'dead'") == 0
            assert _count(conn, "attempts > 2") == 0
            cluster.set_brokers(up=True)
            await wait_until(lambda: _count(conn, "status = 'done'") == 50, timeout=90,
                             what="the backlog drained")  # fmt: skip
            assert _state(dsn) == "closed"
        finally:
            for worker in workers:
                assert stop_worker(worker) == 0
    assert _count(conn, "attempts > 2") == 0


async def test_the_rate_limit_holds_for_all_replicas_together(conn, dsn, tmp_path):
    rate, window = 40, 5.0
    with Sink() as sink:
        workers = [
            spawn_worker(
                dsn,
                *WORKER_FLAGS,
                "--http-url",
                sink.url,
                "--rate-limit",
                f"{rate}/s",
                owner=f"r{i}",
                log_path=str(tmp_path / f"r{i}.log"),
            )
            for i in range(2)
        ]
        try:
            # Seeded once both listen, so the first one up cannot send it all alone.
            await wait_until(lambda: listening(conn, ["r0", "r1"]) == 2, what="both listening")
            seed(conn, 300)  # a deep backlog: only the limit holds them back
            await wait_until(lambda: _count(conn, "status = 'done'") == 300, timeout=120)
        finally:
            for worker in workers:
                assert stop_worker(worker) == 0
        arrivals = sorted(r.received for r in sink.requests)
    assert {r.worker for r in sink.requests} == {"r0", "r1"}  # both replicas sent
    most = max(
        sum(1 for t in arrivals[i:] if t < start + window) for i, start in enumerate(arrivals)
    )
    # What the bucket grants in a window: the rate, and the burst it holds (half a second's
    # worth). Arrivals are counted at the API, so each replica's tokens taken before the
    # window may land in it: its unused chunk (a twentieth of a second's) and its requests
    # in flight. Each replica at the rate on its own would send twice the rate.
    burst, chunk = rate / 2, math.ceil(rate * TOKEN_CHUNK_SECONDS)
    bound = rate * window + burst + len(workers) * (chunk + CONCURRENCY)
    assert most <= bound, (most, bound)


class Routed:
    """A plugin-style publisher with one destination per event type: `down` fails."""

    name = "routed"

    def __init__(self) -> None:
        self.down = {"payments"}
        self.sent: list[tuple[str, int]] = []

    def destination_of(self, message: Message) -> str:
        return f"routed {message.event_type}"

    async def start(self) -> None: ...

    async def close(self) -> None: ...

    async def publish(self, message: Message) -> None:
        self.sent.append((message.event_type, message.id))
        if message.event_type in self.down:
            raise RetryableError("connection refused")


async def test_per_message_destinations_fail_apart(conn, dsn):
    """One route down holds back only its own messages; the others flow. Once it is back, a
    probe closes its breaker and its messages go too."""
    publisher = Routed()
    payments = seed(conn, 20, event_type="payments")
    # A retry backoff longer than the breaker takes to open, even on a loaded machine: a
    # message retried before it opened is not sent again meanwhile (the test settings' 50 ms
    # cap would).
    s = settings(
        dsn, probe_delay_max=timedelta(seconds=2), backoff_base=timedelta(seconds=3),
        backoff_cap=timedelta(seconds=4),
    )  # fmt: skip
    async with dispatching(s, publisher):
        orders = seed(conn, 20, event_type="orders")
        await wait_until(lambda: _count(conn, "status = 'done'") == 20, what="orders delivered")
        # Only payments' breaker opened (orders has no row, or a closed one).
        await wait_until(lambda: _routes(conn).get("routed payments") == "open")
        assert _routes(conn).get("routed orders", "closed") == "closed"
        # Held back, not retried: a payments message sent more than once was a probe (each
        # failed probe counts one failure past the messages that opened the breaker; one may be
        # under way). Read in one statement, so the row and the attempts agree.
        retried, probes = conn.execute(
            "SELECT (SELECT coalesce(sum(attempts - 1), 0) FROM outbox WHERE id = ANY(%s)), "
            "failures - cardinality(failing_ids) + (probe_owner IS NOT NULL)::int "
            "FROM outbox_destinations WHERE destination = 'routed payments'",
            (payments,),
        ).fetchone()
        assert retried <= probes, (retried, probes)
        publisher.down.clear()
        await wait_until(lambda: _count(conn, "status = 'done'") == 40, timeout=60)
    assert _routes(conn)["routed payments"] == "closed"
    assert {i for kind, i in publisher.sent if kind == "orders"} == set(orders)
    assert _count(conn, "status = 'dead'") == 0


def _routes(conn) -> dict[str, str]:
    return dict(conn.execute("SELECT destination, state FROM outbox_destinations").fetchall())
