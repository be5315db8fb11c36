"""The partitioned outbox and the incident tools as a user meets them: `outbox partitions`,
`outbox maintain`, the conversion, `outbox replay` and `outbox reconcile`, run as commands on a
real server. What they print agrees with the table, whatever state its statistics are in; no
unfinished row is left out of the table; hostile names, roles without the owner's rights,
Ctrl-C and Ctrl-D, a closed pipe and a held lock each end in one line with its exit code."""

from __future__ import annotations

import json
import re
import shlex
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from datetime import datetime
from typing import Any

import psycopg
import pytest
from helpers import interrupt_once_waiting, interruptible, seed
from helpers import outbox_on as outbox
from psycopg import sql
from psycopg.conninfo import make_conninfo
from test_replay import _on_terminal as on_terminal

from outbox import Event, enqueue_many
from outbox.partitions import RETIRING_MARK, Layout, upkeep_lock
from outbox.schema import migrate
from outbox.table import Table

TABLE = Table.parse("outbox")


def test_done_rows_agree_with_the_table_when_the_statistics_are_stale(empty_dsn: str) -> None:
    """The first `outbox maintain` analyzes the partitions while they are empty (0 rows, as
    far as the planner knows); rows written and delivered before autovacuum analyzes them
    again were listed `~0` and retired as `0 rows` (the operator's purged total with them)."""
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        migrate(conn, TABLE, layout=Layout(100, 3))
        first = outbox(empty_dsn, "maintain")
        assert first.returncode == 0, first.stderr
        # Stale until a run of maintenance analyzes them: an autovacuum between the two
        # listings below made the second one the estimate (`~99`) where the first counted.
        for k in range(4):
            conn.execute(f"ALTER TABLE outbox_p{k} SET (autovacuum_enabled = false)")
        seed(conn, 250)
        conn.execute("UPDATE outbox SET status = 'done', done_at = now()")
        # What those writes changed reaches the statistics the commands read once this
        # session is idle (in a second or so otherwise).
        conn.execute("SELECT pg_stat_force_next_flush()")
        listing = outbox(empty_dsn, "partitions", "--json")
        assert listing.returncode == 0, listing.stderr
        by_name = {p["name"]: p for p in json.loads(listing.stdout)["partitions"]}
        assert [by_name[f"outbox_p{k}"]["done_estimate"] for k in range(3)] == [99, 100, 51]
        assert by_name["outbox_p0"]["done_figure"] == "count"
        text = outbox(empty_dsn, "partitions").stdout.splitlines()
        assert text[1].split()[:6] == ["outbox_p0", "0-99", "0", "0", "0", "99"], text
        retired = outbox(empty_dsn, "maintain", "--retention", "0s")
        assert retired.returncode == 0, retired.stderr
        assert re.search(r"retired 2 \(~?199 rows\)", retired.stdout), retired.stdout
        assert conn.execute("SELECT count(*) FROM outbox").fetchone() == (51,)
        # Analyzed by that run, the partition left is the planner's estimate again.
        after = json.loads(outbox(empty_dsn, "partitions", "--json").stdout)["partitions"]
        assert (after[0]["name"], after[0]["done_estimate"]) == ("outbox_p2", 51)
        assert after[0]["done_figure"] == "estimate"


@pytest.mark.parametrize("command", [["stats"], ["partitions"], ["partitions", "--json"]])
def test_output_piped_into_a_reader_that_left_ends_without_a_traceback(
    empty_dsn: str, command: list[str]
) -> None:
    """`outbox stats | head -3`: the reader closes the pipe before the command writes. It
    printed a BrokenPipeError's traceback; it ends quietly, as a SIGPIPE would have."""
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        migrate(conn, TABLE, layout=Layout(100, 3))
    run = subprocess.Popen(
        [sys.executable, "-m", "outbox", *command, "--dsn", empty_dsn],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert run.stdout is not None
    run.stdout.close()  # the reader is gone before the first line is written
    _, stderr = run.communicate(timeout=60)
    assert stderr == ""
    assert run.returncode == 128 + signal.SIGPIPE


@pytest.fixture
def worker_role(empty_dsn: str) -> Iterator[str]:
    """A DSN of a role with a worker's grants on a partitioned `outbox` (the parent's, carried
    to its partitions), that neither owns it nor may create tables."""
    name = f"worker_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(name)))
        conn.execute("REVOKE CREATE ON SCHEMA public FROM PUBLIC")
        migrate(conn, TABLE, layout=Layout(100, 2))
        conn.execute(
            sql.SQL(
                "GRANT SELECT, UPDATE ON outbox TO {r}; GRANT SELECT ON outbox_layout, "
                "outbox_destinations TO {r}; GRANT SELECT ON SEQUENCE outbox_id_seq TO {r}"
            ).format(r=sql.Identifier(name))
        )
    try:
        yield make_conninfo(empty_dsn, user=name)
    finally:
        with psycopg.connect(empty_dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP OWNED BY {r}").format(r=sql.Identifier(name)))
            conn.execute(sql.SQL("DROP ROLE {r}").format(r=sql.Identifier(name)))


def test_maintain_by_a_role_that_does_not_own_the_table_changes_nothing_and_says_so(
    empty_dsn: str, worker_role: str
) -> None:
    """A worker's role running `outbox maintain` failed on its first statement with
    PostgreSQL's words for it (`permission denied for schema public`, or `must be owner of
    table outbox_p0` with the PL/pgSQL context of the note), never naming the owner it needs."""
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        seed(conn, 250)  # partitions 3 and 4 are missing ahead
        conn.execute("UPDATE outbox SET status = 'done', done_at = now() WHERE id < 100")
        before = conn.execute("SELECT count(*) FROM pg_inherits").fetchone()
        run = outbox(worker_role, "maintain", "--retention", "0s")
        assert run.returncode == 1, (run.stdout, run.stderr)
        lines = run.stderr.strip().splitlines()
        assert len(lines) == 1, run.stderr
        assert "does not own table outbox" in lines[0] and "run it as postgres" in lines[0]
        assert conn.execute("SELECT count(*) FROM pg_inherits").fetchone() == before
        assert conn.execute("SELECT count(*) FROM outbox").fetchone() == (250,)
        # The upkeep lock was let go: the table's owner runs it at once.
        owner = outbox(empty_dsn, "maintain", "--retention", "0s")
        assert owner.returncode == 0, owner.stderr
        assert re.search(r"made 2 partitions ahead, retired 1 \(~?99 rows\)", owner.stdout), (
            owner.stdout
        )


@pytest.mark.parametrize(
    "revoke, command, said",
    [
        ("REVOKE SELECT ON outbox_layout FROM {r}", ["partitions"],
         "permission denied for table outbox_layout (role {r})"),
        ("REVOKE SELECT ON outbox_layout FROM {r}", ["migrate", "--partition-size", "100"],
         "permission denied for table outbox_layout (role {r})"),
        # Granted on the parent after its partitions were made (`outbox migrate` carries it).
        ("SELECT", ["stats"], "permission denied for table outbox_p0 (role {r})"),
        ("REVOKE SELECT ON SEQUENCE outbox_id_seq FROM {r}", ["partitions"],
         "table outbox cannot be served: role {r} may not read public.outbox_id_seq"),
        ("SELECT", ["maintain"], "role {r} does not own table outbox: "),
    ],
    ids=["partitions", "migrate", "stats", "sequence", "maintain"],
)  # fmt: skip
def test_a_refused_privilege_is_one_plain_line_without_a_class_name(
    empty_dsn: str, worker_role: str, revoke: str, command: list[str], said: str
) -> None:
    """Errors the database raised (and the refusals raised as its errors) were printed after
    the driver's class name: `InsufficientPrivilege: permission denied for table
    outbox_layout`, `SequenceUnreadable: table outbox cannot be served: ...`, `NotTableOwner:
    role ... does not own table outbox`. They are one line of what is wrong, naming the role
    a privilege was refused to."""
    role = psycopg.conninfo.conninfo_to_dict(worker_role)["user"]
    assert isinstance(role, str)
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL(revoke).format(r=sql.Identifier(role)))
    run = outbox(worker_role, *command)
    assert run.returncode == 1, (run.stdout, run.stderr)
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1, run.stderr
    assert lines[0].startswith(f"outbox: error: {said.format(r=role)}"), lines[0]


# A plain name, and names whose partitions' names PostgreSQL's 63 bytes cut short (the
# layout names them `<prefix>_<digest>`), one with a capital, a quote and 2-byte letters.
LONG_NAMES = ["outbox", "t" * 61, 'Ab"' + "é" * 29]


@pytest.mark.parametrize("name", LONG_NAMES, ids=["short", "long", "long-hostile"])
@pytest.mark.parametrize("row", ["finished", "unfinished"])
def test_a_partition_left_detached_by_a_run_is_finished_whatever_the_tables_name(
    empty_dsn: str, name: str, row: str
) -> None:
    """A run killed between its DETACH and its DROP leaves a noted partition attached to
    nothing; the next run drops it, or attaches it back if a row in it is unfinished. Found
    by the name's prefix alone, a long table name's partition was left detached for good
    (its rows out of the table, its space never given back)."""
    table = Table(None, name)
    argument = shlex.split(table.argument)[0]  # `--table` as a shell passes it on
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        migrate(conn, table, layout=Layout(100, 2))
        seed_into(conn, table, 250)
        conn.execute(
            sql.SQL("UPDATE {t} SET status = 'done', done_at = now()").format(t=table.ident)
        )
        noted = outbox(empty_dsn, "maintain", "--table", argument, "--retention", "7d")
        assert "2 finished but within the retention" in noted.stdout, noted.stderr
        first = table.derived_name("p0")
        leaf = Table(None, first).ident
        # A run marks its note retiring just before its detach.
        comment = conn.execute(
            sql.SQL("SELECT obj_description({r}::regclass, 'pg_class')").format(
                r=Table(None, first).regclass_literal
            )
        ).fetchone()
        assert comment is not None
        conn.execute(
            sql.SQL("COMMENT ON TABLE {p} IS {c}").format(p=leaf, c=f"{comment[0]}{RETIRING_MARK}")
        )
        conn.execute(sql.SQL("ALTER TABLE {t} DETACH PARTITION {p}").format(t=table.ident, p=leaf))
        if row == "unfinished":
            conn.execute(sql.SQL("UPDATE {p} SET status = 'pending' WHERE id = 50").format(p=leaf))
        run = outbox(empty_dsn, "maintain", "--table", argument, "--retention", "0s")
        assert run.returncode == 0, run.stderr
        left = conn.execute(
            "SELECT c.relispartition FROM pg_class c WHERE c.relname = %s", (first,)
        ).fetchall()
        if row == "finished":
            assert re.search(r"retired 2 \(~?199 rows\)", run.stdout), run.stdout
            assert left == []
        else:
            assert re.search(r"retired 1 \(~?100 rows\)", run.stdout), run.stdout
            assert left == [(True,)]
            pending = sql.SQL("SELECT id FROM {t} WHERE status = 'pending'").format(t=table.ident)
            assert conn.execute(pending).fetchall() == [(50,)]


def seed_into(conn: psycopg.Connection[Any], table: Table, count: int) -> None:
    events = [Event("order", f"agg-{i}", "Tested", {"n": i}) for i in range(count)]
    with conn.transaction():
        enqueue_many(conn, events, table=table)


def test_a_conversion_stopped_by_hand_says_it_dropped_its_constraint(dsn: str) -> None:
    """Ctrl-C while the conversion waits for its swap's lock: the constraint it validated is
    dropped again, and the one line says so. It said the generic line instead
    (`a conversion to partitions keeps the steps it finished`), which was not what it did."""
    with psycopg.connect(dsn, autocommit=True) as conn, psycopg.connect(dsn) as reader:
        seed(conn, 20)
        conn.execute(  # a stopped run's bound: this run validates it, then waits to swap
            "ALTER TABLE outbox ADD CONSTRAINT outbox_p0_range CHECK (id >= 0 AND id < 5000) "
            "NOT VALID"
        )
        reader.execute("SELECT count(*) FROM outbox")  # holds off the swap's ACCESS EXCLUSIVE
        command = subprocess.Popen(
            [sys.executable, "-m", "outbox", "migrate", "--partition-size", "100", "--dsn", dsn],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            preexec_fn=interruptible,
        )
        try:
            interrupt_once_waiting(conn, command, "LOCK TABLE % IN ACCESS EXCLUSIVE MODE")
            reader.rollback()  # the drop of the constraint may have the lock now
            _, stderr = command.communicate(timeout=60)
        finally:
            command.kill()
        assert command.returncode == 130, stderr
        lines = stderr.strip().splitlines()
        assert len(lines) == 1, stderr
        assert lines[0] == (
            "outbox: error: table outbox: interrupted; the CHECK outbox_p0_range was dropped "
            "again: the table is as it was"
        )
        left = conn.execute(
            "SELECT count(*) FROM pg_constraint WHERE conname = 'outbox_p0_range'"
        ).fetchone()
        assert left == (0,)
        assert conn.execute("SELECT relkind FROM pg_class WHERE relname = 'outbox'").fetchone() == (
            "r",
        )


@pytest.mark.parametrize("command", ["replay", "reconcile"])
def test_ctrl_d_at_the_typed_confirmation_sends_nothing_in_one_line(dsn: str, command: str) -> None:
    """Ctrl-D (the end of the input) at `type N to confirm:` ended in an EOFError traceback;
    it is no answer, as a wrong count: nothing sent, one line, exit 1."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        seed(conn, 5)
        conn.execute("UPDATE outbox SET status = 'done', done_at = now()")
        window = ["--since", "1h", "--until", "0s"]
        if command == "reconcile":  # an inbox that recorded none of them: all 5 are missing
            conn.execute("CREATE SCHEMA receiver")
            migrated = outbox(dsn, "inbox", "migrate", "--table", "receiver.inbox")
            assert migrated.returncode == 0, migrated.stderr
            window += ["--inbox-dsn", dsn, "--inbox-table", "receiver.inbox", "--replay"]
            conn.execute("INSERT INTO receiver.inbox (consumer, message_id) VALUES ('b', 'x')")
        code, seen = on_terminal([command, "--dsn", dsn, *window], "\x04")
        assert code == 1, seen
        assert "Traceback" not in seen and "EOFError" not in seen, seen
        assert seen.splitlines()[-1] == "outbox: error: not confirmed: nothing sent", seen
        statuses = conn.execute("SELECT status, count(*) FROM outbox GROUP BY 1").fetchall()
        assert statuses == [("done", 5)]


def test_a_detach_left_pending_with_an_unfinished_row_is_attached_back(empty_dsn: str) -> None:
    """A run stopped while its DETACH ... CONCURRENTLY waited for a replay's batch leaves
    the partition pending detach; the batch then commits its row pending and takes
    maintenance's note off. The next run finished the detach and, the partition carrying no
    note, left it out of the table with its pending row in it: never delivered."""
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        migrate(conn, TABLE, layout=Layout(100, 2))
        seed(conn, 250)
        conn.execute("UPDATE outbox SET status = 'done', done_at = now()")
        noted = outbox(empty_dsn, "maintain", "--retention", "7d")
        assert "2 finished but within the retention" in noted.stdout, noted.stderr
        with psycopg.connect(empty_dsn) as batch:  # what a replay's batch does, held open
            batch.execute("UPDATE outbox SET status = 'pending', done_at = NULL WHERE id = 50")
            run = subprocess.Popen(
                [sys.executable, "-m", "outbox", "maintain", "--retention", "0s", "--dsn",
                 empty_dsn],
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                preexec_fn=interruptible,
            )  # fmt: skip
            try:
                interrupt_once_waiting(conn, run, "%DETACH PARTITION%CONCURRENTLY")
                assert run.wait(timeout=60) == 130
            finally:
                run.kill()
            batch.execute("COMMENT ON TABLE outbox_p0 IS NULL")
        pending = conn.execute(
            "SELECT inhdetachpending FROM pg_inherits WHERE inhrelid = 'outbox_p0'::regclass"
        ).fetchone()
        assert pending == (True,)
        again = outbox(empty_dsn, "maintain", "--retention", "0s")
        assert again.returncode == 0, again.stderr
        assert conn.execute("SELECT status FROM outbox WHERE id = 50").fetchone() == ("pending",)
        assert conn.execute("SELECT count(*) FROM outbox WHERE id < 100").fetchone() == (99,)


def test_maintain_that_gives_up_on_the_upkeep_lock_names_that_lock(empty_dsn: str) -> None:
    """`outbox maintain` waits for the upkeep lock a worker's keeper (or another run) holds,
    bounded by --lock-timeout. Giving up, it blamed a lock on the table: `a LOCK TABLE, a
    migration or a long transaction`, none of which holds it up."""
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        migrate(conn, TABLE, layout=Layout(100, 2))
        conn.execute(sql.SQL("SELECT pg_advisory_lock({key})").format(key=upkeep_lock(TABLE)))
        run = outbox(empty_dsn, "maintain", "--lock-timeout", "200ms")
    assert run.returncode == 1, run.stderr
    waited, gave_up = run.stderr.strip().splitlines()
    assert waited.startswith("outbox: waiting for the partition upkeep lock of table outbox")
    assert gave_up.startswith(
        "outbox: error: gave up after waiting 200ms for the partition upkeep lock of table outbox"
    ), gave_up
    assert "LOCK TABLE" not in gave_up


@pytest.mark.parametrize("written", ["last tuesday", "2026-12-01T10:00:00"])
def test_a_note_whose_time_is_no_time_is_taken_for_none(empty_dsn: str, written: str) -> None:
    """A partition's comment that starts as maintenance's note but gives no time with its
    offset (written by hand, or copied): `outbox partitions` and `outbox maintain` ended in
    a ValueError (or, for a time without offset, a TypeError) traceback. It is no note: the
    run notes the partition anew."""
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        migrate(conn, TABLE, layout=Layout(100, 2))
        seed(conn, 150)
        conn.execute("UPDATE outbox SET status = 'done', done_at = now()")
        comment = f"outbox-dispatcher: nothing unfinished since {written}"
        conn.execute(sql.SQL("COMMENT ON TABLE outbox_p0 IS {c}").format(c=sql.Literal(comment)))
        listing = outbox(empty_dsn, "partitions", "--json")
        assert listing.returncode == 0, listing.stderr
        first = json.loads(listing.stdout)["partitions"][0]
        assert (first["name"], first["retirable"], first["done_since"]) == ("outbox_p0", True, None)
        run = outbox(empty_dsn, "maintain", "--retention", "1h")
        assert run.returncode == 0, run.stderr
        assert "1 finished but within the retention of 1h" in run.stdout, run.stdout
        noted = conn.execute("SELECT obj_description('outbox_p0'::regclass)").fetchone()
        assert noted is not None and noted[0] != comment
        assert datetime.fromisoformat(noted[0].rsplit(" ", 1)[1]).tzinfo is not None
