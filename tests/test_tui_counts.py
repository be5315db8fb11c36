"""The dashboard's counts read as `outbox stats` prints them (`QueueStats.count_text`): a
count that stopped at the limit is `≥N`, and a lower bound of 0 is `unknown`. The panel
showed a capped pending count as exact, and the done rows it had not counted as `≥0`, read
as none done, on a table of hundreds of done rows."""

from __future__ import annotations

import functools
import re

import pytest
from helpers import seed
from test_tui import SIZE, _app, screen_text, settle, until

from outbox import stats as stats_module
from outbox.tui import source as source_module


def _done(conn, ids: list[int]) -> None:
    conn.execute(
        "UPDATE outbox SET status = 'done', done_at = now(), attempts = 1 WHERE id = ANY(%s)",
        (ids,),
    )


@pytest.fixture
def capped(monkeypatch: pytest.MonkeyPatch) -> int:
    """The TUI's counts stop at 100 rows instead of 10,000: the cap reached by a few hundred."""
    limit = 100
    monkeypatch.setattr(
        source_module,
        "queue_stats_async",
        functools.partial(stats_module.queue_stats_async, count_limit=limit),
    )
    return limit


async def test_capped_counts_read_at_least_and_uncounted_done_rows_unknown(conn, dsn, capped):
    _done(conn, seed(conn, 300))
    seed(conn, 500)
    conn.execute("SELECT pg_stat_force_next_flush()")
    conn.execute("ANALYZE outbox")
    app = _app(dsn, paused=True)
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: re.search(r"pending\s+≥100\b", screen_text(app)), "counts")
        await settle(pilot)
        shown = screen_text(app)
        assert re.search(r"pending\s+≥100\s+≥100 ready", shown), shown
        assert re.search(r"done\s+unknown\s+outbox stats --exact counts them", shown), shown
        assert "≥0" not in shown, shown
        assert re.search(r"backlog\s+≥100\b", shown), shown


async def test_exact_counts_read_as_before(conn, dsn, capped):
    _done(conn, seed(conn, 30))
    seed(conn, 50)
    app = _app(dsn, paused=True)
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: re.search(r"pending\s+50\b", screen_text(app)), "counts")
        pilot.app.action_refresh_now()  # the second poll counts a small table's done rows
        await settle(pilot)
        await until(pilot, lambda: re.search(r"done\s+30\b", screen_text(app)), "done counted")
        shown = screen_text(app)
        assert re.search(r"pending\s+50\s+50 ready", shown), shown
        assert "≥" not in shown and "unknown" not in shown, shown
