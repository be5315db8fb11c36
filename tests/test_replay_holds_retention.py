"""A replay running holds off `outbox maintain`'s retirement: each batch held the run's lock
only while it ran, and a run between two batches retired a partition the replay had not
reached yet. Partitions of 100 ids, rows 1 to 250 done, a replay of them all in batches of
50 previewed (and confirmed) 250: a run with --retention 0s between its second and third
batches retired p1 (ids 100 to 199), and the replay sent 150 again, saying only `sent 150
messages again`. Now the run makes partitions ahead and analyzes, retires nothing while a
replay runs, and says so; the next run retires as usual, and a replay whose session ended
holds nothing off."""

from __future__ import annotations

import re
import subprocess
import sys
import threading
from typing import Any

import psycopg
from helpers import outbox_on, seed, statuses, wait_until_db

from outbox.partitions import Layout
from outbox.schema import migrate
from outbox.table import Table

TABLE = Table.parse("outbox")
ROW_WAIT = "EXISTS (SELECT FROM pg_locks WHERE locktype = 'transactionid' AND NOT granted)"
ADVISORY_WAIT = "EXISTS (SELECT FROM pg_locks WHERE locktype = 'advisory' AND NOT granted)"


def _delivered(dsn: str, conn: psycopg.Connection[Any]) -> None:
    migrate(conn, TABLE, layout=Layout(100, 2))
    seed(conn, 250)
    conn.execute("UPDATE outbox SET status = 'done', done_at = now()")
    # Vacuumed now, and noted finished by a run whose retention keeps them: no autovacuum
    # of the partitions later holds off a run's note (it gives up on a lock after 100 ms).
    conn.execute("VACUUM ANALYZE outbox")
    kept = outbox_on(dsn, "maintain", "--retention", "7d")
    assert kept.returncode == 0 and "retired 0" in kept.stdout, kept.stdout + kept.stderr


def _replaying(dsn: str, *command: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "outbox", *command, "--dsn", dsn],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _run_between_batches(
    dsn: str,
    conn: psycopg.Connection[Any],
    blocker: psycopg.Connection[Any],
    replaying: subprocess.Popen[str],
) -> tuple[subprocess.CompletedProcess[str], str, str]:
    """A run of `outbox maintain --retention 0s` let in between the batch whose row
    `blocker` locked (before the replay began) and the next one: the run queues for its lock
    behind the held batch and takes it once that batch commits, the next batch queued behind
    the run. The run's outcome, and the replay's output."""
    ran: list[subprocess.CompletedProcess[str]] = []
    run = threading.Thread(
        target=lambda: ran.append(outbox_on(dsn, "maintain", "--retention", "0s"))
    )
    try:
        wait_until_db(conn, ROW_WAIT)  # the held batch, waiting for its row
        run.start()
        wait_until_db(conn, ADVISORY_WAIT)  # the run, behind the batch's shared hold
        blocker.rollback()  # the batch commits; the run takes its lock
        run.join(60)
        out, err = replaying.communicate(timeout=60)
    finally:
        replaying.kill()
        replaying.wait()
    assert not run.is_alive() and ran
    return ran[0], out, err


def test_a_run_between_two_batches_of_a_replay_retires_nothing(empty_dsn: str) -> None:
    """Rows 1 to 250 done, a replay in batches of 50 held at its second (id 60): a run with
    --retention 0s between its second and third batches retired p1, and the replay sent 150
    of the 250 it previewed. It retires nothing and says which session's replay held it
    off; the replay sends all 250; the next run retires as usual."""
    with (
        psycopg.connect(empty_dsn, autocommit=True) as conn,
        psycopg.connect(empty_dsn) as blocker,
    ):
        _delivered(empty_dsn, conn)
        blocker.execute("SELECT FROM outbox WHERE id = 60 FOR UPDATE")
        replaying = _replaying(
            empty_dsn, "replay", "--since", "1h", "--until", "0s", "--batch", "40", "--yes"
        )
        ran, out, err = _run_between_batches(empty_dsn, conn, blocker, replaying)
        sent = conn.execute("SELECT count(*) FROM outbox WHERE replay = 1").fetchone()
        assert (replaying.returncode, sent) == (0, (250,)), (out, err, ran.stdout, ran.stderr)
        assert out.endswith("replay 1: sent 250 messages again in 7 batches (Tested 250)\n"), out
        assert ran.returncode == 0, ran.stderr
        assert "retired 0 (0 rows)" in ran.stdout, ran.stdout
        assert (
            "outbox: kept outbox_p1, finished for the retention: a replay is running "
            "(the session of pid " in ran.stdout
        ), ran.stdout
        assert statuses(conn) == {"pending": 250}
        # The replay over, the next run retires what is finished: nothing is (all pending),
        # and it says nothing of a replay.
        conn.execute("UPDATE outbox SET status = 'done', done_at = now()")
        after = outbox_on(empty_dsn, "maintain", "--retention", "0s")
        assert after.returncode == 0 and "retired 2 (" in after.stdout, after.stdout
        assert "replay" not in after.stdout


def test_a_replay_whose_session_ended_holds_nothing_off(empty_dsn: str) -> None:
    """A replay killed in its second batch (SIGKILL: its session ends, never resumed): the
    next run retires p1 as it would have without it."""
    with (
        psycopg.connect(empty_dsn, autocommit=True) as conn,
        psycopg.connect(empty_dsn) as blocker,
    ):
        _delivered(empty_dsn, conn)
        blocker.execute("SELECT FROM outbox WHERE id = 60 FOR UPDATE")
        replaying = _replaying(
            empty_dsn, "replay", "--since", "1h", "--until", "0s", "--batch", "40", "--yes"
        )
        try:
            wait_until_db(conn, ROW_WAIT)
        finally:
            replaying.kill()
            replaying.wait()
        blocker.rollback()
        wait_until_db(conn, "NOT EXISTS (SELECT FROM pg_locks WHERE locktype = 'advisory')")
        ran = outbox_on(empty_dsn, "maintain", "--retention", "0s")
        assert ran.returncode == 0, ran.stderr
        assert re.search(r"retired 1 \(~?100 rows\)", ran.stdout), ran.stdout
        assert "replay" not in ran.stdout


def test_a_reconcile_replay_holds_retirement_off_while_it_runs(empty_dsn: str) -> None:
    """`outbox reconcile --replay` sends through the same batches, and holds the replays
    lock as `outbox replay` does: while its batch waits for a row (id 60 locked), a run of
    `outbox maintain` let in keeps p1. It held only its batch's hold on the run's lock."""
    from outbox import inbox

    with (
        psycopg.connect(empty_dsn, autocommit=True) as conn,
        psycopg.connect(empty_dsn) as blocker,
    ):
        _delivered(empty_dsn, conn)
        inbox.migrate(conn)
        blocker.execute("SELECT FROM outbox WHERE id = 60 FOR UPDATE")
        replaying = _replaying(
            empty_dsn, "reconcile", "--inbox-dsn", empty_dsn, "--inbox-table", "outbox_inbox",
            "--consumer", "billing", "--since", "1h", "--until", "0s", "--replay", "--yes",
        )  # fmt: skip
        try:
            wait_until_db(conn, ROW_WAIT)
            # The batch's shared hold of the run's lock, and the replay's of the replays lock.
            holds = conn.execute(
                "SELECT count(*) FROM pg_locks AS l JOIN pg_locks AS w USING (pid)"
                " WHERE l.locktype = 'advisory' AND l.granted AND l.mode = 'ShareLock'"
                " AND w.locktype = 'transactionid' AND NOT w.granted"
            ).fetchone()
            assert holds == (2,)
            # A run now keeps p1 (retiring it, its DETACH would wait for the batch, for as
            # long as the statement timeout a run sets).
            with psycopg.connect(
                empty_dsn, autocommit=True, options="-c statement_timeout=5s"
            ) as run_conn:
                done = _held_run(run_conn)
            blocker.rollback()
            out, err = replaying.communicate(timeout=60)
        finally:
            replaying.kill()
            replaying.wait()
        assert done.retired == [] and done.held_off is not None, done
        assert done.held_off.startswith(
            "kept outbox_p0, outbox_p1, finished for the retention: a replay"
        )
        assert replaying.returncode == 0, err
        sent = conn.execute("SELECT count(*) FROM outbox WHERE replay = 1").fetchone()
        assert sent == (250,), (out, err)


def _held_run(conn: psycopg.Connection[Any]) -> Any:
    """What a run's retirement does beside a replay running, begun past the run's lock (the
    batch waiting holds it shared): the steps after it, as `maintain` runs them."""
    from datetime import timedelta

    from outbox.operations.partition_maintenance import _end, _maintaining, _Session
    from outbox.runner import perform, step

    session = _Session()
    try:
        return perform(conn, _maintaining(TABLE, timedelta(0), session))
    finally:
        perform(conn, step(_end(TABLE, session)))


def test_a_replay_that_sent_fewer_than_confirmed_says_so(empty_dsn: str) -> None:
    """Ten rows of the window deleted while the replay's second batch waits (as `outbox
    purge` would): it sends 240 of the 250 confirmed, and its closing line says how many it
    did not send and why, where it said only `sent 240 messages again`."""
    with (
        psycopg.connect(empty_dsn, autocommit=True) as conn,
        psycopg.connect(empty_dsn) as blocker,
    ):
        _delivered(empty_dsn, conn)
        blocker.execute("SELECT FROM outbox WHERE id = 60 FOR UPDATE")
        replaying = _replaying(
            empty_dsn, "replay", "--since", "1h", "--until", "0s", "--batch", "40", "--yes"
        )
        try:
            wait_until_db(conn, ROW_WAIT)
            conn.execute("DELETE FROM outbox WHERE id BETWEEN 150 AND 159")
            blocker.rollback()
            out, err = replaying.communicate(timeout=60)
        finally:
            replaying.kill()
            replaying.wait()
        assert replaying.returncode == 0, err
        assert out.startswith("outbox: replay 1: sent 240 messages again in 6 batches"), out
        assert out.endswith(
            "; 10 of the 250 confirmed not sent: they no longer matched when their batch came "
            "(sent again by another replay, requeued, or deleted: `outbox purge`, a partition "
            "dropped by hand)\n"
        ), out
