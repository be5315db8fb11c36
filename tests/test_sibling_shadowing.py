"""A table named without its schema (`outbox`, in public) and tables of its sibling tables'
names (`outbox_destinations`, `outbox_actions`) in a schema before it along the search_path
(the role's own, first as "$user"): the commands and the workers read and write the table's
own, in the schema the table is in, and leave the others alone. Named as the table was
named, without a schema, each was the first table of its name along the search_path: a
pause recorded, and an action logged, where no worker of another role looks, and a worker
held back by a pause the table's own destinations do not hold."""

from __future__ import annotations

from typing import Any

import psycopg
from helpers import outbox_on as outbox
from helpers import seed, wait_until
from test_destinations_served import Routed
from workers import dispatching, settings

from outbox.schema import migrate
from outbox.table import Table

TABLE = Table.parse("outbox")


def _table_and_shadows(dsn: str) -> None:
    """The table in public, then the role's own schema holding an empty copy of its
    destinations and of its audit log."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        migrate(conn, TABLE)
        conn.execute("CREATE SCHEMA AUTHORIZATION CURRENT_USER")
        for sibling in ("destinations", "actions"):
            conn.execute(
                f"CREATE TABLE outbox_{sibling} (LIKE public.outbox_{sibling} INCLUDING ALL)"
            )


def _rows(dsn: str, statement: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return conn.execute(statement).fetchall()


def test_a_pause_is_recorded_in_the_tables_own_destinations_and_audit_log(
    empty_dsn: str,
) -> None:
    """`outbox pause` records the pause in the table's destinations and its action in the
    table's audit log, past tables of their names before them along the search_path, and
    `outbox resume` finds it there. Named without its schema, both went to the other
    tables: a worker of a role without a schema of its own sent on."""
    _table_and_shadows(empty_dsn)
    done = outbox(empty_dsn, "pause", "billing", "--reason", "maintenance window")
    assert done.returncode == 0, (done.stdout, done.stderr)
    assert _rows(empty_dsn, "SELECT destination, state FROM public.outbox_destinations") == [
        ("billing", "paused")
    ]
    assert _rows(empty_dsn, "SELECT count(*) FROM public.outbox_actions") == [(1,)]
    resumed = outbox(empty_dsn, "resume", "billing")
    assert resumed.returncode == 0, (resumed.stdout, resumed.stderr)
    assert _rows(empty_dsn, "SELECT destination, state FROM public.outbox_destinations") == [
        ("billing", "closed")
    ]
    assert _rows(empty_dsn, "SELECT count(*) FROM public.outbox_actions") == [(2,)]
    shadows = (
        "SELECT (SELECT count(*) FROM outbox_destinations), (SELECT count(*) FROM outbox_actions)"
    )
    assert _rows(empty_dsn, shadows) == [(0, 0)]


async def test_a_worker_serves_by_the_tables_own_destinations(empty_dsn: str) -> None:
    """A worker delivers to a destination the table's own destinations do not hold paused,
    and stamps it served there, past a table of their name before them along the
    search_path that holds it paused: named without its schema, the worker read that one
    and held the messages back."""
    _table_and_shadows(empty_dsn)
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO outbox_destinations (destination, state, reason, changed_by)"
            " VALUES ('routed orders', 'paused', 'not the table''s', 'someone')"
        )
        served = "SELECT destination, state, served_by FROM {} ORDER BY destination"
        async with dispatching(settings(empty_dsn, owner="router-1"), Routed()):
            seed(conn, 3, event_type="orders")
            await wait_until(
                lambda: (
                    conn.execute(
                        "SELECT count(*) FROM public.outbox WHERE status = 'done'"
                    ).fetchone()
                    == (3,)
                ),
                what="the messages delivered",
            )
            await wait_until(
                lambda: (
                    conn.execute(served.format("public.outbox_destinations")).fetchall()
                    == [("routed orders", "closed", "router-1")]
                ),
                what="the destination stamped served in the table's own destinations",
            )
        assert conn.execute(served.format("outbox_destinations")).fetchall() == [
            ("routed orders", "paused", None)
        ]


async def test_the_tui_shows_and_pauses_the_tables_own_destinations(empty_dsn: str) -> None:
    """The TUI lists the table's own destinations and records a pause in them and in the
    table's audit log, past tables of their names before them along the search_path: named
    without its schema, it listed the other table's and paused there."""
    from outbox.tui.source import PgSource

    _table_and_shadows(empty_dsn)
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        conn.execute("INSERT INTO public.outbox_destinations (destination) VALUES ('billing')")
        conn.execute("INSERT INTO outbox_destinations (destination) VALUES ('elsewhere')")
    source = PgSource(empty_dsn, TABLE)
    try:
        assert [d.destination for d in await source.destinations()] == ["billing"]
        await source.change_destination("pause", "billing", "maintenance window")
    finally:
        await source.close()
    assert _rows(empty_dsn, "SELECT destination, state FROM public.outbox_destinations") == [
        ("billing", "paused")
    ]
    assert _rows(empty_dsn, "SELECT count(*) FROM public.outbox_actions") == [(1,)]
    assert _rows(empty_dsn, "SELECT destination, state FROM outbox_destinations") == [
        ("elsewhere", "closed")
    ]


async def test_the_operator_reads_the_tables_own_destinations(empty_dsn: str) -> None:
    """The operator's read of the table counts the table's own destinations (billing
    paused), past a table of their name before them along the search_path holding another
    one paused (named without its schema, the operator read that one). The pooled
    connection goes back with its search_path as it was: once a table of the name is made
    in the role's schema, the next read finds that table, and its destinations."""
    from outbox.controller.database import Pools, Target, read_table

    _table_and_shadows(empty_dsn)
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        insert = "INSERT INTO {} (destination, state) VALUES (%s, 'paused')"
        conn.execute(insert.format("public.outbox_destinations"), ("billing",))
        conn.execute(insert.format("outbox_destinations"), ("elsewhere",))
    stats, _ = await read_table(empty_dsn, TABLE)  # the one-shot form
    assert [d.destination for d in stats.destinations] == ["billing"]
    pools, target = Pools(max_connections=1), Target(empty_dsn, "1")
    try:
        reading = await pools.read(("ns", "d"), target, TABLE, ordered=False)
        assert [d.destination for d in reading.stats.destinations] == ["billing"]
        with psycopg.connect(empty_dsn, autocommit=True) as conn:
            user = conn.execute("SELECT current_user").fetchone()[0]  # type: ignore[index]
            migrate(conn, Table(str(user), "outbox"))
        # The same connection (one at most): its search_path back as it was, the role's
        # schema first. Left with public first, the read found public.outbox again.
        reading = await pools.read(("ns", "d"), target, TABLE, ordered=False)
        assert [d.destination for d in reading.stats.destinations] == ["elsewhere"]
    finally:
        await pools.close()
