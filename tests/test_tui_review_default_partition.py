"""A partitioned table someone gave a DEFAULT partition by hand cannot be served (the
table's check says why): outbox-tui says so in its status line on every screen and keeps
running, instead of ending with a traceback at its first poll."""

from __future__ import annotations

import psycopg
from test_tui import SIZE, _app, screen_text, settle, until

from outbox.partitions import Layout
from outbox.schema import migrate
from outbox.table import Table


async def test_a_default_partition_is_reported_not_a_crash(empty_dsn):
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        migrate(conn, Table.parse("outbox"), layout=Layout(1000, 3))
        conn.execute("CREATE TABLE outbox_rest PARTITION OF outbox DEFAULT")
        app = _app(empty_dsn, paused=True)
        async with app.run_test(size=SIZE) as pilot:
            await until(pilot, lambda: "DEFAULT" in screen_text(app), "the problem said")
            assert app.is_running
            await pilot.press("d")
            await settle(pilot)
            assert app.is_running and "DEFAULT" in screen_text(app), screen_text(app)
            # Someone removes it: the next poll shows the queue, without a restart.
            conn.execute("DROP TABLE outbox_rest")
            app.action_refresh_now()
            await until(pilot, lambda: "● connected" in screen_text(app), "the recovery")
            await pilot.press("escape")
            await until(pilot, lambda: "pending" in screen_text(app), "the dashboard")
