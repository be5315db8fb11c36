"""Which destinations the running workers serve, and why it matters: a breaker left open by
workers that are gone (their URL changed, the demo ended) must not hold the operator's size
for ever, nor page, since nothing will ever probe it again. Real PostgreSQL, real worker
replicas stamping their destinations, and the operator's read and decide steps on what they
left (no Kubernetes: tests/k8s/test_operator_destinations.py runs the whole operator)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import psycopg
from helpers import seed, wait_until
from workers import dispatching, settings
from yarl import URL

from outbox import destinations as dest
from outbox.controller import status as st
from outbox.controller.decision import decide
from outbox.controller.reconcile import Reading
from outbox.controller.scaling import ScalingPolicy
from outbox.controller.spec import DispatcherSpec
from outbox.demo.sink import Reply, Sink
from outbox.models import Message
from outbox.runner import fetch
from outbox.schema import MIGRATIONS, SCHEMA_VERSION, migrate, migration_statements
from outbox.stats import QueueStats, queue_stats
from outbox.table import Table
from outbox.worker.publishers.http import HttpPublisher

OLD = "http://old-api.test:8080"  # the URL the demo's workers sent to, now gone
# The scenario as a new user met it: 3,000 messages, the oldest ready for 46 s against a
# 10 s target, one worker running.
SPEC = {
    "database": {"dsnSecretRef": {"name": "orders-db"}},
    "publisher": {"type": "http", "http": {"url": "http://api.test/"}},
    "scaling": {"minReplicas": 1, "maxReplicas": 10, "targetOldestReadyAgeSeconds": 10},
}
RESOURCE_METADATA = {"namespace": "shop", "name": "orders", "generation": 1}


def _fail(conn: psycopg.Connection[Any], table: Table, destination: str, owner: str) -> None:
    """Five different messages fail there, as the workers that serve it report them: open."""
    for message_id in range(1, 6):
        failure = dest.Failure(message_id, "publish timed out")
        change = dest.change_sync(
            conn,
            table,
            destination,
            lambda row, now, f=failure: dest.failed(
                row, f, owner=owner, now=now, policy=dest.Policy()
            ),
        )
    assert change.after is not None and change.after.state == dest.OPEN


def _left_open_by_gone_workers(conn: psycopg.Connection[Any], table: Table) -> None:
    """The old URL's workers served it, it opened, and they stopped ten minutes ago."""
    fetch(conn, dest.served(table, [OLD], owner="demo-worker-1"))
    _fail(conn, table, OLD, "demo-worker-1")
    conn.execute(
        "UPDATE outbox_destinations SET served_at = now() - interval '10 minutes' "
        "WHERE destination = %s",
        (OLD,),
    )


def _waiting(conn: psycopg.Connection[Any], count: int, ready_for: int) -> None:
    ids = seed(conn, count)
    conn.execute(
        "UPDATE outbox SET available_at = now() - make_interval(secs => %s) WHERE id = ANY(%s)",
        (ready_for, ids),
    )


def _served_by(conn: psycopg.Connection[Any], destination: str) -> str | None:
    found = conn.execute(
        "SELECT served_by FROM outbox_destinations WHERE destination = %s "
        "AND served_at > now() - %s",
        (destination, dest.IDLE_AFTER),
    ).fetchone()
    return None if found is None else found[0]


def _decision(stats: QueueStats, replicas: int = 1) -> tuple[int, str, str]:
    """The operator's read and decide steps on this reading, one worker running."""
    reading = Reading(
        spec=DispatcherSpec.parse({"metadata": RESOURCE_METADATA, "spec": SPEC}),
        now=datetime.now(UTC),
        status_before={},
        dsn="",
        stats=stats,
        problem=None,
        deployment={"spec": {"replicas": replicas}, "status": {"readyReplicas": replicas}},
    )
    decision = decide(reading.observed, reading.limits, lambda: ScalingPolicy(reading.spec.scaling))
    return decision.replicas, decision.reason, decision.message


def _worker_state(replica: Any, destination: str, state: str) -> float | None:
    return replica.metrics.registry.get_sample_value(
        "outbox_destination_state", {"destination": destination, "state": state}
    )


async def test_a_breaker_nobody_sends_to_any_more_does_not_freeze_the_autoscaler(conn, dsn, table):
    """A dispatcher pointed at the same table with another URL: the old origin's open row
    holds nothing back, and the operator scales for the backlog; its own destination,
    served by a live worker, still holds the size when it opens."""
    _left_open_by_gone_workers(conn, table)
    # A slow receiver: the backlog waits while the one worker delivers.
    with Sink(lambda body, nth: Reply(200, delay=0.2)) as sink:
        new = str(URL(sink.url).origin())
        publisher = HttpPublisher(sink.url, owner="orders-worker-0")
        async with dispatching(settings(dsn, owner="orders-worker-0"), publisher) as replica:
            # Stamped before its first claim.
            await wait_until(lambda: _served_by(conn, new) == "orders-worker-0", what="stamp")
            _waiting(conn, 3000, ready_for=46)
            stats = queue_stats(conn, table)
            old = next(d for d in stats.destinations if d.destination == OLD)
            assert (old.state, old.idle, old.served_by) == ("open", True, "demo-worker-1")
            assert stats.unreachable == ()

            replicas, reason, message = _decision(stats)
            assert replicas > 1 and reason == "Backlog", (replicas, reason, message)
            reachable = st.destination_condition(stats)
            assert (reachable.status, reachable.reason) == (True, "Reachable")
            assert f"idle, not counted: {OLD} open" in reachable.message
            # The worker reports the destination it serves, not what another left behind.
            await wait_until(lambda: _worker_state(replica, new, "closed") == 1, what="metric")
            assert _worker_state(replica, OLD, "open") is None

            # Its own destination opens: more workers would not help. Held.
            _fail(conn, table, new, "orders-worker-0")
            stats = queue_stats(conn, table)
            assert [d.destination for d in stats.unreachable] == [new]
            replicas, reason, message = _decision(stats)
            assert (replicas, reason) == (1, "DestinationUnreachable"), message
            assert f"{new} is open" in message and OLD not in message
            down = st.destination_condition(stats)
            assert (down.status, down.reason) == (False, "CircuitOpen")
            assert OLD not in down.message
            await wait_until(lambda: _worker_state(replica, new, "open") == 1, what="metric")


class Routed:
    """A plugin-style publisher with one destination per event type."""

    name = "routed"

    def destination_of(self, message: Message) -> str:
        return f"routed {message.event_type}"

    async def start(self) -> None: ...

    async def close(self) -> None: ...

    async def publish(self, message: Message) -> None: ...


async def test_per_message_destinations_are_served_once_met(conn, dsn, table):
    """With a destination per message the worker knows its destinations only as messages
    come: each is stamped once met, and stays served while the worker runs."""
    async with dispatching(settings(dsn, owner="router-1"), Routed()):
        seed(conn, 3, event_type="orders")
        await wait_until(lambda: _served_by(conn, "routed orders") == "router-1", what="orders")
        assert _served_by(conn, "routed payments") is None  # never met
        seed(conn, 2, event_type="payments")
        await wait_until(lambda: _served_by(conn, "routed payments") == "router-1", what="met")
        assert _served_by(conn, "routed orders") == "router-1"


def test_a_v4_table_upgrades_to_v5_in_place_its_rows_idle_until_stamped(empty_dsn):
    """Schema v5 adds who serves each destination; rows from before have no stamp: idle until
    a worker of the new version stamps them. The step is idempotent like the others."""
    table = Table.parse("outbox")
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        v4 = sum(len(step(table)) + 1 for step in MIGRATIONS[:4])  # each with its comment
        for statement in migration_statements(table)[:v4]:
            conn.execute(statement)
        _fail(conn, table, OLD, "w1")  # the v4 rules work on a v4 row
        assert migrate(conn, table) == (4, SCHEMA_VERSION)
        assert migrate(conn, table) == (SCHEMA_VERSION, SCHEMA_VERSION)  # idempotent
        [(row, now)] = fetch(conn, dest.listing(table))
        assert (row.state, row.served_at, row.served_by) == (dest.OPEN, None, None)
        assert dest.is_idle(row, now)
        fetch(conn, dest.served(table, [OLD], owner="w2"))
        [(row, now)] = fetch(conn, dest.listing(table))
        assert row.served_by == "w2" and not dest.is_idle(row, now)
