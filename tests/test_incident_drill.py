"""The after-an-incident commands (docs/replay.md) as an operator meets them, at the edges a
drill reaches: windows at the ends of the calendar."""

from __future__ import annotations

import json
from datetime import UTC, datetime

from test_admin_cli import outbox

from outbox import Event, enqueue_many

T0 = datetime(2026, 3, 1, 14, 0, tzinfo=UTC)


def _delivered(conn, count: int) -> list[int]:
    """`count` done rows, one a minute from T0."""
    events = [Event("order", f"agg-{i % 3}", "OrderPaid", {"n": i}) for i in range(count)]
    with conn.transaction():
        ids = enqueue_many(conn, events)
    conn.execute(
        "UPDATE outbox SET status = 'done', done_at = now(), attempts = 1, "
        "created_at = %s + (id - %s) * interval '1 minute' WHERE id = ANY(%s)",
        (T0, ids[0], ids),
    )
    return ids


def test_a_window_from_the_first_year_or_to_the_last_is_the_whole_table(conn, dsn):
    """A window reaching the calendar's ends means "from the start" or "to the end": it is
    widened for long transactions as any window is, and its edge must not overflow
    (Python's datetime stops at years 1 and 9999) into a traceback."""
    ids = _delivered(conn, 5)
    for since, until in (
        ("0001-01-01T00:00:00+00:00", "2h"),
        ("0001-01-01T00:00:00+01:00", "0s"),
        ("2026-03-01T00:00:00Z", "9999-12-31T23:59:59+00:00"),
        ("0001-01-01T00:00:00Z", "9999-12-31T23:59:59-14:00"),
    ):
        result = outbox("replay", "--dsn", dsn, "--since", since, "--until", until, "--dry-run")
        assert result.returncode == 0, result.stderr
        assert result.stdout.startswith(
            f"outbox: would send again 5 messages (ids {ids[0]} to {ids[-1]}; "
        ), result.stdout
        assert result.stderr == ""
    # The comparison bounds its window the same way.
    migrated = outbox("inbox", "migrate", "--dsn", dsn)
    assert migrated.returncode == 0, migrated.stderr
    reconciled = outbox(
        "reconcile", "--dsn", dsn, "--inbox-dsn", dsn, "--inbox-table", "outbox_inbox",
        "--consumer", "billing", "--since", "0001-01-01T00:00:00Z",
        "--until", "9999-12-31T23:59:59Z", "--json",
    )  # fmt: skip
    assert reconciled.returncode == 0, reconciled.stderr
    found = json.loads(reconciled.stdout)
    assert (found["delivered"], found["missing"]["count"]) == (5, 5)
    assert found["missing"]["ranges"] == [[ids[0], ids[-1]]]


def test_names_a_producer_wrote_print_as_themselves_never_as_terminal_commands(conn, dsn):
    """Any producer (SQL, another language) may write an event type or a consumer name with
    control characters; the worker refuses to send it in a header, and its row goes dead.
    The replay's preview, its confirmation and its summary, and the comparison's report,
    show such names escaped (as every other command does): an ESC read from a row must not
    clear the operator's screen or recolour what follows, nor a bidi override reorder it."""
    evil = "Evil\x1b[2J\x1b[31mRED\u202e"
    conn.execute(
        "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, status, "
        "created_at) VALUES ('order', 'agg-1', %s, '{}', 'dead', %s)",
        (evil, T0),
    )
    window = ("--since", T0.isoformat(), "--until", "0s")
    shown = outbox("replay", "--dsn", dsn, *window, "--status", "dead", "--dry-run")
    assert shown.returncode == 0, shown.stderr
    assert "  Evil\\x1b[2J\\x1b[31mRED\\u202e  1" in shown.stdout.splitlines()
    sent = outbox("replay", "--dsn", dsn, *window, "--status", "dead", "--yes")
    assert sent.returncode == 0, sent.stderr
    assert sent.stdout.endswith("(Evil\\x1b[2J\\x1b[31mRED\\u202e 1)\n"), sent.stdout
    conn.execute("UPDATE outbox SET status = 'done'")
    migrated = outbox("inbox", "migrate", "--dsn", dsn)
    assert migrated.returncode == 0, migrated.stderr
    reconciled = outbox("reconcile", "--dsn", dsn, "--inbox-dsn", dsn, "--inbox-table",
                        "outbox_inbox", "--consumer", "bill\x1bing", *window)  # fmt: skip
    assert reconciled.returncode == 0, reconciled.stderr
    assert "consumer bill\\x1bing: 1 missing" in reconciled.stdout
    assert "missing by type: Evil\\x1b[2J\\x1b[31mRED\\u202e 1" in reconciled.stdout
    for output in (shown.stdout, sent.stdout, reconciled.stdout):
        assert "\x1b" not in output and "\u202e" not in output
