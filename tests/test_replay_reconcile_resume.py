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
        progress = reconcile.start_replay(conn, TABLE, found)
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
