"""The producer API in the application's transaction: visibility, rollback, locks, NOTIFY."""

from __future__ import annotations

import threading
import time

import psycopg
import pytest
from helpers import row

from outbox import SCHEMA_VERSION, Event, enqueue, enqueue_many
from outbox.limits import MAX_HEADERS_BYTES
from outbox.producer import HeadersTooLarge, InvalidHeaders
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


# -- headers (schema v4) ----------------------------------------------------------------------


def _headers_of(conn: psycopg.Connection, message_id: int) -> object:
    return conn.execute("SELECT headers FROM outbox WHERE id = %s", (message_id,)).fetchone()[0]


_UNICODE = {"tenant": "t-9", "x-note": "caf\u00e9 \u2603"}


def test_headers_are_stored_as_given_and_absent_headers_stay_null(conn):
    with conn.transaction():
        one = enqueue(conn, aggregate_type="order", aggregate_id="1", event_type="Paid",
                      payload={}, headers=_UNICODE)  # fmt: skip
        none = enqueue(conn, aggregate_type="order", aggregate_id="1", event_type="Paid",
                       payload={})  # fmt: skip
        many = enqueue_many(conn, [
            Event("order", "2", "Paid", {}, headers={"tenant": "t-1"}),
            Event("order", "2", "Paid", {}),
            Event("order", "2", "Paid", {}, headers={}),
        ])  # fmt: skip
    assert _headers_of(conn, one) == _UNICODE
    assert _headers_of(conn, none) is None
    assert [_headers_of(conn, i) for i in many] == [{"tenant": "t-1"}, None, None]


async def test_headers_with_an_async_connection(aconn, conn):
    async with aconn.transaction():
        one = await enqueue(aconn, aggregate_type="a", aggregate_id="1", event_type="E",
                            payload={}, headers={"k": "v"})  # fmt: skip
        [two] = await enqueue_many(aconn, [Event("a", "1", "E", {}, headers={"k2": "v2"})])
    assert _headers_of(conn, one) == {"k": "v"}
    assert _headers_of(conn, two) == {"k2": "v2"}


@pytest.mark.parametrize(
    ("headers", "says"),
    [
        ({"n": 1}, "header 'n': value must be a str, not int"),
        ({"n": None}, "header 'n': value must be a str, not NoneType"),
        ({1: "v"}, "a header name must be a non-empty str, not int"),
        ({"": "v"}, "a header name must be a non-empty str, not str"),
        ([("n", "v")], "headers must be a mapping of str to str, not list"),
    ],
)
def test_headers_that_are_not_strings_are_refused_and_nothing_is_written(conn, headers, says):
    events = [Event("order", "1", "Paid", {}), Event("order", "1", "Refunded", {}, headers)]
    with pytest.raises(InvalidHeaders) as raised:
        enqueue_many(conn, events)
    assert str(raised.value) == f"event 1 (order Refunded): {says}"
    assert _count(conn) == 0


def test_headers_are_bounded_as_json_text_and_the_error_never_shows_a_value(conn):
    # {"k": "xx…"}: 10 bytes of JSON around the value as psycopg writes it.
    frame = len(b'{"k": ""}')
    fits = {"k": "s" * (MAX_HEADERS_BYTES - frame)}
    with conn.transaction():
        message_id = enqueue(conn, aggregate_type="a", aggregate_id="1", event_type="E",
                             payload={}, headers=fits)  # fmt: skip
    assert _headers_of(conn, message_id) == fits
    over = {"k": "s" * (MAX_HEADERS_BYTES - frame + 1)}
    with pytest.raises(HeadersTooLarge) as raised:
        enqueue(conn, aggregate_type="a", aggregate_id="1", event_type="E", payload={},
                headers=over)  # fmt: skip
    assert raised.value.size == MAX_HEADERS_BYTES + 1 and raised.value.limit == MAX_HEADERS_BYTES
    assert str(raised.value) == (
        f"event 0 (a E): headers of {MAX_HEADERS_BYTES + 1} bytes of JSON exceed the limit of "
        f"{MAX_HEADERS_BYTES} bytes (16KiB); send large data in the payload"
    )
    assert "sss" not in str(raised.value)
    assert _count(conn) == 1


def test_a_table_before_v4_still_takes_events_without_headers(empty_dsn):
    """A producer upgraded before the table is migrated keeps working until it sends headers."""
    table = Table.parse("outbox")
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        for statement in _statements_to_v3(table):
            conn.execute(statement)
        with conn.transaction():
            message_id = enqueue(conn, aggregate_type="a", aggregate_id="1", event_type="E",
                                 payload={}, trace_context=False)  # fmt: skip
        assert message_id >= 1
        with pytest.raises(psycopg.errors.UndefinedColumn), conn.transaction():
            enqueue(conn, aggregate_type="a", aggregate_id="1", event_type="E", payload={},
                    headers={"k": "v"})  # fmt: skip


def _statements_to_v3(table: Table) -> list:
    from outbox.schema import MIGRATIONS, migration_statements

    steps = sum(len(step(table)) + 1 for step in MIGRATIONS[:3])  # each with its comment
    return migration_statements(table)[:steps]


def test_v4_adds_headers_online_to_a_table_with_rows(empty_dsn):
    """No rewrite (the table keeps its file) and no scan: the ALTER's lock lasts a catalog
    change, however many rows the table holds."""
    from outbox.schema import migrate, render_migration

    table = Table.parse("outbox")
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        for statement in _statements_to_v3(table):
            conn.execute(statement)
        conn.execute(
            "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) "
            "SELECT 'a', g::text, 'E', jsonb_build_object('n', g) FROM generate_series(1, 20000) g"
        )
        before = _physical(conn)
        assert migrate(conn, table) == (3, SCHEMA_VERSION)
        after = _physical(conn)
        assert after == before  # same file, no sequential scan, no heap page read
        assert conn.execute("SELECT count(*), count(headers) FROM outbox").fetchone() == (20000, 0)
        # The column has no default and allows NULL: nothing to write into existing rows.
        assert conn.execute(
            "SELECT format_type(atttypid, atttypmod), attnotnull, atthasdef, atthasmissing "
            "FROM pg_attribute WHERE attrelid = 'outbox'::regclass AND attname = 'headers'"
        ).fetchone() == ("jsonb", False, False, False)
    # What `outbox migrate --print` shows.
    assert 'ALTER TABLE "outbox" ADD COLUMN IF NOT EXISTS headers jsonb;' in render_migration(table)


def _physical(conn: psycopg.Connection) -> tuple:
    """The table's file, its sequential scans, its heap pages read (hit or not), with this
    session's counts so far flushed."""
    conn.execute("SELECT pg_stat_force_next_flush()")  # at the end of this statement
    conn.execute("SELECT pg_stat_clear_snapshot()")
    return conn.execute(
        "SELECT c.relfilenode, s.seq_scan, io.heap_blks_read + io.heap_blks_hit "
        "FROM pg_class c JOIN pg_stat_user_tables s ON s.relid = c.oid "
        "JOIN pg_statio_user_tables io ON io.relid = c.oid WHERE c.oid = 'outbox'::regclass"
    ).fetchone()


async def test_a_claim_carries_the_headers_on_the_message(aconn, conn, table):
    from datetime import timedelta

    from outbox.lease import claim

    with conn.transaction():
        ids = enqueue_many(conn, [
            Event("a", "1", "E", {}, headers={"traceparent": "00-" + "1" * 32 + "-" + "2" * 16
                                              + "-01", "tenant": "t"}),
            Event("a", "1", "E", {}),
        ])  # fmt: skip
    messages = await claim(aconn, table, owner="t", batch=10, lease=timedelta(seconds=30),
                           max_attempts=3)  # fmt: skip
    assert [m.id for m in messages] == ids
    assert messages[0].headers == {"traceparent": f"00-{'1' * 32}-{'2' * 16}-01", "tenant": "t"}
    assert messages[1].headers is None


def _at_v3(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        for statement in _statements_to_v3(Table.parse("outbox")):
            conn.execute(statement)


def test_an_active_span_does_not_break_writes_to_a_table_before_v4(empty_dsn, monkeypatch):
    """The trace context is optional: on a table without `headers` the event is written
    without it, in the application's transaction, which goes on; headers the caller gave
    still need the column. Once the table is migrated, the context is stored again."""
    from opentelemetry.sdk.trace import TracerProvider

    import outbox.producer
    from outbox.schema import migrate

    tracer = TracerProvider().get_tracer("tests.producer")
    _at_v3(empty_dsn)
    with psycopg.connect(empty_dsn) as conn:
        with tracer.start_as_current_span("place order"), conn.transaction():
            conn.execute("CREATE TABLE orders (id int)")
            first = enqueue(conn, aggregate_type="a", aggregate_id="1", event_type="E",
                            payload={})  # fmt: skip
            [second] = enqueue_many(conn, [Event("a", "2", "E", {})])  # known now: no lookup
            conn.execute("INSERT INTO orders VALUES (1)")  # the transaction was not aborted
        assert conn.execute("SELECT count(*) FROM orders").fetchone() == (1,)
        assert [r[0] for r in conn.execute("SELECT id FROM outbox ORDER BY id")] == [first, second]
        with (
            tracer.start_as_current_span("explicit"),
            pytest.raises(psycopg.errors.UndefinedColumn),
            conn.transaction(),
        ):
            enqueue(conn, aggregate_type="a", aggregate_id="1", event_type="E", payload={},
                    headers={"k": "v"})  # fmt: skip
        conn.commit()
        with psycopg.connect(empty_dsn, autocommit=True) as admin:
            assert migrate(admin, Table.parse("outbox")) == (3, SCHEMA_VERSION)
        monkeypatch.setattr(outbox.producer, "RECHECK_SECONDS", 0.0)  # no minute to wait
        with tracer.start_as_current_span("after migration") as span, conn.transaction():
            third = enqueue(conn, aggregate_type="a", aggregate_id="3", event_type="E",
                            payload={})  # fmt: skip
        traceparent = _headers_of(conn, third)["traceparent"]
        assert traceparent.split("-")[1] == format(span.get_span_context().trace_id, "032x")


async def test_an_active_span_on_an_async_connection_to_a_table_before_v4(empty_dsn):
    from opentelemetry.sdk.trace import TracerProvider

    tracer = TracerProvider().get_tracer("tests.producer")
    _at_v3(empty_dsn)
    async with await psycopg.AsyncConnection.connect(empty_dsn) as aconn:
        with tracer.start_as_current_span("place order"):
            async with aconn.transaction():
                one = await enqueue(aconn, aggregate_type="a", aggregate_id="1",
                                    event_type="E", payload={})  # fmt: skip
                [two] = await enqueue_many(aconn, [Event("a", "2", "E", {})])
        cursor = await aconn.execute("SELECT id FROM outbox ORDER BY id")
        assert [r[0] for r in await cursor.fetchall()] == [one, two]
