"""`outbox reconcile --resume N`: what the stopped replay compared (its consumer, its inbox
table) is the resumed one's, and its lines name the consumer as the comparison shows it.

The stopped replay is made through `outbox.operations.reconcile` with what is left to send
cut short, as a Ctrl-C after its first batch leaves it: confirmed 9, sent 4, 5 left."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from test_admin_cli import outbox

from outbox import Event, enqueue_many, inbox
from outbox.operations import reconcile
from outbox.table import Table

T0 = datetime(2026, 3, 1, 14, 0, tzinfo=UTC)
TABLE = Table.parse("outbox")
WINDOW = ("--since", T0.isoformat(), "--until", (T0 + timedelta(hours=1)).isoformat())


def _stopped_reconcile(conn, dsn: str, consumer: str) -> tuple[list[int], list[int]]:
    """Replay 1 of `outbox reconcile --replay`, stopped after 4 of the 9 messages missing
    from `consumer`'s keys in outbox_inbox: the ids sent, and those still missing."""
    inbox.migrate(conn)
    with conn.transaction():
        ids = enqueue_many(conn, [Event("order", f"o-{i}", "OrderPaid", {}) for i in range(12)])
    conn.execute("UPDATE outbox SET status = 'done', done_at = now(), created_at = %s", (T0,))
    recorded = ids[::4]
    conn.cursor().executemany(
        "INSERT INTO outbox_inbox (consumer, message_id) VALUES (%s, %s)",
        [(consumer, str(i)) for i in recorded],
    )
    missing = [i for i in ids if i not in recorded]
    with reconcile.connect_inbox(dsn) as reader:
        inbox_table = Table.parse("outbox_inbox")
        found = reconcile.compare(
            conn, TABLE, reader, inbox_table, consumer=consumer,
            since=T0, until=T0 + timedelta(hours=1),
        )  # fmt: skip
        assert found.missing == len(missing) == 9
        progress = reconcile.start_replay(conn, TABLE, found, inbox_table)
        progress.left = 4  # stopped after its first batch of 4
        reconcile.replay_missing(conn, TABLE, reader, inbox_table, progress, actor="test")
    assert progress.sent == 4
    return missing[:4], missing[4:]


def _replayed(conn) -> list[int]:
    found = conn.execute("SELECT id FROM outbox WHERE replay = 1 ORDER BY id").fetchall()
    return [i for (i,) in found]


def test_a_resumed_reconcile_names_the_consumer_as_the_comparison_shows_it(conn, dsn):
    consumer = "bill\\ing"  # a backslash: shown doubled, as every listed name shows it
    sent, left = _stopped_reconcile(conn, dsn, consumer)
    args = ("--dsn", dsn, "--inbox-dsn", dsn, "--inbox-table", "outbox_inbox")
    compared = outbox("reconcile", *args, *WINDOW, "--consumer", consumer)
    assert compared.returncode == 0, compared.stderr
    assert r"consumer bill\\ing: " in compared.stdout, compared.stdout

    other = outbox("reconcile", *args, "--resume", "1", "--yes", "--consumer", "audit")
    assert other.returncode == 2
    assert other.stderr == (
        "outbox: error: --resume: replay 1 compared consumer bill\\\\ing; drop --consumer\n"
    )
    resumed = outbox("reconcile", *args, "--resume", "1", "--yes")
    assert resumed.returncode == 0, resumed.stderr
    assert "(missing for consumer bill\\\\ing; " in resumed.stdout, resumed.stdout
    assert resumed.stdout.endswith("outbox: replay 1: sent 5 missing messages again\n")
    assert _replayed(conn) == sorted(sent + left)


def test_a_resumed_reconcile_refuses_another_inbox_table(conn, dsn):
    """Compared with a table where the consumer has no keys, every delivered message would
    count missing: the resume sent the first 5 of them again (duplicates), and the 5 really
    missing stayed unsent. The replay's records keep the table; another is refused."""
    sent, left = _stopped_reconcile(conn, dsn, "billing")
    inbox.migrate(conn, "other_inbox")  # the consumer has no keys there
    args = ("--dsn", dsn, "--inbox-dsn", dsn, "--resume", "1", "--yes")
    other = outbox("reconcile", *args, "--inbox-table", "other_inbox")
    assert other.returncode == 2
    assert other.stderr == (
        "outbox: error: --resume: replay 1 compared inbox table outbox_inbox, not other_inbox; "
        "give --inbox-table outbox_inbox\n"
    )
    assert _replayed(conn) == sent  # nothing more sent
    resumed = outbox("reconcile", *args, "--inbox-table", "outbox_inbox")
    assert resumed.returncode == 0, resumed.stderr
    assert resumed.stdout.endswith("outbox: replay 1: sent 5 missing messages again\n")
    assert _replayed(conn) == sorted(sent + left)  # the missing ones, each once


def test_a_record_from_before_the_inbox_table_was_kept_resumes_with_the_one_given(conn, dsn):
    sent, left = _stopped_reconcile(conn, dsn, "billing")
    conn.execute(
        "UPDATE outbox_actions SET filter = filter #- '{reconcile,inbox_table}' "
        "WHERE action = 'replay'"
    )
    args = ("--dsn", dsn, "--inbox-dsn", dsn, "--resume", "1", "--yes")
    resumed = outbox("reconcile", *args, "--inbox-table", "outbox_inbox")
    assert resumed.returncode == 0, resumed.stderr
    assert _replayed(conn) == sorted(sent + left)
    # Kept from then on: the resumed batches' records name it.
    (kept,) = conn.execute(
        "SELECT filter->'reconcile'->'inbox_table' FROM outbox_actions "
        "WHERE action = 'replay' ORDER BY id DESC LIMIT 1"
    ).fetchone()
    assert kept == {"schema": None, "name": "outbox_inbox"}
