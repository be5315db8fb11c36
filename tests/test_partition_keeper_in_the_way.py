"""A table of the next partition's name in the way of the worker's partition keeper: each pass
is refused until someone renames or drops it. The keeper says so once, in one line, and the
ids left ahead it exports go on following the producers, so that the alert fires before
inserts fail. Real worker code."""

from __future__ import annotations

import logging

import psycopg
import pytest
from helpers import seed, statuses, wait_until
from test_worker import Scripted
from workers import dispatching, settings

from outbox.partitions import Layout, read_partitions
from outbox.runner import fetch
from outbox.schema import migrate
from outbox.table import Table
from outbox.worker import partition_keeper

TABLE = Table.parse("outbox")


async def test_a_table_in_the_way_is_told_once_and_the_ids_ahead_still_follow(
    empty_dsn: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Partitions p0 to p4 made (ids to 499), then a table outbox_p5 of other columns, then
    350 ids taken: 149 ids are left, fewer than three quarters of the target (400), and the
    keeper's top-up is refused at each pass. It logged the refusal every pass with
    PL/pgSQL's CONTEXT line under it, and the ids ahead stayed at the last pass's 499 while
    producers took them (the alert, under a quarter of the target, would never fire)."""
    monkeypatch.setattr(partition_keeper, "KEEP_INTERVAL", 0.1)
    caplog.set_level(logging.WARNING, logger="outbox.worker")
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        migrate(conn, TABLE, layout=Layout(100, 4))
        async with dispatching(settings(empty_dsn, batch=40), Scripted(lambda m: None)) as r:
            ahead = r.metrics.partition_ids_ahead
            refused = r.metrics.db_errors.labels("keep partitions")
            await wait_until(lambda: ahead._value.get() == 499, what="the first pass")
            conn.execute("CREATE TABLE outbox_p5 (LIKE outbox INCLUDING DEFAULTS, extra int)")
            seed(conn, 350)
            await wait_until(lambda: refused._value.get() >= 5, what="five passes refused")
            assert ahead._value.get() == 149
            told = [m.getMessage() for m in caplog.records if "in the way" in m.getMessage()]
            assert len(told) == 1, told
            assert told[0].startswith(
                "could not keep partitions ahead: table public.outbox_p5 is in the way of "
                "partition 5 of outbox (ids 500 to 599): its columns are not those of outbox"
            ), told
            assert "\n" not in told[0], told
            conn.execute("DROP TABLE outbox_p5")
            await wait_until(
                lambda: (fetch(conn, read_partitions(TABLE)) or [])[-1].high == 800,
                what="the partitions made once it is gone",
            )
            await wait_until(lambda: ahead._value.get() == 449, what="the ids ahead")
            await wait_until(lambda: statuses(conn) == {"done": 350}, what="the drain")
