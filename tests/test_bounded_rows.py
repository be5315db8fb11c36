"""Bounded rows: a row can never crash a worker, and can never cost another row anything. The
producer refuses a payload, a name or headers past their limits; a claim measures every column
in the database, sends a row past a limit to dead with the reason without loading it, and takes
rows by a byte budget; a real worker under a memory limit meets 50 MB payloads, headers and
event types, and headers nested 5,000 deep, and goes on delivering the rest."""

from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from functools import partial
from pathlib import Path

import psycopg
import pytest
from helpers import row, seed, serve_ordering, statuses, wait_until
from psycopg import sql
from psycopg.types.json import set_json_dumps

from outbox import (
    Event,
    HeadersTooLarge,
    InvalidHeaders,
    NameTooLong,
    PayloadTooLarge,
    enqueue,
    enqueue_many,
    lease,
)
from outbox.limits import (
    KIB,
    MAX_HEADER_COUNT,
    MAX_HEADERS_BYTES,
    MAX_NAME_BYTES,
    MAX_PAYLOAD_BYTES,
    MIB,
    WORKER_MAX_PAYLOAD_BYTES,
)
from outbox.models import Message, Outcome
from outbox.producer import get_max_payload_bytes, set_max_payload_bytes
from outbox.worker.ledger import Ledger

# -- the producer ----------------------------------------------------------------------------


def _count(conn: psycopg.Connection) -> int:
    return conn.execute("SELECT count(*) FROM outbox").fetchone()[0]


def _json_size(payload: object) -> int:
    return len(json.dumps(payload).encode())  # psycopg's default dumps


def _payload_of(size: int) -> dict[str, str]:
    """A payload whose JSON text (as json.dumps writes it) is exactly `size` bytes."""
    payload = {"blob": ""}
    payload["blob"] = "s" * (size - _json_size(payload))
    assert _json_size(payload) == size
    return payload


def test_enqueue_refuses_a_payload_past_the_limit_naming_the_event_not_its_content(conn):
    at_limit = _payload_of(MAX_PAYLOAD_BYTES)
    assert enqueue(conn, aggregate_type="doc", aggregate_id="1", event_type="Stored",
                   payload=at_limit)  # fmt: skip
    with pytest.raises(PayloadTooLarge) as refused:
        enqueue(conn, aggregate_type="doc", aggregate_id="2", event_type="Stored",
                payload=_payload_of(MAX_PAYLOAD_BYTES + 1))  # fmt: skip
    assert _count(conn) == 1
    message = str(refused.value)
    assert "event 0 (doc Stored)" in message and f"{MAX_PAYLOAD_BYTES + 1} bytes" in message
    assert "max_payload_bytes 1048576 (1MiB)" in message
    assert "sss" not in message  # nothing of the payload
    assert (refused.value.size, refused.value.limit) == (MAX_PAYLOAD_BYTES + 1, MAX_PAYLOAD_BYTES)


def test_enqueue_many_writes_none_when_one_is_too_large_and_the_transaction_goes_on(conn):
    events = [Event("doc", str(i), "Stored", {"i": i}) for i in range(3)]
    events.insert(2, Event("doc", "big", "Huge", _payload_of(MAX_PAYLOAD_BYTES + 10)))
    with conn.transaction():
        with pytest.raises(PayloadTooLarge, match=r"^event 2 \(doc Huge\)"):
            enqueue_many(conn, events)
        # Refused before anything was sent: the application's transaction is still usable.
        assert enqueue_many(conn, events[:2] + events[3:])
    assert _count(conn) == 3


def test_a_call_may_give_its_own_limit(conn):
    big = _payload_of(3 * MIB)
    with pytest.raises(PayloadTooLarge):
        enqueue(conn, aggregate_type="doc", aggregate_id="1", event_type="E", payload=big)
    [message_id] = enqueue_many(conn, [Event("doc", "1", "E", big)], max_payload_bytes=4 * MIB)
    assert row(conn, message_id)["payload"] == big
    with pytest.raises(PayloadTooLarge, match="max_payload_bytes 10 "):
        enqueue(conn, aggregate_type="doc", aggregate_id="2", event_type="E",
                payload={"a": "0123456789"}, max_payload_bytes=10)  # fmt: skip
    assert _count(conn) == 1


def test_the_process_limit_is_set_once_for_every_call(conn):
    old = set_max_payload_bytes(100)
    try:
        assert get_max_payload_bytes() == 100
        with pytest.raises(PayloadTooLarge, match="max_payload_bytes 100 "):
            enqueue(conn, aggregate_type="d", aggregate_id="1", event_type="E",
                    payload=_payload_of(101))  # fmt: skip
        assert enqueue(conn, aggregate_type="d", aggregate_id="1", event_type="E",
                       payload=_payload_of(100))  # fmt: skip
        with pytest.raises(ValueError, match="out of range"):
            set_max_payload_bytes(0)
    finally:
        set_max_payload_bytes(old)
    assert get_max_payload_bytes() == MAX_PAYLOAD_BYTES


def test_the_text_measured_is_the_connections_own_json_and_is_what_gets_stored(conn):
    """An application's dumps function (psycopg's set_json_dumps) makes the text measured:
    here a compact one that also writes Decimal, which json.dumps alone refuses."""
    set_json_dumps(partial(json.dumps, separators=(",", ":"), default=str), context=conn)
    payload = {"amount": Decimal("9.99"), "note": "n" * 20}
    compact = len(json.dumps(payload, separators=(",", ":"), default=str))
    with pytest.raises(PayloadTooLarge, match=f"payload of {compact} bytes"):
        enqueue(conn, aggregate_type="o", aggregate_id="1", event_type="Paid", payload=payload,
                max_payload_bytes=compact - 1)  # fmt: skip
    message_id = enqueue(conn, aggregate_type="o", aggregate_id="1", event_type="Paid",
                         payload=payload, max_payload_bytes=compact)  # fmt: skip
    assert row(conn, message_id)["payload"] == {"amount": "9.99", "note": "n" * 20}


async def test_an_async_connection_is_bounded_too(aconn, conn):
    with pytest.raises(PayloadTooLarge):
        await enqueue(aconn, aggregate_type="d", aggregate_id="1", event_type="E",
                      payload=_payload_of(MAX_PAYLOAD_BYTES + 1))  # fmt: skip
    assert await enqueue_many(aconn, [Event("d", "1", "E", {"ok": True})]) == [1]
    assert _count(conn) == 1


NAMES = {"aggregate_type": "doc", "aggregate_id": "1", "event_type": "Stored"}


@pytest.mark.parametrize("field", ["event_type", "aggregate_type", "aggregate_id"])
def test_enqueue_refuses_a_name_past_its_limit_naming_the_field_not_its_content(conn, field):
    at_limit = "é" * (MAX_NAME_BYTES // 2)  # two bytes each in UTF-8: the limit is in bytes
    assert enqueue(conn, payload={}, **{**NAMES, field: at_limit})
    with pytest.raises(NameTooLong) as refused:
        enqueue_many(conn, [Event(**{**NAMES, field: at_limit + "x"}, payload={})])
    assert str(refused.value) == (
        f"event 0: {field} of {MAX_NAME_BYTES + 1} bytes exceeds the limit of 1024 bytes (1KiB)"
    )
    assert (refused.value.field, refused.value.size) == (field, MAX_NAME_BYTES + 1)
    with pytest.raises(NameTooLong, match=f"^event 0: {field} of 50000 bytes"):
        enqueue(conn, payload={}, **{**NAMES, field: "x" * 50_000})
    assert _count(conn) == 1


def _headers_of(size: int) -> dict[str, str]:
    """Headers whose text, as PostgreSQL renders the stored value, is exactly `size` bytes:
    `{"tenant": "é…x"}`, characters outside ASCII included (as themselves, two bytes each)."""
    room = size - len('{"tenant": ""}')
    return {"tenant": "é" * (room // 2) + "x" * (room % 2)}


async def test_headers_are_measured_as_the_claim_measures_them_so_what_is_accepted_is_taken(
    conn, aconn, table
):
    """The producer measured the connection's JSON (`é` as `\\u00e9`, six bytes, or compact
    without spaces), the claim PostgreSQL's text: they must agree, byte for byte."""
    set_json_dumps(partial(json.dumps, separators=(",", ":")), context=conn)
    at_limit = _headers_of(MAX_HEADERS_BYTES)
    [message_id] = enqueue_many(conn, [Event(**NAMES, payload={}, headers=at_limit)])
    size = conn.execute("SELECT octet_length(headers::text) FROM outbox").fetchone()[0]
    assert size == MAX_HEADERS_BYTES
    [taken] = await _claim(aconn, table)
    assert (taken.id, taken.headers) == (message_id, at_limit)
    with pytest.raises(HeadersTooLarge, match=f"headers of {MAX_HEADERS_BYTES + 1} bytes"):
        enqueue(conn, payload={}, headers=_headers_of(MAX_HEADERS_BYTES + 1), **NAMES)
    assert _count(conn) == 1


def test_enqueue_refuses_more_headers_than_the_limit(conn):
    most = {f"h{i}": "v" for i in range(MAX_HEADER_COUNT)}
    assert enqueue(conn, payload={}, headers=most, **NAMES, trace_context=False)
    with pytest.raises(InvalidHeaders, match=r"^event 0 \(doc Stored\): 65 headers, more than "):
        enqueue(conn, payload={}, headers={**most, "one": "more"}, **NAMES)
    assert _count(conn) == 1


# -- the claim -------------------------------------------------------------------------------

LONG = timedelta(minutes=5)


def _insert_blob(conn: psycopg.Connection, length: int, aggregate: str = "big") -> int:
    """A row whose payload, as text, is `length` + 12 bytes (`{"blob": "..."}`), made in the
    database: the test process never holds it."""
    return conn.execute(
        "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) "
        "VALUES ('doc', %s, 'Blob', jsonb_build_object('blob', repeat('x', %s))) RETURNING id",
        (aggregate, length),
    ).fetchone()[0]


async def _claim(aconn, table, **kwargs) -> list[Message]:
    kwargs.setdefault("batch", 100)
    return await lease.claim(aconn, table, owner="w", lease=LONG, max_attempts=5, **kwargs)


@pytest.mark.parametrize(
    "mode",
    [{}, {"ordered": True}, {"ordered": True, "by_aggregate": True}],
    ids=["unordered", "ordered", "ordered-by-aggregate"],
)
async def test_an_oversized_row_goes_dead_with_the_reason_and_the_rest_of_the_batch_is_taken(
    conn, aconn, table, mode
):
    if mode:
        serve_ordering(conn)
    small = seed(conn, 3, aggregates=3)
    big = _insert_blob(conn, 3 * MIB)
    small += seed(conn, 2, aggregates=2)  # agg-0, agg-1: behind the first ones
    taken = await _claim(aconn, table, max_payload_bytes=2 * MIB, **mode)
    first_heads = small[:3] if mode else small
    assert [m.id for m in taken] == first_heads
    dead = row(conn, big)
    assert dead["status"] == "dead" and dead["lease_owner"] is None
    reason = f"payload of 3072 kB ({3 * MIB + 12} bytes) exceeds --max-payload-bytes 2MiB"
    assert dead["last_error"] == reason
    assert [e["error"] for e in dead["errors"]] == [reason]
    assert (dead["attempts"], dead["lease_version"]) == (0, 0)  # never sent, never leased
    assert all(row(conn, i)["attempts"] == 1 for i in first_heads)


async def test_an_expired_lease_on_an_oversized_row_ends_dead_too(conn, aconn, table):
    big = _insert_blob(conn, 2 * MIB)
    [first] = await _claim(aconn, table, max_payload_bytes=4 * MIB)  # a worker with a larger limit
    assert first.id == big
    conn.execute("UPDATE outbox SET lease_until = now() - interval '1 second'")
    assert await _claim(aconn, table, max_payload_bytes=MIB) == []
    dead = row(conn, big)
    assert dead["status"] == "dead" and dead["lease_version"] == 1
    assert dead["last_error"].endswith("exceeds --max-payload-bytes 1MiB")
    # The first worker's late finalize is fenced out, like every write after a lost lease.
    assert await lease.finalize(aconn, table, [Outcome.done(first)]) == set()
    assert row(conn, big)["status"] == "dead"


async def test_a_claim_takes_rows_while_they_fit_its_byte_budget_and_leaves_the_rest_untouched(
    conn, aconn, table
):
    ids = [_insert_blob(conn, 100_000, aggregate=f"a{i}") for i in range(6)]
    size = 100_012
    taken = await _claim(aconn, table, claim_bytes=3 * size + 5)
    assert [m.id for m in taken] == ids[:3]
    assert sum(len(m.payload_json) for m in taken) == 3 * size
    left = [row(conn, i) for i in ids[3:]]
    assert {(r["status"], r["attempts"], r["lease_version"]) for r in left} == {("pending", 0, 0)}
    # One row always comes, however small the budget: the next claim never comes back empty.
    assert [m.id for m in await _claim(aconn, table, claim_bytes=1)] == [ids[3]]
    assert [m.id for m in await _claim(aconn, table, claim_bytes=size + 1)] == [ids[4]]
    assert statuses(conn) == {"processing": 5, "pending": 1}


async def test_the_budget_counts_only_rows_within_the_limit(conn, aconn, table):
    small = seed(conn, 2)
    big = _insert_blob(conn, 5 * MIB)
    small += seed(conn, 2)
    taken = await _claim(aconn, table, max_payload_bytes=MIB, claim_bytes=4 * 60)
    assert [m.id for m in taken] == small
    assert row(conn, big)["status"] == "dead"


async def test_the_payload_a_claim_returns_is_the_stored_text_small_or_large(conn, aconn, table):
    small = seed(conn, 1)[0]
    large = _insert_blob(conn, 20_000)
    taken = {m.id: m.payload_json for m in await _claim(aconn, table)}
    assert json.loads(taken[small]) == {"n": 0, "text": "x" * 20}
    assert taken[large] == '{"blob": "' + "x" * 20_000 + '"}'


HUGE = 50 * MIB
DEEP = "(repeat('[', 5000) || repeat(']', 5000))::jsonb"  # 10 KB of text, 5,000 deep
# A row past a limit in one column: (the column, its value as SQL, the reason it is dead).
HOSTILE = {
    "headers nested 5,000 deep": (
        "headers", DEEP, "headers is a JSON array, not an object of string values"
    ),
    "headers an array": (
        "headers", "'[1]'", "headers is a JSON array, not an object of string values"
    ),
    "headers a string": (
        "headers", "'\"x\"'", "headers is a JSON string, not an object of string values"
    ),
    "headers a number": (
        "headers", "'7'", "headers is a JSON number, not an object of string values"
    ),
    "a header a number": (
        "headers", """'{"tenant": "t", "n": 1}'""",
        "headers is not a JSON object of string values (a value is a JSON number)",
    ),
    "a header nested 5,000 deep": (
        "headers", f"jsonb_build_object('tenant', 't', 'deep', {DEEP})",
        "headers is not a JSON object of string values (a value is a JSON array)",
    ),
    "65 headers": (
        "headers", "(SELECT jsonb_object_agg('h' || i, 'v') FROM generate_series(1, 65) AS i)",
        "headers hold 65 entries, more than 64",
    ),
    "headers of 16 KiB and a byte": (
        "headers", f"jsonb_build_object('big', repeat('x', {16 * KIB - 10}))",
        "headers of 16 kB (16385 bytes) exceed 16KiB",
    ),
    "headers of 50 MB": (
        "headers", f"jsonb_build_object('big', repeat('x', {HUGE}))",
        f"headers of 50 MB ({HUGE + 11} bytes) exceed 16KiB",
    ),
    "event_type of 50 MB": (
        "event_type", f"repeat('e', {HUGE})", f"event_type of 50 MB ({HUGE} bytes) exceeds 1KiB"
    ),
    "event_type of 1 KiB and a byte": (
        "event_type", "repeat('é', 512) || 'e'", "event_type of 1025 bytes exceeds 1KiB"
    ),
    "aggregate_type of 5,000 characters": (
        "aggregate_type", "repeat('a', 5000)", "aggregate_type of 5000 bytes exceeds 1KiB"
    ),
    "aggregate_id of 1 KiB and a byte": (
        "aggregate_id", "repeat('i', 1025)", "aggregate_id of 1025 bytes exceeds 1KiB"
    ),
}  # fmt: skip


def _insert_row(conn: psycopg.Connection, column: str, value: str, aggregate: str) -> int:
    """A row whose `column` is the SQL expression `value`, made in the database (the test
    process never holds it); its own aggregate unless the column is aggregate_id."""
    values = {
        "aggregate_type": "'doc'",
        "aggregate_id": sql.Literal(aggregate).as_string(conn),
        "event_type": "'Hostile'",
        "payload": "'{}'",
        "headers": "NULL",
        column: value,
    }
    statement = "INSERT INTO outbox ({}) SELECT {} RETURNING id".format(
        ", ".join(values), ", ".join(f"{v}::{_TYPES[c]}" for c, v in values.items())
    )
    return conn.execute(statement.encode()).fetchone()[0]


_TYPES = {"aggregate_type": "text", "aggregate_id": "text", "event_type": "text",
          "payload": "jsonb", "headers": "jsonb"}  # fmt: skip


def _fate(conn: psycopg.Connection, message_id: int) -> tuple[str, int, int, str, list[str]]:
    """What became of a row, read without loading its hostile columns."""
    return conn.execute(
        "SELECT status, attempts, lease_version, last_error, "
        "ARRAY(SELECT e ->> 'error' FROM jsonb_array_elements(errors) AS e) "
        "FROM outbox WHERE id = %s",
        (message_id,),
    ).fetchone()


@pytest.mark.parametrize(("column", "value", "reason"), HOSTILE.values(), ids=HOSTILE.keys())
async def test_a_row_past_a_limit_in_any_column_is_dead_with_the_reason_and_never_loaded(
    conn, aconn, table, column, value, reason
):
    before = seed(conn, 3, aggregates=3)
    hostile = _insert_row(conn, column, value, aggregate="hostile")
    after = seed(conn, 3, aggregates=3)
    taken = await _claim(aconn, table)  # before: a RecursionError, or every row loaded
    assert [m.id for m in taken] == before + after
    assert _fate(conn, hostile) == ("dead", 0, 0, reason, [reason])  # never leased


@pytest.mark.parametrize(
    "mode",
    [{}, {"ordered": True}, {"ordered": True, "by_aggregate": True}],
    ids=["unordered", "ordered", "ordered-by-aggregate"],
)
async def test_every_hostile_row_of_a_batch_is_dead_and_the_others_are_taken_in_every_mode(
    conn, aconn, table, mode
):
    if mode:
        serve_ordering(conn)
    innocent: list[int] = []
    hostile: dict[int, str] = {}
    traced = {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}
    for n, (column, value, reason) in enumerate(HOSTILE.values()):
        with conn.transaction():
            [message_id] = enqueue_many(conn, [Event("doc", f"i-{n}", "E", {}, headers=traced)])
        innocent.append(message_id)
        hostile[_insert_row(conn, column, value, aggregate=f"h-{n}")] = reason
    taken = await _claim(aconn, table, **mode)
    assert [m.id for m in taken] == innocent
    assert all(m.headers == traced for m in taken)
    for message_id, reason in hostile.items():
        assert _fate(conn, message_id) == ("dead", 0, 0, reason, [reason])


def test_a_claimed_row_whose_headers_cannot_be_read_fails_alone():
    """The claim lets only a small object of strings through; should a row's headers fail
    to load all the same, that row goes dead alone and the others are delivered."""
    now = datetime.now(UTC)

    def row_of(message_id: int, headers: str | None) -> tuple[object, ...]:
        return (message_id, 1, 1, "doc", "a", "E", "{}", now, headers, None, 0.0)

    claimed = lease._claimed([
        row_of(3, '{"tenant": "t"}'),
        row_of(1, "[" * 100_000),
        row_of(2, None),
        row_of(4, '{"n": 1}'),
    ])  # fmt: skip
    assert [(m.id, m.headers) for m in claimed.messages] == [(2, None), (3, {"tenant": "t"})]
    assert [(o.message_id, o.kind, o.error) for o in claimed.unreadable] == [
        (1, "dead", "headers cannot be read: maximum recursion depth exceeded while decoding "
                    "a JSON array from a unicode string"),
        (4, "dead", "headers cannot be read: not a JSON object of string values"),
    ]  # fmt: skip


def test_the_defaults_let_through_what_the_producer_accepts():
    """PostgreSQL spaces out a compact text (`[1,2]` becomes `[1, 2]`): at most half again."""
    assert WORKER_MAX_PAYLOAD_BYTES >= 1.5 * MAX_PAYLOAD_BYTES


async def test_a_compact_payload_at_the_producers_limit_is_delivered_by_a_default_worker(
    conn, aconn, table
):
    set_json_dumps(partial(json.dumps, separators=(",", ":")), context=conn)
    count = (MAX_PAYLOAD_BYTES - 2) // 2  # `[0,0,...,0]`: the densest spacing there is
    [message_id] = enqueue_many(conn, [Event("d", "1", "E", [0] * count)])
    [taken] = await _claim(aconn, table)  # the worker's defaults
    assert taken.id == message_id and len(taken.payload_json) > 1.4 * MAX_PAYLOAD_BYTES


# -- the ledger ------------------------------------------------------------------------------


def _message(message_id: int, size: int) -> Message:
    return Message(message_id, 1, 1, "a", "b", "E", "x" * size, None)  # type: ignore[arg-type]


def test_the_ledger_counts_the_payload_it_holds_and_claims_only_what_is_left():
    ledger = Ledger(batch=10, concurrency=4, claim_bytes=1000)
    assert ledger.bytes_to_claim() == 1000 and ledger.worth_claiming(10)
    held = [_message(i, 300) for i in range(3)]
    ledger.hold(held, now=0.0, claim_seconds=0.01)
    assert (ledger.held_bytes, ledger.bytes_to_claim()) == (900, 100)
    # Large payloads lately: a claim asks for as many as fit, and one more.
    assert ledger.rows_for(100, 10) == 1 and ledger.rows_for(1000, 10) == 4
    ledger.hold([_message(3, 300)], now=0.0, claim_seconds=0.01)
    assert ledger.bytes_to_claim() == -200
    assert not ledger.worth_claiming(10)  # the budget is spent: wait for room
    ledger.drop_all([Outcome.done(m) for m in held[:2]])
    ledger.drop(3, lease_version=2)  # another lease's outcome: nothing dropped
    assert ledger.held_bytes == 600 and ledger.worth_claiming(10)
    ledger.drop(3, lease_version=1)
    ledger.forget(2, lease_version=1)
    assert (ledger.held, ledger.held_bytes) == ({}, 0)


def test_small_payloads_leave_the_claim_its_full_batch():
    ledger = Ledger(batch=100, concurrency=4)
    ledger.hold([_message(i, 200) for i in range(100)], now=0.0, claim_seconds=0.01)
    assert ledger.rows_for(ledger.bytes_to_claim(), 100) == 100


# -- a real worker under a memory limit -------------------------------------------------------

BIG = 50 * MIB
# Address space, not resident memory: a working worker maps about 260 MB (thread stacks,
# malloc arenas, libraries) of which 60-90 MB is resident. 8 rows of 50 MB, as text, are 400.
MEMORY_LIMIT = 512 * MIB


def _limit_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))


def _peak_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    raise AssertionError("no VmHWM")


def _spawn_limited(dsn: str, log: Path, *args: str) -> subprocess.Popen[bytes]:
    """A real `outbox-worker` whose address space is limited (RLIMIT_AS) before it starts."""
    with log.open("ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "outbox.worker", "--owner", "w-limited", *args],
            env={**os.environ, "OUTBOX_DSN": dsn, "OUTBOX_LOG_FORMAT": "json"},
            stdout=out, stderr=out, preexec_fn=_limit_memory,
        )  # fmt: skip


def _tail(log: Path) -> str:
    return log.read_text()[-2000:]


async def _drain_limited(
    conn: psycopg.Connection,
    dsn: str,
    log: Path,
    sink,
    delivered: list[int],
    dead: int,
    *args: str,
) -> int:
    """Runs a limited HTTP worker until `delivered` are done and `dead` rows dead (it must
    live that long and stop cleanly on SIGTERM); the worker's resident peak, in bytes."""
    proc = _spawn_limited(dsn, log, "--publisher", "http", "--http-url", sink.url, *args)
    try:
        await wait_until(
            lambda: (
                statuses(conn) == {"done": len(delivered), "dead": dead} or proc.poll() is not None
            ),
            timeout=120,
            what="the innocent rows delivered, the others dead",
        )
        assert proc.poll() is None, _tail(log)
        peak = _peak_kib(proc.pid) * 1024
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=60)
    assert code == 0, _tail(log)
    assert sorted(sink.delivered_ids()) == sorted(delivered)
    return peak


@pytest.mark.slow
async def test_a_worker_under_a_memory_limit_sends_50_mb_rows_to_dead_and_delivers_the_rest(
    conn, dsn, tmp_path, sink
):
    """The issue's case: 8 rows of 50 MB (a few MB on disk, compressed) in one batch with
    small ones. Before, one claim loaded them all (930 MB resident): under a limit the
    worker died, and every row of the batch spent an attempt per death until it went dead."""
    small: list[int] = []
    big: list[int] = []
    for _ in range(8):
        small += seed(conn, 5)
        big.append(_insert_blob(conn, BIG))
    small += seed(conn, 5)
    peak = await _drain_limited(conn, dsn, tmp_path / "worker.log", sink, small, len(big),
                                "--max-payload-bytes", "8MiB", "--batch", "100")  # fmt: skip
    assert peak < 2 * 8 * MIB + 150 * MIB, f"resident peak {peak / MIB:.0f} MiB"
    reasons = {r[0] for r in conn.execute("SELECT last_error FROM outbox WHERE status = 'dead'")}
    assert reasons == {f"payload of 50 MB ({BIG + 12} bytes) exceeds --max-payload-bytes 8MiB"}
    # Nothing innocent spent an attempt it should not have, nothing large was ever leased.
    assert conn.execute(
        "SELECT array_agg(DISTINCT attempts) FROM outbox WHERE id = ANY(%s)", (small,)
    ).fetchone()[0] == [1]
    assert conn.execute(
        "SELECT array_agg(DISTINCT lease_version) FROM outbox WHERE id = ANY(%s)", (big,)
    ).fetchone()[0] == [0]


@pytest.mark.slow
async def test_a_worker_takes_large_rows_a_few_at_a_time_within_its_byte_budget(
    conn, dsn, tmp_path, sink
):
    """Rows within the limit but large: each claim takes what fits what is left of the
    budget (and one row), so the worker never holds the whole batch, and all are delivered."""
    large_text = 3 * MIB + 12
    large = []
    for i in range(8):
        seed(conn, 3)
        large.append(_insert_blob(conn, 3 * MIB, aggregate=f"large-{i}"))
    log = tmp_path / "worker.log"
    proc = _spawn_limited(dsn, log, "--publisher", "http", "--http-url", sink.url,
                          "--max-payload-bytes", "4MiB", "--claim-bytes", "4MiB",
                          "--log-level", "DEBUG")  # fmt: skip
    try:
        await wait_until(
            lambda: statuses(conn) == {"done": 32} or proc.poll() is not None,
            timeout=120,
            what="every row delivered",
        )
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=60)
    assert code == 0, log.read_text()[-2000:]
    claims = [
        entry["ids"]
        for entry in map(json.loads, log.read_text().splitlines())
        if entry.get("event") == "claimed"
    ]
    large_per_claim = [len(set(ids) & set(large)) for ids in claims]
    assert sum(large_per_claim) == len(large)
    # What is left of 4 MiB, and one row: never more than one large row at a time here.
    assert max(large_per_claim) == 1, claims
    assert all(len(entry) >= 1 for entry in claims) and large_text > 3 * MIB


@pytest.mark.slow
async def test_a_worker_under_a_memory_limit_lives_through_headers_it_could_not_load(
    conn, dsn, tmp_path, sink
):
    """The issue's cases: headers of 5,000 `[` and 5,000 `]` made the worker exit with a
    RecursionError inside the claim, its leases committed: every restart claimed the row
    again and crashed, until it and the ten innocent messages claimed with it were dead;
    headers that are not an object raised an AttributeError on every attempt. Each is now
    dead at the claim with the reason; the worker lives on and the rest is delivered."""
    innocent = seed(conn, 10)
    hostile: dict[int, str] = {}
    for n, kind in enumerate(
        ["headers nested 5,000 deep", "headers an array", "headers a string", "headers a number"]
    ):
        column, value, reason = HOSTILE[kind]
        hostile[_insert_row(conn, column, value, aggregate=f"h-{n}")] = reason
        innocent += seed(conn, 2)
    log = tmp_path / "worker.log"
    await _drain_limited(conn, dsn, log, sink, innocent, len(hostile), "--batch", "100")
    assert {message_id: _fate(conn, message_id) for message_id in hostile} == {
        message_id: ("dead", 0, 0, reason, [reason]) for message_id, reason in hostile.items()
    }
    assert conn.execute(
        "SELECT array_agg(DISTINCT attempts) FROM outbox WHERE id = ANY(%s)", (innocent,)
    ).fetchone()[0] == [1]
    assert "Traceback" not in log.read_text()


@pytest.mark.slow
async def test_a_worker_under_a_memory_limit_sends_50_mb_headers_and_event_types_to_dead(
    conn, dsn, tmp_path, sink
):
    """The issue's case: 8 rows with 50 MB headers and 8 with a 50 MB event type, between
    small ones, under 512 MiB: every claim failed "out of memory for query result" with its
    leases committed, and after a minute every row was dead. Now the large ones are dead at
    the claim, never loaded, and the small ones are delivered, one attempt each."""
    small: list[int] = []
    big: dict[int, str] = {}
    for i in range(8):
        small += seed(conn, 5)
        for kind in ("headers of 50 MB", "event_type of 50 MB"):
            column, value, reason = HOSTILE[kind]
            big[_insert_row(conn, column, value, aggregate=f"big-{i}")] = reason
    small += seed(conn, 5)
    peak = await _drain_limited(conn, dsn, tmp_path / "worker.log", sink, small, len(big),
                                "--batch", "100")  # fmt: skip
    assert peak < 150 * MIB, f"resident peak {peak / MIB:.0f} MiB"  # nothing large came in
    assert {message_id: _fate(conn, message_id) for message_id in big} == {
        message_id: ("dead", 0, 0, reason, [reason]) for message_id, reason in big.items()
    }
    assert conn.execute(
        "SELECT array_agg(DISTINCT attempts) FROM outbox WHERE id = ANY(%s)", (small,)
    ).fetchone()[0] == [1]
