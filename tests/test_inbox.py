"""outbox.inbox against real PostgreSQL: the table, the one call, retention, the commands."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import fields
from datetime import timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
from helpers import wait_until_db

from outbox import inbox
from outbox.plumbing.durations import format_duration
from outbox.schema import SchemaError
from outbox.table import Table
from outbox.worker.settings import WorkerSettings

ROOT = Path(__file__).parent.parent
BASE_ENV = {k: v for k, v in os.environ.items() if not k.startswith(("OUTBOX_", "PG"))}
T = inbox.DEFAULT_INBOX_TABLE


@pytest.fixture
def inbox_conn(conn: psycopg.Connection[Any]) -> psycopg.Connection[Any]:
    inbox.migrate(conn)
    return conn


def keys(conn: psycopg.Connection[Any], table: str = T) -> list[tuple[str, str]]:
    rows = conn.execute(
        psycopg.sql.SQL("SELECT consumer, message_id FROM {} ORDER BY 1, 2").format(
            Table.parse(table).ident
        )
    ).fetchall()
    return [(str(c), str(m)) for c, m in rows]


def outbox_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "outbox", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**BASE_ENV, **(env or {})},
    )


# -- the table -------------------------------------------------------------------------------


def test_migrate_creates_the_table_once_and_check_accepts_it(conn):
    assert inbox.migrate(conn) is True
    assert inbox.migrate(conn) is False  # idempotent
    inbox.check(conn)
    columns = conn.execute(
        "SELECT attname, format_type(atttypid, atttypmod), attnotnull FROM pg_attribute "
        "WHERE attrelid = 'outbox_inbox'::regclass AND attnum > 0 ORDER BY attnum"
    ).fetchall()
    assert columns == [
        ("consumer", "text", True),
        ("message_id", "text", True),
        ("received_at", "timestamp with time zone", True),
        ("replay", "integer", False),
    ]
    pk = conn.execute(
        "SELECT pg_get_constraintdef(oid) FROM pg_constraint "
        "WHERE conrelid = 'outbox_inbox'::regclass AND contype = 'p'"
    ).fetchone()
    assert pk == ("PRIMARY KEY (consumer, message_id)",)
    # Not partitioned: the key is unique across the whole table.
    assert conn.execute(
        "SELECT relkind FROM pg_class WHERE oid = 'outbox_inbox'::regclass"
    ).fetchone() == ("r",)


def test_concurrent_migrations_all_succeed_and_one_creates(dsn):
    def one() -> bool:
        with psycopg.connect(dsn, autocommit=True) as c:
            return inbox.migrate(c, "app.inbox")

    with ThreadPoolExecutor(4) as pool:
        created = list(pool.map(lambda _: one(), range(4)))
    assert sorted(created) == [False, False, False, True]


def test_hostile_table_names_are_the_table_named(conn):
    name = '"we%ird.{x}"'  # a dot, a placeholder character and braces in one part
    assert inbox.migrate(conn, name) is True
    with conn.transaction():
        assert inbox.record(conn, consumer="c", message_id="1", table=name)
    found = conn.execute("SELECT relname FROM pg_class WHERE relname = 'we%ird.{x}'").fetchone()
    assert found == ("we%ird.{x}",)
    assert keys(conn, name) == [("c", "1")]


def test_migrate_refuses_an_outbox_table_and_a_foreign_one(conn):
    with pytest.raises(SchemaError, match="outbox is an outbox table, not an inbox table"):
        inbox.migrate(conn, "outbox")
    conn.execute("CREATE TABLE mine (id int)")
    with pytest.raises(SchemaError, match="mine is a table, not an inbox table"):
        inbox.migrate(conn, "mine")
    with pytest.raises(SchemaError, match="does not exist; run `outbox inbox migrate --table x`"):
        inbox.check(conn, "x")


async def test_check_on_an_async_connection(aconn):
    with pytest.raises(SchemaError, match="does not exist"):
        await inbox.check(aconn)


# -- record ----------------------------------------------------------------------------------


def test_record_says_first_once_per_consumer(inbox_conn):
    conn = inbox_conn
    with conn.transaction():
        assert inbox.record(conn, consumer="billing", message_id="42") is True
    with conn.transaction():
        assert inbox.record(conn, consumer="billing", message_id="42") is False
        assert inbox.record(conn, consumer="shipping", message_id="42") is True
    assert keys(conn) == [("billing", "42"), ("shipping", "42")]


def test_a_rolled_back_effect_leaves_no_record(inbox_conn):
    conn = inbox_conn
    conn.execute("CREATE TABLE effects (message_id text)")
    with pytest.raises(ZeroDivisionError), conn.transaction():
        assert inbox.record(conn, consumer="c", message_id="7")
        conn.execute("INSERT INTO effects VALUES ('7')")
        _ = 1 / 0  # the handler fails after its effect
    assert keys(conn) == []
    assert conn.execute("SELECT count(*) FROM effects").fetchone() == (0,)
    with conn.transaction():  # the redelivery applies it
        assert inbox.record(conn, consumer="c", message_id="7")


async def test_record_on_an_async_connection(dsn, inbox_conn):
    async with await psycopg.AsyncConnection.connect(dsn) as aconn:  # not autocommit
        assert await inbox.record(aconn, consumer="c", message_id="x") is True
        assert await inbox.record(aconn, consumer="c", message_id="x") is False
        await aconn.commit()
    assert keys(inbox_conn) == [("c", "x")]


def test_record_refuses_to_commit_on_its_own(inbox_conn):
    with pytest.raises(RuntimeError, match="inside the receiver's transaction"):
        inbox.record(inbox_conn, consumer="c", message_id="1")
    assert keys(inbox_conn) == []


@pytest.mark.parametrize(
    ("value", "says"),
    [("", "is empty"), ("a\x00b", "holds a NUL"), ("é" * 257, "is longer than 512 bytes")],
)
def test_bad_keys_are_refused_before_the_database(inbox_conn, value, says):
    with pytest.raises(ValueError, match=says), inbox_conn.transaction():
        inbox.record(inbox_conn, consumer="c", message_id=value)
    with pytest.raises(ValueError, match=f"consumer {says}"), inbox_conn.transaction():
        inbox.record(inbox_conn, consumer=value, message_id="1")
    assert keys(inbox_conn) == []


def _waiting_on_a_lock(conn: psycopg.Connection[Any], pid: int) -> str:
    return f"(SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE pid = {pid})"


@pytest.mark.parametrize("first_commits", [True, False])
def test_parallel_duplicates_in_two_transactions_give_one_effect(dsn, inbox_conn, first_commits):
    """The second delivery's INSERT waits for the first transaction: dropped if it committed,
    applied if it rolled back. Never both, never neither."""
    conn = inbox_conn
    conn.execute("CREATE TABLE effects (message_id text, by text)")

    def deliver(c: psycopg.Connection[Any], by: str) -> bool:
        first = inbox.record(c, consumer="c", message_id="m-1")
        if first:
            c.execute("INSERT INTO effects VALUES ('m-1', %s)", (by,))
        return first

    with psycopg.connect(dsn) as one, psycopg.connect(dsn) as two:
        assert deliver(one, "one") is True  # in one's open transaction
        second_pid = two.info.backend_pid
        with ThreadPoolExecutor(1) as pool:
            second = pool.submit(lambda: (deliver(two, "two"), two.commit())[0])
            wait_until_db(conn, _waiting_on_a_lock(conn, second_pid))  # blocked on the key
            assert not second.done()
            one.commit() if first_commits else one.rollback()
            assert second.result(timeout=10) is (not first_commits)
    effects = conn.execute("SELECT message_id, by FROM effects").fetchall()
    assert effects == [("m-1", "one" if first_commits else "two")]
    assert keys(conn) == [("c", "m-1")]


def test_many_parallel_deliveries_of_each_message_give_one_effect_each(dsn, inbox_conn):
    inbox_conn.execute("CREATE TABLE effects (message_id text)")
    messages = [str(i) for i in range(20)]
    start = threading.Barrier(6)

    def receiver(n: int) -> int:
        applied = 0
        with psycopg.connect(dsn) as c:
            start.wait()
            for m in messages[n % 2 :] + messages[: n % 2]:  # not all in the same order
                with c.transaction():
                    if inbox.record(c, consumer="c", message_id=m):
                        c.execute("INSERT INTO effects VALUES (%s)", (m,))
                        applied += 1
        return applied

    with ThreadPoolExecutor(6) as pool:
        applied = sum(pool.map(receiver, range(6)))
    assert applied == len(messages)
    rows = inbox_conn.execute("SELECT message_id, count(*) FROM effects GROUP BY 1").fetchall()
    assert sorted(rows, key=lambda r: int(r[0])) == [(m, 1) for m in messages]


# -- retention -------------------------------------------------------------------------------


def _received(
    conn: psycopg.Connection[Any], consumer: str, ids: range, ago: str, table: str = T
) -> None:
    conn.execute(
        psycopg.sql.SQL(
            "INSERT INTO {} (consumer, message_id, received_at) "
            "SELECT %s, i::text, now() - %s::interval FROM generate_series(%s::int, %s::int) i"
        ).format(Table.parse(table).ident),
        (consumer, ago, ids.start, ids.stop - 1),
    )


@pytest.mark.parametrize("batch", [1, 3, 5000])
def test_purge_deletes_only_keys_past_the_retention(inbox_conn, batch):
    conn = inbox_conn
    _received(conn, "c", range(0, 10), "20 days")
    _received(conn, "d", range(0, 3), "15 days")
    _received(conn, "c", range(10, 14), "13 days")
    _received(conn, "c", range(14, 16), "1 minute")
    dry = inbox.purge(conn, dry_run=True)
    assert (dry.deleted, dry.busy) == (13, False)
    assert len(keys(conn)) == 19
    result = inbox.purge(conn, batch=batch)
    assert (result.deleted, result.busy) == (13, False)
    assert keys(conn) == sorted(("c", str(i)) for i in range(10, 16))
    assert inbox.purge(conn, older_than=timedelta(days=14)).deleted == 0
    assert inbox.purge(conn, older_than=timedelta(hours=1), batch=batch).deleted == 4


def test_purge_ties_on_received_at_across_batches(inbox_conn):
    """Keys recorded by one transaction share received_at: a batch boundary inside them
    must not skip the rest."""
    _received(inbox_conn, "c", range(0, 7), "30 days")
    assert inbox.purge(inbox_conn, batch=2).deleted == 7
    assert keys(inbox_conn) == []


@pytest.mark.parametrize("zone", ["Pacific/Kiritimati", "America/St_Johns", "UTC"])
def test_purge_in_any_session_time_zone(inbox_conn, zone):
    inbox_conn.execute(psycopg.sql.SQL("SET TimeZone = {}").format(psycopg.sql.Literal(zone)))
    _received(inbox_conn, "c", range(0, 3), "20 days")
    _received(inbox_conn, "c", range(3, 4), "1 day")
    assert inbox.purge(inbox_conn, batch=2).deleted == 3
    assert keys(inbox_conn) == [("c", "3")]


# The gate a purge held mid-batch waits at (a session advisory lock the test holds).
_GATE = 4711


@pytest.mark.parametrize(
    ("table", "running", "started", "search_path"),
    [
        ("outbox_inbox", "outbox_inbox", "outbox_inbox", None),
        ("outbox_inbox", "outbox_inbox", "public.outbox_inbox", None),
        ("outbox_inbox", "public.outbox_inbox", '"outbox_inbox"', None),
        ("app.seen", "app.seen", "seen", "app, public"),
    ],
)
def test_one_purger_at_a_time_however_the_table_is_named(
    dsn, inbox_conn, table, running, started, search_path
):
    """A purge runs while another holds the table's purge lock mid-batch: the second stops
    as busy whichever way each names the table (schema-qualified or not, quoted, or found
    through the search_path), and the first finishes the work."""
    conn = inbox_conn
    inbox.migrate(conn, table)
    _received(conn, "c", range(0, 5), "30 days", table)
    if search_path:  # the command's session finds the table through it
        conn.execute(
            psycopg.sql.SQL("ALTER DATABASE {} SET search_path = {}").format(
                psycopg.sql.Identifier(conn.info.dbname), psycopg.sql.SQL(search_path)
            )
        )
    # Deleting a row waits at the gate: the first purge stops there, its lock held.
    conn.execute(
        "CREATE FUNCTION pass_gate() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
        f"PERFORM pg_advisory_xact_lock({_GATE}); RETURN OLD; END $$"
    )
    conn.execute(
        psycopg.sql.SQL(
            "CREATE TRIGGER gate BEFORE DELETE ON {} FOR EACH ROW EXECUTE FUNCTION pass_gate()"
        ).format(Table.parse(table).ident)
    )

    def purge_through_the_gate() -> inbox.PurgeResult:
        with psycopg.connect(dsn, autocommit=True) as c:
            return inbox.purge(c, running)

    with psycopg.connect(dsn, autocommit=True) as gate, ThreadPoolExecutor(1) as pool:
        gate.execute(f"SELECT pg_advisory_lock({_GATE})")
        first = pool.submit(purge_through_the_gate)
        wait_until_db(
            conn,
            "EXISTS (SELECT FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
            f" AND objid = {_GATE} AND objsubid = 1)",
        )
        second = outbox_cli("inbox", "purge", "--table", started, "--dsn", dsn)
        gate.execute(f"SELECT pg_advisory_unlock({_GATE})")
        done = first.result(timeout=60)
    assert second.returncode == 0, second.stderr
    assert "deleted 0 message ids" in second.stdout
    assert "another purge of this table is running; stopped" in second.stdout, second.stdout
    assert (done.deleted, done.busy) == (5, False)
    assert keys(conn, table) == []


@pytest.mark.parametrize("table", ["seen", "nowhere.seen"])
def test_purge_of_a_missing_table_fails_on_the_table(conn, table):
    """The purge lock's key, named as the catalog names the table, falls back to the name
    given: the purge gets as far as the table and fails there (the command says to migrate)."""
    with pytest.raises(psycopg.errors.UndefinedTable):
        inbox.purge(conn, table)


def test_purge_never_waits_for_a_receiver(dsn, inbox_conn):
    """A row someone holds locked is skipped, not waited for (the purge has a 1 s lock
    timeout here: waiting would fail it)."""
    _received(inbox_conn, "c", range(0, 4), "30 days")
    inbox_conn.execute("SET lock_timeout = '1s'")
    with psycopg.connect(dsn) as other:
        other.execute("SELECT 1 FROM outbox_inbox WHERE message_id = '2' FOR UPDATE")
        assert inbox.purge(inbox_conn, batch=2).deleted == 3
    assert keys(inbox_conn) == [("c", "2")]
    assert inbox.purge(inbox_conn).deleted == 1


def test_purge_while_receiving(dsn, inbox_conn):
    """Receivers keep recording (new keys and redeliveries of keys being purged) while the
    purge runs: both finish, no deadlock, every new key stays."""
    _received(inbox_conn, "c", range(0, 3000), "30 days")
    stop = threading.Event()

    def receive() -> int:
        n = 0
        with psycopg.connect(dsn) as c:
            while not stop.is_set() or n < 200:
                with c.transaction():
                    inbox.record(c, consumer="c", message_id=f"new-{n}")
                    inbox.record(c, consumer="c", message_id=str(n % 3000))  # an old key
                n += 1
        return n

    with ThreadPoolExecutor(1) as pool:
        receiving = pool.submit(receive)
        result = inbox.purge(inbox_conn, older_than=timedelta(days=1), batch=100)
        stop.set()
        received = receiving.result(timeout=60)
    new = inbox_conn.execute(
        "SELECT count(*) FROM outbox_inbox WHERE message_id LIKE 'new-%'"
    ).fetchone()
    assert new == (received,)
    old_left = inbox_conn.execute(
        "SELECT count(*) FROM outbox_inbox WHERE received_at < now() - interval '1 day'"
    ).fetchone()
    assert old_left == (0,)
    assert 3000 - received <= result.deleted <= 3000


def _batch_plan(conn: psycopg.Connection[Any], *, analyze: bool = False) -> str:
    """The plan of one purge batch (run and rolled back when `analyze`)."""
    cutoff = conn.execute("SELECT now() - interval '14 days'").fetchone()[0]  # type: ignore[index]
    query = inbox.purge_batch_query(
        Table.parse(T), after=cutoff - timedelta(days=3650), cutoff=cutoff, batch=1000
    )
    options = "ANALYZE, BUFFERS, COSTS OFF" if analyze else "COSTS OFF"
    explain = psycopg.sql.SQL("EXPLAIN ({}) ").format(psycopg.sql.SQL(options))
    with conn.transaction(force_rollback=True):
        plan = conn.execute(explain + query.statement, query.params).fetchall()
    return "\n".join(r[0] for r in plan)


def test_a_purge_batch_walks_the_index_and_deletes_by_address(inbox_conn):
    _received(inbox_conn, "c", range(0, 20000), "30 days")
    _received(inbox_conn, "c", range(20000, 40000), "1 day")
    inbox_conn.execute("ANALYZE outbox_inbox")
    plan = _batch_plan(inbox_conn)
    assert "Seq Scan" not in plan, plan
    assert "Tid Scan" in plan and "outbox_inbox_received" in plan, plan


def _buffers(plan: str) -> int:
    """Every buffer the statement touched (the top node's count covers its children)."""
    hits = re.search(r"Buffers: (.*)", plan)
    assert hits, plan
    return sum(int(n) for n in re.findall(r"=(\d+)", hits.group(1)))


@pytest.mark.slow
def test_a_purge_batch_costs_the_same_at_10k_and_at_2m_keys(dsn, inbox_conn):
    """The cost of a batch is its own size, not the table's (NServiceBus's cleanup scanned
    its 80M-row table). About 15 s, most of it inserting the 2M keys."""
    _received(inbox_conn, "c", range(0, 5000), "30 days")
    _received(inbox_conn, "c", range(5000, 10000), "1 day")
    inbox_conn.execute("VACUUM ANALYZE outbox_inbox")
    small = _buffers(_batch_plan(inbox_conn, analyze=True))
    _received(inbox_conn, "d", range(0, 995_000), "30 days")
    _received(inbox_conn, "d", range(995_000, 1_990_000), "1 day")
    inbox_conn.execute("VACUUM ANALYZE outbox_inbox")
    large = _buffers(_batch_plan(inbox_conn, analyze=True))
    assert large <= small * 1.5 + 20, (small, large)


def test_the_default_retention_covers_the_workers_redelivery_window():
    defaults = {f.name: f.default for f in fields(WorkerSettings) if f.name != "dsn"}
    window = inbox.redelivery_window(
        max_attempts=defaults["max_attempts"],
        lease=defaults["lease"],
        backoff_cap=defaults["backoff_cap"],
        max_defer_age=defaults["max_defer_age"],
    )
    assert window == timedelta(days=1, hours=1, minutes=12)  # the number docs/receiving.md gives
    assert 10 * window <= inbox.DEFAULT_RETENTION
    docs = (ROOT / "docs" / "receiving.md").read_text()
    assert "25 hours 12 minutes" in docs and format_duration(inbox.DEFAULT_RETENTION) in docs


# -- the commands ----------------------------------------------------------------------------


def test_inbox_migrate_print_shows_the_sql_without_a_database():
    result = outbox_cli("inbox", "migrate", "--print", "--table", "app.received")
    assert result.returncode == 0, result.stderr
    assert 'CREATE TABLE IF NOT EXISTS "app"."received"' in result.stdout
    assert "PRIMARY KEY (consumer, message_id)" in result.stdout
    assert 'COMMENT ON TABLE "app"."received" IS \'outbox-dispatcher inbox v2\'' in result.stdout


def test_inbox_commands_migrate_and_purge(dsn, conn):
    made = outbox_cli("inbox", "migrate", "--dsn", dsn)
    assert (made.returncode, made.stdout) == (0, "outbox_inbox: created (inbox v2)\n"), made.stderr
    again = outbox_cli("inbox", "migrate", "--dsn", dsn)
    assert again.stdout == "outbox_inbox: already there (inbox v2)\n"
    # What it gave a table that lacked something, said: the purge's index dropped by hand,
    # then a table of the first version (its replay column and comment).
    conn.execute("DROP INDEX outbox_inbox_received")
    rebuilt = outbox_cli("inbox", "migrate", "--dsn", dsn)
    assert rebuilt.stdout == (
        "outbox_inbox: built the purge's index outbox_inbox_received (inbox v2)\n"
    ), rebuilt.stderr
    conn.execute("ALTER TABLE outbox_inbox DROP COLUMN replay")
    conn.execute("COMMENT ON TABLE outbox_inbox IS 'outbox-dispatcher inbox v1'")
    upgraded = outbox_cli("inbox", "migrate", "--dsn", dsn)
    assert upgraded.stdout == "outbox_inbox: upgraded from v1 (inbox v2)\n", upgraded.stderr
    assert outbox_cli("inbox", "migrate", "--dsn", dsn).stdout == (
        "outbox_inbox: already there (inbox v2)\n"
    )
    _received(conn, "c", range(0, 5), "20 days")
    _received(conn, "c", range(5, 7), "2 days")
    dry = outbox_cli("inbox", "purge", "--dry-run", "--dsn", dsn)
    assert re.fullmatch(
        r"outbox_inbox: would delete 5 message ids received before \S+ \S+\n", dry.stdout
    )
    purged = outbox_cli("inbox", "purge", "--older-than", "1d", "--batch", "2", "--dsn", dsn)
    assert purged.returncode == 0, purged.stderr
    assert purged.stdout.startswith("outbox_inbox: deleted 7 message ids received before ")
    assert keys(conn) == []


def test_inbox_table_from_its_own_variable_not_the_outbox_one(dsn, conn):
    env = {"OUTBOX_TABLE": "outbox", "OUTBOX_INBOX_TABLE": "app.seen", "OUTBOX_DSN": dsn}
    made = outbox_cli("inbox", "migrate", env=env)
    assert made.stdout == "app.seen: created (inbox v2)\n", made.stderr
    assert conn.execute("SELECT to_regclass('app.seen') IS NOT NULL").fetchone() == (True,)


@pytest.mark.parametrize(
    ("args", "code", "says"),
    [
        (["purge", "--older-than", "soon"], 2, "--older-than: 'soon' is not a duration"),
        (["purge", "--batch", "0"], 2, "--batch: 0 is out of range"),
        (["purge", "--batch", "ten"], 2, "--batch: 'ten' is not a whole number"),
        (["purge"], 1, "inbox table outbox_inbox does not exist; run `outbox inbox migrate"),
        (
            ["purge", "--table", "nowhere.seen"],
            1,
            "inbox table nowhere.seen does not exist; "
            "run `outbox inbox migrate --table nowhere.seen`",
        ),
        (["migrate", "--table", "outbox"], 1, "outbox is an outbox table, not an inbox table"),
        (["purge", "--table", "outbox"], 1, "outbox is an outbox table, not an inbox table"),
    ],
)
def test_inbox_command_errors_are_one_line(dsn, args, code, says):
    result = outbox_cli("inbox", *args, "--dsn", dsn)
    assert result.returncode == code
    assert result.stderr.count("\n") == 1 and says in result.stderr, result.stderr


def test_the_inbox_needs_psycopg_only_and_the_receiver_no_framework_until_asked():
    heavy = ("aiohttp", "nats", "confluent_kafka", "standardwebhooks", "psycopg_pool", "uvicorn")
    script = (
        "import sys, outbox.inbox, outbox.commands.inbox, outbox.cli, outbox.receiver, "
        "outbox.receiver.http\n"
        f"print(sorted(m for m in {heavy!r} if m in sys.modules))"
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=BASE_ENV
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout == "[]\n"


@pytest.mark.parametrize("command", [["migrate"], ["purge"]])
def test_an_unreachable_server_fails_without_leaking_the_password(command):
    result = outbox_cli("inbox", *command, "--dsn", "postgresql://u:s3cret@127.0.0.1:1/db")
    assert result.returncode == 1
    assert "cannot connect" in result.stderr and "s3cret" not in result.stdout + result.stderr


# -- the purge's index -------------------------------------------------------------------


def _indexes(conn: psycopg.Connection[Any]) -> list[str]:
    rows = conn.execute(
        "SELECT indexrelid::regclass::text FROM pg_index "
        "WHERE indrelid = 'outbox_inbox'::regclass AND NOT indisprimary ORDER BY 1"
    ).fetchall()
    return [str(name) for (name,) in rows]


async def test_check_names_a_missing_purge_index_and_migrate_builds_it(inbox_conn, aconn, dsn):
    """Without its index on received_at, every purge batch reads the whole table: the check
    (the library's, sync and async, and `outbox inbox check`) names the index and the fix,
    the purge is refused the same way, and `outbox inbox migrate` builds it."""
    inbox_conn.execute("DROP INDEX outbox_inbox_received")
    with pytest.raises(SchemaError) as missing:
        inbox.check(inbox_conn)
    said = str(missing.value)
    assert "lacks the index on received_at" in said, said
    assert "outbox_inbox_received" in said and "`outbox inbox migrate --table outbox_inbox`" in said
    with pytest.raises(SchemaError, match="lacks the index on received_at"):
        await inbox.check(aconn)
    for command in ("check", "purge"):
        refused = outbox_cli("inbox", command, "--dsn", dsn)
        assert refused.returncode == 1
        assert refused.stderr.count("\n") == 1 and said in refused.stderr, refused.stderr

    built = outbox_cli("inbox", "migrate", "--dsn", dsn)
    assert built.returncode == 0, built.stderr
    assert _indexes(inbox_conn) == ["outbox_inbox_received"]
    inbox.check(inbox_conn)
    ready = outbox_cli("inbox", "check", "--dsn", dsn)
    assert ready.returncode == 0 and ready.stdout.startswith("outbox_inbox: ready"), ready


def test_an_index_on_received_at_made_by_hand_counts_whatever_its_name(inbox_conn):
    inbox_conn.execute("DROP INDEX outbox_inbox_received")
    inbox_conn.execute("CREATE INDEX CONCURRENTLY by_arrival ON outbox_inbox (received_at)")
    inbox.check(inbox_conn)
    assert inbox.migrate(inbox_conn) is False
    assert _indexes(inbox_conn) == ["by_arrival"]  # no second index on the same column


def test_another_index_holding_the_purge_index_name_is_named_not_kept_silently(inbox_conn):
    """`CREATE INDEX IF NOT EXISTS` would keep whatever holds the name: migrate says so."""
    inbox_conn.execute("DROP INDEX outbox_inbox_received")
    inbox_conn.execute("CREATE INDEX outbox_inbox_received ON outbox_inbox (message_id)")
    for call in (inbox.check, inbox.migrate):
        with pytest.raises(SchemaError, match="outbox_inbox_received is not one") as refused:
            call(inbox_conn)
        assert "drop it, then run `outbox inbox migrate" in str(refused.value)
