"""The real console scripts as subprocesses: `outbox` (migrate, stats, purge), `outbox-worker`."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import psycopg
import pytest
from helpers import seed, wait_until_db
from workers import stop_worker

from outbox.demo.embedded import free_port
from outbox.schema import REQUIRED_COLUMNS, migrate
from outbox.table import Table

# A clean environment: no OUTBOX_* or PG* variable of the caller's may change what is tested.
BASE_ENV = {k: v for k, v in os.environ.items() if not k.startswith(("OUTBOX_", "PG"))}
UNREACHABLE = "postgresql://u:s3cret@127.0.0.1:1/db"

EXPECTED_TYPES = {
    "id": "bigint",
    "aggregate_type": "text",
    "aggregate_id": "text",
    "event_type": "text",
    "payload": "jsonb",
    "created_at": "timestamp with time zone",
    "status": "text",
    "available_at": "timestamp with time zone",
    "attempts": "integer",
    "lease_owner": "text",
    "lease_until": "timestamp with time zone",
    "lease_version": "bigint",
    "last_error": "text",
    "done_at": "timestamp with time zone",
    "errors": "jsonb",  # v3: the error history
    "headers": "jsonb",  # v4: the producer's metadata
    "replay": "integer",  # v6: the last replay that sent the row again
}
NULLABLE = {
    "lease_owner",
    "lease_until",
    "last_error",
    "done_at",
    "errors",
    "headers",
    "replay",
}
INDEX_SUFFIXES = ("ready", "leased", "waiting", "dead")  # and "aggregate" when ordered


def run(
    module: str, *args: str, env: dict[str, str] | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", module, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**BASE_ENV, **(env or {})},
    )


def outbox(*args: str, **kwargs) -> subprocess.CompletedProcess[str]:
    return run("outbox", *args, **kwargs)


def one_line(text: str) -> str:
    lines = text.splitlines()
    assert len(lines) == 1, f"expected one line, got {len(lines)}: {text!r}"
    assert text.endswith("\n")
    return lines[0]


def columns(conn: psycopg.Connection, regclass: str) -> list[tuple[str, str, bool]]:
    return [
        (str(name), str(type_), bool(not_null))
        for name, type_, not_null in conn.execute(
            "SELECT attname, format_type(atttypid, atttypmod), attnotnull FROM pg_attribute "
            "WHERE attrelid = %s::regclass AND attnum > 0 AND NOT attisdropped ORDER BY attnum",
            (regclass,),
        ).fetchall()
    ]


def indexes(conn: psycopg.Connection, regclass: str) -> set[str]:
    return {
        str(r[0])
        for r in conn.execute(
            "SELECT c.relname FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid "
            "WHERE i.indrelid = %s::regclass",
            (regclass,),
        ).fetchall()
    }


def notify_triggers(conn: psycopg.Connection, regclass: str) -> list[tuple[str, str]]:
    """(trigger name, function name) of the table's AFTER INSERT triggers."""
    return [
        (str(name), str(func))
        for name, func in conn.execute(
            "SELECT t.tgname, p.proname FROM pg_trigger t JOIN pg_proc p ON p.oid = t.tgfoid "
            "WHERE t.tgrelid = %s::regclass AND NOT t.tgisinternal",
            (regclass,),
        ).fetchall()
    ]


def comment(conn: psycopg.Connection, regclass: str) -> str | None:
    row = conn.execute("SELECT obj_description(%s::regclass, 'pg_class')", (regclass,)).fetchone()
    return row[0] if row else None


# -- migrate ---------------------------------------------------------------------------------


def test_migrate_creates_the_contract_table_and_is_idempotent(empty_dsn):
    first = outbox("migrate", "--dsn", empty_dsn)
    assert first.returncode == 0, first.stderr
    assert first.stdout == "outbox: migrated from v0 to v7, for --ordering none\n"
    assert first.stderr == ""

    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        cols = columns(conn, "outbox")
        assert [c[0] for c in cols] == [*REQUIRED_COLUMNS, "errors", "headers", "replay"]
        assert {name: type_ for name, type_, _ in cols} == EXPECTED_TYPES
        assert {name for name, _, not_null in cols if not not_null} == NULLABLE
        identity = conn.execute(
            "SELECT attidentity FROM pg_attribute WHERE attrelid = 'outbox'::regclass "
            "AND attname = 'id'"
        ).fetchone()
        assert identity == ("a",)  # GENERATED ALWAYS
        assert indexes(conn, "outbox") == {"outbox_pkey"} | {
            f"outbox_{suffix}" for suffix in INDEX_SUFFIXES
        }
        assert notify_triggers(conn, "outbox") == [("outbox_notify", "outbox_notify")]
        assert comment(conn, "outbox") == "outbox-dispatcher schema v7"
        # The status CHECK constraint is part of the contract too.
        with pytest.raises(psycopg.errors.CheckViolation):
            conn.execute(
                "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, status) "
                "VALUES ('a', '1', 'E', '{}', 'lost')"
            )

    again = outbox("migrate", "--dsn", empty_dsn)
    assert again.returncode == 0, again.stderr
    assert again.stdout == "outbox: already at schema v7, for --ordering none\n"


def test_migrate_reads_dsn_and_table_from_the_environment(empty_dsn):
    result = outbox("migrate", env={"OUTBOX_DSN": empty_dsn, "OUTBOX_TABLE": "from_env"})
    assert result.returncode == 0, result.stderr
    assert result.stdout == "from_env: migrated from v0 to v7, for --ordering none\n"
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        assert comment(conn, "from_env") == "outbox-dispatcher schema v7"
        assert conn.execute("SELECT to_regclass('outbox')").fetchone() == (None,)


def test_migrate_a_schema_qualified_table(empty_dsn):
    result = outbox("migrate", "--dsn", empty_dsn, "--table", "app.events")
    assert result.returncode == 0, result.stderr
    assert result.stdout == "app.events: migrated from v0 to v7, for --ordering none\n"
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        assert [c[0] for c in columns(conn, "app.events")] == [
            *REQUIRED_COLUMNS,
            "errors",
            "headers",
            "replay",
        ]
        assert conn.execute("SELECT to_regclass('public.events')").fetchone() == (None,)
        index_schemas = conn.execute(
            "SELECT DISTINCT schemaname FROM pg_indexes WHERE tablename = 'events'"
        ).fetchall()
        assert index_schemas == [("app",)]
        assert indexes(conn, "app.events") == {"events_pkey"} | {
            f"events_{suffix}" for suffix in INDEX_SUFFIXES
        }
        assert notify_triggers(conn, "app.events") == [("events_notify", "events_notify")]
        # The trigger announces inserts on the table's own channel.
        conn.execute('LISTEN "outbox:app.events"')
        conn.execute(
            "INSERT INTO app.events (aggregate_type, aggregate_id, event_type, payload) "
            "VALUES ('a', '1', 'E', '{}')"
        )
        received = list(conn.notifies(timeout=5, stop_after=1))
        assert [n.channel for n in received] == ["outbox:app.events"]

    again = outbox("migrate", "--dsn", empty_dsn, "--table", "app.events")
    assert again.stdout == "app.events: already at schema v7, for --ordering none\n"
    stats = outbox("stats", "--json", "--exact", "--dsn", empty_dsn, "--table", "app.events")
    assert stats.returncode == 0, stats.stderr
    assert json.loads(stats.stdout)["pending"] == 1


@pytest.mark.parametrize(
    ("name", "relname"),
    [('"orders.v2"', "orders.v2"), ('app."it\'s ""odd"""', 'it\'s "odd"'), ("-orders", "-orders")],
)
def test_the_migrate_command_an_error_suggests_names_the_same_table(empty_dsn, name, relname):
    """The suggestion is a shell command line: run as printed, it creates the very table the
    failing command wanted (a dot inside quotes stays quoted, a quote survives, a leading
    dash is not read as an option)."""
    missing = outbox("stats", "--dsn", empty_dsn, f"--table={name}")
    assert missing.returncode == 1
    suggested = one_line(missing.stderr).rpartition("run `")[2].removesuffix("`")
    assert suggested.startswith("outbox migrate --table ")
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"
    subprocess.run(
        ["bash", "-c", suggested], check=True, capture_output=True, timeout=60,
        env={**BASE_ENV, "PATH": path, "OUTBOX_DSN": empty_dsn},
    )  # fmt: skip
    found = outbox("stats", "--json", "--exact", "--dsn", empty_dsn, f"--table={name}")
    assert found.returncode == 0, found.stderr
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        tables = conn.execute(
            "SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE c.relkind = 'r' AND n.nspname NOT IN ('pg_catalog', 'information_schema')"
        ).fetchall()
    # That table (and its audit log, `<name>_actions`), and no other: no `v2` in a schema
    # `orders`.
    assert (relname,) in tables and all(name.startswith(relname) for (name,) in tables)


def test_migrate_print_shows_quoted_sql_and_touches_no_database(empty_dsn):
    # The DSN points nowhere: printing must not try to connect.
    result = outbox("migrate", "--print", "--table", "x", "--dsn", UNREACHABLE, timeout=10)
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    sql_text = result.stdout
    assert 'CREATE TABLE IF NOT EXISTS "x" (' in sql_text
    for suffix in INDEX_SUFFIXES:
        assert f'CREATE INDEX IF NOT EXISTS "x_{suffix}" ON "x"' in sql_text
    assert 'CREATE OR REPLACE FUNCTION "x_notify"()' in sql_text
    # The channel is the table's as the catalog names it, found where the script runs.
    assert 'CREATE OR REPLACE TRIGGER "x_notify" AFTER INSERT ON "x"' in sql_text
    assert 'EXECUTE FUNCTION "x_notify"(%L)' in sql_text and "'outbox:'" in sql_text
    assert "''outbox:''" not in sql_text, "the DO block's body reads as it runs, quotes single"
    assert "COMMENT ON TABLE \"x\" IS 'outbox-dispatcher schema v1'" in sql_text
    # v2: the audit log of operator actions, named after the table.
    assert 'CREATE TABLE IF NOT EXISTS "x_actions" (' in sql_text
    assert "COMMENT ON TABLE \"x\" IS 'outbox-dispatcher schema v7'" in sql_text

    # The printed SQL is the migration: applied by hand, `outbox migrate` finds v6.
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        conn.execute(sql_text.encode())
        assert comment(conn, "x") == "outbox-dispatcher schema v7"
    again = outbox("migrate", "--dsn", empty_dsn, "--table", "x")
    assert again.stdout == "x: already at schema v7, for --ordering none\n"


def test_migrate_builds_and_drops_the_ordering_index_on_request_and_else_keeps_it(empty_dsn):
    built = outbox("migrate", "--dsn", empty_dsn, "--ordering", "aggregate")
    assert built.returncode == 0, built.stderr
    assert built.stdout == (
        "outbox: migrated from v0 to v7; built ordered mode's index outbox_aggregate, for "
        "--ordering none or aggregate\n"
    )
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        assert "outbox_aggregate" in indexes(conn, "outbox")
        definition = conn.execute(
            "SELECT indexdef FROM pg_indexes WHERE indexname = 'outbox_aggregate'"
        ).fetchone()
        assert definition is not None
        assert "(aggregate_id, id) WHERE (status <> 'done'::text)" in definition[0]
    # Unset, an existing table stays as it is: an ordered deployment's upgrade keeps its index.
    kept = outbox("migrate", "--dsn", empty_dsn)
    assert kept.stdout == "outbox: already at schema v7, for --ordering none or aggregate\n"
    # The variable the workers read builds, but never drops: one meant for other workers
    # must not take an ordered table's index away. Dropping takes the flag.
    kept = outbox("migrate", env={"OUTBOX_DSN": empty_dsn, "OUTBOX_ORDERING": "none"})
    assert kept.stdout == "outbox: already at schema v7, for --ordering none or aggregate\n"
    dropped = outbox("migrate", "--dsn", empty_dsn, "--ordering", "none")
    assert dropped.returncode == 0, dropped.stderr
    assert dropped.stdout == (
        "outbox: at schema v7; dropped ordered mode's index outbox_aggregate, for --ordering none\n"
    )
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        assert indexes(conn, "outbox") == {"outbox_pkey"} | {
            f"outbox_{suffix}" for suffix in INDEX_SUFFIXES
        }
    rebuilt = outbox("migrate", env={"OUTBOX_DSN": empty_dsn, "OUTBOX_ORDERING": "aggregate"})
    assert rebuilt.stdout == (
        "outbox: at schema v7; built ordered mode's index outbox_aggregate, for --ordering none "
        "or aggregate\n"
    )


def _open_writer(dsn: str) -> psycopg.Connection:
    """A writing transaction left open: CREATE INDEX CONCURRENTLY waits for it to end, with
    its index already in the catalog, marked invalid."""
    holder = psycopg.connect(dsn)
    holder.execute(
        "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) "
        "VALUES ('a', '2', 'E', '{}')"
    )
    return holder


_CONCURRENT_BUILD = (
    "CREATE INDEX CONCURRENTLY outbox_aggregate ON outbox (aggregate_id, id) WHERE status <> 'done'"
)


def test_migrate_rebuilds_an_invalid_ordering_index_and_waits_for_one_being_built(empty_dsn):
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        migrate(conn, Table.parse("outbox"))
        conn.execute(
            "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) "
            "VALUES ('a', '1', 'E', '{}')"
        )
    # Being built: the migration must neither wait on it nor drop it.
    holder = _open_writer(empty_dsn)
    builder = psycopg.connect(empty_dsn, autocommit=True)
    building = threading.Thread(target=_build, args=(builder,))
    building.start()
    try:
        with psycopg.connect(empty_dsn, autocommit=True) as conn:
            wait_until_db(conn, "EXISTS (SELECT 1 FROM pg_stat_progress_create_index)", timeout=30)
        busy = outbox("migrate", "--dsn", empty_dsn, "--ordering", "aggregate")
        assert busy.returncode == 1, busy
        assert "index outbox_aggregate on outbox is being built" in one_line(busy.stderr)
    finally:
        holder.rollback()
        holder.close()
        building.join(timeout=60)
        builder.close()
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        assert conn.execute(
            "SELECT indisvalid FROM pg_index WHERE indexrelid = 'outbox_aggregate'::regclass"
        ).fetchone() == (True,)  # the concurrent build finished undisturbed
        conn.execute("DROP INDEX outbox_aggregate")
    # Left by a failed build (here cancelled by its statement timeout while it waited): an
    # index that exists and is never used. IF NOT EXISTS alone would keep it for ever.
    holder = _open_writer(empty_dsn)
    try:
        with psycopg.connect(empty_dsn, autocommit=True) as conn:
            conn.execute("SET statement_timeout = '300ms'")
            with pytest.raises(psycopg.errors.QueryCanceled):
                conn.execute(_CONCURRENT_BUILD)
            assert conn.execute(
                "SELECT indisvalid FROM pg_index WHERE indexrelid = 'outbox_aggregate'::regclass"
            ).fetchone() == (False,)
    finally:
        holder.rollback()
        holder.close()
    result = outbox("migrate", "--dsn", empty_dsn, "--ordering", "aggregate")
    assert result.stdout == (
        "outbox: at schema v7; built ordered mode's index outbox_aggregate again (it was "
        "invalid), for --ordering none or aggregate\n"
    )
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        assert conn.execute(
            "SELECT indisvalid FROM pg_index WHERE indexrelid = 'outbox_aggregate'::regclass"
        ).fetchone() == (True,)


def _build(conn: psycopg.Connection) -> None:
    conn.execute(_CONCURRENT_BUILD)


def test_migrate_will_not_take_another_index_for_the_ordering_index(empty_dsn):
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        migrate(conn, Table.parse("outbox"))
        conn.execute("CREATE INDEX outbox_aggregate ON outbox (aggregate_id)")  # someone's own
    result = outbox("migrate", "--dsn", empty_dsn, "--ordering", "aggregate")
    assert result.returncode == 1
    assert "index outbox_aggregate on outbox is not ordered mode's" in one_line(result.stderr)
    # Not ours to drop either.
    assert outbox("migrate", "--dsn", empty_dsn, "--ordering", "none").returncode == 0
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        assert "outbox_aggregate" in indexes(conn, "outbox")


def test_migrate_print_with_an_ordering_shows_its_statement():
    ordered = outbox("migrate", "--print", "--table", "x", "--ordering", "aggregate").stdout
    assert ordered.endswith(
        'CREATE INDEX IF NOT EXISTS "x_aggregate" ON "x" (aggregate_id, id) '
        "WHERE status <> 'done';\n\n"
    )
    unordered = outbox("migrate", "--print", "--table", "app.x", "--ordering", "none").stdout
    assert unordered.endswith('DROP INDEX IF EXISTS "app"."x_aggregate";\n\n')
    assert "x_aggregate" not in outbox("migrate", "--print", "--table", "x").stdout


def test_migrate_print_of_a_partitioned_layout_says_it_does_not_convert():
    # Run on a database where the table exists plain, the printed SQL would convert nothing:
    # the text says so at its top, before any statement.
    printed = outbox("migrate", "--print", "--table", "x", "--partition-size", "1000").stdout
    head, _, rest = printed.partition("\n\n")
    assert head.startswith("-- A new partitioned table.")
    assert "outbox migrate --partition-size N" in head
    assert rest.startswith("CREATE SEQUENCE")
    assert not outbox("migrate", "--print", "--table", "x").stdout.startswith("--")


def test_migrate_print_quotes_awkward_names():
    result = outbox("migrate", "--print", "--table", '"my schema"."we""ird"')
    assert result.returncode == 0, result.stderr
    assert 'CREATE SCHEMA IF NOT EXISTS "my schema"' in result.stdout
    assert 'CREATE TABLE IF NOT EXISTS "my schema"."we""ird" (' in result.stdout
    assert 'CREATE INDEX IF NOT EXISTS "we""ird_ready" ON "my schema"."we""ird"' in result.stdout


def test_migrate_refuses_a_newer_schema_version(empty_dsn):
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        migrate(conn, Table.parse("outbox"))
        conn.execute("COMMENT ON TABLE outbox IS 'outbox-dispatcher schema v99'")
    result = outbox("migrate", "--dsn", empty_dsn)
    assert result.returncode != 0
    assert result.stdout == ""
    line = one_line(result.stderr)
    assert line.startswith("outbox: error: table outbox is at schema v99")
    assert "upgrade outbox-dispatcher" in line
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        assert comment(conn, "outbox") == "outbox-dispatcher schema v99"


_GOOD_COLUMNS = {
    "id": "bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY",
    "aggregate_type": "text NOT NULL",
    "aggregate_id": "text NOT NULL",
    "event_type": "text NOT NULL",
    "payload": "jsonb NOT NULL",
    "created_at": "timestamptz NOT NULL DEFAULT now()",
    "status": "text NOT NULL DEFAULT 'pending'",
    "available_at": "timestamptz NOT NULL DEFAULT now()",
    "attempts": "integer NOT NULL DEFAULT 0",
    "lease_owner": "text",
    "lease_until": "timestamptz",
    "lease_version": "bigint NOT NULL DEFAULT 0",
    "last_error": "text",
    "done_at": "timestamptz",
}


@pytest.mark.parametrize(
    ("changes", "reason"),
    [
        ({"attempts": "text NOT NULL DEFAULT '0'"}, "attempts is text (expected integer)"),
        ({"id": "bigint PRIMARY KEY"}, "id is not an identity column"),
        ({"id": "integer GENERATED ALWAYS AS IDENTITY PRIMARY KEY"},
         "id is integer (expected bigint)"),
        ({"payload": "json NOT NULL"}, "payload is json (expected jsonb)"),
        ({"created_at": "timestamp NOT NULL DEFAULT now()"},
         "created_at is timestamp without time zone (expected timestamp with time zone)"),
        ({"status": "text DEFAULT 'pending'"}, "status allows NULL"),
        ({"lease_version": "bigint NOT NULL"}, "lease_version has no default"),
        ({"aggregate_id": "varchar(10) NOT NULL", "attempts": "bigint NOT NULL DEFAULT 0"},
         "aggregate_id is character varying(10) (expected text); attempts is bigint"),
    ],
)  # fmt: skip
def test_migrate_refuses_a_table_with_the_right_names_and_the_wrong_columns(
    empty_dsn, changes, reason
):
    """It used to adopt such a table, stamp it current, and the worker then failed every
    claim (or every enqueue) for ever."""
    columns_sql = ", ".join(f"{name} {spec}" for name, spec in {**_GOOD_COLUMNS, **changes}.items())
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        conn.execute(f"CREATE TABLE outbox ({columns_sql})")
    result = outbox("migrate", "--dsn", empty_dsn)
    assert result.returncode == 1
    line = one_line(result.stderr)
    assert line.startswith("outbox: error: table outbox exists but is not an outbox table (wrong")
    assert reason in line
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        assert comment(conn, "outbox") is None  # not adopted
        assert indexes(conn, "outbox") == {"outbox_pkey"}


def test_migrate_adopts_a_hand_made_table_with_an_identity_and_extra_columns(empty_dsn):
    columns_sql = ", ".join(f"{name} {spec}" for name, spec in _GOOD_COLUMNS.items())
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        conn.execute(f"CREATE TABLE outbox ({columns_sql}, tenant text)")  # extra: fine
    result = outbox("migrate", "--dsn", empty_dsn)
    assert result.stdout == "outbox: migrated from v0 to v7, for --ordering none\n", result.stderr


@pytest.mark.parametrize(
    ("alter", "reason"),
    [
        ("ALTER TABLE outbox ALTER COLUMN attempts TYPE bigint", "attempts is bigint"),
        ("ALTER TABLE outbox ALTER COLUMN status DROP NOT NULL", "status allows NULL"),
        (
            "ALTER TABLE outbox ALTER COLUMN available_at DROP DEFAULT",
            "available_at has no default",
        ),
        ("ALTER TABLE outbox ALTER COLUMN errors TYPE text", "errors is text (expected jsonb)"),
    ],
)
def test_worker_refuses_a_migrated_table_whose_columns_were_altered(empty_dsn, alter, reason):
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        migrate(conn, Table.parse("outbox"))
        conn.execute(alter)
    result = run("outbox.worker", "--dsn", empty_dsn, "--publisher", "null", timeout=30)
    assert result.returncode == 2, result
    line = one_line(result.stderr)
    assert line.startswith("outbox-worker: error: table outbox has wrong columns: ")
    assert reason in line


def test_worker_refuses_a_migrated_table_that_lost_a_column_a_later_step_added(empty_dsn):
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        migrate(conn, Table.parse("outbox"))
        conn.execute("ALTER TABLE outbox DROP COLUMN errors")  # v3's, dropped by hand
    result = run("outbox.worker", "--dsn", empty_dsn, "--publisher", "null", timeout=30)
    assert result.returncode == 2, result
    assert one_line(result.stderr) == (
        "outbox-worker: error: table outbox lacks required columns: errors"
    )


def test_migrate_refuses_a_table_of_the_wrong_shape(empty_dsn):
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE outbox (id int)")
    result = outbox("migrate", "--dsn", empty_dsn)
    assert result.returncode != 0
    line = one_line(result.stderr)
    assert "table outbox exists but is not an outbox table" in line
    missing = line.split("missing columns: ", 1)[1].rstrip(")").split(", ")
    assert missing == [c for c in REQUIRED_COLUMNS if c != "id"]
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        # Left exactly as it was.
        assert columns(conn, "outbox") == [("id", "integer", False)]
        assert indexes(conn, "outbox") == set()
        assert comment(conn, "outbox") is None


def test_migrate_adopts_a_hand_made_table_of_the_right_shape(empty_dsn):
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        conn.execute(
            """CREATE TABLE outbox (
                id bigserial PRIMARY KEY, tenant text, aggregate_type text NOT NULL,
                aggregate_id text NOT NULL, event_type text NOT NULL, payload jsonb NOT NULL,
                created_at timestamptz NOT NULL DEFAULT now(),
                status text NOT NULL DEFAULT 'pending',
                available_at timestamptz NOT NULL DEFAULT now(),
                attempts integer NOT NULL DEFAULT 0, lease_owner text, lease_until timestamptz,
                lease_version bigint NOT NULL DEFAULT 0, last_error text, done_at timestamptz)"""
        )
        conn.execute(
            "INSERT INTO outbox (tenant, aggregate_type, aggregate_id, event_type, payload) "
            "VALUES ('t1', 'a', '1', 'E', '{}')"
        )
    result = outbox("migrate", "--dsn", empty_dsn)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "outbox: migrated from v0 to v7, for --ordering none\n"
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        assert comment(conn, "outbox") == "outbox-dispatcher schema v7"
        assert {f"outbox_{s}" for s in INDEX_SUFFIXES} <= indexes(conn, "outbox")
        assert notify_triggers(conn, "outbox") == [("outbox_notify", "outbox_notify")]
        # The extra column and the existing row are kept.
        assert conn.execute("SELECT tenant FROM outbox").fetchall() == [("t1",)]


# -- stats -----------------------------------------------------------------------------------


def _shape_queue(conn: psycopg.Connection) -> list[int]:
    """10 rows: 2 ready, 1 waiting, 2 leased (1 expired), 1 dead, 4 done."""
    ids = seed(conn, 10)
    conn.execute("UPDATE outbox SET created_at = now() - interval '90 seconds', "
                 "available_at = now() - interval '30 seconds' WHERE id = %s",
                 (ids[0],))  # fmt: skip
    conn.execute("UPDATE outbox SET available_at = now() + interval '1 hour', attempts = 2 "
                 "WHERE id = %s", (ids[2],))  # fmt: skip
    conn.execute("UPDATE outbox SET status = 'processing', attempts = 1, lease_owner = 'w', "
                 "lease_until = now() + interval '1 minute' WHERE id = %s", (ids[3],))  # fmt: skip
    conn.execute("UPDATE outbox SET status = 'processing', attempts = 1, lease_owner = 'w', "
                 "lease_until = now() - interval '1 minute' WHERE id = %s", (ids[4],))  # fmt: skip
    conn.execute("UPDATE outbox SET status = 'dead', attempts = 12 WHERE id = %s", (ids[5],))
    conn.execute("UPDATE outbox SET status = 'done', done_at = now(), attempts = 1 "
                 "WHERE id = ANY(%s)", (ids[6:],))  # fmt: skip
    return ids


def test_stats_json_reports_the_queue_state(conn, dsn):
    ids = _shape_queue(conn)
    result = outbox("stats", "--json", "--dsn", dsn)
    assert result.returncode == 0, result.stderr
    data = json.loads(one_line(result.stdout))
    assert data["table"] == "outbox"
    assert data["pending"] == 3
    assert data["ready"] == 2
    assert data["processing"] == 2
    assert data["expired_leases"] == 1
    assert data["dead"] == 1
    assert data["backlog"] == 5
    assert data["max_id"] == max(ids)
    assert data["attempts"] == {"0": 2, "1": 2, "2": 1}
    # Never analyzed, the table's statistics say nothing: its done rows are counted.
    assert (data["done"], data["done_is_estimate"]) == (4, False)
    assert isinstance(data["oldest_pending_age"], float)
    assert isinstance(data["oldest_ready_age"], float)
    assert data["oldest_pending_age"] == pytest.approx(90, abs=10)
    assert data["oldest_ready_age"] == pytest.approx(30, abs=10)
    assert "T" in data["sampled_at"]

    exact = outbox("stats", "--json", "--exact", "--dsn", dsn)
    assert exact.returncode == 0, exact.stderr
    exact_data = json.loads(exact.stdout)
    assert exact_data["done"] == 4
    assert exact_data["done_is_estimate"] is False


def test_stats_human_output_names_every_figure(conn, dsn):
    _shape_queue(conn)
    result = outbox("stats", "--exact", "--dsn", dsn)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    for key in ("table", "pending", "retrying", "processing", "done", "dead",
                "oldest unfinished age", "oldest ready age", "highest id", "attempts",
                "destinations"):  # fmt: skip
        assert any(line.startswith(key) for line in out.splitlines()), (key, out)
    assert "3 (2 ready)" in out
    assert "2 (1 with expired lease)" in out
    assert "0: 2, 1: 2, 2: 1" in out


def test_stats_on_a_database_without_the_table(empty_dsn):
    result = outbox("stats", "--dsn", empty_dsn)
    assert result.returncode == 1
    assert "outbox migrate" in one_line(result.stderr)


# -- purge -----------------------------------------------------------------------------------


def _done_rows(conn: psycopg.Connection, old: int, recent: int) -> None:
    """`old` done rows finished 8 days ago, `recent` 6 days ago, plus undone old rows."""
    ids = seed(conn, old + recent + 3)
    conn.execute("UPDATE outbox SET status = 'done', done_at = now() - interval '8 days' "
                 "WHERE id = ANY(%s)", (ids[:old],))  # fmt: skip
    conn.execute("UPDATE outbox SET status = 'done', done_at = now() - interval '6 days' "
                 "WHERE id = ANY(%s)", (ids[old : old + recent],))  # fmt: skip
    # Old, but not done: never purged.
    conn.execute("UPDATE outbox SET status = 'dead', created_at = now() - interval '30 days' "
                 "WHERE id = %s", (ids[-1],))  # fmt: skip
    conn.execute("UPDATE outbox SET created_at = now() - interval '30 days' WHERE id = %s",
                 (ids[-2],))  # fmt: skip


def _by_status(conn: psycopg.Connection) -> dict[str, int]:
    return dict(conn.execute("SELECT status, count(*) FROM outbox GROUP BY status").fetchall())


def test_purge_dry_run_counts_and_deletes_nothing(conn, dsn):
    _done_rows(conn, old=4, recent=2)
    result = outbox("purge", "--older-than", "7d", "--dry-run", "--dsn", dsn)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "outbox: would delete 4 done rows\n"
    assert _by_status(conn) == {"done": 6, "pending": 2, "dead": 1}


def test_purge_deletes_only_old_done_rows(conn, dsn):
    _done_rows(conn, old=4, recent=2)
    result = outbox("purge", "--older-than", "7d", "--dsn", dsn)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "outbox: deleted 4 done rows\n"
    assert _by_status(conn) == {"done": 2, "pending": 2, "dead": 1}
    oldest_done = conn.execute(
        "SELECT min(done_at) > now() - interval '7 days' FROM outbox WHERE status = 'done'"
    ).fetchone()
    assert oldest_done == (True,)
    again = outbox("purge", "--older-than", "7d", "--dsn", dsn)
    assert again.stdout == "outbox: deleted 0 done rows\n"


@pytest.mark.parametrize("old", [5, 4])  # a last partial batch, and batches that divide evenly
def test_purge_in_small_batches_deletes_everything_due(conn, dsn, old):
    _done_rows(conn, old=old, recent=1)
    result = outbox("purge", "--older-than", "7d", "--batch", "2", "--dsn", dsn)
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"outbox: deleted {old} done rows\n"
    assert _by_status(conn) == {"done": 1, "pending": 2, "dead": 1}


@pytest.mark.parametrize("command", [["purge", "--older-than", "7d"], ["inbox", "purge"]])
def test_purge_batches_come_from_their_own_variable_not_the_workers_batch(conn, dsn, command):
    # In a worker's pod OUTBOX_BATCH is the claim batch: a purge run there must not take it.
    run = outbox(*command, "--dsn", dsn, env={"OUTBOX_BATCH": "abc", "OUTBOX_INBOX_TABLE": "i"})
    if command[0] == "inbox":
        assert "does not exist" in run.stderr  # got past its settings to the (missing) table
    else:
        assert run.returncode == 0, run.stderr
    refused = outbox(*command, "--dsn", dsn, env={"OUTBOX_PURGE_BATCH": "abc"})
    assert refused.returncode == 2
    assert one_line(refused.stderr).startswith("outbox: error: OUTBOX_PURGE_BATCH: ")


def test_purge_retention_from_hours(conn, dsn):
    _done_rows(conn, old=2, recent=3)
    # Everything done more than 5 days ago goes: the 8- and the 6-day-old rows.
    result = outbox("purge", "--older-than", "120h", "--dsn", dsn)
    assert result.stdout == "outbox: deleted 5 done rows\n"


# -- usage errors ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "env", "named"),
    [
        (["purge", "--older-than", "5x", "--dsn", "host=x"], {}, "--older-than"),
        (["purge", "--older-than", "7d", "--batch", "0", "--dsn", "host=x"], {}, "--batch"),
        (["purge", "--dsn", "host=x"], {}, "--older-than"),  # required
        (["stats", "--bogus"], {}, "--bogus"),
        (["stats", "--table", 'a"b', "--dsn", "host=x"], {}, "--table"),
        (["stats", "--table", "a.b.c", "--dsn", "host=x"], {}, "--table"),
        (["stats"], {"OUTBOX_TABLE": '"open'}, "OUTBOX_TABLE"),
        (["stats", "--dsn", "host=x port"], {}, "--dsn"),
        (["stats"], {"OUTBOX_DSN": "host=x port"}, "OUTBOX_DSN"),
        (["migrate", "--print", "--table", 'a"b'], {}, "--table"),
        # Out of range: these used to end in a traceback (OverflowError) or fail for ever.
        (["purge", "--older-than", "99999999999999d", "--dsn", "host=x"], {}, "--older-than"),
        (["purge", "--older-than", "9999999999999", "--dsn", "host=x"], {}, "--older-than"),
        (
            ["purge", "--older-than", "7d", "--batch", "3000000000", "--dsn", "host=x"],
            {},
            "--batch",
        ),
        (["stats", "--lock-timeout", "soon", "--dsn", "host=x"], {}, "--lock-timeout"),
        (["stats", "--statement-timeout", "99999d", "--dsn", "host=x"], {}, "--statement-timeout"),
        (["stats"], {"OUTBOX_LOCK_TIMEOUT": "-1s"}, "OUTBOX_LOCK_TIMEOUT"),
        (["frobnicate"], {}, "frobnicate"),
        ([], {}, "COMMAND"),
        # Ids are bigint: beyond, a database error used to answer (exit 1).
        (["requeue", "--id", "99999999999999999999", "--dsn", "host=x"], {}, "--id"),
        (["skip", "--id", "9223372036854775808", "--dsn", "host=x"], {}, "--id"),
        # Empty, it matched every dead message: `--error "$UNSET"` was --all-dead.
        (["requeue", "--error", "", "--dsn", "host=x"], {}, "--error"),
        (["demo", "--workers", "100000"], {}, "--workers"),
        (["demo", "--events", "0"], {}, "--events"),
        # libpq ends a URL's authority at its first /: the password was shown as host and port.
        (["stats", "--dsn", "postgresql://u:s3cret/pw@127.0.0.1:1/db"], {}, "--dsn"),
        (["stats"], {"OUTBOX_DSN": "postgresql://u:s3cret/p@w@127.0.0.1:1/db"}, "OUTBOX_DSN"),
        # Settings that can never work: a traceback, exit 1, or (the worker) retries for ever.
        # Named by the parameter; its value (here a password) is never echoed.
        (["stats", "--dsn", "host=127.0.0.1 port=1 connect_timeout=s3cret"], {}, "connect_timeout"),
        (
            ["stats", "--dsn", "host=127.0.0.1 port=1"],
            {"PGCONNECT_TIMEOUT": "s3cret"},
            "connect_timeout",
        ),
        (["stats", "--dsn", "host=127.0.0.1 port=abc password=s3cret"], {}, "port"),
        (["stats", "--dsn", "host=127.0.0.1 port=1 sslmode=s3cret"], {}, "sslmode"),
        (["stats", "--dsn", "host=127.0.0.1 port=1 require_auth=s3cret"], {}, "require_auth"),
        (["stats", "--dsn", "host=127.0.0.1 port=1"], {"PGSSLMODE": "s3cret"}, "sslmode"),
        (["stats", "--dsn", "host=127.0.0.1 port= password=s3cret"], {}, "parameter 2"),
    ],
)
def test_outbox_usage_errors_exit_2_with_one_line(args, env, named):
    result = outbox(*args, env=env, timeout=20)
    assert result.returncode == 2, result
    assert result.stdout == ""
    line = one_line(result.stderr)
    assert line.startswith("outbox: error: ")
    assert named in line
    assert "s3cret" not in line


@pytest.mark.parametrize(
    ("command", "args", "says"),
    [
        ("outbox", ["maintain", "--retention", "-1s"], "--retention: '-1s' is negative"),
        ("outbox", ["purge", "--older-than", "-2h"], "--older-than: '-2h' is negative"),
        ("outbox", ["purge", "--older-than", "7d", "--batch", "-5"], "--batch: -5 is out of"),
        ("outbox.worker", ["--lease", "-5s"], "--lease: '-5s' is negative"),
    ],
)
def test_a_negative_value_after_its_flag_is_refused_for_what_it_is(command, args, says):
    """A value starting with a minus is the flag's, refused with its reason: argparse took
    `-1s` for a flag of its own and said only `expected one argument`."""
    result = run(command, *args, "--dsn", "host=x", timeout=20)
    assert result.returncode == 2, result
    assert says in one_line(result.stderr)


@pytest.mark.parametrize(
    ("args", "env", "named"),
    [
        (["--lease", "5x"], {}, "--lease"),
        (["--batch", "0"], {}, "--batch"),
        ([], {"OUTBOX_BATCH": "abc"}, "OUTBOX_BATCH"),
        (["--publisher", "http"], {}, "--http-url"),
        (["--http-url", "ftp://x"], {}, "--http-url"),
        (["--ordering", "sideways"], {}, "--ordering"),
        (["--bogus"], {}, "--bogus"),
        (["--table", 'a"b'], {}, "--table"),
        (["--dsn", "host=x port"], {}, "--dsn"),
        # Out of range: accepted, these used to fail every claim for ever, or a traceback.
        (["--batch", "3000000000"], {}, "--batch"),
        (["--max-attempts", "3000000000"], {}, "--max-attempts"),
        (["--concurrency", "99999999"], {}, "--concurrency"),
        (["--lease", "9999999999999"], {}, "--lease"),
        (["--lease", "99999999999999d"], {}, "--lease"),
        (["--lease", "1ms"], {}, "--lease"),  # shorter than it can be renewed: a busy loop
        (["--poll-interval", "9999d"], {}, "--poll-interval"),
        ([], {"OUTBOX_MAX_ATTEMPTS": "99999999999"}, "OUTBOX_MAX_ATTEMPTS"),
        # Malformed plugin paths used to be tracebacks; an empty one ran the log publisher.
        (["--publisher", ":x"], {}, "--publisher"),
        (["--publisher", ".rel:x"], {}, "--publisher"),
        (["--publisher", "os:"], {}, "--publisher"),
        (["--publisher", ""], {}, "--publisher"),
        (["--publisher", "no_such_module_anywhere:X"], {}, "--publisher"),
        # Header lines that could not be sent (or would inject another header).
        (
            ["--publisher", "http", "--http-url", "http://h/", "--http-header", "A: b\r\nX: y"],
            {},
            "--http-header",
        ),
        (
            ["--publisher", "http", "--http-url", "http://h/", "--http-header", "A: b\nX: y"],
            {},
            "--http-header",
        ),
        (
            ["--publisher", "http", "--http-url", "http://h/", "--http-header", "A: b\x0bc"],
            {},
            "--http-header",
        ),
        (
            ["--publisher", "http", "--http-url", "http://h/", "--http-header", "Bad Name: b"],
            {},
            "--http-header",
        ),
        (["--dsn", "postgresql://u:s3cret/pw@127.0.0.1:1/db"], {}, "--dsn"),
        # Settings that can never work: a traceback, exit 1, or (the worker) retries for ever.
        # Named by the parameter; its value (here a password) is never echoed.
        (["--dsn", "host=127.0.0.1 port=1 connect_timeout=s3cret"], {}, "connect_timeout"),
        (["--dsn", "host=127.0.0.1 port=1"], {"PGCONNECT_TIMEOUT": "s3cret"}, "connect_timeout"),
        (["--dsn", "host=127.0.0.1 port=abc password=s3cret"], {}, "port"),
        (["--dsn", "host=127.0.0.1 port=1 sslmode=s3cret"], {}, "sslmode"),
        (["--dsn", "host=127.0.0.1 port=1 require_auth=s3cret"], {}, "require_auth"),
    ],
)
def test_worker_usage_errors_exit_2_with_one_line(args, env, named):
    result = run("outbox.worker", *args, env=env, timeout=20)
    assert result.returncode == 2, result
    assert result.stdout == ""
    line = one_line(result.stderr)
    assert line.startswith("outbox-worker: error: ")
    assert named in line
    assert "s3cret" not in line


def test_the_console_scripts_are_installed():
    bin_dir = Path(sys.executable).parent
    for script in ("outbox", "outbox-worker"):
        result = subprocess.run(
            [str(bin_dir / script), "--bogus-flag"], capture_output=True, text=True,
            timeout=20, env=BASE_ENV,
        )  # fmt: skip
        assert result.returncode == 2
        assert one_line(result.stderr).startswith(f"{script}: error: ")


# -- secrets ---------------------------------------------------------------------------------


@pytest.mark.parametrize("command", [["stats"], ["migrate"], ["purge", "--older-than", "7d"]])
def test_unreachable_server_fails_fast_without_leaking_the_password(command):
    started = time.monotonic()
    result = outbox(*command, "--dsn", UNREACHABLE, timeout=20)
    assert time.monotonic() - started < 10
    assert result.returncode not in (0, 2)
    assert "s3cret" not in result.stdout + result.stderr
    line = one_line(result.stderr)
    # Where it tried (host and port) and why, never the password.
    assert line.startswith("outbox: error: cannot connect to 127.0.0.1 port 1 (database db")
    assert line.endswith("Connection refused")


def test_an_unreachable_server_from_pg_variables_is_named_as_libpq_resolves_it():
    """The server named was the DSN's alone: `the local socket port 5432` for PGHOST."""
    result = outbox("stats", env={"PGHOST": "127.0.0.1", "PGPORT": "1", "PGUSER": "u"}, timeout=20)
    assert result.returncode == 1
    line = one_line(result.stderr)
    assert line.startswith("outbox: error: cannot connect to 127.0.0.1 port 1 (user u): ")


@pytest.mark.parametrize(
    "dsn",
    [
        "host=127.0.0.1 port=1 user=u sslpassword=s3cret dbname=db",
        "host=127.0.0.1 port=1 oauth_client_secret=s3cret dbname=db",
        "postgresql://u@127.0.0.1:1/db?sslpassword=s3cret",
        "postgresql://u:p@s3cret@127.0.0.1:1/db",  # an unencoded @ in the password
        "postgresql://u:p@s3cret@127.0.0.1:1/db?sslpassword=s3cret",
        "host=127.0.0.1 port=1 password=s3cret sslpassword=s3cret bogus",  # unparseable
        "host=127.0.0.1 port=1 SSLPASSWORD=s3cret",  # unparseable (keys are lower case)
    ],
)
def test_no_secret_parameter_of_a_dsn_is_echoed(dsn):
    """Only `password` used to be masked: sslpassword was printed in clear by every command,
    and a URL password with an unencoded @ showed its tail as the host."""
    for result in (outbox("stats", "--dsn", dsn, timeout=20),
                   run("outbox.worker", "--dsn", dsn, "--bogus", timeout=20)):  # fmt: skip
        assert "s3cret" not in result.stdout + result.stderr
        assert result.returncode != 0
        one_line(result.stderr)


@pytest.mark.parametrize(
    "url",
    [
        "ftp://user:s3cret@example.com/events",
        "ftp://example.com/events?token=s3cret",
        "http://user:s3cret@exa mple.com/events?token=s3cret",
        "http://s3cret@localhost:99999/events",  # a token as the user
    ],
)
def test_a_refused_publisher_url_is_named_without_its_credentials(url):
    result = run("outbox.worker", "--publisher", "http", "--http-url", url, timeout=20)
    assert result.returncode == 2
    line = one_line(result.stderr)
    assert line.startswith("outbox-worker: error: --http-url: ")
    assert "s3cret" not in line and "***" in line


@pytest.mark.parametrize(
    "header", ["Authorization: Bearer s3cret\r\nX-Injected: 1", "Authorization: s3cret\x7f"]
)
def test_a_refused_secret_header_is_never_echoed(header):
    result = run(
        "outbox.worker", "--publisher", "http", "--http-url", "http://h/", "--http-header",
        header, timeout=20,
    )  # fmt: skip
    assert result.returncode == 2
    line = one_line(result.stderr)
    assert "Authorization" in line and "s3cret" not in line


def test_password_in_a_malformed_dsn_is_not_echoed():
    for dsn in ("postgresql://u:my s3cret@h/db", "host=h password=my s3cret"):
        result = outbox("stats", "--dsn", dsn, timeout=20)
        assert result.returncode == 2
        assert "s3cret" not in result.stderr
        assert "--dsn" in one_line(result.stderr)


# -- the worker process ----------------------------------------------------------------------


def _get(port: int, path: str) -> tuple[int, str]:
    # A generous timeout: the worker answers at once, but on a loaded 2-core machine its
    # process may wait for a core longer than a couple of seconds.
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=15) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def _wait_ready(proc: subprocess.Popen[bytes], port: int, log: Path, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while True:
        if proc.poll() is not None:
            raise AssertionError(f"worker exited with {proc.returncode}: {log.read_text()}")
        try:
            if _get(port, "/readyz")[0] == 200:
                return
        except OSError:
            pass  # not listening yet
        if time.monotonic() > deadline:
            raise AssertionError(f"worker not ready after {timeout}s: {log.read_text()}")
        time.sleep(0.05)


def _spawn(args: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with open(log, "wb") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "outbox.worker", *args],
            env={**BASE_ENV, **env},
            stdout=out,
            stderr=subprocess.STDOUT,
        )


def _json_lines(log: Path) -> list[dict]:
    return [json.loads(line) for line in log.read_text().splitlines()]


def test_worker_serves_health_and_metrics_and_never_logs_the_password(dsn, conn, tmp_path):
    secret = "s3cret-worker-pw"
    port = free_port()
    log = tmp_path / "worker.log"
    seed(conn, 3)
    proc = _spawn(
        ["--publisher", "null", "--log-format", "json", "--metrics-port", str(port),
         "--poll-interval", "200ms"],
        env={"OUTBOX_DSN": f"{dsn} password={secret}"},  # trust auth ignores it
        log=log,
    )  # fmt: skip
    try:
        _wait_ready(proc, port, log)
        assert _get(port, "/healthz") == (200, "ok\n")
        # The worker dispatches the seeded rows with the null publisher.
        deadline = time.monotonic() + 20
        while conn.execute("SELECT count(*) FROM outbox WHERE status = 'done'").fetchone()[0] < 3:
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.05)
        # The counter moves when the finalize's commit has answered, a moment after the rows.
        while 'outbox_messages_total{outcome="done"} 3.0' not in (
            metrics := _get(port, "/metrics")[1]
        ):
            assert time.monotonic() < deadline, metrics
            time.sleep(0.05)
        for name in ("outbox_messages_total", "outbox_lost_leases_total",
                     "outbox_publish_duration_seconds", "outbox_claim_batch_size",
                     "outbox_in_flight_messages"):  # fmt: skip
            assert name in metrics, name
    finally:
        code = stop_worker(proc, signal.SIGTERM, timeout=30)
    assert code == 0, log.read_text()
    text = log.read_text()
    assert secret not in text
    entries = _json_lines(log)  # every line is JSON
    started = [e for e in entries if "dispatching" in e["message"]]
    assert len(started) == 1
    assert "password=***" in started[0]["message"]
    assert "uvloop event loop" in started[0]["message"]  # the default, uvloop being installed
    assert any("SIGTERM" in e["message"] for e in entries)


def test_worker_runs_on_asyncio_s_own_loop_when_asked(dsn, conn, tmp_path):
    log = tmp_path / "worker.log"
    seed(conn, 3)
    proc = _spawn(
        ["--publisher", "null", "--log-format", "json", "--event-loop", "asyncio"],
        env={"OUTBOX_DSN": dsn},
        log=log,
    )
    try:
        deadline = time.monotonic() + 20
        while conn.execute("SELECT count(*) FROM outbox WHERE status = 'done'").fetchone()[0] < 3:
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.05)
    finally:
        code = stop_worker(proc, signal.SIGTERM, timeout=30)
    assert code == 0, log.read_text()
    [started] = [e for e in _json_lines(log) if "dispatching" in e["message"]]
    assert "asyncio event loop" in started["message"]


def test_worker_warns_about_a_publish_timeout_close_to_the_lease(dsn, tmp_path):
    port = free_port()
    log = tmp_path / "worker.log"
    proc = _spawn(
        ["--publisher", "null", "--log-format", "json", "--metrics-port", str(port),
         "--publish-timeout", "50s", "--lease", "60s"],
        env={"OUTBOX_DSN": dsn},
        log=log,
    )  # fmt: skip
    try:
        _wait_ready(proc, port, log)
        assert proc.poll() is None  # warned, not refused
    finally:
        code = stop_worker(proc, signal.SIGTERM, timeout=30)
    assert code == 0, log.read_text()
    warnings = [e for e in _json_lines(log) if e["level"] == "warning"]
    assert len(warnings) == 1, warnings
    assert "publish timeout 50s" in warnings[0]["message"]
    assert "lease 1m" in warnings[0]["message"]


def test_worker_without_the_table_exits_2_and_points_to_migrate(empty_dsn):
    result = run("outbox.worker", "--dsn", empty_dsn, "--publisher", "null", timeout=30)
    assert result.returncode == 2, result
    line = one_line(result.stderr)
    assert line.startswith("outbox-worker: error: ")
    assert "outbox migrate" in line


def test_worker_refuses_a_table_at_another_schema_version(empty_dsn):
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        migrate(conn, Table.parse("outbox"))
        conn.execute("COMMENT ON TABLE outbox IS 'outbox-dispatcher schema v99'")
    result = run("outbox.worker", "--dsn", empty_dsn, "--publisher", "null", timeout=30)
    assert result.returncode == 2, result
    line = one_line(result.stderr)
    assert "v99" in line and "outbox migrate" in line


# -- waiting on others -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "command",
    [
        ["stats"],
        ["stats", "--exact"],
        ["requeue", "--all-dead"],
        ["skip", "--id", "1"],
        ["purge", "--older-than", "0s"],
    ],
)
def test_a_command_gives_up_on_a_lock_held_elsewhere_and_says_so(dsn, command):
    """`LOCK TABLE outbox` in another session used to make `outbox stats` hang for ever."""
    with psycopg.connect(dsn) as holder:
        holder.execute("LOCK TABLE outbox")  # held until this block ends
        result = outbox(*command, "--dsn", dsn, "--lock-timeout", "200ms", timeout=60)
    assert result.returncode == 1
    line = one_line(result.stderr)
    assert line.startswith("outbox: error: gave up after waiting 200ms for a lock on outbox")
    assert "--lock-timeout" in line


def test_a_timeout_under_a_millisecond_is_a_limit_not_none(dsn):
    # PostgreSQL takes whole milliseconds, and 0 means no limit: 0.5ms used to wait for ever.
    with psycopg.connect(dsn) as holder:
        holder.execute("LOCK TABLE outbox")
        result = outbox("stats", "--dsn", dsn, "--lock-timeout", "0.5ms", timeout=60)
    assert result.returncode == 1
    assert one_line(result.stderr).startswith("outbox: error: gave up after waiting")


def test_a_statement_that_runs_too_long_is_cancelled_and_named(dsn):
    # Another migration holds the migration lock; with no lock timeout, the statement
    # timeout is what ends the wait.
    with psycopg.connect(dsn) as holder:
        holder.execute("SELECT pg_advisory_lock(hashtextextended('outbox-dispatcher migrate', 0))")
        result = outbox("migrate", "--dsn", dsn, "--lock-timeout", "0", "--statement-timeout",
                        "300ms", timeout=60)  # fmt: skip
    assert result.returncode == 1
    line = one_line(result.stderr)
    assert line.startswith("outbox: error: gave up after a statement on outbox ran for 300ms")


@pytest.mark.parametrize("size", ["99999999999", "0", "1001"])
def test_the_tuis_page_size_is_bounded(size):
    script = str(Path(sys.executable).parent / "outbox-tui")
    result = subprocess.run(
        [script, "--page-size", size], capture_output=True, text=True, timeout=30, env=BASE_ENV
    )
    assert result.returncode == 2
    line = one_line(result.stderr)
    assert line.startswith("outbox-tui: error: --page-size: ") and "out of range" in line
