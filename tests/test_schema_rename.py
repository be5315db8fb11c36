"""A renamed outbox table: `outbox migrate --table <new name>` leaves exactly one NOTIFY
trigger, the new name's, on the new name's channel, whatever the old one was called."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
from test_cli import one_line, outbox

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
    migrated = outbox("migrate", "--dsn", dsn, "--table", "events")
    assert migrated.returncode == 0, migrated.stderr
    # The old name's siblings are the new orders' now: events gets its own, empty.
    assert (
        "made events_actions, events_destinations, events_replays, events_layout anew (those "
        "named orders serve the table of that name now)" in migrated.stdout
    ), migrated.stdout

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


def _relations(conn: Any, prefix: str) -> set[str]:
    rows = conn.execute(
        "SELECT relname::text FROM pg_class WHERE relnamespace = 'public'::regnamespace "
        "AND relname LIKE %s",
        (prefix + "\\_%",),
    ).fetchall()
    return {name for (name,) in rows}


def test_a_renamed_table_takes_its_siblings_along_with_their_history(dsn, conn):
    """After `ALTER TABLE orders RENAME TO events` the audit log, destinations, replay counter
    and layout record are still `orders_...`: `outbox migrate --table events` renames them
    (and the table's own indexes) in its transaction, says so, and the commands that read
    them work on `events`; a new `orders` gets its own."""
    assert outbox("migrate", "--dsn", dsn, "--table", "orders", "--ordering", "aggregate")
    conn.execute("INSERT INTO orders_actions (action, count) VALUES ('requeue', 3)")
    conn.execute("ALTER TABLE orders RENAME TO events")

    migrated = outbox("migrate", "--dsn", dsn, "--table", "events")
    assert migrated.returncode == 0, migrated.stderr
    assert migrated.stdout == (
        "events: at schema v7; renamed what it had as orders: orders_actions to events_actions, "
        "orders_destinations to events_destinations, orders_replays to events_replays, "
        "orders_layout to events_layout, with 6 indexes and 1 sequence; made the NOTIFY "
        "trigger events_notify in place of "
        "orders_notify, for --ordering none or aggregate\n"
    )
    # Of the old name only what PostgreSQL named itself is left (primary keys, the audit log's
    # identity): the project looks none of them up, and a new table's are named around them.
    assert _relations(conn, "orders") == {
        "orders_pkey",
        "orders_actions_pkey",
        "orders_actions_id_seq",
        "orders_destinations_pkey",
        "orders_layout_pkey",
    }
    assert conn.execute("SELECT action, count FROM events_actions").fetchall() == [("requeue", 3)]
    for command in ("stats", "destinations"):
        result = outbox(command, "--dsn", dsn, "--table", "events")
        assert result.returncode == 0, result.stderr
    again = outbox("migrate", "--dsn", dsn, "--table", "events")
    assert again.stdout == "events: already at schema v7, for --ordering none or aggregate\n"
    # A new table of the old name gets siblings and indexes of its own, none of events'.
    assert outbox("migrate", "--dsn", dsn, "--table", "orders").returncode == 0
    assert conn.execute("SELECT count(*) FROM orders_actions").fetchone() == (0,)
    assert "orders_ready" in _relations(conn, "orders")


def test_a_renamed_partitioned_table_takes_its_partitions_along(empty_dsn):
    """Its partitions are `orders_p<k>` with their `orders_p<k>_range` CHECKs, which
    outbox maintain reads each partition's ids from: renamed with the rest."""
    made = outbox(
        "migrate", "--dsn", empty_dsn, "--table", "orders", "--partition-size", "100",
        "--partitions-ahead", "2",
    )  # fmt: skip
    assert made.returncode == 0, made.stderr
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        conn.execute("ALTER TABLE orders RENAME TO events")
        migrated = outbox("migrate", "--dsn", empty_dsn, "--table", "events")
        assert migrated.returncode == 0, migrated.stderr
        assert (
            "orders_layout to events_layout, with 5 indexes, 1 sequence and 3 partitions; "
            in migrated.stdout
        ), migrated.stdout
        assert "orders_p0" not in _relations(conn, "orders")
        checks = conn.execute(
            "SELECT conname::text FROM pg_constraint WHERE contype = 'c' "
            "AND conname LIKE 'events\\_p%\\_range' ORDER BY 1"
        ).fetchall()
        assert len(checks) == 3
    for command in ("partitions", "maintain"):
        result = outbox(command, "--dsn", empty_dsn, "--table", "events")
        assert result.returncode == 0, result.stderr
    assert "events_p0" in outbox("partitions", "--dsn", empty_dsn, "--table", "events").stdout


def test_a_renamed_table_whose_indexes_name_no_old_name_is_refused(dsn, conn):
    """Its indexes renamed by hand too, nothing tells where its siblings are: the migration
    refuses in one line naming what is missing and the statements to run, and makes no empty
    audit log in place of the one holding the history."""
    assert outbox("migrate", "--dsn", dsn, "--table", "orders").returncode == 0
    conn.execute("ALTER TABLE orders RENAME TO events")
    for suffix in ("ready", "leased", "waiting", "dead"):
        conn.execute(f"ALTER INDEX orders_{suffix} RENAME TO events_{suffix}")

    refused = outbox("migrate", "--dsn", dsn, "--table", "events")
    assert refused.returncode == 1
    assert one_line(refused.stderr) == (
        "outbox: error: table events lacks events_actions, events_destinations, events_replays, "
        "events_layout, which its schema version has, and its indexes name no other name it "
        "had; if it was renamed, rename its old name's to these, then run this again: "
        'ALTER TABLE "<old name>_actions" RENAME TO "events_actions"; ALTER TABLE '
        '"<old name>_destinations" RENAME TO "events_destinations"; ALTER SEQUENCE '
        '"<old name>_replays" RENAME TO "events_replays"; ALTER TABLE "<old name>_layout" '
        'RENAME TO "events_layout"'
    )
    assert _relations(conn, "events") == {
        f"events_{s}" for s in ("ready", "leased", "waiting", "dead")
    }
    for old, new in (("actions", "TABLE"), ("destinations", "TABLE"), ("replays", "SEQUENCE")):
        conn.execute(f"ALTER {new} orders_{old} RENAME TO events_{old}")
    conn.execute("ALTER TABLE orders_layout RENAME TO events_layout")
    assert outbox("migrate", "--dsn", dsn, "--table", "events").returncode == 0


def test_a_renamed_table_whose_old_siblings_are_gone_gets_them_anew(dsn, conn):
    """Dropped by hand after the rename: no history is left to keep, so the migration makes
    them again, saying so, rather than refuse for ever."""
    assert outbox("migrate", "--dsn", dsn, "--table", "orders").returncode == 0
    conn.execute("ALTER TABLE orders RENAME TO events")
    conn.execute("DROP TABLE orders_actions, orders_destinations, orders_layout")
    conn.execute("DROP SEQUENCE orders_replays")

    migrated = outbox("migrate", "--dsn", dsn, "--table", "events")
    assert migrated.returncode == 0, migrated.stderr
    assert (
        "made events_actions, events_destinations, events_replays, events_layout anew (none "
        "left under orders)" in migrated.stdout
    ), migrated.stdout
    assert outbox("destinations", "--dsn", dsn, "--table", "events").returncode == 0
