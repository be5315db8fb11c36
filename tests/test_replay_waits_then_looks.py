"""A replay's batch waits for a run of `outbox maintain` to end, then looks for a partition
pending detach. It looked in the statement that waited, which sees the catalog as it was
when it began (READ COMMITTED): a partition the run left pending detach while the batch
waited (the run interrupted in its DETACH ... CONCURRENTLY) went unseen, and the batch,
in a statement begun after, read past it through the table: its rows skipped, never sent
again. The same look serves `outbox reconcile`'s chunks (`reconcile._beside_maintenance`)."""

from __future__ import annotations

import subprocess
import sys
import threading
from collections.abc import Callable
from typing import Any

import psycopg
from helpers import seed, statuses, wait_until_db
from test_replay_preview_detaching import _left_half_detached
from test_replay_retirement import _delivered

from outbox import inbox
from outbox.operations.partition_maintenance import run_lock
from outbox.operations.replay import HalfDetached, preview, send_batch, start
from outbox.partitions import Layout
from outbox.runner import perform
from outbox.schema import migrate
from outbox.table import Table

TABLE = Table.parse("outbox")
WAITING = "EXISTS (SELECT FROM pg_locks WHERE locktype = 'advisory' AND NOT granted)"


def _interrupted_run_meanwhile(
    dsn: str, conn: psycopg.Connection[Any], work: Callable[[], object]
) -> list[BaseException]:
    """`work()` begun while a run holds its lock; the run leaves p1 pending detach and
    ends. What `work` raised."""
    failures: list[BaseException] = []

    def run_it() -> None:
        try:
            work()
        except BaseException as exc:  # reported by the test
            failures.append(exc)

    with psycopg.connect(dsn, autocommit=True) as run:
        key = run_lock(TABLE).as_string(run)
        run.execute(f"SELECT pg_advisory_lock({key})")
        worker = threading.Thread(target=run_it)
        worker.start()
        try:
            wait_until_db(conn, WAITING)
            _left_half_detached(dsn, conn, "outbox_p1")
        finally:
            run.execute(f"SELECT pg_advisory_unlock({key})")
            worker.join(30)
    assert not worker.is_alive()
    return failures


def test_a_batch_that_waited_for_a_run_sees_the_partition_it_left_half_detached(empty_dsn):
    """Rows 1 to 250 done in p0, p1 and p2; the batch of 300 waits for a run, which leaves
    p1 pending detach: the batch sent p0's and p2's 150 rows, and p1's stayed done. It
    stops instead, sending nothing."""
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        f = _delivered(conn)
        progress = perform(conn, start(TABLE, perform(conn, preview(TABLE, f))))
        with psycopg.connect(empty_dsn, autocommit=True) as replaying:
            failures = _interrupted_run_meanwhile(
                empty_dsn,
                conn,
                lambda: perform(
                    replaying, send_batch(TABLE, progress, batch=300), transaction=True
                ),
            )
        assert (progress.sent, statuses(conn)) == (0, {"done": 150})
        assert len(failures) == 1 and isinstance(failures[0], HalfDetached), failures
        assert "partition outbox_p1 of table outbox is half detached" in str(failures[0])


def test_a_reconcile_replay_batch_that_waited_for_a_run_sees_what_it_left(empty_dsn: str):
    """`outbox reconcile --replay`, rows 1 to 2500 delivered (partitions of 1000 ids), none
    in the inbox: batches of 1000. A run queues for its lock behind the first batch (held
    up by a row lock), gets it once that batch commits, and leaves p2 pending detach while
    the second batch waits for it. The second batch sent ids 1001 to 1999, read past p2's
    2000, and the third stopped at p2: id 2000 was never sent again. The second stops."""
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        migrate(conn, TABLE, layout=Layout(1000, 2))
        seed(conn, 2500)
        conn.execute("UPDATE outbox SET status = 'done', done_at = now()")
        inbox.migrate(conn)
        key = run_lock(TABLE).as_string(conn)
        with (
            psycopg.connect(empty_dsn) as blocker,
            psycopg.connect(empty_dsn, autocommit=True) as run,
        ):
            blocker.execute("SELECT FROM outbox WHERE id = 1000 FOR UPDATE")  # in the 1st batch
            replaying = subprocess.Popen(
                [
                    sys.executable, "-m", "outbox", "reconcile", "--dsn", empty_dsn,
                    "--inbox-dsn", empty_dsn, "--inbox-table", "outbox_inbox",
                    "--consumer", "billing", "--since", "1h", "--until", "0s",
                    "--replay", "--yes",
                ],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )  # fmt: skip
            locking = threading.Thread(
                target=run.execute, args=(f"SELECT pg_advisory_lock({key})",)
            )
            try:
                wait_until_db(
                    conn,
                    "EXISTS (SELECT FROM pg_locks WHERE locktype = 'transactionid' "
                    "AND NOT granted)",
                )
                locking.start()  # queued behind the first batch's shared hold
                wait_until_db(conn, WAITING)
                blocker.rollback()  # the first batch commits; the run takes its lock
                locking.join(30)
                assert not locking.is_alive()
                wait_until_db(conn, WAITING)  # the second batch, behind the run
                _left_half_detached(empty_dsn, conn, "outbox_p2")
                run.execute(f"SELECT pg_advisory_unlock({key})")
                out, err = replaying.communicate(timeout=60)
            finally:
                replaying.kill()
                replaying.wait()
        sent = conn.execute("SELECT count(*), max(id) FROM outbox WHERE replay = 1").fetchone()
        assert sent == (1000, 1000), (sent, err)
        assert (replaying.returncode, out) == (1, "")
        assert err.startswith("outbox: error: replay 1: partition outbox_p2 of table outbox")
