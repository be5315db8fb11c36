"""The producer API in the application's transaction: visibility, rollback, locks, NOTIFY."""

from __future__ import annotations

import threading
import time

import psycopg
import pytest
from helpers import row

from outbox import Event, enqueue, enqueue_many
from outbox.table import Table


def _count(conn: psycopg.Connection, where: str = "true") -> int:
    return conn.execute(f"SELECT count(*) FROM outbox WHERE {where}").fetchone()[0]


def test_enqueue_is_invisible_to_others_until_commit(conn, dsn):
    with psycopg.connect(dsn) as writer:  # not autocommit: an open transaction
        message_id = enqueue(
            writer,
            aggregate_type="order",
            aggregate_id="o-1",
            event_type="OrderPaid",
            payload={"order_id": 1, "amount": "9.99"},
        )
        assert isinstance(message_id, int)
        assert writer.info.transaction_status == psycopg.pq.TransactionStatus.INTRANS
        assert _count(conn) == 0
        writer.commit()
    assert _count(conn) == 1
    stored = row(conn, message_id)
    assert stored["aggregate_type"] == "order"
    assert stored["aggregate_id"] == "o-1"
    assert stored["event_type"] == "OrderPaid"
    assert stored["payload"] == {"order_id": 1, "amount": "9.99"}
    assert stored["status"] == "pending"
    assert stored["attempts"] == 0
    assert stored["lease_version"] == 0


def test_enqueue_inside_a_transaction_block_commits_with_the_business_change(conn, dsn):
    conn.execute("CREATE TABLE orders (id int PRIMARY KEY, state text)")
    with psycopg.connect(dsn, autocommit=True) as app:
        with app.transaction():
            app.execute("INSERT INTO orders VALUES (1, 'paid')")
            enqueue(app, aggregate_type="order", aggregate_id="1", event_type="OrderPaid",
                    payload={"id": 1})  # fmt: skip
            assert _count(conn) == 0
        assert _count(conn) == 1
        assert conn.execute("SELECT state FROM orders").fetchone() == ("paid",)


def test_rollback_leaves_nothing(conn, dsn):
    class Abort(Exception):
        pass

    conn.execute("CREATE TABLE orders (id int PRIMARY KEY, state text)")
    with psycopg.connect(dsn, autocommit=True) as app, pytest.raises(Abort), app.transaction():
        app.execute("INSERT INTO orders VALUES (1, 'paid')")
        enqueue_many(app, [Event("order", "1", "OrderPaid", {"id": 1})] * 3)
        raise Abort
    assert _count(conn) == 0
    assert conn.execute("SELECT count(*) FROM orders").fetchone() == (0,)


async def test_enqueue_with_an_async_connection(aconn, conn):
    async with aconn.transaction():
        message_id = await enqueue(
            aconn, aggregate_type="cart", aggregate_id="c-9", event_type="CartClosed",
            payload=["a", 1, None, True],
        )  # fmt: skip
        ids = await enqueue_many(
            aconn, [Event("cart", "c-9", "ItemAdded", {"n": n}) for n in range(3)]
        )
        assert _count(conn) == 0  # still in the async transaction
    assert _count(conn) == 4
    assert row(conn, message_id)["payload"] == ["a", 1, None, True]
    assert ids == sorted(ids) and ids[0] > message_id
    assert [row(conn, i)["payload"] for i in ids] == [{"n": 0}, {"n": 1}, {"n": 2}]


def test_enqueue_many_returns_ids_in_input_order_and_payloads_round_trip(conn):
    payloads = [
        {"nested": {"list": [1, 2.5, "three"], "none": None}},
        ["top", "level", "array"],
        "just a string with \u00e9 and \u2603",
        42,
        {"big": 2**53, "bool": False},
        None,  # JSON null is a valid payload
    ]
    events = [Event("thing", f"t-{i % 2}", f"E{i}", p) for i, p in enumerate(payloads)]
    with conn.transaction():
        ids = enqueue_many(conn, events)
    assert len(ids) == len(events) == len(set(ids))
    assert ids == sorted(ids)
    for message_id, event in zip(ids, events, strict=True):
        stored = row(conn, message_id)
        assert stored["event_type"] == event.event_type
        assert stored["aggregate_id"] == event.aggregate_id
        assert stored["payload"] == event.payload
    # The JSON text round-trips too (what publishers forward).
    text = conn.execute("SELECT payload::text FROM outbox WHERE id = %s", (ids[0],)).fetchone()[0]
    assert '"list": [1, 2.5, "three"]' in text


def test_enqueue_many_of_nothing_inserts_nothing(conn):
    assert enqueue_many(conn, []) == []
    assert enqueue_many(conn, [], lock_aggregate=True) == []
    assert _count(conn) == 0


def test_enqueue_into_a_schema_qualified_table(conn):
    from outbox.schema import migrate

    table = Table.parse("app.events")
    migrate(conn, table)
    with conn.transaction():
        message_id = enqueue(conn, aggregate_type="a", aggregate_id="1", event_type="E",
                             payload={}, table="app.events")  # fmt: skip
        enqueue(conn, aggregate_type="a", aggregate_id="1", event_type="E", payload={},
                table=table, lock_aggregate=True)  # fmt: skip
    assert conn.execute("SELECT count(*) FROM app.events").fetchone() == (2,)
    assert _count(conn) == 0
    assert message_id >= 1


def _waiting_advisory_locks(conn: psycopg.Connection, pid: int) -> int:
    return conn.execute(
        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted AND pid = %s",
        (pid,),
    ).fetchone()[0]


def test_lock_aggregate_serializes_writers_of_one_aggregate(conn, dsn):
    with (
        psycopg.connect(dsn) as first,  # not autocommit: its transaction stays open
        psycopg.connect(dsn, autocommit=True) as second,
    ):
        second_pid = second.info.backend_pid
        result: dict[str, object] = {}

        def write_second() -> None:
            try:
                with second.transaction():
                    result["id"] = enqueue(
                        second, aggregate_type="order", aggregate_id="o-7", event_type="Second",
                        payload={}, lock_aggregate=True,
                    )  # fmt: skip
                    result["returned_at"] = time.monotonic()
            except BaseException as exc:  # surfaced by the assertions below
                result["error"] = exc

        first_a = enqueue(first, aggregate_type="order", aggregate_id="o-7",
                          event_type="FirstA", payload={}, lock_aggregate=True)  # fmt: skip
        thread = threading.Thread(target=write_second)
        thread.start()
        try:
            # The second writer waits on the aggregate's advisory lock...
            deadline = time.monotonic() + 10
            while _waiting_advisory_locks(conn, second_pid) == 0:
                assert thread.is_alive(), f"second writer did not block: {result}"
                assert time.monotonic() < deadline, "second writer never waited on the lock"
                time.sleep(0.01)
            assert thread.is_alive()
            assert "id" not in result
            # ...so an id the first transaction takes later is still lower than the second's.
            first_b = enqueue(first, aggregate_type="order", aggregate_id="o-7",
                              event_type="FirstB", payload={}, lock_aggregate=True)  # fmt: skip
            # Another aggregate is not held up by the lock.
            with psycopg.connect(dsn, autocommit=True) as other, other.transaction():
                enqueue(other, aggregate_type="order", aggregate_id="o-8", event_type="Other",
                        payload={}, lock_aggregate=True)  # fmt: skip
            assert "id" not in result
            committed_at = time.monotonic()
            first.commit()
        finally:
            thread.join(timeout=10)
        assert not thread.is_alive()
        assert "error" not in result, result.get("error")
        second_id = result["id"]
        assert isinstance(second_id, int)
        assert first_a < first_b < second_id
        assert result["returned_at"] > committed_at  # type: ignore[operator]
    order = [r[0] for r in conn.execute(
        "SELECT event_type FROM outbox WHERE aggregate_id = 'o-7' ORDER BY id"
    ).fetchall()]  # fmt: skip
    assert order == ["FirstA", "FirstB", "Second"]


def test_without_lock_aggregate_writers_do_not_block(conn, dsn):
    with (
        psycopg.connect(dsn) as first,
        psycopg.connect(dsn) as second,
    ):
        a = enqueue(first, aggregate_type="o", aggregate_id="x", event_type="A", payload={})
        b = enqueue(second, aggregate_type="o", aggregate_id="x", event_type="B", payload={})
        c = enqueue(first, aggregate_type="o", aggregate_id="x", event_type="C", payload={})
        # Interleaved ids within one aggregate: what lock_aggregate exists to prevent.
        assert a < b < c
        second.commit()
        first.commit()
    assert _count(conn) == 3


def test_enqueue_notifies_the_table_channel_after_commit(conn, dsn):
    channel = Table.parse("outbox").channel
    assert channel == "outbox:outbox"
    with psycopg.connect(dsn, autocommit=True) as listener:
        listener.execute(f'LISTEN "{channel}"')
        with psycopg.connect(dsn) as app:
            enqueue_many(app, [Event("o", "1", "E", {}), Event("o", "2", "E", {})])
            # Nothing is delivered while the inserting transaction is open.
            assert list(listener.notifies(timeout=0.2)) == []
            app.commit()
        received = list(listener.notifies(timeout=5, stop_after=1))
        assert len(received) == 1
        assert received[0].channel == channel
        assert received[0].payload == ""


def test_a_rolled_back_enqueue_notifies_nobody(conn, dsn):
    with psycopg.connect(dsn, autocommit=True) as listener:
        listener.execute('LISTEN "outbox:outbox"')
        with psycopg.connect(dsn) as app:
            enqueue(app, aggregate_type="o", aggregate_id="1", event_type="E", payload={})
            app.rollback()
            # A later committed insert is the event to wait for: it must be the only one.
            enqueue(app, aggregate_type="o", aggregate_id="2", event_type="E", payload={})
            app.commit()
        received = list(listener.notifies(timeout=5, stop_after=1))
        assert len(received) == 1
        assert list(listener.notifies(timeout=0.2)) == []
