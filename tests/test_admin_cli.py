"""`outbox requeue` and `outbox skip` as subprocesses: how many rows changed, fenced and
recorded like the TUI's actions, one-line usage errors with exit code 2; and `outbox
migrate` upgrading a v1 table in place."""

from __future__ import annotations

import os
import subprocess
import sys

import psycopg
import pytest
from helpers import row, seed, statuses

from outbox.operations import repair
from outbox.runner import fetch
from outbox.schema import MIGRATIONS, migration_statements
from outbox.table import Table

BASE_ENV = {k: v for k, v in os.environ.items() if not k.startswith(("OUTBOX_", "PG"))}


def outbox(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "outbox", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**BASE_ENV, **(env or {})},
    )


def _dead(conn, ids: list[int], error: str = "boom") -> None:
    conn.execute(
        "UPDATE outbox SET status = 'dead', attempts = 12, last_error = %s WHERE id = ANY(%s)",
        (error, ids),
    )


def test_requeue_by_id_reports_what_it_left_alone(conn, dsn, table):
    ids = seed(conn, 4)
    _dead(conn, ids[:2])
    result = outbox("requeue", "--dsn", dsn, "--id", f"{ids[0]},{ids[1]}", "--id", str(ids[2]),
                    "--id", "999999")  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert result.stdout == (
        f"outbox: requeued 2 dead messages (left alone, not dead: {ids[2]} (pending); "
        "not found: 999999)\n"
    )
    assert statuses(conn) == {"pending": 4}
    assert row(conn, ids[0])["attempts"] == 0
    [record] = fetch(conn, repair.recent_actions(table))
    assert (record.action, record.count, record.requested) == ("requeue", 2, 2)
    assert record.message_ids == sorted(ids[:2])
    assert record.filter == {"ids": [ids[0], ids[1], ids[2], 999999], "via": "outbox requeue"}


def test_requeue_by_error_and_dry_run(conn, dsn):
    ids = seed(conn, 5)
    _dead(conn, ids[:3], "HTTP 503: busy")
    _dead(conn, ids[3:4], "HTTP 422: invalid")
    dry = outbox("requeue", "--dsn", dsn, "--error", "http 503", "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert dry.stdout == "outbox: would requeue 3 dead messages\n"
    assert statuses(conn) == {"dead": 4, "pending": 1}
    with psycopg.connect(dsn) as other:
        assert fetch(other, repair.recent_actions(Table.parse("outbox"))) == []  # not recorded

    done = outbox("requeue", "--dsn", dsn, "--error", "HTTP 503")
    assert done.stdout == "outbox: requeued 3 dead messages\n"
    assert statuses(conn) == {"dead": 1, "pending": 4}


def test_requeue_all_dead_and_skip(conn, dsn):
    ids = seed(conn, 3)
    _dead(conn, ids)
    skipped = outbox("skip", "--dsn", dsn, "--id", str(ids[0]))
    assert skipped.returncode == 0, skipped.stderr
    assert skipped.stdout == "outbox: skipped 1 dead message\n"
    assert row(conn, ids[0])["status"] == "done"
    again = outbox("skip", "--dsn", dsn, "--id", str(ids[0]), "--dry-run")
    assert (
        again.stdout
        == f"outbox: would skip 0 dead messages (left alone, not dead: {ids[0]} (done))\n"
    )
    everything = outbox("requeue", "--dsn", dsn, "--all-dead")
    assert everything.stdout == "outbox: requeued 2 dead messages\n"
    assert statuses(conn) == {"done": 1, "pending": 2}
    none_left = outbox("requeue", "--dsn", dsn, "--all-dead")
    assert none_left.stdout == "outbox: requeued 0 dead messages\n"


def test_requeue_a_schema_qualified_table(empty_dsn):
    assert outbox("migrate", "--dsn", empty_dsn, "--table", "app.events").returncode == 0
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        conn.execute("INSERT INTO app.events (aggregate_type, aggregate_id, event_type, payload, "
                     "status) VALUES ('a', '1', 'E', '{}', 'dead')")  # fmt: skip
    result = outbox("requeue", "--dsn", empty_dsn, "--table", "app.events", "--all-dead")
    assert result.stdout == "app.events: requeued 1 dead message\n"
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        assert conn.execute("SELECT count(*) FROM app.events_actions").fetchone() == (1,)


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["requeue", "--dsn", "host=x"], "--id --error --all-dead"),
        (["requeue", "--dsn", "host=x", "--id", "1", "--all-dead"], "--all-dead"),
        (["requeue", "--dsn", "host=x", "--id", "x"], "--id"),
        (["requeue", "--dsn", "host=x", "--id", "0"], "--id"),
        (["skip", "--dsn", "host=x"], "--id"),
        (["skip", "--dsn", "host=x", "--error", "x"], "--id"),  # skip takes ids only
        (["migrate", "--dsn", "host=x", "--ordering", "sideways"], "--ordering"),
    ],
)
def test_usage_errors_exit_2_with_one_line(args, named):
    result = outbox(*args)
    assert result.returncode == 2, result
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("outbox: error: ")
    assert named in lines[0]


def test_migrate_reports_v1_to_v3_on_a_v1_table(empty_dsn):
    table = Table.parse("outbox")
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        for statement in migration_statements(table)[: len(MIGRATIONS[0](table)) + 1]:
            conn.execute(statement)
    result = outbox("migrate", "--dsn", empty_dsn)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "outbox: migrated from v1 to v7, for --ordering none\n"
    again = outbox("migrate", "--dsn", empty_dsn)
    assert again.stdout == "outbox: already at schema v7, for --ordering none\n"
