"""`R` on the dead letters (requeue everything matching the filter) on a partitioned table
made with hundreds of partitions ahead (`outbox migrate --partition-size 1000
--partitions-ahead 200`): the rows it would change are read, and changed, planning the
partitions they can be in, not every partition once per dialog; and a row the operator saw
is requeued wherever it is, the window of unfinished rows moved since or not."""

from __future__ import annotations

import re
from typing import Any

import psycopg
from helpers import row
from test_tui import SIZE, _app, screen_text, settle, until
from test_tui_review_partitions import _partitions_planned, pconn, statements  # noqa: F401
from textual.widgets import Input

from outbox.partitions import FINISHED_NOTE
from outbox.tui.screens.confirm import ConfirmScreen
from outbox.tui.screens.dead import DeadScreen


def _explained(conn: psycopg.Connection[Any], ran: list[tuple[str, Any]], marker: str) -> list[int]:
    """Partitions planned by each statement ran that `marker` is in."""
    return [
        _partitions_planned(conn, text, params)
        for text, params in ran
        if marker in " ".join(text.split())
    ]


async def test_requeue_all_plans_only_the_partitions_dead_rows_can_be_in(
    pconn,  # noqa: F811
    empty_dsn,
    statements,  # noqa: F811
):
    app = _app(empty_dsn, paused=True)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        await pilot.press("d")
        await until(pilot, lambda: "dead letters 3" in screen_text(app), "the dead list")
        await pilot.press("R")
        await until(pilot, lambda: isinstance(app.screen, ConfirmScreen), "the dialog")
        await until(pilot, lambda: "Requeue 3 dead messages?" in screen_text(app), "the count")
        app.screen.query_one("#typed-count", Input).value = "3"  # every dead row: typed
        await pilot.press("enter")
        await until(pilot, lambda: "requeued 3 of 3" in screen_text(app), "the requeue")
    assert [row(pconn, i)["status"] for i in (5, 1500, 2600)] == ["pending"] * 3
    # The selection: the window is partitions 0-3 (nothing noted finished, the newest id's).
    selected = _explained(pconn, statements, "SELECT id, status, lease_version FROM")
    assert selected and max(selected) <= 4, selected
    # The fenced UPDATE: the partitions its ids are in.
    updated = _explained(pconn, statements, "UPDATE")
    assert updated and max(updated) <= 3, updated


async def test_a_row_the_window_moved_past_is_still_requeued(pconn, empty_dsn, statements):  # noqa: F811
    """The operator confirms a requeue of id 5 (partition 0) after the window of unfinished
    rows moved past its partition (noted finished meanwhile): the row is still changed."""
    app = _app(empty_dsn, paused=True)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        await pilot.press("d")
        await until(pilot, lambda: "dead letters 3" in screen_text(app), "the dead list")
        dead = app.screen
        assert isinstance(dead, DeadScreen)
        await until(pilot, lambda: dead.highlighted() is not None, "a row")
        while (m := dead.highlighted()) is not None and m.id != 5:
            await pilot.press("down")
        await pilot.press("r")
        await until(pilot, lambda: isinstance(app.screen, ConfirmScreen), "the dialog")
        pconn.execute(f"COMMENT ON TABLE outbox_p0 IS '{FINISHED_NOTE}2026-01-01'")
        await pilot.press("y")
        await until(pilot, lambda: "requeued 1 of 1" in screen_text(app), "the requeue")
    assert (row(pconn, 5)["status"], row(pconn, 5)["attempts"]) == ("pending", 0)
    updated = _explained(pconn, statements, "UPDATE")
    assert updated and max(updated) <= 1, updated


def test_plain_table_repair_statement_is_unchanged(table):
    from outbox import queries
    from outbox.operations.repair import Seen, repair

    query = repair(table, "requeue", [Seen(1, "dead", 0), Seen(9, "dead", 0)])
    assert query.statement == queries.repair(table, "requeue")
    assert re.search(r"o\.id >=", str(query.statement)) is None
