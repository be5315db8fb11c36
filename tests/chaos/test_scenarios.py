"""One scenario per fault, each on several real `outbox-worker` processes and a real
PostgreSQL, each ending with the recorded history run through the checker.

The size comes from OUTBOX_CHAOS_SCALE (1 in `make test`, larger in `make chaos`): more
messages, more faults, longer outages. Every scenario also asserts that its fault really
happened and left its mark (a duplicate it caused, a fenced finalize, a reaped poison),
so a fault that silently missed cannot pass as survived.
"""

from __future__ import annotations

import contextlib
import json
import threading
import zlib
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from statistics import mean

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from chaos.checker import CLOCK_SLACK, EXTEND, LEASES, RETRY, TAKEOVER, kind
from chaos.cluster import LEASE, Run, assert_clean
from chaos.downstream import Call
from chaos.history import Transition
from chaos.proxy import Proxy
from outbox.demo.embedded import EmbeddedPostgres
from outbox.demo.sink import Reply
from outbox.models import Event
from outbox.queries import REAPED_ERROR
from outbox.schema import migrate
from outbox.table import Table

pytestmark = [pytest.mark.chaos, pytest.mark.slow]

LEASE_SECONDS = float(LEASE.rstrip("s"))


def _roll(call: Call) -> float:
    """A fixed number in [0, 1) per message, so each message meets the same fate every run."""
    return (zlib.crc32(str(call.key).encode()) % 10_000) / 10_000


def _milestones(total: int, faults: int) -> Iterator[int]:
    """Done counts at which to strike, spread over the run."""
    for k in range(faults):
        yield total * (k + 1) // (faults + 2)


class Trap:
    """Arm the sink to act on the worker of the next request, before answering it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._armed = False
        self.sprung = threading.Event()
        self.victim: str | None = None

    def arm(self) -> None:
        self.sprung.clear()
        with self._lock:
            self._armed = True

    def take(self, call: Call, eligible: list[str]) -> bool:
        with self._lock:
            if not self._armed or call.worker not in eligible:
                return False
            self._armed = False
            self.victim = call.worker
        return True


def test_sigkill_workers_after_claim_and_after_publish(new_run, dsn, scale, rng):
    total, kills = 200 * scale, 2 * scale
    trap = Trap()
    run: Run

    def script(call: Call) -> Reply:
        if trap.take(call, run.live()):
            # Published (we have it) and not finalized (it never hears back): SIGKILL now.
            run.kill(call.worker)
            trap.sprung.set()
        return Reply()

    run = new_run("sigkill", dsn, script=script, ordered=True)
    for _ in range(3):
        run.spawn()
    run.produce(total, aggregates=20, seconds=2 + kills)
    for k, done in enumerate(_milestones(total, kills)):
        run.wait_progress(done)
        if k % 2 == 0:
            trap.arm()
            run.wait_for(trap.sprung.is_set, "the trap to kill a worker mid-request")
        else:
            # At a random point, preferably after a claim: a worker holding leases, most of
            # them not yet published (leases are held for milliseconds: look a while).
            with contextlib.suppress(AssertionError):
                run.wait_for(lambda: bool(_holders(run)), "a worker holding leases", timeout=5)
            run.kill(rng.choice(_holders(run) or run.live()))
        run.spawn()  # the replacement a supervisor would start
    run.wait_drained()
    verdict = run.finish()
    assert_clean(verdict)
    assert sum(f.kind == "SIGKILL" for f in run.faults) == kills
    # The kill after publishing must have cost a duplicate, and the checker must have seen why.
    assert any(r.startswith("worker SIGKILLed") for r in verdict.reasons), verdict.reasons


def _holders(run: Run) -> list[str]:
    live = set(run.live())
    try:
        with psycopg.connect(run.dsn, autocommit=True) as conn:
            rows = conn.execute(
                "SELECT DISTINCT lease_owner FROM outbox WHERE status = 'processing'"
            ).fetchall()
    except psycopg.OperationalError:
        return []
    return sorted(str(r[0]) for r in rows if r[0] in live)


def test_sigstop_a_worker_past_its_lease_then_sigcont(new_run, dsn, scale):
    total, pauses = 200 * scale, scale
    trap = Trap()
    run: Run

    def script(call: Call) -> Reply:
        if trap.take(call, run.live()):
            run.pause(call.worker)  # a "GC pause" while its request is in flight
            trap.sprung.set()
        return Reply()

    run = new_run("sigstop", dsn, script=script)
    for _ in range(3):
        run.spawn()
    run.produce(total, seconds=2 + 3 * LEASE_SECONDS * pauses)
    for done in _milestones(total, pauses):
        run.wait_progress(done)
        trap.arm()
        run.wait_for(trap.sprung.is_set, "the trap to pause a worker mid-request")
        victim = trap.victim
        # Outlast the lease: every row it holds is taken over by the others.
        run.wait_for(
            lambda v=victim: run.count(f"status = 'processing' AND lease_owner = '{v}'") == 0,
            "the paused worker's leases to be taken over",
        )
        run.resume(victim)
    run.wait_drained()
    verdict = run.finish()
    assert_clean(verdict)
    # It woke up believing it held its leases: its finalizes were refused, not applied.
    assert verdict.lost_leases >= 1
    assert any("paused" in r for r in verdict.reasons), verdict.reasons


@pytest.fixture
def own_server(tmp_path: Path) -> Iterator[EmbeddedPostgres]:
    """A server of the scenario's own, to restart at will (durable: nothing committed may be
    lost by a crash)."""
    server = EmbeddedPostgres(tmp_path / "pg")
    server.start()
    with psycopg.connect(server.dsn(), autocommit=True) as conn:
        migrate(conn, Table.parse("outbox"))
    try:
        yield server
    finally:
        server.stop()


def test_postgres_restarts_mid_run(new_run, own_server, scale):
    total, restarts = 200 * scale, 2 * scale
    run = new_run("postgres-restart", own_server.dsn(), ordered=True)
    for _ in range(3):
        run.spawn()
    run.produce(total, aggregates=20, seconds=2 + 2 * restarts)
    for k, done in enumerate(_milestones(total, restarts)):
        run.wait_progress(done)
        run.fault("restart")
        # Alternately a clean fast shutdown and a crash (immediate: no checkpoint).
        own_server.stop(mode="immediate" if k % 2 else "fast", remove=False)
        own_server.start()
    run.wait_drained()
    verdict = run.finish()
    assert_clean(verdict)
    errors = [e for e in run.history().logs if e.kind == "db_error"]
    assert errors, "the workers never noticed the restarts"


def test_worker_backends_terminated(new_run, dsn, scale):
    total, rounds = 200 * scale, 4 * scale
    run = new_run("terminate-backends", dsn)
    for _ in range(3):
        run.spawn()
    run.produce(total, seconds=2 + rounds / 2)
    for done in _milestones(total, rounds):
        run.wait_progress(done)
        with psycopg.connect(dsn, autocommit=True) as conn:
            killed = conn.execute(
                "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity"
                " WHERE datname = current_database() AND application_name ~ '^w[0-9]+( |$)'"
            ).fetchone()[0]
        for _ in range(killed):
            run.fault("terminate")
    run.wait_drained()
    verdict = run.finish()
    assert_clean(verdict)
    assert sum(f.kind == "terminate" for f in run.faults) >= rounds


def _via(proxy: Proxy, dsn: str) -> str:
    return make_conninfo(dsn, host="127.0.0.1", port=str(proxy.port))


def _port(dsn: str) -> int:
    return int(conninfo_to_dict(dsn).get("port") or 5432)


def test_database_link_dropped(new_run, dsn, scale):
    total, drops = 200 * scale, 3 * scale
    with Proxy(_port(dsn)) as proxy:
        run = new_run("db-link-drop", dsn)
        for _ in range(3):
            run.spawn(dsn=_via(proxy, dsn))
        run.produce(total, seconds=2 + drops)
        for done in _milestones(total, drops):
            run.wait_progress(done)
            # Every worker connected again (a pool connection and a listener each).
            run.wait_for(lambda: proxy.open_connections >= 6, "the workers to reconnect")
            proxy.refusing = True
            if proxy.drop():
                run.fault("drop")
            # Keep the link down until every worker has failed to reconnect at least once.
            refused = proxy.refused
            run.wait_for(lambda r=refused: proxy.refused >= r + 3, "reconnects to be refused")
            proxy.refusing = False
        run.wait_drained()
        verdict = run.finish()
    assert_clean(verdict)
    assert sum(f.kind == "drop" for f in run.faults) == drops


def test_database_link_stalled_past_the_lease(new_run, dsn, scale):
    total, stalls = 200 * scale, scale
    trap = Trap()
    with Proxy(_port(dsn)) as proxy:
        run: Run

        def script(call: Call) -> Reply:
            if trap.take(call, stalled):
                # Its publish is in flight: it holds at least this lease when the link stalls.
                proxy.stall()
                run.fault("stall")
                trap.sprung.set()
            return Reply()

        run = new_run("db-link-stall", dsn, script=script)
        stalled = [run.spawn(dsn=_via(proxy, dsn)) for _ in range(2)]
        run.spawn()  # one worker keeps a direct link and takes over what the others held
        run.produce(total, seconds=2 + 3 * LEASE_SECONDS * stalls)
        owners = ", ".join(f"'{o}'" for o in stalled)
        for done in _milestones(total, stalls):
            run.wait_progress(done)
            trap.arm()
            run.wait_for(trap.sprung.is_set, "the trap to stall a worker's link mid-request")
            run.wait_for(
                lambda: run.count(f"status = 'processing' AND lease_owner IN ({owners})") == 0,
                "the stalled workers' leases to be taken over",
            )
            proxy.resume()
        run.wait_drained()
        verdict = run.finish()
    assert_clean(verdict)
    assert sum(f.kind == "stall" for f in run.faults) == stalls
    # The stalled workers' outcomes reached the database after the takeover: refused.
    assert verdict.lost_leases >= 1
    takeovers = [t for t in run.history().transitions if kind(t) == TAKEOVER]
    assert any(t.old_owner in stalled for t in takeovers)


TIMEOUT = 0.6
# What the first request of a message meets, by share of messages.
FIRST_TRY_FAULTS = (
    (0.08, "late 200", Reply(200, delay=TIMEOUT * 1.5)),  # answered after the publish timeout
    (0.04, "hang", Reply(200, delay=LEASE_SECONDS * 1.5)),  # answered much later still
    (0.12, "HTTP 503", Reply(503)),
    (0.08, "HTTP 429", Reply(429, {"Retry-After": "1"})),
    (0.08, "slow 200", Reply(200, delay=TIMEOUT / 3)),  # slow, but in time
)


def test_publisher_faults(new_run, dsn, scale):
    total = 200 * scale
    lock = threading.Lock()
    burst = {"left": 0, "count": 0, "seen": 0}

    def script(call: Call) -> Reply:
        with lock:
            burst["seen"] += 1
            if burst["seen"] % 60 == 0:  # now and then a burst: the next 8 requests get 5xx
                burst["left"], burst["count"] = 8, burst["count"] + 1
                run.fault("5xx burst")
            if burst["left"]:
                burst["left"] -= 1
                return Reply(502 if burst["left"] % 2 else 500)
        if call.nth > 1:
            return Reply()
        roll = _roll(call)
        for share, fault, reply in FIRST_TRY_FAULTS:
            if roll < share:
                run.fault(fault)
                return reply
            roll -= share
        return Reply()

    # A cap above the Retry-After, which the cap would otherwise bound. Each message's own
    # handling of each fault is the subject here, so the destination's breaker is off: with
    # it, a Retry-After pauses the whole destination and a burst of 5xx opens it
    # (tests/test_destination_outage.py).
    run = new_run(
        "publisher-faults", dsn, script=script, publish_timeout=TIMEOUT,
        worker_args=("--backoff-cap", "2s", "--breaker-failures", "0"),
    )  # fmt: skip
    for _ in range(3):
        run.spawn()
    run.produce(total)
    run.wait_drained()
    verdict = run.finish()
    assert_clean(verdict)
    requests = run.history().deliveries
    refused = [d for d in requests if not d.ok]
    late = [d for d in requests if d.ok and d.answered - d.received >= TIMEOUT]
    assert burst["count"] >= 1 and refused and late
    assert any("after the publish timeout" in r for r in verdict.reasons), verdict.reasons
    # Retry-After: 1 is honoured. The retry a worker wrote on reading a 429 is due one second
    # after its now(), and the message's next try reaches the API no sooner. (Timed from the
    # worker's record, not from the API's answer: a starved worker whose publish timeout
    # passed before it read the 429 retries on its own backoff, as it should.)
    after_429 = [
        t for t in run.history().transitions if kind(t) == RETRY and "HTTP 429" in t.new_error
    ]
    assert after_429
    for t in after_429:
        assert abs(t.new_available_at - t.tx_now - 1.0) < 1e-3, t
        later = [d.received for d in requests if d.key == t.id and d.received > t.tx_now]
        next_try = min(later)
        assert next_try >= t.new_available_at - CLOCK_SLACK, (t, next_try)


def test_downstream_outage_then_recovery_with_full_jitter(new_run, dsn, scale):
    total = 100 * scale
    base, cap = 0.1, 1.6
    outage = threading.Event()
    outage.set()

    def script(call: Call) -> Reply:
        return Reply(503) if outage.is_set() else Reply()

    # The retries' full jitter is the subject: the destination's breaker, which would hold
    # every message back unsent during the outage, is off (tests/test_destination_outage.py
    # has the outage with it on).
    run = new_run(
        "downstream-outage", dsn, script=script, max_attempts=40,
        worker_args=("--backoff-base", f"{base * 1000:g}ms", "--backoff-cap", f"{cap:g}s",
                     "--breaker-failures", "0"),
    )  # fmt: skip
    run.fault("outage")
    for _ in range(3):
        run.spawn()
    run.produce(total, per_tx=50, pause=0)
    # The outage lasts until every message has failed at the cap's attempt number (4).
    run.wait_for(run.produced, "the messages to be committed")
    run.wait_for(
        lambda: run.count("attempts < 5 AND status <> 'done'") == 0,
        "every message to fail four times",
        timeout=120,
    )
    outage.clear()
    run.wait_drained()
    verdict = run.finish()
    assert_clean(verdict)
    assert verdict.dead == 0  # the outage ended before the attempt limit
    # The retry delays the workers chose: available_at - now() of every retry they wrote.
    spread = []
    for t in run.history().transitions:
        if kind(t) == RETRY:
            delay = t.new_available_at - t.tx_now
            ceiling = min(cap, base * 2**t.old_attempts)
            assert -0.001 <= delay <= ceiling + 0.001, (t, delay, ceiling)
            spread.append(delay / ceiling)
    # Full jitter: uniform over [0, ceiling], not clustered at the ceiling or its middle.
    assert len(spread) >= 4 * total * 0.9
    assert 0.4 <= mean(spread) <= 0.6, mean(spread)
    quarters = [sum(q / 4 <= u < (q + 1) / 4 for u in spread) / len(spread) for q in range(4)]
    assert all(0.15 <= share <= 0.35 for share in quarters), quarters


def test_poison_messages_go_dead_without_an_endless_loop(new_run, dsn, scale):
    limit, poisons = 3, scale
    run = new_run(
        "poison", dsn, max_attempts=limit,
        publisher="chaos.plugins:CrashingHttpPublisher",
        script=lambda call: Reply(500) if call.body.get("event_type") == "AlwaysFails" else Reply(),
    )  # fmt: skip
    failing = run.enqueue(
        [Event("order", f"failing-{i}", "AlwaysFails", {"n": -i}) for i in range(poisons)]
    )
    for _ in range(3):
        run.spawn()
    run.produce(100 * scale, seconds=5)
    # The crashing ones come after everything else has settled, and one at a time: a crash
    # costs an attempt to every message the crashed worker held, so a produced message claimed
    # in the same batch as a crashing one would share its fate, and each count must be exact.
    failed = ", ".join(map(str, failing))
    run.wait_for(lambda: run.count(f"id IN ({failed}) AND status = 'dead'") == poisons, "deaths")
    run.wait_drained()
    crashes: list[str] = []

    def supervise() -> None:
        # Like an orchestrator: a crashed worker is replaced. A poison must not crash
        # workers for ever: more crashes than attempts would be the endless loop.
        for owner in run.notice_exits():
            crashes.append(owner)
            assert len(crashes) <= limit * poisons, f"{len(crashes)} workers crashed"
            run.spawn()

    crashing = []
    for i in range(poisons):
        [message_id] = run.enqueue([Event("order", f"crash-{i}", "Crashes", {"crash": True})])
        crashing.append(message_id)
        run.wait_for(
            lambda m=message_id: run.count(f"id = {m} AND status = 'dead'") == 1,
            "the crashing message to be reaped", tick=supervise,
        )  # fmt: skip
    run.wait_drained(tick=supervise)
    # The last crash may only be noticed now: `wait_for` ticks while it waits, and its row
    # can be reaped (the worker exits the moment it claims it) before a slow round looks.
    supervise()
    verdict = run.finish()
    assert_clean(verdict)
    history = run.history()
    for message_id in crashing:
        row = history.final[message_id]
        assert (row.status, row.attempts, row.last_error) == ("dead", limit, REAPED_ERROR)
        assert not [d for d in history.deliveries if d.key == message_id]  # it never got out
    assert len(crashes) == limit * poisons  # every claim of one cost a worker, and no more
    for message_id in failing:
        row = history.final[message_id]
        assert (row.status, row.attempts) == ("dead", limit)
        assert row.last_error.startswith(f"retries exhausted ({limit})")
        assert [d.status for d in history.deliveries if d.key == message_id] == [500] * limit
    assert verdict.dead == 2 * poisons


def _stalls(takeovers: list[Transition]) -> list[tuple[str, float]]:
    """The episodes that cost a live worker its leases: per owner, the lease ends that fall
    within one lease length of an episode's first are that episode's."""
    episodes: list[tuple[str, float]] = []
    for owner, until in sorted((t.old_owner or "", t.old_lease_until or 0.0) for t in takeovers):
        if not episodes or episodes[-1][0] != owner or until - episodes[-1][1] > LEASE_SECONDS:
            episodes.append((owner, until))
    return episodes


def test_clock_skew_changes_nothing(new_run, dsn, scale):
    total = 200 * scale
    timeout = 1.0
    skews = {3600.0, -3600.0, 86400.0}

    def script(call: Call) -> Reply:
        # Some publishes hold their lease long enough to need the lease keeper.
        return Reply(200, delay=0.9) if _roll(call) < 0.2 else Reply()

    run = new_run("clock-skew", dsn, script=script, publish_timeout=timeout)
    skew_of = {run.spawn(skew=s): s for s in sorted(skews)}
    run.produce(total, seconds=2 + scale)
    victims = set()
    for done in _milestones(total, scale):
        run.wait_progress(done)
        victim = run.live()[0]
        run.kill(victim)  # so that leases are taken over between skewed workers
        victims.add(victim)
        skew_of[run.spawn(skew=-skew_of[victim])] = -skew_of[victim]
    run.wait_drained()
    verdict = run.finish()
    assert_clean(verdict)
    history = run.history()
    for t in history.transitions:
        step = kind(t)
        if step in LEASES or step == EXTEND:
            # The lease is the database's now() + lease, whatever the worker's clock says.
            assert abs(t.new_lease_until - t.tx_now - LEASE_SECONDS) < 1e-3, t
    # Takeovers are of killed workers. A live one stalled past its lease by a loaded machine
    # loses every lease it held then (the checker has explained them above), all ending within
    # one lease of each other: a stall or two; a skewed clock would lose leases all along.
    stray = [t for t in history.transitions if kind(t) == TAKEOVER and t.old_owner not in victims]
    assert len(_stalls(stray)) <= 2, stray
    assert any(kind(t) == EXTEND for t in history.transitions)
    # The skew was real: each worker logged times shifted by its skew.
    for owner, skew in skew_of.items():
        first = json.loads(run.logs[owner].read_text().splitlines()[0])
        shift = datetime.fromisoformat(first["time"]).timestamp() - run.spawned_at[owner]
        assert abs(shift - skew) < 60, (owner, shift, skew)
