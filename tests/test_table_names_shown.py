"""A table's name is shown escaped (`outbox.table.shown`) on every line that names it: the
errors a command raises, what `outbox migrate` says it made, the inbox commands' lines,
the producer's refusal. A quoted identifier may hold a line break, an ESC, a right-to-left
override and a backslash; raw, the name would break the line, send the terminal commands,
or (the four characters `\\x07`) show as another name."""

from __future__ import annotations

import re
from datetime import timedelta

import psycopg
import pytest
from helpers import outbox_on as outbox

from outbox import enqueue
from outbox.operations.partition_maintenance import UpkeepBusy, maintain
from outbox.partitions import Layout, upkeep_lock
from outbox.producer import OutOfPartitions
from outbox.schema import migrate
from outbox.table import Table, shown, shown_argument

ODD = "out\nbox\x1b[2J\u202exob\\x07"
ODD_SHOWN = r"out\nbox\x1b[2J\u202exob\\x07"
# What a line must not hold: line breaks, controls, the bidirectional overrides.
CONTROL = re.compile(r"[\x00-\x09\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def _one_line(text: str) -> str:
    [line] = text.splitlines()
    assert not CONTROL.search(line), repr(line)
    return line


def test_shown_escapes_the_name_as_the_lines_below_expect():
    assert shown(Table(None, ODD)) == ODD_SHOWN


def test_migrate_names_what_it_made_escaped(empty_dsn):
    table = Table(None, ODD)
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        migrate(conn, table)
        trigger = psycopg.sql.Identifier(f"{ODD}_notify")
        conn.execute(psycopg.sql.SQL("DROP TRIGGER {} ON {}").format(trigger, table.ident))
    done = outbox(empty_dsn, "migrate", "--table", ODD, "--ordering", "aggregate")
    assert done.returncode == 0, done.stderr
    line = _one_line(done.stdout)
    assert f"made the NOTIFY trigger {ODD_SHOWN}_notify" in line, line
    assert f"built ordered mode's index {ODD_SHOWN}_" in line, line


def test_a_missing_table_is_named_escaped(empty_dsn):
    missing = outbox(empty_dsn, "stats", "--table", ODD)
    assert missing.returncode == 1, missing
    line = _one_line(missing.stderr)
    assert f"table {ODD_SHOWN} does not exist; run `outbox migrate --table $'" in line, line


def test_a_table_that_is_no_outbox_table_is_named_escaped(empty_dsn):
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        conn.execute(psycopg.sql.SQL("CREATE TABLE {} (x int)").format(Table(None, ODD).ident))
    refused = outbox(empty_dsn, "migrate", "--table", ODD)
    assert refused.returncode == 1, refused
    line = _one_line(refused.stderr)
    assert f"table {ODD_SHOWN} exists but is not an outbox table" in line, line


def test_the_inbox_commands_name_the_table_escaped(empty_dsn):
    missing = outbox(empty_dsn, "inbox", "purge", "--table", ODD)
    assert missing.returncode == 1, missing
    line = _one_line(missing.stderr)
    assert f"inbox table {ODD_SHOWN} does not exist" in line, line

    assert outbox(empty_dsn, "inbox", "migrate", "--table", ODD).returncode == 0
    ready = outbox(empty_dsn, "inbox", "check", "--table", ODD)
    assert ready.returncode == 0, ready.stderr
    assert _one_line(ready.stdout).startswith(f"{ODD_SHOWN}: ready"), ready.stdout
    purged = outbox(empty_dsn, "inbox", "purge", "--table", ODD, "--older-than", "0s")
    assert purged.returncode == 0, purged.stderr
    line = _one_line(purged.stdout)
    assert line.startswith(f"{ODD_SHOWN}: deleted 0 message ids"), line


def test_an_outbox_table_is_refused_as_an_inbox_by_its_escaped_name(empty_dsn):
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        migrate(conn, Table(None, ODD))
    refused = outbox(empty_dsn, "inbox", "migrate", "--table", ODD)
    assert refused.returncode == 1, refused
    line = _one_line(refused.stderr)
    assert f"{ODD_SHOWN} is an outbox table, not an inbox table" in line, line


def test_the_producer_names_a_table_out_of_partitions_escaped(empty_dsn):
    table = Table(None, ODD)
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        migrate(conn, table, layout=Layout(100, 1))
        conn.execute(
            psycopg.sql.SQL("SELECT setval(pg_get_serial_sequence({t}, 'id'), 1000000)").format(
                t=table.regclass_literal
            )
        )
        with pytest.raises(OutOfPartitions) as refused:
            enqueue(conn, aggregate_type="a", aggregate_id="1", event_type="E", payload={},
                    table=table)  # fmt: skip
    said = str(refused.value)
    assert not CONTROL.search(said), repr(said)
    assert said.startswith(f"table {ODD_SHOWN} has no partition for id 1000001"), said
    assert f"run `outbox maintain --table {shown_argument(table)}` now" in said, said


def test_a_replay_never_recorded_names_the_table_escaped(empty_dsn):
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        migrate(conn, Table(None, ODD))
    never = outbox(empty_dsn, "replay", "--table", ODD, "--resume", "5", "--yes")
    assert never.returncode == 1, never
    line = _one_line(never.stderr)
    assert f"replay 5 recorded no batch in {ODD_SHOWN}'s audit log" in line, line


def test_a_missing_inbox_table_is_named_escaped(empty_dsn):
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        migrate(conn, Table(None, ODD))
    no_inbox = outbox(
        empty_dsn, "reconcile", "--table", ODD, "--inbox-dsn", empty_dsn,
        "--inbox-table", ODD + "i", "--consumer", "c", "--since", "1h", "--until", "0s",
    )  # fmt: skip
    assert no_inbox.returncode == 1, no_inbox
    line = _one_line(no_inbox.stderr)
    assert f"inbox table {ODD_SHOWN}i does not exist at the --inbox-dsn" in line, line


def test_a_keepers_skipped_round_names_the_table_escaped(empty_dsn):
    table = Table(None, ODD)
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        migrate(conn, table, layout=Layout(100, 2))
        # A keeper's round while another session holds the upkeep lock: skipped, said so.
        with psycopg.connect(empty_dsn, autocommit=True) as holder:
            holder.execute(
                psycopg.sql.SQL("SELECT pg_advisory_lock({key})").format(key=upkeep_lock(table))
            )
            with pytest.raises(UpkeepBusy) as busy:
                maintain(conn, table, retention=timedelta(days=7))
    said = str(busy.value)
    assert not CONTROL.search(said), repr(said)
    assert said.startswith(f"the partition upkeep lock of table {ODD_SHOWN} is held"), said


def test_a_role_that_does_not_own_the_table_is_refused_by_its_escaped_name(empty_dsn):
    table = Table(None, ODD)
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        migrate(conn, table, layout=Layout(100, 2))
        conn.execute(
            "DO $$BEGIN CREATE ROLE shown_maintainer LOGIN PASSWORD 'm';"
            " EXCEPTION WHEN duplicate_object THEN NULL; END$$"
        )
        # All it needs but the table's ownership.
        conn.execute("GRANT ALL ON ALL TABLES IN SCHEMA public TO shown_maintainer")
        conn.execute("GRANT ALL ON ALL SEQUENCES IN SCHEMA public TO shown_maintainer")
        other = psycopg.conninfo.make_conninfo(
            conn.info.dsn, user="shown_maintainer", password="m", dbname=conn.info.dbname
        )
    refused = outbox(other, "maintain", "--table", ODD)
    assert refused.returncode == 1, refused
    line = _one_line(refused.stderr)
    assert f"role shown_maintainer does not own table {ODD_SHOWN}: outbox maintain" in line, line
