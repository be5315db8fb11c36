"""`outbox partitions` and `outbox maintain` on a partitioned table: partitions made ahead,
finished ones retired whole once the retention has passed, never one holding a pending,
processing or dead row."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from helpers import outbox_on as outbox
from helpers import seed, wait_until_db

from outbox.partitions import Layout, read_partitions, upkeep_lock
from outbox.runner import fetch
from outbox.schema import migrate
from outbox.table import Table

TABLE = Table.parse("outbox")


@pytest.fixture
def history(empty_dsn: str) -> Any:
    """450 rows in partitions of 100 ids: all done but a dead row in partition 1 and a
    pending one in partition 3; partition 4 holds the newest ids."""
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        migrate(conn, TABLE, layout=Layout(100, 2))
        migrate(conn, TABLE, layout=Layout(100, 5))  # room for 450 rows
        seed(conn, 449)
        conn.execute("UPDATE outbox SET status = 'done', done_at = now()")
        conn.execute("UPDATE outbox SET status = 'dead', done_at = NULL WHERE id = 150")
        conn.execute("UPDATE outbox SET status = 'pending', done_at = NULL WHERE id = 320")
        yield conn


def test_rows_retired_from_the_statistics_are_marked_an_estimate(history, empty_dsn):
    """Partitions whose statistics are fresh are not counted before they are dropped: their
    rows come from the planner's estimate, which the summary marks `~`, as the listing does
    (`outbox partitions`)."""
    history.execute("ANALYZE outbox_p0, outbox_p2")
    result = outbox(empty_dsn, "maintain", "--retention", "0s")
    assert result.returncode == 0, result.stderr
    assert re.search(r"retired 2 \(~?199 rows\)", result.stdout), result.stdout


def test_a_run_stopped_by_a_lock_wait_says_what_it_left(history, empty_dsn):
    """`outbox maintain` commits step by step: a DETACH ... CONCURRENTLY that waits past
    --lock-timeout for an older transaction leaves its partition pending detach, and the
    run's line says so (it said that nothing was changed); the next run finishes it."""
    with psycopg.connect(empty_dsn) as reader:
        reader.execute("SELECT count(*) FROM outbox")  # idle in transaction from here
        stopped = outbox(empty_dsn, "maintain", "--retention", "0s", "--lock-timeout", "1s")
        pending = history.execute(
            "SELECT inhrelid::regclass::text FROM pg_inherits"
            " WHERE inhparent = 'outbox'::regclass AND inhdetachpending"
        ).fetchall()
    assert stopped.returncode == 1, stopped.stdout
    lines = stopped.stderr.strip().splitlines()
    assert len(lines) == 1 and "gave up after waiting 1s for a lock on outbox" in lines[0]
    assert "nothing was changed" not in lines[0]
    assert "the run stopped there: what it did before stays, and a partition it was " \
        "detaching is finished by the next run" in lines[0], lines[0]  # fmt: skip
    assert pending == [("outbox_p0",)]
    again = outbox(empty_dsn, "maintain", "--retention", "0s")
    assert again.returncode == 0, again.stderr
    assert "outbox_p0" not in _leaves(history) and "outbox_p2" not in _leaves(history)


def _leaves(conn: Any) -> list[str]:
    return [p.name for p in fetch(conn, read_partitions(TABLE)) or []]


def test_maintain_retires_finished_partitions_and_nothing_else(history, empty_dsn):
    result = outbox(empty_dsn, "maintain", "--retention", "0s")
    assert result.returncode == 0, result.stderr
    assert re.search(r"retired 2 \(~?199 rows\)", result.stdout)  # ids 1-99 and 200-299
    assert result.stdout.endswith("within the retention of 0s; analyzed\n")  # not `0ms`
    leaves = _leaves(history)
    assert "outbox_p0" not in leaves and "outbox_p2" not in leaves
    # Pinned: a dead row, a pending row; the newest ids' partition; those made ahead.
    assert leaves[:3] == ["outbox_p1", "outbox_p3", "outbox_p4"]
    assert leaves[-1] == "outbox_p9"  # 5 whole partitions past the one holding id 449
    counts = dict(history.execute("SELECT status, count(*) FROM outbox GROUP BY 1").fetchall())
    assert counts == {"done": 248, "dead": 1, "pending": 1}  # the retired rows are gone
    assert history.execute(
        "SELECT count(*) FROM outbox WHERE id < 100 OR id BETWEEN 200 AND 299"
    ).fetchone() == (0,)
    # The parent was analyzed (autovacuum never does it for a partitioned table).
    analyzed = history.execute(
        "SELECT last_analyze IS NOT NULL FROM pg_stat_user_tables WHERE relname = 'outbox'"
    ).fetchone()
    assert analyzed == (True,)


def test_a_partition_stays_for_the_retention_and_the_listing_says_why(history, empty_dsn):
    kept = outbox(empty_dsn, "maintain", "--retention", "1h")
    assert kept.returncode == 0, kept.stderr
    assert re.search(
        r"retired 0 \(~?0 rows\), 2 finished but within the retention of 1h", kept.stdout
    )
    listing = outbox(empty_dsn, "partitions", "--json")
    assert listing.returncode == 0, listing.stderr
    by_name = {p["name"]: p for p in json.loads(listing.stdout)["partitions"]}
    assert by_name["outbox_p0"]["retirable"] and by_name["outbox_p0"]["done_since"]
    assert by_name["outbox_p0"]["done_estimate"] >= 0
    assert by_name["outbox_p1"]["why_not"] == ("1 dead row pins it until it is requeued or skipped")
    assert by_name["outbox_p3"]["why_not"] == "1 row is not done yet"
    assert by_name["outbox_p4"]["why_not"] == "it holds the newest ids"
    assert by_name["outbox_p9"]["why_not"] == "made ahead"
    assert (by_name["outbox_p3"]["low"], by_name["outbox_p3"]["high"]) == (300, 400)
    # The dead row skipped, its partition goes at the next run with a retention of 0s.
    history.execute("UPDATE outbox SET status = 'done', done_at = now() WHERE id = 150")
    text = outbox(empty_dsn, "partitions")
    assert "outbox_p1" in text.stdout and "yes" in text.stdout.splitlines()[2]
    again = outbox(empty_dsn, "maintain", "--retention", "0s")
    assert re.search(r"retired 3 \(~?299 rows\)", again.stdout), again.stdout


def test_partitions_on_a_plain_table_and_a_bad_retention(dsn):
    plain = outbox(dsn, "partitions")
    assert plain.returncode == 1
    assert plain.stderr == (
        "outbox: error: table outbox has no partitions: it is a plain table, not partitioned by "
        "`outbox migrate --partition-size`; `outbox migrate --table outbox --partition-size N` "
        "converts it online; see docs/partitioning.md\n"
    )
    bad = outbox(dsn, "maintain", "--retention", "soon")
    assert bad.returncode == 2 and "--retention" in bad.stderr


def test_the_listing_aligns_its_columns_to_the_widest_cell(empty_dsn):
    """Partition names longer than the column was (24 letters) and more ids than its 23:
    every cell of a column starts (or, for the counts, ends) where its header does."""
    table = Table.parse("orders_outbox_of_the_billing_service")
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        migrate(conn, table, layout=Layout(10**11, 2))
        conn.execute(
            "INSERT INTO orders_outbox_of_the_billing_service"
            " (aggregate_type, aggregate_id, event_type, payload) VALUES ('a', 'b', 'c', '{}')"
        )
    listing = outbox(empty_dsn, "partitions", "--table", str(table))
    assert listing.returncode == 0, listing.stderr
    header, *rows = listing.stdout.splitlines()
    assert len(rows) == 3 and rows[2].startswith("orders_outbox_of_the_billing_service_p2  ")
    starts = {name: header.index(name) for name in ("ids", "oldest created_at", "retirable")}
    ends = {name: header.index(name) + len(name) for name in ("pending", "dead", "done")}
    for row, ids in zip(rows, ("0-99999999999", "100000000000-199999999999"), strict=False):
        assert row.index(ids) == starts["ids"], listing.stdout
        for end in ends.values():
            assert row[end - 1].isdigit() and row[end] == " ", listing.stdout
        assert row[starts["oldest created_at"] :].startswith(("20", "- ")), listing.stdout
        assert row[starts["retirable"] :].startswith("no: "), listing.stdout


def test_a_partitioned_table_without_partitions_says_so_in_one_line(empty_dsn):
    """Every partition detached by hand: one line saying there is none, why that can be and
    what makes them, where a header over nothing was printed."""
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        migrate(conn, TABLE, layout=Layout(100, 1))
        for name in _leaves(conn):
            conn.execute(f"ALTER TABLE outbox DETACH PARTITION {name}")
    listing = outbox(empty_dsn, "partitions")
    assert listing.returncode == 0, listing.stderr
    assert listing.stdout == (
        "outbox: no partitions: none is attached (detached or dropped by hand, `outbox "
        "maintain` never retires the newest); `outbox maintain --table outbox` makes them "
        "ahead of the highest id\n"
    )
    assert json.loads(outbox(empty_dsn, "partitions", "--json").stdout)["partitions"] == []


def test_purge_on_a_partitioned_table_points_to_maintain(history, empty_dsn, dsn):
    """`outbox purge` still deletes done rows of a partitioned table, and says that
    `outbox maintain --retention` retires them whole instead; on a plain table it says
    nothing of it."""
    purged = outbox(empty_dsn, "purge", "--older-than", "0s")
    assert purged.returncode == 0, purged.stderr
    assert purged.stdout.splitlines() == [
        "outbox: deleted 447 done rows",
        "outbox: is partitioned: `outbox maintain --table outbox --retention 0s` retires its "
        "finished partitions whole (DETACH and DROP), where DELETE leaves dead rows for vacuum "
        "and a bloated table",
    ]
    assert history.execute("SELECT count(*) FROM outbox").fetchone() == (2,)
    plain = outbox(dsn, "purge", "--older-than", "1h", "--dry-run")
    assert plain.returncode == 0, plain.stderr
    assert plain.stdout == "outbox: would delete 0 done rows\n"


# A session waiting in DETACH ... CONCURRENTLY.
_DETACHING = (
    "(SELECT pid FROM pg_stat_activity WHERE query LIKE '%DETACH PARTITION%CONCURRENTLY' "
    "AND wait_event_type = 'Lock')"
)


def _attached(conn: Any, name: str) -> bool:
    return bool(
        conn.execute(
            "SELECT EXISTS (SELECT FROM pg_inherits WHERE inhrelid = to_regclass(%s))", (name,)
        ).fetchone()[0]
    )


@pytest.mark.parametrize("crash", ["session ended mid-detach", "client killed before the drop"])
def test_a_retirement_cut_short_is_finished_by_the_next_run(history, empty_dsn, crash):
    # A transaction that read the table holds the DETACH ... CONCURRENTLY in its wait.
    with psycopg.connect(empty_dsn) as reader:
        reader.execute("SELECT count(*) FROM outbox")
        run = subprocess.Popen(
            [sys.executable, "-m", "outbox", "maintain", "--retention", "0s", "--dsn", empty_dsn],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        wait_until_db(history, f"{_DETACHING} IS NOT NULL", timeout=60)
        pid = history.execute(f"SELECT {_DETACHING}").fetchone()[0]
        if crash == "session ended mid-detach":
            # The database session goes (a failover, a kill): the partition is left pending
            # detach, which PostgreSQL refuses to finish on its own.
            history.execute("SELECT pg_terminate_backend(%s)", (pid,))
            assert run.wait(timeout=60) != 0
            pending = history.execute(
                "SELECT inhdetachpending FROM pg_inherits WHERE inhrelid = 'outbox_p0'::regclass"
            ).fetchone()
            assert pending == (True,)
        else:
            # The process goes: its session finishes the detach once the reader is done, and
            # nobody is left to drop the partition.
            run.kill()
            run.wait(timeout=60)
        reader.rollback()
    if crash == "client killed before the drop":
        wait_until_db(history, "to_regclass('outbox_p0') NOT IN (SELECT inhrelid FROM pg_inherits)")
    assert history.execute("SELECT to_regclass('outbox_p0') IS NOT NULL").fetchone() == (True,)
    again = outbox(empty_dsn, "maintain", "--retention", "0s")
    assert again.returncode == 0, again.stderr
    assert re.search(r"retired 2 \(~?199 rows\)", again.stdout)  # partition 0 among them, finished
    assert history.execute("SELECT to_regclass('outbox_p0')").fetchone() == (None,)
    assert history.execute("SELECT count(*) FROM outbox WHERE id < 100").fetchone() == (0,)


def test_a_partition_detached_then_found_unfinished_is_attached_back(history, empty_dsn):
    # Detached by a run whose process died, and a row in it made pending again meanwhile.
    outbox(empty_dsn, "maintain", "--retention", "1h")  # notes partitions 0 and 2 finished
    history.execute("ALTER TABLE outbox DETACH PARTITION outbox_p2")
    history.execute("UPDATE outbox_p2 SET status = 'pending', done_at = NULL WHERE id = 250")
    result = outbox(empty_dsn, "maintain", "--retention", "0s")
    assert result.returncode == 0, result.stderr
    assert re.search(r"retired 1 \(~?99 rows\)", result.stdout)  # partition 0 only
    assert _attached(history, "outbox_p2")
    assert history.execute("SELECT status FROM outbox WHERE id = 250").fetchone() == ("pending",)


async def test_a_failed_run_leaves_the_connection_clean_for_the_pool(history, empty_dsn):
    """The operator runs maintenance on pooled connections: one whose run failed goes back
    outside any transaction, holding no advisory lock (a worker's upkeep would skip forever)."""
    from psycopg.pq import TransactionStatus

    from outbox.operations.maintenance import retire_done_async

    async with await psycopg.AsyncConnection.connect(empty_dsn, autocommit=True) as conn:
        await conn.execute("SET lock_timeout = '200ms'")
        await conn.execute("SET synchronous_commit = 'local'")  # maintenance sets it off
        with psycopg.connect(empty_dsn) as holder:
            holder.execute("LOCK TABLE outbox_p0 IN ACCESS EXCLUSIVE MODE")
            with pytest.raises(psycopg.errors.LockNotAvailable):
                await retire_done_async(conn, TABLE, older_than=timedelta(0))
        assert conn.info.transaction_status == TransactionStatus.IDLE
        locks = await conn.execute(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid()"
        )
        assert await locks.fetchone() == (0,)
        setting = await conn.execute("SHOW synchronous_commit")  # as the session had it
        assert await setting.fetchone() == ("local",)
        # The next run finishes the work.
        assert await retire_done_async(conn, TABLE, older_than=timedelta(0)) == 199
        assert conn.info.transaction_status == TransactionStatus.IDLE
    assert "outbox_p0" not in _leaves(history)


def test_a_replay_of_a_window_whose_partitions_were_dropped_says_they_are_gone(history, empty_dsn):
    history.execute("UPDATE outbox SET created_at = now() - interval '2 days' WHERE id < 100")
    assert outbox(empty_dsn, "maintain", "--retention", "0s").returncode == 0  # p0 dropped
    since = (datetime.now(UTC) - timedelta(days=3)).isoformat()
    until = (datetime.now(UTC) - timedelta(days=1)).isoformat()
    result = outbox(empty_dsn, "replay", "--since", since, "--until", until, "--dry-run")
    assert result.returncode == 0, result.stderr
    assert "no message matches" in result.stdout
    assert "older ones are gone (purged, or their partitions dropped by `outbox maintain`)" in (
        result.stdout
    )
    # A window the table still holds rows of says nothing of retention.
    # (Its end is the newest row's own time, not the clock's: they may be under a second old.)
    (newest,) = history.execute("SELECT max(created_at) FROM outbox").fetchone()
    end = (newest + timedelta(seconds=1)).isoformat()
    recent = outbox(empty_dsn, "replay", "--since", until, "--until", end, "--dry-run")
    assert "would send again" in recent.stdout and "gone" not in recent.stdout


def test_stats_count_what_is_unfinished_and_leave_finished_partitions_out(history, empty_dsn):
    """A snapshot names the ids from the first partition maintenance has not noted finished
    to the newest: the finished partitions are neither planned nor opened, and what is
    unfinished anywhere is still counted (a dead row pins its partition, a replay takes the
    note off)."""
    from outbox.stats import Window, queue_stats, stats_query, unfinished_window

    assert outbox(empty_dsn, "maintain", "--retention", "1h").returncode == 0
    # Partitions 0 and 2 noted; 1 holds a dead row, 3 a pending one, 4 the newest ids.
    assert fetch(history, unfinished_window(TABLE)) == Window(100, 500)
    query = stats_query(TABLE, window=Window(100, 500))
    plan = "\n".join(
        row[0]
        for row in history.execute(
            psycopg.sql.SQL("EXPLAIN (COSTS OFF) ") + query.statement, query.params
        ).fetchall()
    )
    assert "outbox_p1" in plan and "outbox_p4" in plan
    assert "outbox_p0" not in plan and "outbox_p5" not in plan  # finished; made ahead
    stats = queue_stats(history, TABLE)
    assert (stats.pending, stats.dead, stats.max_id) == (1, 1, 449)
    # A replay of partition 0's rows takes its note off: they are counted again.
    history.execute("UPDATE outbox SET created_at = now() - interval '2 days' WHERE id < 100")
    since = (datetime.now(UTC) - timedelta(days=3)).isoformat()
    until = (datetime.now(UTC) - timedelta(days=1)).isoformat()
    sent = outbox(empty_dsn, "replay", "--since", since, "--until", until, "--yes")
    assert sent.returncode == 0, sent.stderr
    assert fetch(history, unfinished_window(TABLE)) == Window(0, 500)
    assert queue_stats(history, TABLE).pending == 100
    # Once everything below the newest partition is noted, the snapshot names that one.
    history.execute("UPDATE outbox SET status = 'done', done_at = now() WHERE id < 400")
    assert outbox(empty_dsn, "maintain", "--retention", "1h").returncode == 0
    assert fetch(history, unfinished_window(TABLE)) == Window(400, 500, "outbox_p4")
    stats = queue_stats(history, TABLE)
    assert (stats.pending, stats.dead, stats.max_id) == (0, 0, 449)


@pytest.mark.parametrize("writer", ["a producer's insert", "a replay's update"])
def test_a_partition_is_not_noted_finished_while_a_row_in_it_is_uncommitted(
    history, empty_dsn, writer
):
    """A row written to a finished partition and not committed yet is invisible to
    maintenance: noted finished regardless, `outbox stats` would leave the row out once it
    commits. The note waits for the writer's lock, and a run that cannot have it leaves the
    partition unnoted."""
    from outbox.stats import Window, queue_stats, unfinished_window

    with psycopg.connect(empty_dsn, autocommit=True) as writer_conn:
        if writer == "a producer's insert":
            # Id 250 drawn long ago (its partition behind the newest), inserted only now.
            writer_conn.execute("CREATE TEMP TABLE drawn AS SELECT * FROM outbox WHERE id = 250")
            writer_conn.execute("UPDATE drawn SET status = 'pending', done_at = NULL")
            writer_conn.execute("DELETE FROM outbox WHERE id = 250")
            write = "INSERT INTO outbox SELECT * FROM drawn"
        else:
            write = "UPDATE outbox SET status = 'pending', done_at = NULL WHERE id = 250"
        with writer_conn.transaction():
            writer_conn.execute(write)
            run = outbox(empty_dsn, "maintain", "--retention", "1h")
            assert run.returncode == 0, run.stderr
    comment = history.execute("SELECT obj_description('outbox_p2'::regclass)").fetchone()
    assert comment == (None,)  # partition 0 was noted, partition 2 was not
    assert history.execute("SELECT obj_description('outbox_p0'::regclass)").fetchone()[0]
    assert fetch(history, unfinished_window(TABLE)) == Window(100, 500)
    stats = queue_stats(history, TABLE)
    assert (stats.pending, stats.dead) == (2, 1)  # ids 250 and 320; 150
    # Committed, the partition is noted by the next run only once its row is done.
    history.execute("UPDATE outbox SET status = 'done', done_at = now() WHERE id = 250")
    assert outbox(empty_dsn, "maintain", "--retention", "1h").returncode == 0
    assert history.execute("SELECT obj_description('outbox_p2'::regclass)").fetchone()[0]


def _converted(dsn: str) -> Any:
    """A plain table of 150 rows converted with partitions of 100 ids: its first partition
    holds ids 0-399 (four partition sizes), ids 400-404 are in the next; every row below
    400 done and noted finished by maintenance."""
    from outbox.operations.conversion import convert

    conn = psycopg.connect(dsn, autocommit=True)
    seed(conn, 150)
    convert(conn, TABLE, Layout(100, 2))
    seed(conn, 5)
    conn.execute("UPDATE outbox SET status = 'done', done_at = now() WHERE id < 400")
    assert fetch(conn, read_partitions(TABLE))[0].high == 400  # type: ignore[index]
    # Created in order: ids below 100 four days ago, ids 100-120 two days ago.
    conn.execute("UPDATE outbox SET created_at = now() - interval '4 days' WHERE id < 100")
    conn.execute(
        "UPDATE outbox SET created_at = now() - interval '2 days' WHERE id BETWEEN 100 AND 120"
    )
    assert outbox(dsn, "maintain", "--retention", "1h").returncode == 0
    assert conn.execute("SELECT obj_description('outbox_p0'::regclass)").fetchone()[0]
    return conn


def _replay_ids_100_to_120(dsn: str) -> subprocess.Popen[str]:
    since = (datetime.now(UTC) - timedelta(days=3)).isoformat()
    until = (datetime.now(UTC) - timedelta(days=1)).isoformat()
    args = ["replay", "--since", since, "--until", until, "--yes", "--dsn", dsn]
    return subprocess.Popen(
        [sys.executable, "-m", "outbox", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_a_replay_takes_the_note_off_a_converted_tables_wide_first_partition(dsn):
    """Ids 100-120 are past the first partition size but inside the converted partition:
    the note is found by the partition's bounds, not by id // size."""
    from outbox.stats import queue_stats

    with _converted(dsn) as conn:
        run = _replay_ids_100_to_120(dsn)
        out, err = run.communicate(timeout=120)
        assert run.returncode == 0, err
        assert "21" in out, out
        assert conn.execute("SELECT obj_description('outbox_p0'::regclass)").fetchone() == (None,)
        assert queue_stats(conn, TABLE).pending == 26  # ids 100-120 and 400-404


def test_a_replay_whose_session_ends_before_the_note_is_off_sends_nothing(dsn):
    """The rows sent again and the note taken off commit together: a replay cut short
    between the two leaves neither a pending row in a noted partition (left out of
    `outbox stats`) nor anything half-done."""
    from outbox.stats import queue_stats

    with _converted(dsn) as conn, psycopg.connect(dsn) as holder:
        # COMMENT waits for this lock; the replay's UPDATE does not.
        holder.execute("LOCK TABLE outbox_p0 IN SHARE UPDATE EXCLUSIVE MODE")
        run = _replay_ids_100_to_120(dsn)
        commenting = (
            "(SELECT pid FROM pg_stat_activity WHERE query LIKE 'COMMENT ON TABLE%' "
            "AND wait_event_type = 'Lock')"
        )
        wait_until_db(conn, f"{commenting} IS NOT NULL", timeout=60)
        conn.execute(f"SELECT pg_terminate_backend({commenting})")
        assert run.wait(timeout=60) != 0
        holder.rollback()
        pending = conn.execute("SELECT count(*) FROM outbox WHERE status = 'pending'").fetchone()
        assert pending == (5,)  # ids 100-120 still done: nothing of the batch committed
        assert queue_stats(conn, TABLE).pending == 5
        assert conn.execute("SELECT obj_description('outbox_p0'::regclass)").fetchone()[0]


_UPKEEP_LOCK = psycopg.sql.SQL("SELECT pg_advisory_lock({key})").format(key=upkeep_lock(TABLE))


async def test_the_operator_skips_a_round_while_the_upkeep_lock_is_held(history, empty_dsn):
    """A session holding the upkeep lock (idle in a transaction, or a run by hand) would
    hold the operator's pass for as long as it lasts: the operator tries the lock and
    reports the round skipped; the next round, the lock free, retires."""
    import asyncio

    from outbox.controller.database import Pools, Target
    from outbox.controller.problem import Problem

    pools, target = Pools(), Target(empty_dsn, "1")
    try:
        with psycopg.connect(empty_dsn, autocommit=True) as holder:
            holder.execute(_UPKEEP_LOCK)
            async with asyncio.timeout(30):  # before the fix: waited for ever
                with pytest.raises(Problem) as skipped:
                    await pools.purge(("ns", "d"), target, TABLE, timedelta(0))
            assert skipped.value.reason == "UpkeepBusy"
            assert "skipped this round" in skipped.value.message
            assert "outbox_p0" in _leaves(history)
            # Let go by hand: a closed session's backend ends after close() returns, and its
            # locks with it, so the next round could still find the lock held (about one
            # time in two, closing and trying at once).
            holder.execute("SELECT pg_advisory_unlock_all()")
        assert await _purged(pools, target) == 199
    finally:
        await pools.close()


async def _purged(pools: Any, target: Any) -> int:
    """The operator's pass that retires, once the run is over: DETACH ... CONCURRENTLY waits
    for the snapshots older than it in every database of the server (other tests' too), and
    past the pass's deadline (PASS_TIMEOUT_SECONDS) the pass reports the run still going."""
    from outbox.controller.database import RetentionRunning

    while True:
        try:
            return int(await pools.purge(("ns", "d"), target, TABLE, timedelta(0)))
        except RetentionRunning:
            continue  # each call waits on the run itself, up to the deadline


async def test_a_retention_run_held_by_an_idle_transaction_goes_on_beside_the_passes(
    history, empty_dsn, monkeypatch
):
    """DETACH ... CONCURRENTLY waits for every older transaction on the parent: the pass
    waits for the run no longer than its deadline, and a later pass reports what it did."""
    import asyncio

    from outbox.controller import database
    from outbox.controller.database import Pools, RetentionRunning, Target

    monkeypatch.setattr(database, "PASS_TIMEOUT_SECONDS", 1.0)
    pools, target = Pools(), Target(empty_dsn, "1")
    try:
        with psycopg.connect(empty_dsn) as reader:
            reader.execute("SELECT count(*) FROM outbox")  # idle in transaction from here
            async with asyncio.timeout(30):
                with pytest.raises(RetentionRunning):
                    await pools.purge(("ns", "d"), target, TABLE, timedelta(0))
            wait_until_db(history, f"{_DETACHING} IS NOT NULL", timeout=60)
            with pytest.raises(RetentionRunning):  # still the same run, not a second one
                await pools.purge(("ns", "d"), target, TABLE, timedelta(0))
            reader.rollback()
        assert await _purged(pools, target) == 199
        assert "outbox_p0" not in _leaves(history)
    finally:
        await pools.close()


def test_a_detach_held_past_the_statement_timeout_is_finished_by_the_next_run(
    history, empty_dsn, monkeypatch
):
    from outbox.operations import partition_maintenance as pm

    monkeypatch.setattr(pm, "STATEMENT_TIMEOUT", timedelta(milliseconds=500))
    with psycopg.connect(empty_dsn, autocommit=True) as conn, psycopg.connect(empty_dsn) as reader:
        conn.execute("SET statement_timeout = '7s'")
        reader.execute("SELECT count(*) FROM outbox")  # holds the DETACH's wait
        with pytest.raises(psycopg.errors.QueryCanceled):
            pm.maintain(conn, TABLE, retention=timedelta(0))
        assert conn.execute("SHOW statement_timeout").fetchone() == ("7s",)  # put back
        reader.rollback()
        done = pm.maintain(conn, TABLE, retention=timedelta(0))
    assert done.rows_retired == 199 and sorted(done.retired) == ["outbox_p0", "outbox_p2"]


def test_outbox_maintain_says_it_waits_for_the_upkeep_lock(history, empty_dsn):
    with psycopg.connect(empty_dsn, autocommit=True) as holder:
        holder.execute(_UPKEEP_LOCK)
        run = subprocess.Popen(
            [sys.executable, "-m", "outbox", "maintain", "--retention", "0s", "--dsn", empty_dsn],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert run.stderr is not None
        said = run.stderr.readline()
        assert "waiting for the partition upkeep lock of table outbox" in said
    out, err = run.communicate(timeout=120)  # the holder's session ended: the lock is free
    assert run.returncode == 0, err
    assert re.search(r"retired 2 \(~?199 rows\)", out)


def test_stats_count_a_row_written_with_its_own_id_past_the_sequence(history, empty_dsn):
    """`outbox maintain` sees ids a producer wrote of its own past the sequence (max(id));
    a snapshot does too: the partition it went to is in the window."""
    from outbox.stats import Window, queue_stats, unfinished_window

    _write_past_the_sequence(history)
    assert fetch(history, unfinished_window(TABLE)) == Window(0, 600)
    stats = queue_stats(history, TABLE)
    assert (stats.pending, stats.max_id) == (2, 520)  # ids 320 and 520


def _write_past_the_sequence(conn: psycopg.Connection[Any]) -> None:
    """A copy of the pending row 320 as id 520: partition 5, made ahead of the sequence's
    last id (449)."""
    columns = [
        row[0]
        for row in conn.execute(
            "SELECT attname FROM pg_attribute WHERE attrelid = 'outbox'::regclass"
            " AND attnum > 0 AND NOT attisdropped AND attname <> 'id' ORDER BY attnum"
        ).fetchall()
    ]
    listed = ", ".join(f'"{c}"' for c in columns)
    conn.execute(
        f"INSERT INTO outbox (id, {listed}) SELECT 520, {listed} FROM outbox WHERE id = 320"
    )


def test_partitions_and_maintain_count_from_a_row_written_past_the_sequence(history, empty_dsn):
    """`outbox stats` counts a row written with an id of its own past the sequence (the
    partition's file holds it); `outbox partitions` listed its partition `made ahead` and
    `outbox maintain` counted the partitions ahead from the sequence's last id. Both count
    from the same highest id in use now, and the listing says which partition holds it."""
    _write_past_the_sequence(history)
    listing = outbox(empty_dsn, "partitions", "--json")
    assert listing.returncode == 0, listing.stderr
    by_name = {p["name"]: p for p in json.loads(listing.stdout)["partitions"]}
    assert by_name["outbox_p5"]["why_not"] == (
        "it holds a row written with an id past the sequence's last, 449"
    )
    assert by_name["outbox_p5"]["written_past"] and not by_name["outbox_p4"]["written_past"]
    text = outbox(empty_dsn, "partitions").stdout.splitlines()
    assert text[-1] == (
        "outbox: outbox_p5 holds a row written with an id past the sequence's last; "
        "0 partitions made ahead of it"
    )
    made = outbox(empty_dsn, "maintain")
    assert made.returncode == 0, made.stderr
    # Five whole partitions past the one holding id 520, as migrate counts from max(id).
    assert "made 5 partitions ahead" in made.stdout, made.stdout
    assert [p.high for p in fetch(history, read_partitions(TABLE)) or []][-1] == 1100
    again = outbox(empty_dsn, "partitions").stdout.splitlines()
    assert again[-1].endswith("; 5 partitions made ahead of it")


async def test_a_layout_left_on_a_plain_table_is_purged_as_plain(dsn, caplog):
    """A conversion undone by hand that left `<table>_layout`'s row: the operator's
    retention purges the plain table, with a warning, instead of failing every pass."""
    from outbox.controller.database import Pools, Target
    from outbox.partitions import record_layout

    with psycopg.connect(dsn, autocommit=True) as conn:
        seed(conn, 10)
        conn.execute("UPDATE outbox SET status = 'done', done_at = now() - interval '1 day'")
        conn.execute(record_layout(TABLE, Layout(100, 2)))
    pools = Pools()
    try:
        purged = await pools.purge(("ns", "d"), Target(dsn, "1"), TABLE, timedelta(hours=1))
    finally:
        await pools.close()
    assert purged == 10
    assert "purged as a plain table; delete that row" in caplog.text


def test_a_converted_first_partition_left_detached_and_unfinished_is_attached_back_whole(dsn):
    """Detached by a run that died before the drop, and a row past the first partition
    size made pending meanwhile: attached back with the ids its range CHECK says (0-399),
    not as one partition size."""
    with _converted(dsn) as conn:
        conn.execute("ALTER TABLE outbox DETACH PARTITION outbox_p0")
        conn.execute("UPDATE outbox_p0 SET status = 'pending', done_at = NULL WHERE id = 120")
        result = outbox(dsn, "maintain", "--retention", "0s")
        assert result.returncode == 0, result.stderr
        bound = conn.execute(
            "SELECT pg_get_expr(relpartbound, oid) FROM pg_class WHERE relname = 'outbox_p0'"
        ).fetchone()
        assert bound == ("FOR VALUES FROM ('0') TO ('400')",)
        assert conn.execute("SELECT status FROM outbox WHERE id = 120").fetchone() == ("pending",)
