"""A renamed outbox table: `outbox migrate --table <new name>` leaves exactly one NOTIFY
trigger, the new name's, on the new name's channel, whatever the old one was called."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
from test_cli import outbox

from outbox.table import Table

# The project's triggers on a table, by what they run (the notify function's body), not
# by their names: (trigger, function, channel).
PROJECT_TRIGGERS = """
SELECT t.tgname::text, p.proname::text, convert_from(rtrim(t.tgargs, '\\x00'::bytea), 'UTF8')
  FROM pg_trigger t JOIN pg_proc p ON p.oid = t.tgfoid
 WHERE t.tgrelid = %s::regclass AND NOT t.tgisinternal AND p.prosrc LIKE '%%pg_notify(TG_ARGV%%'
 ORDER BY 1"""


def _triggers(conn: Any, table: str) -> list[tuple[str, str, str]]:
    return conn.execute(PROJECT_TRIGGERS, (table,)).fetchall()


def _notifications_of_one_insert(dsn: str, conn: Any, table: str) -> list[str]:
    """The channels notified by one committed insert into `table`, listening on both names'.
    A marker notified after the insert's commit ends the wait: notifications arrive in
    commit order, so everything the insert sent has arrived before it."""
    with psycopg.connect(dsn, autocommit=True) as listener:
        for channel in (Table.parse("orders").channel, Table.parse("events").channel, "marker"):
            listener.execute(f'LISTEN "{channel}"')
        conn.execute(
            f"INSERT INTO {table} (aggregate_type, aggregate_id, event_type, payload) "
            "VALUES ('order', '1', 'placed', '{}')"
        )
        conn.execute("NOTIFY marker")
        heard = []
        for note in listener.notifies(timeout=10):
            if note.channel == "marker":
                break
            heard.append(note.channel)
        else:
            pytest.fail("the marker notification never came")
    return heard


@pytest.mark.parametrize("comment", ["kept", "dropped"])
def test_a_renamed_table_keeps_one_trigger_on_its_new_channel(dsn, conn, comment):
    """The comment kept, the table is at the current version and the migration had nothing
    to run: the old trigger stayed, notifying the old channel (its workers never woken). The
    comment dropped, the table is adopted and the migration made the new name's trigger
    beside the old one: two notifications per insert."""
    assert outbox("migrate", "--dsn", dsn, "--table", "orders").returncode == 0
    conn.execute("ALTER TABLE orders RENAME TO events")
    if comment == "dropped":
        conn.execute("COMMENT ON TABLE events IS NULL")
    migrated = outbox("migrate", "--dsn", dsn, "--table", "events")
    assert migrated.returncode == 0, migrated.stderr

    assert _triggers(conn, "events") == [("events_notify", "events_notify", "outbox:events")]
    assert _notifications_of_one_insert(dsn, conn, "events") == ["outbox:events"]
    # The old name's function served no other table: it went with its trigger.
    assert conn.execute("SELECT to_regprocedure('orders_notify()')").fetchone() == (None,)


def test_the_old_names_function_stays_while_a_table_of_that_name_uses_it(dsn, conn):
    """A new table took the old name: its trigger still runs the old name's function."""
    assert outbox("migrate", "--dsn", dsn, "--table", "orders").returncode == 0
    conn.execute("ALTER TABLE orders RENAME TO events")
    assert outbox("migrate", "--dsn", dsn, "--table", "orders").returncode == 0
    assert outbox("migrate", "--dsn", dsn, "--table", "events").returncode == 0

    assert _triggers(conn, "events") == [("events_notify", "events_notify", "outbox:events")]
    assert _triggers(conn, "orders") == [("orders_notify", "orders_notify", "outbox:orders")]
    assert _notifications_of_one_insert(dsn, conn, "orders") == ["outbox:orders"]


def test_a_right_trigger_is_not_written_again(dsn, conn):
    """Every replica may migrate at start-up: a table whose trigger is right keeps the very
    same catalog row (creating or replacing a trigger takes a lock that blocks inserts)."""
    row = "SELECT xmin::text FROM pg_trigger WHERE tgrelid = 'outbox'::regclass"
    before = conn.execute(row).fetchall()
    assert outbox("migrate", "--dsn", dsn).returncode == 0
    assert conn.execute(row).fetchall() == before
    assert _triggers(conn, "outbox") == [("outbox_notify", "outbox_notify", "outbox:outbox")]


def test_the_notify_function_in_another_kind_of_trigger_is_left_alone(dsn, conn):
    """Only the project's kind of trigger (after each inserting statement) is the
    migration's: the function run by a row trigger on updates is someone's own use."""
    assert outbox("migrate", "--dsn", dsn, "--table", "orders").returncode == 0
    conn.execute("ALTER TABLE orders RENAME TO events")
    conn.execute(
        "CREATE TRIGGER audit AFTER UPDATE ON events FOR EACH ROW "
        "EXECUTE FUNCTION orders_notify('audit')"
    )
    assert outbox("migrate", "--dsn", dsn, "--table", "events").returncode == 0

    assert _triggers(conn, "events") == [
        ("audit", "orders_notify", "audit"),
        ("events_notify", "events_notify", "outbox:events"),
    ]
    assert _notifications_of_one_insert(dsn, conn, "events") == ["outbox:events"]
