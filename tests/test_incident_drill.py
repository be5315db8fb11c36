"""The after-an-incident commands (docs/replay.md) as an operator meets them, at the edges a
drill reaches: windows at the ends of the calendar."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import psycopg
from helpers import seed, serve_ordering
from test_admin_cli import outbox

from outbox import Event, enqueue_many
from outbox.lease import claim, finalize
from outbox.models import Outcome

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


async def test_ordered_a_replay_outlives_the_worker_that_held_a_later_message(conn, dsn, table):
    """A worker leases an aggregate's second message and dies (SIGKILL: it never finalizes);
    meanwhile the first is replayed. Once that lease has expired, another worker must be able
    to go on with the aggregate: take over the second, or send the replay."""
    serve_ordering(conn)
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as aconn:
        first, second = seed(conn, 2, aggregates=1)
        options = {"batch": 10, "lease": timedelta(minutes=1), "max_attempts": 5, "ordered": True}
        [held] = await claim(aconn, table, owner="w1", **options)
        await finalize(aconn, table, [Outcome.done(held)])
        [dying] = await claim(aconn, table, owner="w1", **options)
        assert dying.id == second
        since = (datetime.now(UTC) - timedelta(hours=1)).isoformat()
        sent = outbox("replay", "--dsn", dsn, "--since", since, "--until", "0s",
                      "--limit", "1", "--yes")  # fmt: skip
        assert sent.returncode == 0 and "sent 1 message again" in sent.stdout, sent.stderr
        # The dead worker's lease runs out (set, rather than waited for).
        conn.execute(
            "UPDATE outbox SET lease_until = now() - interval '1 second' WHERE id = %s", (second,)
        )
        for by_aggregate in (False, True):
            taken = await claim(aconn, table, owner="w2", by_aggregate=by_aggregate, **options)
            assert [m.id for m in taken] in ([first], [second]), by_aggregate
            conn.execute(
                "UPDATE outbox SET status = 'processing', lease_until = now() - interval '1s' "
                "WHERE id = %s",
                (second,),
            )  # as the dead worker left it, for the other way of claiming
            conn.execute(
                "UPDATE outbox SET status = 'pending', lease_until = NULL WHERE id = %s", (first,)
            )
