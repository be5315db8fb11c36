"""`outbox migrate --partition-size` on a plain table: converted online, the old table the
first partition (attached without a scan), resumable after a stop at any step, refused when
it holds what the partitioned table could not carry; workers and the operator follow it."""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from helpers import (
    explain_prepared,
    interrupt_once_waiting,
    interruptible,
    seed,
    statuses,
    wait_until,
    wait_until_db,
)
from helpers import outbox_on as outbox
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from test_worker import Scripted
from workers import dispatching, settings

from outbox import claim_window, enqueue, lease
from outbox.claim_window import ClaimWindow
from outbox.controller.database import Pools, Target
from outbox.models import Outcome
from outbox.operations.conversion import _bound_statements, convert, migrate_converting
from outbox.partitions import Layout, check, read_partitions
from outbox.queries import queries
from outbox.runner import fetch
from outbox.schema import _COLUMNS_AFTER_ID, SchemaError, check_table, migrate
from outbox.table import Table

TABLE = Table.parse("outbox")
SIZE = 100
QUICK = {"lock_timeout": timedelta(milliseconds=50), "pause": timedelta(milliseconds=10)}


def _leaves(conn: Any) -> list[tuple[str, int, int]]:
    return [(p.name, p.low, p.high) for p in fetch(conn, read_partitions(TABLE)) or []]


def _shape(conn: Any) -> dict[str, Any]:
    """What the schema makes of the parent, as the catalog holds it."""

    def rows(query: str) -> list[tuple[Any, ...]]:
        return sorted(conn.execute(query).fetchall())

    return {
        "kind": rows("SELECT relkind, obj_description(oid, 'pg_class') FROM pg_class "
                     "WHERE oid = 'outbox'::regclass"),
        "partitioning": rows("SELECT partstrat, partattrs::text, partdefid FROM "
                             "pg_partitioned_table WHERE partrelid = 'outbox'::regclass"),
        "columns": rows("SELECT attname, format_type(atttypid, atttypmod), attnotnull, "
                        "attidentity, pg_get_expr(d.adbin, d.adrelid) FROM pg_attribute a "
                        "LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum "
                        "WHERE attrelid = 'outbox'::regclass AND attnum > 0 AND NOT attisdropped"),
        "sequence": rows("SELECT pg_get_serial_sequence('outbox', 'id')"),
        "indexes": rows("SELECT c.relname, pg_get_indexdef(c.oid) FROM pg_index i JOIN "
                        "pg_class c ON c.oid = i.indexrelid WHERE i.indrelid = 'outbox'::regclass"),
        "constraints": rows("SELECT conname, pg_get_constraintdef(oid) FROM pg_constraint "
                            "WHERE conrelid = 'outbox'::regclass"),
        "triggers": rows("SELECT tgname, pg_get_triggerdef(oid) FROM pg_trigger "
                         "WHERE tgrelid = 'outbox'::regclass"),
        "layout": rows("SELECT * FROM outbox_layout"),
        "siblings": rows("SELECT relname, relkind FROM pg_class WHERE relname IN "
                         "('outbox_layout', 'outbox_replays', 'outbox_actions', "
                         "'outbox_destinations', 'outbox_id_seq')"),
    }  # fmt: skip


async def _checked(dsn: str) -> Layout | None:
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as aconn:
        return await check_table(aconn, TABLE, ordered=True)


async def test_a_converted_table_is_what_a_fresh_partitioned_one_is(dsn, empty_dsn):
    """Parent, indexes (by name), constraints, triggers, sequence, layout and siblings the
    same as `outbox migrate --partition-size` makes on a fresh database; the check passes
    alike (every partition carries every index); the rows are where they were."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        migrate(conn, TABLE, "aggregate")
        ids = seed(conn, 250, aggregates=5)
        conn.execute("UPDATE outbox SET status = 'done', done_at = now() WHERE id <= 100")
        converted = outbox(dsn, "migrate", "--partition-size", str(SIZE), "--partitions-ahead",
                           "3")  # fmt: skip
        assert converted.returncode == 0, converted.stderr
        assert "attached without a scan for ids 0 to 599" in converted.stdout, converted.stdout
        assert "6 indexes attached, not rebuilt" in converted.stdout
        assert "NOTIFY trigger moved" in converted.stdout
        assert "new ids from 600" in converted.stdout
        ours = _shape(conn)
        assert _leaves(conn) == [("outbox_p0", 0, 600), ("outbox_p6", 600, 700),
                                 ("outbox_p7", 700, 800), ("outbox_p8", 800, 900)]  # fmt: skip
        assert conn.execute("SELECT array_agg(id ORDER BY id) FROM outbox_p0").fetchone() == (ids,)
        assert statuses(conn) == {"done": 100, "pending": 150}
        # The next id is the next partition's first; the partitions ahead follow it.
        assert (
            enqueue(conn, aggregate_type="a", aggregate_id="1", event_type="E", payload={}) == 600
        )
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        migrate(conn, TABLE, "aggregate", layout=Layout(SIZE, 3))
        fresh = _shape(conn)
    for part in ours:
        assert ours[part] == fresh[part], part
    converted_layout, fresh_layout = await _checked(dsn), await _checked(empty_dsn)
    assert converted_layout == fresh_layout == Layout(SIZE, 3)
    assert converted_layout is not None and converted_layout.named_leaves
    assert converted_layout.converted_below == 600
    # Running it again finds the table partitioned: nothing more to convert.
    again = outbox(dsn, "migrate", "--partition-size", str(SIZE), "--partitions-ahead", "3")
    assert again.returncode == 0 and "converted" not in again.stdout, again.stdout


def test_grants_carry_to_the_partitioned_table(dsn):
    """A producer role that could insert still can (the id now comes from a sequence, which
    it may use); a reader may read the layout the workers' check reads."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE ROLE outbox_producer LOGIN PASSWORD 'p'")
        conn.execute("GRANT SELECT, INSERT ON outbox TO outbox_producer")
        seed(conn, 10)
        done = convert(conn, TABLE, Layout(SIZE, 2))
        assert done is not None and done.grants == 2
        producer = make_conninfo(dsn, user="outbox_producer", password="p")
        with psycopg.connect(producer, autocommit=True) as p:
            assert (
                enqueue(p, aggregate_type="a", aggregate_id="1", event_type="E", payload={}) == 300
            )
            assert p.execute("SELECT partition_size FROM outbox_layout").fetchone() == (SIZE,)
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                p.execute("UPDATE outbox SET attempts = 0")  # what it had not, it has not


@pytest.mark.parametrize("stopped_after", ["bound", "validate", "swap"])
def test_run_again_after_a_stop_it_goes_on(dsn, stopped_after):
    """The state each step leaves when the command stops after it (a crash, a cancel):
    running it again finishes the conversion."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        seed(conn, 150)
        if stopped_after in ("bound", "validate"):
            conn.execute(
                "ALTER TABLE outbox ADD CONSTRAINT outbox_p0_range CHECK (id >= 0 AND id < 500) "
                "NOT VALID"
            )
        if stopped_after == "validate":
            conn.execute("ALTER TABLE outbox VALIDATE CONSTRAINT outbox_p0_range")
        if stopped_after == "swap":  # converted, the partitions ahead not made yet
            done = convert(conn, TABLE, Layout(SIZE, 3))
            assert done is not None
            assert _leaves(conn) == [("outbox_p0", 0, 500), ("outbox_p5", 500, 600)]
        seed(conn, 10)  # producers went on
        _, _, done = migrate_converting(conn, TABLE, None, Layout(SIZE, 3))
        assert (done is None) == (stopped_after == "swap")
        if done is not None:
            assert done.steps == (["validate", "swap"] if stopped_after == "bound" else ["swap"])
            assert not done.scanned
        assert _leaves(conn)[0] == ("outbox_p0", 0, 500)
        # Three partitions past the one holding the highest id: after the swap, ids from 500.
        top = 800 if stopped_after == "swap" else 700
        assert _leaves(conn)[-1] == (f"outbox_p{top // SIZE}", top, top + SIZE)
        assert statuses(conn) == {"pending": 160}


def test_a_bound_the_ids_came_near_is_replaced(dsn):
    """A constraint left by a stopped run, its bound close to the ids now given: producers
    would soon fail on it, so it is replaced by one with the layout's room again."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        seed(conn, 150)
        conn.execute(
            "ALTER TABLE outbox ADD CONSTRAINT outbox_p0_range CHECK (id >= 0 AND id < 200) "
            "NOT VALID"
        )
        done = convert(conn, TABLE, Layout(SIZE, 3))
        assert done is not None and done.steps == ["bound", "validate", "swap"]
        assert _leaves(conn)[0] == ("outbox_p0", 0, 500)


def _bound_left(conn: Any) -> bool:
    found = conn.execute("SELECT count(*) FROM pg_constraint WHERE conname = 'outbox_p0_range'")
    return bool(found.fetchone()[0])


def test_a_swap_that_fails_half_way_leaves_the_plain_table_whole(dsn):
    """The swap is one transaction: one of its statements failing (a table in the way of the
    rename) changes nothing, and the constraint added is dropped again; the plain table
    serves on, and the next run completes it."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        seed(conn, 20)
        conn.execute("CREATE TABLE outbox_p0 (x int)")
        with pytest.raises(psycopg.errors.DuplicateTable):
            convert(conn, TABLE, Layout(SIZE, 2))
        assert conn.execute("SELECT relkind FROM pg_class WHERE relname = 'outbox'").fetchone() \
            == ("r",)  # fmt: skip
        assert not _bound_left(conn)
        assert enqueue(conn, aggregate_type="a", aggregate_id="1", event_type="E", payload={}) == 21
        conn.execute("DROP TABLE outbox_p0")
        done = convert(conn, TABLE, Layout(SIZE, 2))
        assert done is not None and done.steps == ["bound", "validate", "swap"]
        assert statuses(conn) == {"pending": 21}


def test_a_long_transaction_holds_the_swap_off_and_the_error_says_what_is_left(dsn):
    """The swap asks for its lock with a short lock_timeout and retries; a transaction that
    holds the table throughout makes it give up, with the table plain and whole. Its
    constraint could not be dropped either (the same lock): the error says it is left, and
    how to drop it. The rows that transaction inserted are in the first partition once the
    command is run again."""
    with psycopg.connect(dsn, autocommit=True) as conn, psycopg.connect(dsn) as long:
        seed(conn, 20)

        def hold() -> None:  # the constraint added and valid, a transaction takes the table
            enqueue(long, aggregate_type="a", aggregate_id="1", event_type="E", payload={})

        with pytest.raises(SchemaError) as gave_up:
            convert(conn, TABLE, Layout(SIZE, 2), attempts=3, before_swap=hold, **QUICK)
        said = str(gave_up.value)
        assert re.search(r"could not take its exclusive lock .* 3 attempts", said), said
        assert "the CHECK outbox_p0_range is left on it" in said, said
        assert "inserts will fail on it once the ids reach 300" in said, said
        assert 'drop it (ALTER TABLE "outbox" DROP CONSTRAINT "outbox_p0_range")' in said, said
        assert "nothing of this step was changed" not in said
        assert _bound_left(conn)
        long.commit()
        assert conn.execute("SELECT relkind FROM pg_class WHERE relname = 'outbox'").fetchone() \
            == ("r",)  # fmt: skip
        done = convert(conn, TABLE, Layout(SIZE, 2), attempts=3, **QUICK)
        assert done is not None and done.swap_attempts == 1
        assert conn.execute("SELECT count(*) FROM outbox_p0").fetchone() == (21,)


def _lock_waits(conn: Any, pid: int, seen: set[Any]) -> int:
    """The lock waits of `pid` seen so far: each LOCK statement it waits in, told apart by
    its start (each attempt is a statement of its own)."""
    row = conn.execute(
        "SELECT query_start FROM pg_stat_activity WHERE datname = current_database()"
        " AND pid = %s AND wait_event_type = 'Lock'",
        (pid,),
    ).fetchone()
    if row is not None:
        seen.add(row[0])
    return len(seen)


def test_giving_up_before_the_swap_drops_the_constraint_so_inserts_go_on_past_its_bound(dsn):
    """Left on the plain table, the constraint would fail every insert once the sequence
    reached its bound: the command that gives up drops it. A transaction holds the swap off
    through its attempts and ends as the command asks for the lock to drop the constraint."""
    with (
        psycopg.connect(dsn, autocommit=True) as conn,
        psycopg.connect(dsn, autocommit=True) as watcher,
        psycopg.connect(dsn) as long,
        ThreadPoolExecutor(1) as pool,
    ):
        seed(conn, 20)

        def hold() -> None:  # the constraint added and valid, a transaction takes the table
            enqueue(long, aggregate_type="a", aggregate_id="1", event_type="E", payload={})

        waits = {"lock_timeout": timedelta(seconds=1), "pause": timedelta(milliseconds=10)}
        converting = pool.submit(
            convert, conn, TABLE, Layout(SIZE, 2), attempts=2, before_swap=hold, **waits
        )
        seen: set[Any] = set()
        pid = conn.info.backend_pid
        while _lock_waits(watcher, pid, seen) < 3 and not converting.done():
            time.sleep(0.02)  # the swap's two attempts, then the drop's first
        long.commit()
        with pytest.raises(SchemaError) as gave_up:
            converting.result(timeout=60)
        said = str(gave_up.value)
        assert "could not take its exclusive lock" in said, said
        assert "the CHECK outbox_p0_range was dropped again" in said, said
        assert not _bound_left(conn)
        assert conn.execute("SELECT relkind FROM pg_class WHERE relname = 'outbox'").fetchone() \
            == ("r",)  # fmt: skip
        # The ids reach the bound the constraint had (ids below 300): inserts go on.
        conn.execute("SELECT setval(pg_get_serial_sequence('outbox', 'id'), 400)")
        assert enqueue(conn, aggregate_type="a", aggregate_id="1", event_type="E", payload={}) \
            == 401  # fmt: skip


def test_a_table_holding_negative_ids_is_refused_in_one_line_naming_the_lowest(dsn):
    """Partition k holds k x size on: a row below 0 fits none, and the conversion failed on
    its first partition's CHECK in PostgreSQL's words (`CheckViolation: check constraint
    "outbox_p0_range" ... is violated by some row`). Refused before anything changes,
    naming the lowest id and what to do; id 0 is partition 0's first."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        seed(conn, 1)
        conn.execute(
            "INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, payload)"
            " OVERRIDING SYSTEM VALUE VALUES (-7, 'a', '1', 'E', '{}'), (0, 'a', '1', 'E', '{}')"
        )
        result = outbox(dsn, "migrate", "--partition-size", str(SIZE))
        assert result.returncode == 1
        assert result.stderr.splitlines() == [
            "outbox: error: table outbox cannot be converted to partitions: its lowest id is "
            "-7, and the partitions hold ids from 0 up; give those rows ids of 0 or more (or "
            "delete them) and run this again; nothing was changed"
        ]
        untouched = conn.execute(
            "SELECT relkind, (SELECT count(*) FROM pg_constraint WHERE conname = "
            "'outbox_p0_range') FROM pg_class WHERE relname = 'outbox'"
        ).fetchone()
        assert untouched == ("r", 0)
        conn.execute("DELETE FROM outbox WHERE id = -7")
        again = outbox(dsn, "migrate", "--partition-size", str(SIZE))
        assert again.returncode == 0, again.stderr
        assert conn.execute("SELECT count(*) FROM outbox_p0 WHERE id IN (0, 1)").fetchone() == (2,)


@pytest.mark.parametrize(
    "addition, named",
    [
        ("CREATE TRIGGER audit AFTER UPDATE ON outbox FOR EACH ROW EXECUTE FUNCTION "
         "outbox_notify('x')", "trigger audit"),
        ("CREATE UNIQUE INDEX outbox_once ON outbox (aggregate_id, event_type)",
         "unique index outbox_once without id"),
        ("CREATE TABLE receipts (message bigint REFERENCES outbox (id))", "foreign key"),
        ("CREATE PUBLICATION outbox_out FOR TABLE outbox", "publication outbox_out"),
        ("ALTER TABLE outbox ENABLE ROW LEVEL SECURITY", "row-level security"),
        ("ALTER TABLE outbox FORCE ROW LEVEL SECURITY", "row-level security"),
        ("CREATE POLICY own ON outbox USING (aggregate_id = current_user)", "policy own"),
        ("GRANT SELECT (id, status) ON outbox TO PUBLIC", "column grants on id, status"),
    ],
    ids=["trigger", "unique", "foreign-key", "publication", "rls", "forced-rls", "policy",
         "column-grant"],
)  # fmt: skip
def test_what_the_partitioned_table_could_not_carry_is_refused_first(dsn, addition, named):
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(addition)
        result = outbox(dsn, "migrate", "--partition-size", str(SIZE))
        assert result.returncode == 1
        assert "cannot be converted to partitions" in result.stderr and named in result.stderr
        assert result.stderr.count("\n") == 1, result.stderr
        untouched = conn.execute(
            "SELECT relkind, (SELECT count(*) FROM pg_constraint WHERE conname = "
            "'outbox_p0_range') FROM pg_class WHERE relname = 'outbox'"
        ).fetchone()
        assert untouched == ("r", 0)


async def test_a_running_worker_learns_the_layout_and_claims_partition_by_partition(dsn):
    """A replica on the plain table hears the conversion's NOTIFY: its next claim reads the
    layout, and from then on its claims have a window of partitions. What it held across the
    swap is finalized through the partitioned table."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        seed(conn, 120)
        release = asyncio.Event()

        async def publish(message: Any) -> None:
            if message.id <= 10:
                await release.wait()  # held across the swap

        s = settings(dsn, batch=20)
        async with dispatching(s, Scripted(publish)) as replica:
            await wait_until(lambda: statuses(conn).get("done") == 110, what="the rest done")
            assert replica.window.layout is None
            readings: list[int] = []  # the claim window's readings: partition-aware claims
            read = replica.window.read

            async def counted(aconn: Any, table: Table, batch: int) -> None:
                readings.append(batch)
                await read(aconn, table, batch)

            replica.window.read = counted  # type: ignore[method-assign]
            await asyncio.to_thread(convert, conn, TABLE, Layout(SIZE, 3))
            await wait_until(lambda: replica.window.layout is not None, what="layout learnt")
            assert replica.window.layout == Layout(SIZE, 3)
            release.set()
            ids = seed(conn, 30)
            assert ids[0] == 500  # the first id past the converted table
            await wait_until(lambda: statuses(conn) == {"done": 150}, what="all done")
            assert readings  # its claims read a window of partitions
        attempts = conn.execute("SELECT max(attempts) FROM outbox").fetchone()
        assert attempts == (1,)  # nothing was taken twice


async def test_the_operators_kept_check_follows_the_table_to_its_new_oid(dsn):
    """The operator keeps a table's check and identity between passes; after the conversion
    the name reaches another table (the old one is its first partition): the next pass
    notices, checks it again and reports its new identity."""
    pools = Pools()
    target = Target(dsn, "1")
    try:
        before = await pools.read(("ns", "d"), target, TABLE, ordered=False)
        again = await pools.read(("ns", "d"), target, TABLE, ordered=False)
        assert again.identity == before.identity
        with psycopg.connect(dsn, autocommit=True) as conn:
            seed(conn, 5)
            convert(conn, TABLE, Layout(SIZE, 2))
            oid = conn.execute("SELECT 'outbox'::regclass::oid::text").fetchone()
        after = await pools.read(("ns", "d"), target, TABLE, ordered=False)
        assert after.identity != before.identity and (after.identity.oid,) == oid
        assert after.stats.pending == 5
    finally:
        await pools.close()
    params = conninfo_to_dict(dsn)
    assert after.identity.text == f"table public.outbox of database {params['dbname']}"


def test_a_table_whose_id_has_a_sequence_default_keeps_its_sequence(empty_dsn):
    """A hand-made table adopted by `outbox migrate`, its id a bigserial: no identity to
    drop; its sequence becomes the parent's, past the first partition's bound."""
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        conn.execute(
            "CREATE TABLE outbox (id bigserial PRIMARY KEY, "
            + _COLUMNS_AFTER_ID.as_string(conn)
            + ")"
        )
        migrate(conn, TABLE)
        seed(conn, 30)
        done = convert(conn, TABLE, Layout(SIZE, 2))
        assert done is not None and done.next_id == 300
        assert conn.execute("SELECT pg_get_serial_sequence('outbox', 'id')").fetchone() == (
            "public.outbox_id_seq",
        )
        assert seed(conn, 1) == [300]


def test_two_runs_at_once_convert_the_table_once(dsn):
    """Every replica may run `outbox migrate` at start: the runs take turns, and the later
    one finds the table partitioned."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        seed(conn, 40)

    def run() -> Any:
        with psycopg.connect(dsn, autocommit=True) as conn:
            return convert(conn, TABLE, Layout(SIZE, 2))

    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(lambda _: run(), range(2)))
    assert sorted(r is None for r in results) == [False, True]
    with psycopg.connect(dsn, autocommit=True) as conn:
        assert _leaves(conn)[0] == ("outbox_p0", 0, 300)
        assert statuses(conn) == {"pending": 40}


async def test_a_worker_that_missed_the_notify_looks_again_on_its_own(dsn, monkeypatch):
    """Without the NOTIFY (its listener away), a plain table's window looks again whether the
    table was converted every LAYOUT_TTL; told by a forget, at its next claim."""
    window = ClaimWindow(None)
    assert not window.layout_due()
    window.forget()  # what the listener does on a NOTIFY `layout` or on reconnecting
    assert window.layout_due()
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as aconn:
        assert await window.learn_layout(aconn, TABLE) is None  # still plain
        assert not window.layout_due()
        with psycopg.connect(dsn, autocommit=True) as conn:
            seed(conn, 5)
            convert(conn, TABLE, Layout(SIZE, 2))
        assert not window.layout_due()  # not told, and looked a moment ago
        monkeypatch.setattr(claim_window, "LAYOUT_TTL", 0.0)
        assert window.layout_due()
        assert await window.learn_layout(aconn, TABLE) == Layout(SIZE, 2)
    assert window.layout == Layout(SIZE, 2) and not window.layout_due()


def test_the_converted_partition_is_retired_whole_once_its_rows_are_done(dsn):
    with psycopg.connect(dsn, autocommit=True) as conn:
        seed(conn, 150)
        convert(conn, TABLE, Layout(SIZE, 2))
        seed(conn, 5)  # ids 400-404: the newest, in the next partition
        conn.execute("UPDATE outbox SET status = 'done', done_at = now() WHERE id < 400")
    result = outbox(dsn, "maintain", "--retention", "0s")
    assert result.returncode == 0, result.stderr
    with psycopg.connect(dsn, autocommit=True) as conn:
        assert _leaves(conn)[0][0] == "outbox_p4"  # the converted table is gone
        assert statuses(conn) == {"pending": 5}


@pytest.mark.parametrize("ordered", [False, True], ids=["unordered", "ordered"])
async def test_partitions_retired_just_above_a_pinned_converted_one_are_stepped_over(dsn, ordered):
    """The converted table pinned by a dead row while `outbox maintain` retires the partitions
    right above it: the check counted gaps only from the lowest partition above the converted
    one, so the missing ones between were named by every claim's reading (`relation
    "public.outbox_p12" does not exist`), checked again and named again, for good: nothing was
    delivered any more, by a worker that lived through the retirement (its window forgotten,
    as after a reconnection or at its next reading from the lowest partition) or a new one."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        if ordered:
            migrate(conn, TABLE, "aggregate")
        enqueue(conn, aggregate_type="order", aggregate_id="poison", event_type="Poison",
                payload={})  # fmt: skip
        seed(conn, 299)
        conn.execute("UPDATE outbox SET status = 'done', done_at = now() WHERE id > 1")
        conn.execute("UPDATE outbox SET status = 'dead' WHERE id = 1")
    converted = outbox(dsn, "migrate", "--partition-size", str(SIZE), "--partitions-ahead", "8")
    assert converted.returncode == 0, converted.stderr
    assert "new ids from 1200" in converted.stdout, converted.stdout

    def fresh(conn: Any, count: int) -> list[int]:
        return seed(conn, count, aggregates=50)  # ordered: a claim takes one of each

    async def drain(
        aconn: psycopg.AsyncConnection[tuple[object, ...]], window: ClaimWindow, count: int
    ) -> list[int]:
        taken: list[int] = []
        for _ in range(40):
            got = await lease.claim(
                aconn, TABLE, owner="w", batch=50, lease=timedelta(minutes=1),
                max_attempts=5, window=window, ordered=ordered,
            )  # fmt: skip
            taken += [m.id for m in got]
            await lease.finalize(aconn, TABLE, [Outcome.done(m) for m in got], layout=window.layout)
            if len(taken) >= count:
                break
        return sorted(taken)

    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as aconn:
        layout = await check(aconn, TABLE)
        assert layout is not None and layout.converted_below == 1200 and not layout.gaps
        living = ClaimWindow(layout)
        with psycopg.connect(dsn, autocommit=True) as conn:
            expected = fresh(conn, 500)  # ids 1200 to 1699: p12 to p16
        assert await drain(aconn, living, len(expected)) == expected
        retired = outbox(dsn, "maintain", "--retention", "0s")
        assert retired.returncode == 0, retired.stderr
        with psycopg.connect(dsn, autocommit=True) as conn:
            assert [name for name, _, _ in _leaves(conn)[:3]] == [
                "outbox_p0", "outbox_p16", "outbox_p17"
            ]  # fmt: skip
            expected = fresh(conn, 20)  # ids 1700 to 1719, in p17
        new = ClaimWindow(await check(aconn, TABLE))  # a new worker's
        assert await drain(aconn, new, len(expected)) == expected
        with psycopg.connect(dsn, autocommit=True) as conn:
            expected = fresh(conn, 20)
        living.forget()
        assert await drain(aconn, living, len(expected)) == expected
        for window in (new, living):  # the check noted the gaps
            assert window.layout is not None and window.layout.gaps == {12, 13, 14, 15}
    with psycopg.connect(dsn, autocommit=True) as conn:
        assert conn.execute("SELECT status FROM outbox WHERE id = 1").fetchone() == ("dead",)


def test_new_ids_start_past_every_id_drawn_even_past_the_bound(dsn):
    """Ids drawn from the identity and not (yet) inserted count: a session that drew past the
    first partition's bound before the swap (it could not insert them) never meets its ids
    again."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        seed(conn, 10)

        def drawn() -> None:
            conn.execute("SELECT setval(pg_get_serial_sequence('outbox', 'id'), 450)")

        done = convert(conn, TABLE, Layout(SIZE, 2), before_swap=drawn)
        assert done is not None and (done.first_high, done.next_id) == (300, 451)
        assert _leaves(conn) == [("outbox_p0", 0, 300), ("outbox_p3", 300, 400),
                                 ("outbox_p4", 400, 500)]  # fmt: skip
        assert seed(conn, 1) == [451]


@pytest.mark.parametrize("generic", [False, True], ids=["custom", "generic"])
async def test_claims_in_the_converted_partition_plan_it_alone(dsn, generic):
    """A window inside the converted table goes through the parent with its range, which
    prunes to the converted table alone; a window past it names its partition itself."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        migrate(conn, TABLE, "aggregate")
        seed(conn, 250)
        convert(conn, TABLE, Layout(SIZE, 3))
        migrate(conn, TABLE, layout=Layout(SIZE, 3))
        layout = await _checked(dsn)
        assert layout is not None and layout.named_leaves
        assert layout.leaf_of(TABLE, (100, 200)) is None  # no outbox_p1: inside outbox_p0
        assert layout.leaf_of(TABLE, (600, 700)) == Table("public", "outbox_p6")
        args = {
            "max_attempts": "12", "batch": "50", "owner": "w", "lease": "60 seconds",
            "max_payload_bytes": "2097152", "claim_bytes": "16777216",
        }  # fmt: skip
        plan = explain_prepared(conn, queries(TABLE, (100, 200)).claim, args, generic=generic)
        assert set(re.findall(r"outbox_p\d+", plan)) == {"outbox_p0"}, plan


async def test_a_schema_qualified_name_with_placeholder_characters_converts(dsn):
    """Every name the conversion makes is derived from the table's and quoted: a schema,
    a dot and a `%` in the name change nothing."""
    odd = Table.parse('app."my%out.box"')
    with psycopg.connect(dsn, autocommit=True) as conn:
        migrate(conn, odd, "aggregate")
        for _ in range(3):
            enqueue(conn, aggregate_type="a", aggregate_id="1", event_type="E", payload={},
                    table=odd)  # fmt: skip
        _, _, done = migrate_converting(conn, odd, None, Layout(SIZE, 2))
        assert done is not None and not done.scanned and len(done.indexes) == 6
        assert enqueue(conn, aggregate_type="a", aggregate_id="1", event_type="E", payload={},
                       table=odd) == 300  # fmt: skip
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as aconn:
        layout = await check_table(aconn, odd, ordered=True)
    assert layout == Layout(SIZE, 2) and layout.named_leaves and layout.converted_below == 300


def test_a_renamed_tables_identity_gives_way_to_its_own_sequence(empty_dsn):
    """A table made under another name keeps that name's identity sequence; converted, its
    id comes from `<table>_id_seq` as on a fresh partitioned table."""
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        migrate(conn, Table.parse("events"))
        conn.execute("ALTER TABLE events RENAME TO outbox")
        conn.execute("DROP TRIGGER events_notify ON outbox")  # its old name's channel
        conn.execute("COMMENT ON TABLE outbox IS NULL")  # adopted again under its new name
        migrate(conn, TABLE)
        seed(conn, 3)
        convert(conn, TABLE, Layout(SIZE, 2))
        assert conn.execute("SELECT pg_get_serial_sequence('outbox', 'id')").fetchone() == (
            "public.outbox_id_seq",
        )
        assert seed(conn, 1) == [300]


def test_stopped_by_hand_during_the_validate_it_drops_the_constraint(dsn):
    """Ctrl-C while the VALIDATE waits (or scans a big table): the statement is cancelled
    and the constraint dropped, so no insert ever meets it. The VALIDATE waits here on a
    transaction holding the table's SHARE UPDATE EXCLUSIVE lock, which ends once the command
    asks for the lock that drops the constraint."""
    with (
        psycopg.connect(dsn, autocommit=True) as conn,
        psycopg.connect(dsn) as holder,
    ):
        seed(conn, 20)
        conn.execute(  # a stopped run's bound: this run goes straight to the VALIDATE
            "ALTER TABLE outbox ADD CONSTRAINT outbox_p0_range CHECK (id >= 0 AND id < 5000) "
            "NOT VALID"
        )
        holder.execute("LOCK TABLE outbox IN SHARE UPDATE EXCLUSIVE MODE")
        command = subprocess.Popen(
            [sys.executable, "-m", "outbox", "migrate", "--partition-size", str(SIZE),
             "--dsn", dsn],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=interruptible,
        )  # fmt: skip
        try:
            interrupt_once_waiting(conn, command, "ALTER TABLE % VALIDATE CONSTRAINT %")
            wait_until_db(
                conn,
                "EXISTS (SELECT FROM pg_stat_activity WHERE datname = current_database()"
                " AND wait_event_type = 'Lock' "
                "AND query LIKE 'LOCK TABLE % IN ACCESS EXCLUSIVE MODE')",
            )
            holder.commit()
            _, stderr = command.communicate(timeout=60)
        finally:
            command.kill()
        assert command.returncode != 0, stderr
        assert not _bound_left(conn), stderr
        assert conn.execute("SELECT relkind FROM pg_class WHERE relname = 'outbox'").fetchone() \
            == ("r",)  # fmt: skip


def test_a_conversion_stopped_midway_is_named_by_migrate_and_maintain(empty_dsn: str) -> None:
    """A conversion killed after its first step (while it validated, say) leaves its CHECK on
    the plain table, which fails every insert once the ids reach its bound: `outbox migrate`
    without --partition-size and `outbox maintain` said nothing of it."""
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        migrate(conn, TABLE)
        seed(conn, 50)
        for statement in _bound_statements(TABLE, None, 1000):
            conn.execute(statement)  # what the conversion's first step leaves
    said = outbox(empty_dsn, "migrate")
    assert said.returncode == 0, said.stderr
    warning = (
        "outbox: warning: a conversion of table outbox was stopped: the CHECK outbox_p0_range "
        "is left on it, "
        'and inserts will fail on it once the ids reach 1000: drop it (ALTER TABLE "outbox" '
        'DROP CONSTRAINT "outbox_p0_range") or run this again to finish the conversion'
    )
    assert said.stderr.strip().splitlines() == [warning]
    refused = outbox(empty_dsn, "maintain")
    assert refused.returncode == 1
    assert "a conversion of table outbox was stopped: the CHECK outbox_p0_range is left" in (
        refused.stderr
    )
