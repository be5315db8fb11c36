"""What outbox-tui says about the state it shows, driven with Pilot against real PostgreSQL:
done rows the statistics know nothing of are counted, not read as ~0; names take the width
there is; blocked aggregates say they are ordered mode's; an action's outcome is news, not
state."""

from __future__ import annotations

import re

from helpers import seed, serve_ordering
from test_tui import SIZE, _app, screen_text, settle, until

from outbox.tui.widgets import StatusLine


def _deliver(conn, count: int) -> None:
    ids = seed(conn, count)
    conn.execute("UPDATE outbox SET status = 'done', done_at = now() WHERE id = ANY(%s)", (ids,))


async def test_done_rows_of_a_table_never_analyzed_are_counted_not_read_as_zero(conn, dsn):
    # The demo's state: every message delivered before autoanalyze ran.
    conn.execute("ALTER TABLE outbox SET (autovacuum_enabled = off)")
    _deliver(conn, 2994)
    app = _app(dsn, paused=True)  # the first poll only
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: "connected" in screen_text(app), "the first poll")
        await settle(pilot)
        assert re.search(r"done\s+3\.0k\s*│", screen_text(app)), screen_text(app)


async def test_a_bigger_table_never_analyzed_stays_bounded_and_says_at_least(conn, dsn):
    """Done rows counted to the limit are a lower bound: the dashboard says so, and does not
    take the table for a small one (whose every row it would count on every poll)."""
    conn.execute("ALTER TABLE outbox SET (autovacuum_enabled = off)")
    _deliver(conn, 10_050)
    app = _app(dsn)
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: "connected" in screen_text(app), "the first poll")
        # Polls after the first stay bounded: an exact count would show 10.1k.
        await refreshes(pilot, 3)
        assert re.search(r"done\s+≥10\.0k\s+at least", screen_text(app)), screen_text(app)


async def refreshes(pilot, n: int) -> None:
    for _ in range(n):
        pilot.app.action_refresh_now()
        await settle(pilot)


LONG_EVENT = "OrderPaymentAuthorizationFailed"  # 31 characters
LONG_AGGREGATE = "order/2f1c9a7e-1b44-4c57-9d0e-6a2b8f3c5d10"  # a UUID, as many ids are
LONG_OWNER = "outbox-worker-orders-eu-west-1-7d9f8c6b5d-x2x9z"  # a pod's name, 47 characters


async def test_event_types_and_aggregates_take_the_width_there_is(conn, dsn):
    """Columns sized for short names cut long ones while the last error had room to give."""
    serve_ordering(conn)
    ids = seed(conn, 3, event_type=LONG_EVENT)
    aggregate = LONG_AGGREGATE.split("/", 1)[1]
    conn.execute("UPDATE outbox SET aggregate_id = %s WHERE id = ANY(%s)", (aggregate, ids[:2]))
    conn.execute(
        "UPDATE outbox SET status = 'dead', last_error = 'HTTP 503' WHERE id = %s", (ids[0],)
    )
    conn.execute(
        "UPDATE outbox SET status = 'processing', lease_owner = %s, "
        "lease_until = now() + interval '1 minute' WHERE id = %s",
        (LONG_OWNER, ids[2]),
    )
    app = _app(dsn, ordered=True)
    async with app.run_test(size=(200, 30)) as pilot:
        await settle(pilot)
        await pilot.press("d")
        await until(pilot, lambda: "HTTP 503" in screen_text(app), "the dead letters")
        await settle(pilot)
        assert re.search(rf"{LONG_AGGREGATE}\s+{LONG_EVENT}\s+0\s", screen_text(app)), screen_text(
            app
        )
        await pilot.press("escape", "b")
        await until(pilot, lambda: "blocked aggregates 1" in screen_text(app), "the heads")
        assert re.search(rf"{LONG_AGGREGATE}\s+{LONG_EVENT}\s+1\s", screen_text(app)), screen_text(
            app
        )
        await pilot.press("escape", "w")
        await until(pilot, lambda: "gone" in screen_text(app), "the workers")
        assert re.search(rf"{LONG_OWNER}\s+gone", screen_text(app)), screen_text(app)
        await pilot.press("escape", "b")
        await until(pilot, lambda: "blocked aggregates 1" in screen_text(app), "the heads")
        # On 80 columns the last error keeps its room, and the names give way.
        await pilot.resize_terminal(80, 30)
        await settle(pilot)
        assert "HTTP 503" in screen_text(app), screen_text(app)


async def test_blocked_aggregates_say_they_are_ordered_modes_own(conn, dsn):
    """`b` in unordered mode said `blocked aggregates 0`, as if it had looked; on a table
    without ordered mode's index it said 0 too, having read nothing."""
    (dead,) = seed(conn, 1)
    conn.execute("UPDATE outbox SET status = 'dead', last_error = 'x' WHERE id = %s", (dead,))
    for ordered, said in (
        (False, "blocked aggregates ordered mode only: unordered, a dead message blocks nothing"),
        (True, "blocked aggregates unknown: the table lacks ordered mode's index"),
    ):
        app = _app(dsn, ordered=ordered)
        async with app.run_test(size=(160, 30)) as pilot:
            await settle(pilot)
            await pilot.press("b")
            await until(pilot, lambda: said in screen_text(app), said)  # noqa: B023
            assert "blocked aggregates 0" not in screen_text(app)


def _status_line(app) -> str:
    return str(app.screen.query_one(StatusLine).render())


async def test_an_actions_outcome_leaves_the_status_line_after_a_while(conn, dsn):
    """`requeued 1 of 1` stayed in the status line for the rest of the session, as if it
    were the state of things."""
    (dead,) = seed(conn, 1)
    conn.execute("UPDATE outbox SET status = 'dead', last_error = 'x' WHERE id = %s", (dead,))
    app = _app(dsn)
    app.NOTICE_SECONDS = 5.0  # long enough that a loaded machine cannot miss it
    async with app.run_test(size=(160, 30)) as pilot:
        await settle(pilot)
        await pilot.press("d")
        await until(pilot, lambda: "page 1" in screen_text(app), "the dead letters")
        await pilot.press("r")
        await until(pilot, lambda: "Requeue 1 dead message?" in screen_text(app), "the dialog")
        await pilot.press("y")
        await until(pilot, lambda: "requeued 1 of 1" in _status_line(app), "the outcome")
        await until(pilot, lambda: "requeued" not in _status_line(app), "the outcome gone")
        assert "connected" in _status_line(app)
