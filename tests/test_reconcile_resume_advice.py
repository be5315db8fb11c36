"""`outbox reconcile --replay` refused between two batches of one chunk: a partition an
interrupted `outbox maintain` left pending detach in what the chunk still had to send. The
refusal told the user to go on with `outbox replay --resume N`, which refuses a reconcile's
replay and points on to `outbox reconcile --resume N`: two commands to reach the one that
goes on. It names the reconcile's own resume, once."""

from __future__ import annotations

import subprocess
import sys
from datetime import timedelta

import psycopg
from helpers import outbox_on as outbox
from helpers import seed, wait_until_db
from test_replay_preview_detaching import _left_half_detached

from outbox import inbox
from outbox.partitions import Layout
from outbox.schema import migrate
from outbox.table import Table

TABLE = Table.parse("outbox")


def test_a_reconcile_replay_stopped_between_batches_names_its_own_resume(empty_dsn: str):
    """Rows 1 to 2500 delivered (partitions of 1000 ids), none in the inbox: one chunk of
    2500 missing, sent in batches of 1000. While the first batch waits for a row lock, p2
    (ids 2000 to 2999) is left pending detach: the second batch stops there, and says to go
    on with the reconcile's resume, which then sends the rest."""
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        migrate(conn, TABLE, layout=Layout(1000, 2))
        seed(conn, 2500)
        conn.execute("UPDATE outbox SET status = 'done', done_at = now()")
        inbox.migrate(conn)
        now = conn.execute("SELECT now()").fetchone()
        assert now is not None
        since, until = now[0] - timedelta(hours=1), now[0] + timedelta(minutes=1)
        with psycopg.connect(empty_dsn) as blocker:
            blocker.execute("SELECT FROM outbox WHERE id = 1000 FOR UPDATE")  # in the 1st batch
            replaying = subprocess.Popen(
                [
                    sys.executable, "-m", "outbox", "reconcile", "--dsn", empty_dsn,
                    "--inbox-dsn", empty_dsn, "--inbox-table", "outbox_inbox",
                    "--consumer", "billing", "--since", since.isoformat(),
                    "--until", until.isoformat(), "--replay", "--yes",
                ],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )  # fmt: skip
            try:
                # The first batch (ids 1 to 1000) waits for the row: the chunk was read, the
                # batch found no partition pending detach.
                wait_until_db(
                    conn,
                    "EXISTS (SELECT FROM pg_locks WHERE locktype = 'transactionid' "
                    "AND NOT granted)",
                )
                _left_half_detached(empty_dsn, conn, "outbox_p2")
                blocker.rollback()  # the first batch commits; the second finds p2
                out, err = replaying.communicate(timeout=60)
            finally:
                replaying.kill()
                replaying.wait()
        assert (replaying.returncode, out) == (1, ""), (out, err)
        assert err == (
            "outbox: error: replay 1: partition outbox_p2 of table outbox is half detached (a "
            "run of outbox maintain was interrupted), so its rows cannot be read through the "
            "table; run `outbox maintain --table outbox` to finish it, then go on with `outbox "
            "reconcile --table outbox --inbox-table outbox_inbox --resume 1` and the same "
            "--inbox-dsn\n"
        )
        sent = conn.execute("SELECT count(*), max(id) FROM outbox WHERE replay = 1").fetchone()
        assert sent == (1000, 1000)

        # What it says works: the detach finished (a row of p2 unfinished, it attaches p2
        # back), the resume sends the other 1500.
        conn.execute("UPDATE outbox SET status = 'pending' WHERE id = 2000")
        finished = outbox(empty_dsn, "maintain", "--retention", "7d")
        assert finished.returncode == 0, finished.stderr
        conn.execute("UPDATE outbox SET status = 'done' WHERE id = 2000")
        resumed = outbox(
            empty_dsn, "reconcile", "--table", "outbox", "--inbox-table", "outbox_inbox",
            "--resume", "1", "--inbox-dsn", empty_dsn, "--yes",
        )  # fmt: skip
        assert resumed.returncode == 0, resumed.stderr
        assert (
            resumed.stdout.splitlines()[-1] == "outbox: replay 1: sent 1500 missing messages again"
        )
        assert conn.execute("SELECT count(*) FROM outbox WHERE replay = 1").fetchone() == (2500,)
