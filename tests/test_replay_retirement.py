"""A replay beside `outbox maintain` retiring partitions: a batch reads its rows through the
table in id order and the replay moves past the last id it read, so a partition left out of
the table for a while (pending detach) must never be read past. A batch waits for a run of
`outbox maintain` to end and keeps the next from beginning while it runs; a partition an
interrupted run left pending detach stops the replay with what to do, where its rows were
skipped without a word (and, the partition attached back, stayed done, never sent again)."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta

import psycopg
import pytest
from helpers import seed, statuses, wait_until_db
from test_replay_preview_detaching import _left_half_detached

from outbox.operations.partition_maintenance import run_lock
from outbox.operations.replay import ReplayFilter, preview, send_batch, start
from outbox.partitions import Layout
from outbox.plumbing.errors import SchemaError
from outbox.runner import perform
from outbox.schema import migrate
from outbox.table import Table

TABLE = Table.parse("outbox")


def _delivered(conn: psycopg.Connection[tuple[object, ...]]) -> ReplayFilter:
    """Partitions of 100 ids, rows 1 to 250 all done: p0, p1 and p2 hold them. The filter
    that replays them all."""
    migrate(conn, TABLE, layout=Layout(100, 2))
    seed(conn, 250)
    conn.execute("UPDATE outbox SET status = 'done', done_at = now()")
    now = datetime.now(UTC)
    return ReplayFilter(since=now - timedelta(hours=1), until=now + timedelta(minutes=1))


@pytest.mark.parametrize("run_names", ["outbox", "public.outbox"])
def test_a_replay_batch_waits_for_a_run_of_maintenance_to_end(empty_dsn, run_names):
    """A run holds its lock from its start to its end (as `outbox maintain` does, detaching
    partitions meanwhile): the batch waits for it, and sends its rows once it has ended;
    whether the run was given the table's name with its schema or without."""
    run_lock_key = run_lock(Table.parse(run_names))
    with (
        psycopg.connect(empty_dsn, autocommit=True) as conn,
        psycopg.connect(empty_dsn, autocommit=True) as run,
        psycopg.connect(empty_dsn, autocommit=True) as replaying,
    ):
        f = _delivered(conn)
        progress = perform(conn, start(TABLE, perform(conn, preview(TABLE, f))))
        run.execute(psycopg.sql.SQL("SELECT pg_advisory_lock({})").format(run_lock_key))
        failures: list[BaseException] = []

        def batch() -> None:
            try:
                perform(replaying, send_batch(TABLE, progress, batch=100), transaction=True)
            except BaseException as exc:  # reported by the test
                failures.append(exc)

        sender = threading.Thread(target=batch)
        sender.start()
        try:
            wait_until_db(
                conn,
                "EXISTS (SELECT FROM pg_stat_activity WHERE pid = "
                f"{replaying.info.backend_pid} AND wait_event = 'advisory')",
            )
            assert statuses(conn) == {"done": 250}  # nothing sent while the run goes on
        finally:
            run.execute(psycopg.sql.SQL("SELECT pg_advisory_unlock({})").format(run_lock_key))
            sender.join(30)
        assert not failures, failures
        assert progress.sent == 100 and statuses(conn) == {"done": 150, "pending": 100}


def test_a_replay_stops_at_a_partition_an_interrupted_run_left_half_detached(empty_dsn):
    """p1 pending detach (a DETACH ... CONCURRENTLY cancelled while it waited for a
    transaction on the table) after the replay was previewed: the replay's window holds it,
    so the replay stops with what to do before it sends a row, rather than reading past p1
    to p2. (A preview after it says so itself: tests/test_replay_preview_detaching.py.)"""
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        f = _delivered(conn)
        progress = perform(conn, start(TABLE, perform(conn, preview(TABLE, f))))
        _left_half_detached(empty_dsn, conn, "outbox_p1")

        with pytest.raises(SchemaError) as stopped:
            perform(conn, send_batch(TABLE, progress, batch=100), transaction=True)
        message = str(stopped.value)
        assert "partition outbox_p1 of table outbox is half detached" in message
        assert "outbox maintain --table outbox" in message
        # It recorded no batch: nothing to resume (`--resume` would find no replay).
        assert message.endswith("then run this replay again") and "--resume" not in message
        assert progress.sent == 0
        # p1's rows are out of the table while it is pending detach, and still done.
        assert statuses(conn) == {"done": 150}
        assert conn.execute("SELECT status, count(*) FROM outbox_p1 GROUP BY 1").fetchall() == [
            ("done", 100)
        ]
