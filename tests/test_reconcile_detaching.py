"""`outbox reconcile` on a partitioned table with a partition an interrupted `outbox
maintain` left pending detach. While it is so the table leaves its rows out: the comparison
counted the other partitions' delivered rows only, never found that partition's messages
missing from the inbox, and counted the keys the inbox holds of them extra (no such row),
and exited 0 as if it had compared the window. It says, as a replay does, which partition is
half detached and to run `outbox maintain`, then the comparison again."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import datetime, timedelta

import psycopg
from helpers import outbox_on as outbox
from helpers import wait_until_db
from test_replay_preview_detaching import _delivered, _left_half_detached
from test_replay_preview_detaching import _refusal as replay_refusal

from outbox import inbox
from outbox.operations import reconcile
from outbox.operations.partition_maintenance import run_lock
from outbox.table import Table

TABLE = Table.parse("outbox")


def _delivered_but_missing(conn: psycopg.Connection[tuple[object, ...]]) -> datetime:
    """`_delivered`'s rows 1 to 250, the inbox holding all but 5 of p0's (10 to 14) and 30
    of p1's (120 to 149); the database's now."""
    now = _delivered(conn)
    inbox.migrate(conn)
    missing = [*range(10, 15), *range(120, 150)]
    conn.cursor().executemany(
        "INSERT INTO outbox_inbox (consumer, message_id) VALUES ('billing', %s)",
        [(str(i),) for i in range(1, 251) if i not in missing],
    )
    return now


def _refusal(partition: str) -> str:
    return replay_refusal(partition, then="run this comparison again")


def test_a_reconcile_across_a_half_detached_partition_says_so(empty_dsn: str):
    """Rows 1 to 250 delivered (partitions of 100 ids), the inbox holding all but 5 of p0's
    and 30 of p1's; p1 pending detach. The comparison said 150 delivered, 5 missing and 70
    extra (p1's keys: no row through the table). It refuses instead, sends nothing, and once
    `outbox maintain` has finished the detach compares what the table holds."""
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        now = _delivered_but_missing(conn)
        _left_half_detached(empty_dsn, conn, "outbox_p1")
        since, until = now - timedelta(hours=4), now + timedelta(minutes=1)
        args = (
            "reconcile", "--inbox-dsn", empty_dsn, "--inbox-table", "outbox_inbox",
            "--consumer", "billing", "--since", since.isoformat(), "--until", until.isoformat(),
        )  # fmt: skip

        refused = outbox(empty_dsn, *args)
        assert (refused.returncode, refused.stdout, refused.stderr) == (
            1,
            "",
            _refusal("outbox_p1"),
        ), refused
        as_json = outbox(empty_dsn, *args, "--json")
        assert (as_json.returncode, as_json.stdout, as_json.stderr) == (
            1,
            "",
            _refusal("outbox_p1"),
        ), as_json
        sending = outbox(empty_dsn, *args, "--replay", "--yes")
        assert (sending.returncode, sending.stderr) == (1, _refusal("outbox_p1")), sending
        assert conn.execute("SELECT count(*) FROM outbox_actions").fetchone() == (0,)
        assert conn.execute("SELECT count(*) FROM outbox WHERE status <> 'done'").fetchone() == (0,)

        # A row of p1 unfinished (requeued): the run finishing the detach attaches p1 back.
        conn.execute("UPDATE outbox_p1 SET status = 'pending' WHERE id = 100")
        finished = outbox(empty_dsn, "maintain", "--retention", "7d")
        assert finished.returncode == 0, finished.stderr
        compared = outbox(empty_dsn, *args)
        assert compared.returncode == 0, compared.stderr
        assert compared.stdout.splitlines()[0].endswith(
            ": 249 delivered from " + f"{since.isoformat()} to {until.isoformat()}; consumer "
            "billing: 35 missing, 1 extra, 0 keys that are no id"
        ), compared.stdout
        assert compared.stdout.splitlines()[2:] == [
            "missing ids: 10-14, 120-149",
            "extra keys (in the inbox, not delivered in the window): 100",
        ]


def test_a_reconcile_waits_for_a_run_of_maintain_detaching_a_partition(empty_dsn: str):
    """A run of `outbox maintain` retiring p1 (its lock held, p1 detached, out of the table)
    while a comparison begins: the comparison read past p1 (150 delivered, its inbox keys
    extra), though the run then attached p1 back. It waits for the run to end, as a replay's
    batch does, and counts p1's rows."""
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        now = _delivered(conn)
        inbox.migrate(conn)
        conn.cursor().executemany(
            "INSERT INTO outbox_inbox (consumer, message_id) VALUES ('billing', %s)",
            [(str(i),) for i in range(1, 251) if i != 150],
        )
        since, until = now - timedelta(hours=4), now + timedelta(minutes=1)
        with psycopg.connect(empty_dsn, autocommit=True) as run:
            key = run_lock(TABLE).as_string(run)
            run.execute(f"SELECT pg_advisory_lock({key})")  # as a run holds it
            # The run has detached p1 (its DETACH ... CONCURRENTLY, then FINALIZE) and looks
            # in it before dropping it.
            _left_half_detached(empty_dsn, conn, "outbox_p1")
            run.execute("ALTER TABLE outbox DETACH PARTITION outbox_p1 FINALIZE")
            comparing = subprocess.Popen(
                [
                    sys.executable, "-m", "outbox", "reconcile", "--dsn", empty_dsn,
                    "--inbox-dsn", empty_dsn, "--inbox-table", "outbox_inbox",
                    "--since", since.isoformat(), "--until", until.isoformat(), "--json",
                ],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )  # fmt: skip
            try:
                wait_until_db(
                    conn,
                    "EXISTS (SELECT FROM pg_locks WHERE locktype = 'advisory' AND NOT granted)",
                )
                # It finds a row of p1 unfinished and attaches it back, then ends.
                run.execute("UPDATE outbox_p1 SET status = 'pending' WHERE id = 199")
                run.execute(
                    "ALTER TABLE outbox ATTACH PARTITION outbox_p1 FOR VALUES FROM (100) TO (200)"
                )
                run.execute(f"SELECT pg_advisory_unlock({key})")
                out, err = comparing.communicate(timeout=60)
            finally:
                comparing.kill()
                comparing.wait()
        assert comparing.returncode == 0, err
        found = json.loads(out)
        assert found["delivered"] == 249
        assert found["missing"]["ranges"] == [[150, 150]]
        assert found["extra"]["ranges"] == [[199, 199]]


def test_a_resumed_reconcile_replay_across_a_half_detached_partition_says_how_to_go_on(
    empty_dsn: str,
):
    """Replay 1 of `outbox reconcile --replay` stopped after 3 of the 35 missing messages,
    then p1 left pending detach: the resume read past p1 and sent p0's missing messages only,
    and ended as if it had sent all. It refuses, saying to go on under the same number."""
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        now = _delivered_but_missing(conn)
        since, until = now - timedelta(hours=4), now + timedelta(minutes=1)
        inbox_table = Table.parse("outbox_inbox")
        with reconcile.connect_inbox(empty_dsn) as reader:
            found = reconcile.compare(
                conn, TABLE, reader, inbox_table, consumer="billing", since=since, until=until
            )
            assert found.missing == 35
            progress = reconcile.start_replay(conn, TABLE, found, inbox_table)
            progress.left = 3  # stopped after its first batch of 3
            reconcile.replay_missing(conn, TABLE, reader, inbox_table, progress, actor="test")
        assert progress.sent == 3
        _left_half_detached(empty_dsn, conn, "outbox_p1")

        resumed = outbox(
            empty_dsn, "reconcile", "--inbox-dsn", empty_dsn, "--inbox-table", "outbox_inbox",
            "--resume", "1", "--yes",
        )  # fmt: skip
        assert resumed.returncode == 1, resumed
        assert resumed.stderr == (
            "outbox: error: partition outbox_p1 of table outbox is half detached (a run of "
            "outbox maintain was interrupted), so its rows cannot be read through the table; "
            "run `outbox maintain --table outbox` to finish it, then go on with `outbox "
            "reconcile --table outbox --inbox-table outbox_inbox --resume 1` and the same "
            "--inbox-dsn\n"
        )
        sent = conn.execute("SELECT array_agg(id ORDER BY id) FROM outbox WHERE replay = 1")
        assert sent.fetchone() == ([10, 11, 12],)
