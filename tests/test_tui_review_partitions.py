"""outbox-tui on a partitioned table made with hundreds of partitions ahead
(`outbox migrate --partition-size 1000 --partitions-ahead 200`): every screen's statements
plan the partitions unfinished rows can be in, not every partition on each refresh, and a
dead row in an old partition is requeued and skipped, fenced, as on a plain table."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from helpers import row, seed
from test_tui import SIZE, _app, screen_text, settle, until

from outbox.partitions import Layout
from outbox.schema import migrate
from outbox.table import Table
from outbox.tui.screens.confirm import ConfirmScreen
from outbox.tui.screens.dead import DeadScreen

TABLE = Table.parse("outbox")
PARTITION = 1000
AHEAD = 200


@pytest.fixture
def pconn(empty_dsn: str) -> Iterator[psycopg.Connection[Any]]:
    """3,000 rows over 3 partitions of 1,000 ids, 200 more made ahead; ordered mode; mostly
    done, one dead row in each of the first three partitions."""
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        migrate(conn, TABLE, "aggregate", layout=Layout(PARTITION, AHEAD))
        seed(conn, 3000, aggregates=50)
        conn.execute("UPDATE outbox SET status = 'done', done_at = now() WHERE id < 2500")
        conn.execute(
            "UPDATE outbox SET status = 'dead', attempts = 12, last_error = 'HTTP 503' "
            "WHERE id IN (5, 1500, 2600)"
        )
        conn.execute(
            "UPDATE outbox SET status = 'processing', lease_owner = 'w1', "
            "lease_until = now() + interval '1 minute' WHERE id = 2700"
        )
        conn.execute("ANALYZE outbox")
        yield conn


@pytest.fixture
def statements(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, Any]]:
    """Every statement the app's async connections run, with its values."""
    ran: list[tuple[str, Any]] = []
    execute = psycopg.AsyncCursor.execute

    async def recorded(self: Any, query: Any, params: Any = None, **kw: Any) -> Any:
        text = query if isinstance(query, str | bytes) else query.as_string(self.connection)
        ran.append((text.decode() if isinstance(text, bytes) else text, params))
        return await execute(self, query, params, **kw)

    monkeypatch.setattr(psycopg.AsyncCursor, "execute", recorded)
    return ran


def _partitions_planned(conn: psycopg.Connection[Any], statement: str, params: Any) -> int:
    cursor = psycopg.RawCursor(conn) if isinstance(params, list) else conn.cursor()
    plan = "\n".join(r[0] for r in cursor.execute("EXPLAIN " + statement, params).fetchall())
    return len(set(re.findall(r"\boutbox_p\d+\b", plan)))


async def test_every_screen_plans_only_the_partitions_unfinished_rows_are_in(
    pconn, empty_dsn, statements
):
    app = _app(empty_dsn, paused=True, ordered=True)
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: re.search(r"dead\s+3\b", screen_text(app)), "the dashboard")
        # A second poll: after the first, a small table's done rows were counted exactly.
        pilot.app.action_refresh_now()
        await settle(pilot)
        for key in ("d", "g", "escape", "enter", "escape", "escape", "b", "escape", "w"):
            await pilot.press(key)
            await settle(pilot)
        assert "w1" in screen_text(app)
    reads = {
        text: params
        for text, params in statements
        if text.lstrip().upper().startswith(("SELECT", "WITH"))
    }
    planned = {text: _partitions_planned(pconn, text, params) for text, params in reads.items()}
    assert any("status = 'dead'" in text for text in planned)
    # The window: from the first partition (nothing noted finished) to the newest id's, 0-3.
    wide = {" ".join(text.split())[:120]: n for text, n in planned.items() if n > 4}
    assert not wide, wide


async def test_a_dead_row_in_an_old_partition_is_requeued_and_skipped_fenced(pconn, empty_dsn):
    app = _app(empty_dsn, paused=True)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        await pilot.press("d")
        await until(pilot, lambda: "dead letters 3" in screen_text(app), "the dead list")
        dead = app.screen
        assert isinstance(dead, DeadScreen)

        async def highlight(message_id: int) -> None:
            await until(pilot, lambda: dead.highlighted() is not None, "a row")
            while (m := dead.highlighted()) is not None and m.id != message_id:
                await pilot.press("down")

        # Requeue id 5 (partition 0), but it is re-claimed and fails again while the dialog
        # is open: left alone.
        await highlight(5)
        await pilot.press("r")
        await until(pilot, lambda: isinstance(app.screen, ConfirmScreen), "the dialog")
        pconn.execute("UPDATE outbox SET lease_version = lease_version + 1 WHERE id = 5")
        await pilot.press("y")
        await until(pilot, lambda: "requeued 0 of 1" in screen_text(app), "the fenced result")
        assert row(pconn, 5)["status"] == "dead"
        pilot.app.action_refresh_now()
        await settle(pilot)
        await highlight(5)
        await pilot.press("r")
        await until(pilot, lambda: isinstance(app.screen, ConfirmScreen), "the dialog")
        await pilot.press("y")
        await until(pilot, lambda: "requeued 1 of 1" in screen_text(app), "the requeue")
        pilot.app.action_refresh_now()
        await until(pilot, lambda: "dead letters 2" in screen_text(app), "the refresh")
        await highlight(1500)
        await pilot.press("s")
        await until(pilot, lambda: isinstance(app.screen, ConfirmScreen), "the skip dialog")
        await pilot.press("y")
        await until(pilot, lambda: "skipped 1 of 1" in screen_text(app), "the skip")
    requeued, skipped = row(pconn, 5), row(pconn, 1500)
    assert (requeued["status"], requeued["attempts"]) == ("pending", 0)
    assert skipped["status"] == "done"
    assert row(pconn, 2600)["status"] == "dead"
