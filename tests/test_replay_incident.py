"""The two incidents of docs/replay.md, from outside: 1,000 messages delivered by a real
worker (ordered) to a real HTTP receiver on another PostgreSQL server that applies them
through `outbox.inbox`; then

1. `outbox replay` of a 10-minute window filtered by type: `--dry-run` changes nothing, the
   replay re-sends exactly the matching messages, recognizably (their own ids, replay 1),
   per aggregate in their original order, recorded in the audit log;
2. the receiver's database "restored" without 37 of them: `outbox reconcile`, reading the
   inbox with a read-only role, reports those 37 and nothing else, and with `--replay` sends
   exactly them again, which the receiver applies.

Also the comparison itself, in chunks of a few ids: extra keys, keys that are no id, and
another consumer's keys kept apart."""

from __future__ import annotations

import json
import re
import shlex
import sys
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from conftest import TEST_SETTINGS
from helpers import interrupted_on_a_locked_row, serve_ordering, wait_until
from psycopg_pool import AsyncConnectionPool
from test_admin_cli import BASE_ENV, outbox
from test_receiver_http import SECRET, aiohttp_server
from workers import dispatching, settings

from outbox import Event, enqueue_many, inbox
from outbox.demo.embedded import EmbeddedPostgres
from outbox.operations import reconcile
from outbox.receiver.aiohttp import inbox_handler
from outbox.receiver.http import Delivery
from outbox.signing_keys import signing_key
from outbox.table import Table
from outbox.worker.publishers.http import HttpPublisher

T0 = datetime(2026, 3, 1, 14, 0, tzinfo=UTC)
TYPES = ("OrderPaid", "OrderShipped", "OrderRefunded", "OrderClosed")
SPACING = timedelta(seconds=6)  # 1,000 messages over 100 minutes


@pytest.fixture(scope="module")
def receiving_server() -> Iterator[EmbeddedPostgres]:
    """The receiver's own PostgreSQL server: the outbox and the inbox are on two servers."""
    with EmbeddedPostgres(settings=TEST_SETTINGS) as server:
        yield server


@pytest.fixture
def receiving(receiving_server: EmbeddedPostgres) -> Iterator[tuple[str, str]]:
    """(the receiver's DSN, a read-only role's DSN) of a fresh database on that server."""
    admin = receiving_server.dsn()
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute("DROP DATABASE IF EXISTS shop WITH (FORCE)")
        conn.execute("CREATE DATABASE shop")
    dsn = receiving_server.dsn("shop")
    with psycopg.connect(dsn, autocommit=True) as conn:
        inbox.migrate(conn)
        conn.execute(
            "CREATE TABLE effects (seq bigserial, message_id bigint, event_type text, "
            "aggregate_id text, replay int)"
        )
        conn.execute("DROP ROLE IF EXISTS reader")
        conn.execute("CREATE ROLE reader LOGIN")
        conn.execute("GRANT SELECT ON outbox_inbox TO reader")
    yield dsn, dsn.replace("postgres@", "reader@")


@pytest.fixture
async def pool(receiving: tuple[str, str]) -> AsyncIterator[AsyncConnectionPool]:
    async with AsyncConnectionPool(receiving[0], min_size=1, max_size=8, open=False) as p:
        yield p


class Shop:
    """The receiver: applies each delivery through the inbox (replays too), counts requests."""

    def __init__(self, pool: AsyncConnectionPool) -> None:
        self.requests = 0
        self.view = inbox_handler(
            self.apply,
            connect=pool.connection,
            consumer="billing",
            secrets=[SECRET],
            replays="apply",
        )

    async def apply(self, conn: psycopg.AsyncConnection[Any], delivery: Delivery) -> None:
        event = delivery.json()
        await conn.execute(
            "INSERT INTO effects (message_id, event_type, aggregate_id, replay) "
            "VALUES (%s, %s, %s, %s)",
            (event["id"], event["event_type"], event["aggregate_id"], delivery.replay),
        )

    async def handle(self, request: Any) -> Any:
        self.requests += 1
        return await self.view(request)


def _effects(dsn: str, where: str = "true") -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn) as conn:
        return conn.execute(
            f"SELECT message_id, event_type, aggregate_id, replay FROM effects WHERE {where} "
            "ORDER BY seq"
        ).fetchall()


def _window(minutes: tuple[int, int]) -> list[str]:
    since, until = (T0 + timedelta(minutes=m) for m in minutes)
    return ["--since", since.isoformat(), "--until", until.isoformat()]


async def test_replay_a_window_then_reconcile_a_restore(conn, dsn, receiving, pool):
    receiver_dsn, reader_dsn = receiving
    serve_ordering(conn)
    with conn.transaction():
        ids = enqueue_many(
            conn,
            [Event("order", f"o-{i % 40}", TYPES[i % 4], {"n": i}) for i in range(1000)],
            trace_context=False,
        )
    shop = Shop(pool)
    done = "SELECT count(*) FROM outbox WHERE status = 'done'"
    async with aiohttp_server(shop.handle) as url:
        publisher = HttpPublisher(url, owner="t", signing_keys=[signing_key(SECRET)])
        async with dispatching(settings(dsn, ordering="aggregate", batch=100), publisher):
            await wait_until(lambda: conn.execute(done).fetchone() == (1000,), timeout=120)
            # As if produced over 100 minutes from T0, ids rising with created_at.
            conn.execute(
                "UPDATE outbox SET created_at = %s + (id - %s) * %s::interval",
                (T0, ids[0], SPACING),
            )
            assert shop.requests == 1000 and len(_effects(receiver_dsn)) == 1000

            # 1. "The consumer had a bug from 14:30 to 14:40: send every OrderPaid again."
            window = _window((30, 40))
            before = conn.execute("SELECT * FROM outbox ORDER BY id").fetchall()
            dry = outbox("replay", "--dsn", dsn, *window, "--event-type", "OrderPaid", "--dry-run")
            assert dry.returncode == 0, dry.stderr
            matching = [i for n, i in enumerate(ids) if 300 <= n < 400 and n % 4 == 0]
            assert dry.stdout.splitlines()[0].startswith(
                f"outbox: would send again 25 messages (ids {matching[0]} to {matching[-1]};"
            )
            assert conn.execute("SELECT * FROM outbox ORDER BY id").fetchall() == before
            sent = outbox(
                "replay", "--dsn", dsn, *window, "--event-type", "OrderPaid", "--yes",
                "--reason", "consumer bug 14:30-14:40", "--batch", "10",
            )  # fmt: skip
            assert sent.returncode == 0, sent.stderr
            assert (
                sent.stdout
                == "outbox: replay 1: sent 25 messages again in 3 batches (OrderPaid 25)\n"
            )
            await wait_until(lambda: conn.execute(done).fetchone() == (1000,), timeout=60)
            await wait_until(lambda: shop.requests == 1025, timeout=30)
            replayed = _effects(receiver_dsn, "replay IS NOT NULL")
            assert sorted(r[0] for r in replayed) == matching  # exactly these, once each
            assert {(r[1], r[3]) for r in replayed} == {("OrderPaid", 1)}
            for aggregate in {r[2] for r in replayed}:
                in_order = [r[0] for r in replayed if r[2] == aggregate]
                assert in_order == sorted(in_order)
            audit = conn.execute(
                "SELECT actor, count, filter FROM outbox_actions WHERE action = 'replay' "
                "ORDER BY id"
            ).fetchall()
            assert [a[1] for a in audit] == [10, 10, 5]
            assert audit[0][2]["reason"] == "consumer bug 14:30-14:40"
            assert audit[0][2]["filter"]["event_types"] == ["OrderPaid"]

            # 2. "Their database was restored from last night's backup": 37 applied messages
            # lost, their effects with them.
            lost = ids[500:520] + ids[700:717]
            with psycopg.connect(receiver_dsn, autocommit=True) as shop_db:
                shop_db.execute(
                    "DELETE FROM outbox_inbox WHERE message_id = ANY(%s)", ([str(i) for i in lost],)
                )
                shop_db.execute("DELETE FROM effects WHERE message_id = ANY(%s)", (lost,))
            requests = shop.requests
            check = [
                "reconcile", "--dsn", dsn, "--inbox-dsn", reader_dsn, "--inbox-table",
                "outbox_inbox", "--consumer", "billing", *_window((0, 100)),
            ]  # fmt: skip
            found = outbox(*check, "--json")
            assert found.returncode == 0, found.stderr
            report = json.loads(found.stdout)
            assert report["delivered"] == 1000
            assert report["missing"]["count"] == 37
            assert report["missing"]["ranges"] == [[ids[500], ids[519]], [ids[700], ids[716]]]
            by_type = {t: sum(1 for i in lost if TYPES[ids.index(i) % 4] == t) for t in TYPES}
            assert report["missing"]["by_type"] == {t: n for t, n in by_type.items() if n}
            assert (report["extra"]["count"], report["not_ids"]) == (0, 0)
            text = outbox(*check)
            assert f"missing ids: {ids[500]}-{ids[519]}, {ids[700]}-{ids[716]}" in text.stdout

            repaired = outbox(*check, "--replay", "--yes")
            assert repaired.returncode == 0, repaired.stderr
            assert "replay 2: sent 37 missing messages again" in repaired.stdout
            await wait_until(lambda: shop.requests == requests + 37, timeout=30)
            await wait_until(lambda: conn.execute(done).fetchone() == (1000,), timeout=60)
    assert sorted(r[0] for r in _effects(receiver_dsn, "replay = 2")) == sorted(lost)
    assert len(_effects(receiver_dsn)) == 1025
    again = json.loads(outbox(*check, "--json").stdout)
    assert again["missing"]["count"] == 0
    # The read-only role could not have written: the inbox session refuses any write.
    with (
        reconcile.connect_inbox(reader_dsn) as reader,
        pytest.raises(psycopg.errors.ReadOnlySqlTransaction),
    ):
        reader.execute("CREATE TEMP TABLE t (x int)")


def test_the_comparison_goes_in_small_chunks_and_tells_keys_apart(conn, dsn, receiving):
    receiver_dsn, reader_dsn = receiving
    with conn.transaction():
        ids = enqueue_many(
            conn, [Event("order", "o", TYPES[i % 2], {}) for i in range(60)], trace_context=False
        )
    conn.execute(
        "UPDATE outbox SET status = 'done', created_at = %s + (id - %s) * interval '1 minute'",
        (T0, ids[0]),
    )
    conn.execute("UPDATE outbox SET status = 'pending' WHERE id = %s", (ids[30],))
    with psycopg.connect(receiver_dsn, autocommit=True) as shop_db:
        keys = [str(i) for n, i in enumerate(ids) if n not in (3, 4, 5, 40)]
        keys += [str(ids[-1] + 1000), "order-17", "0042"]  # no row; no id; not an id's text
        shop_db.cursor().executemany(
            "INSERT INTO outbox_inbox (consumer, message_id) VALUES ('billing', %s)",
            [(k,) for k in keys],
        )
        shop_db.execute(
            "INSERT INTO outbox_inbox (consumer, message_id) VALUES ('audit', %s)", (str(ids[3]),)
        )
    table, inbox_table = Table.parse("outbox"), Table.parse("outbox_inbox")
    with reconcile.connect_inbox(reader_dsn) as reader:
        with pytest.raises(reconcile.AmbiguousConsumer, match="several consumers"):
            reconcile.compare(conn, table, reader, inbox_table, consumer=None,
                              since=T0, until=T0 + timedelta(hours=2), chunk=7)  # fmt: skip
        found = reconcile.compare(
            conn, table, reader, inbox_table, consumer="billing", since=T0,
            until=T0 + timedelta(hours=2), chunk=7,
        )  # fmt: skip
    assert found.delivered == 59  # one is pending again
    assert (found.missing, found.missing_ranges.kept) == (4, [(ids[3], ids[5]), (ids[40], ids[40])])
    assert found.missing_by_type == {"OrderShipped": 2, "OrderPaid": 2}
    # Extra: recorded, but pending in the outbox (ids[30]); the key past the ids is out of
    # the window's id range, so it is not looked at.
    assert (found.extra, found.extra_ranges.kept) == (1, [(ids[30], ids[30])])
    assert found.foreign == 2  # "order-17" and "0042"


def test_a_reconcile_replay_stopped_past_its_first_chunk_resumes_to_its_windows_end(conn, dsn):
    """More missing than one chunk of the comparison (`reconcile.CHUNK` ids), the replay
    stopped by Ctrl-C in its second chunk: the line it prints says what is left, and the
    command it shows sends all of it (not only the rest of the chunk under way), each missing
    message once. `outbox replay --resume`, which cannot find what is missing, refuses it."""
    inbox.migrate(conn)
    with conn.transaction():
        ids = enqueue_many(
            conn,
            [
                Event("order", f"o-{i % 40}", TYPES[i % 4], {})
                for i in range(reconcile.CHUNK * 2 + 500)
            ],
            trace_context=False,
        )
    conn.execute("UPDATE outbox SET status = 'done', done_at = now()")
    recorded = ids[::100]  # the rest the inbox never recorded
    conn.cursor().executemany(
        "INSERT INTO outbox_inbox (consumer, message_id) VALUES ('billing', %s)",
        [(str(i),) for i in recorded],
    )
    missing = sorted(set(ids) - set(recorded))
    check = [
        sys.executable, "-m", "outbox", "reconcile", "--dsn", dsn, "--inbox-dsn", dsn,
        "--inbox-table", "outbox_inbox", "--since", "1h", "--until", "0s", "--replay", "--yes",
    ]  # fmt: skip
    # A missing message of the second chunk: its batch waits, and is stopped there.
    code, stderr = interrupted_on_a_locked_row(conn, dsn, missing[12_345], check, env=BASE_ENV)
    assert code == 130, stderr
    stopped = re.fullmatch(
        r"outbox: replay 1: stopped after (\d+) missing messages \(12 batches\), (\d+) of the "
        r"(\d+) confirmed left; go on with `(outbox reconcile [^`]+)` and the same --inbox-dsn\n",
        stderr,
    )
    assert stopped, stderr
    sent, left, confirmed = (int(n) for n in stopped.groups()[:3])
    # The first chunk's 9,900 missing (10 batches), then two batches of the second chunk.
    assert (sent, left, confirmed) == (11_900, len(missing) - 11_900, len(missing))

    refused = outbox("replay", "--dsn", dsn, "--resume", "1", "--yes")
    assert refused.returncode == 2
    assert "replay 1 is a `reconcile --replay`: go on with `outbox reconcile" in refused.stderr

    shown = shlex.split(stopped.group(4))
    other = outbox(*shown[1:], "--dsn", dsn, "--inbox-dsn", dsn, "--yes", "--consumer", "audit")
    assert other.returncode == 2
    assert "replay 1 compared consumer billing; drop --consumer" in other.stderr
    resumed = outbox(*shown[1:], "--dsn", dsn, "--inbox-dsn", dsn, "--yes")
    assert resumed.returncode == 0, resumed.stderr
    assert resumed.stdout.endswith(f"outbox: replay 1: sent {left} missing messages again\n")
    batches = conn.execute(
        "SELECT message_ids FROM outbox_actions WHERE action = 'replay' ORDER BY id"
    ).fetchall()
    assert sorted(i for (sent_ids,) in batches for i in sent_ids) == missing  # each once
    assert conn.execute("SELECT count(*) FROM outbox WHERE replay = 1").fetchone() == (
        len(missing),
    )
