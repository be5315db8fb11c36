"""What outbox-tui says about the state it shows, driven with Pilot against real PostgreSQL:
done rows the statistics know nothing of are counted, not read as ~0."""

from __future__ import annotations

import re

from helpers import seed
from test_tui import SIZE, _app, screen_text, settle, until


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
