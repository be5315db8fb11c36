"""A table named without its schema (`outbox`, in public) and tables of its partitions' names
in a schema before it along the search_path (the role's own, first as "$user"): `outbox
maintain`, `outbox partitions` and `outbox stats` name each partition, and the layout's
table, in the schema the table is in, so they read, note, make, detach and drop the table's
own partitions and leave the others alone. Named as the table was named, without a schema,
they reached the first table of the name along the search_path."""

from __future__ import annotations

import json
import logging
from datetime import timedelta

import psycopg
import pytest
from helpers import outbox_on as outbox
from helpers import seed

from outbox.partitions import RETIRING_MARK, Layout, check, keep_ahead
from outbox.schema import migrate
from outbox.table import Table

TABLE = Table.parse("outbox")


def _table(dsn: str) -> None:
    """Partitions of 100 ids, 2 ahead, p0 to p2 made: rows 1 to 250, those of p0 and p1
    done, p2's pending (the next run makes p3 and p4)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        migrate(conn, TABLE, layout=Layout(100, 2))
        seed(conn, 250)
        conn.execute("UPDATE outbox SET status = 'done', done_at = now() WHERE id < 200")


def _shadow(dsn: str, *names: str, rows: bool = True) -> None:
    """A table of each of `names` in the role's own schema, first along the search_path
    ("$user"), as a partition is made (no index), holding a pending row of the partition's
    ids unless not `rows`."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE SCHEMA IF NOT EXISTS AUTHORIZATION CURRENT_USER")
        for name in names:
            conn.execute(
                f"CREATE TABLE {name} (LIKE public.outbox INCLUDING DEFAULTS INCLUDING CONSTRAINTS)"
            )
            if rows:
                index = int(name.removeprefix("outbox_p"))
                conn.execute(
                    f"INSERT INTO {name} (id, aggregate_type, aggregate_id, event_type, payload)"
                    f" VALUES ({index * 100 + 50}, 'shadow', 's', 'Shadow', '{{}}')"
                )


def _shadows(dsn: str) -> dict[str, tuple[int, str | None]]:
    """Each table of the role's own schema: (rows, the table it is a partition of)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        found = conn.execute(
            "SELECT c.relname::text, (SELECT inhparent::regclass::text FROM pg_inherits"
            " WHERE inhrelid = c.oid) FROM pg_class c"
            " WHERE c.relnamespace = to_regnamespace(quote_ident(current_user))"
            " AND c.relkind = 'r'"
        ).fetchall()
        return {
            str(name): (
                int(conn.execute(f"SELECT count(*) FROM {name}").fetchone()[0]),  # type: ignore[index]
                parent,
            )
            for name, parent in found
        }


def _partitions(dsn: str) -> list[str]:
    """The table's partitions, as schema.name, in id order."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        return [
            str(name)
            for (name,) in conn.execute(
                "SELECT n.nspname || '.' || c.relname FROM pg_inherits i"
                " JOIN pg_class c ON c.oid = i.inhrelid"
                " JOIN pg_namespace n ON n.oid = c.relnamespace"
                " WHERE i.inhparent = 'public.outbox'::regclass"
                " ORDER BY substr(c.relname, 9)::int"
            ).fetchall()
        ]


def test_maintain_retires_the_tables_partitions_and_leaves_the_shadowing_tables(
    empty_dsn: str,
) -> None:
    """p0 and p1 are finished: a run with no retention retires them both, and the table of
    p1's name before them along the search_path keeps its row, attached to nothing. Named
    without its schema, p1 was read there (one pending row: kept), or noted and detached
    there (not a partition: the run failed)."""
    _table(empty_dsn)
    _shadow(empty_dsn, "outbox_p1")
    done = outbox(empty_dsn, "maintain", "--retention", "0s")
    assert done.returncode == 0, (done.stdout, done.stderr)
    assert "retired 2 (" in done.stdout, done.stdout
    assert _partitions(empty_dsn) == [f"public.outbox_p{k}" for k in (2, 3, 4)]
    assert _shadows(empty_dsn) == {"outbox_p1": (1, None)}
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        assert conn.execute("SELECT to_regclass('public.outbox_p1')").fetchone() == (None,)
        assert conn.execute("SELECT count(*) FROM public.outbox").fetchone() == (51,)


def test_maintain_drops_the_partition_a_run_left_detached_not_the_shadowing_table(
    empty_dsn: str,
) -> None:
    """A run that detached p1 and ended before its DROP leaves it detached, noted: the next
    run drops it, and not an empty table of its name before it along the search_path (named
    without its schema, the DROP took that one, and left p1 detached for good)."""
    _table(empty_dsn)
    done = outbox(empty_dsn, "maintain", "--retention", "7d")  # notes p0 and p1 finished
    assert done.returncode == 0, (done.stdout, done.stderr)
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        comment = conn.execute(
            "SELECT obj_description('public.outbox_p1'::regclass, 'pg_class')"
        ).fetchone()
        assert comment is not None  # a run marks its note retiring just before its detach
        conn.execute(
            psycopg.sql.SQL("COMMENT ON TABLE public.outbox_p1 IS {}").format(
                f"{comment[0]}{RETIRING_MARK}"
            )
        )
        conn.execute("ALTER TABLE public.outbox DETACH PARTITION public.outbox_p1")
    _shadow(empty_dsn, "outbox_p1", rows=False)
    done = outbox(empty_dsn, "maintain", "--retention", "0s")
    assert done.returncode == 0, (done.stdout, done.stderr)
    assert "retired 2 (" in done.stdout, done.stdout
    assert _shadows(empty_dsn) == {"outbox_p1": (0, None)}
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        assert conn.execute("SELECT to_regclass('public.outbox_p1')").fetchone() == (None,)


def test_maintain_makes_and_attaches_the_tables_own_partition_past_a_shadowing_table(
    empty_dsn: str,
) -> None:
    """An empty table of p3's name, as a partition is made, before the table along the
    search_path: the run makes p3 in the table's schema and attaches that one (named
    without its schema, the other table was attached, to take the ids of p3)."""
    _table(empty_dsn)  # partitions p0 to p2: the run makes p3 and p4
    _shadow(empty_dsn, "outbox_p3", rows=False)
    done = outbox(empty_dsn, "maintain", "--retention", "7d")
    assert done.returncode == 0, (done.stdout, done.stderr)
    assert "made 2 partitions ahead" in done.stdout, done.stdout
    assert _partitions(empty_dsn) == [f"public.outbox_p{k}" for k in range(5)]
    assert _shadows(empty_dsn) == {"outbox_p3": (0, None)}


def test_a_table_in_the_way_is_named_in_the_tables_schema(empty_dsn: str) -> None:
    """A table of p3's name in the table's schema, holding a row, is in the way of p3; an
    empty one of the same name before it along the search_path is not. The refusal names
    the one in the way with its schema: named as the table is, the advice to drop it would
    have reached the other one, and the next run failed alike."""
    _table(empty_dsn)
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE public.outbox_p3 (LIKE public.outbox INCLUDING DEFAULTS)")
        conn.execute(
            "INSERT INTO public.outbox_p3 (id, aggregate_type, aggregate_id, event_type, payload)"
            " VALUES (350, 'mine', 'm', 'Mine', '{}')"
        )
    _shadow(empty_dsn, "outbox_p3", rows=False)
    done = outbox(empty_dsn, "maintain", "--retention", "7d")
    assert done.returncode == 1, (done.stdout, done.stderr)
    assert "table public.outbox_p3 is in the way of partition 3 of outbox" in done.stderr, (
        done.stderr
    )
    assert _shadows(empty_dsn) == {"outbox_p3": (0, None)}
    assert _partitions(empty_dsn) == [f"public.outbox_p{k}" for k in range(3)]


def _noted_and_shadowed(dsn: str) -> None:
    """`_table`, p0 and p1 noted finished by a run, then tables of p1's and p2's names
    before them along the search_path, holding a pending row each."""
    _table(dsn)
    done = outbox(dsn, "maintain", "--retention", "7d")  # notes p0 and p1 finished
    assert done.returncode == 0, (done.stdout, done.stderr)
    _shadow(dsn, "outbox_p1", "outbox_p2")


def test_partitions_reads_the_tables_partitions(empty_dsn: str) -> None:
    """`outbox partitions` lists p1 finished (no pending row) and p2 with its 51 pending
    rows, past tables of their names holding a pending row each before them along the
    search_path: named without its schema, each partition was read there (p1: 1 pending,
    not retirable)."""
    _noted_and_shadowed(empty_dsn)
    listed = outbox(empty_dsn, "partitions", "--json")
    assert listed.returncode == 0, listed.stderr
    rows = {p["name"]: p for p in json.loads(listed.stdout)["partitions"]}
    assert (rows["outbox_p1"]["pending"], rows["outbox_p1"]["retirable"]) == (0, True)
    assert rows["outbox_p1"]["done_since"] is not None
    assert rows["outbox_p2"]["pending"] == 51
    assert _shadows(empty_dsn) == {"outbox_p1": (1, None), "outbox_p2": (1, None)}


def test_stats_counts_the_tables_partition(empty_dsn: str) -> None:
    """`outbox stats` counts p2's 51 pending rows (p2 is its whole window once p0 and p1
    are noted finished, and is named itself), past a table of its name holding a pending
    row before it along the search_path: named without its schema, that one was counted."""
    _noted_and_shadowed(empty_dsn)
    stats = outbox(empty_dsn, "stats", "--json")
    assert stats.returncode == 0, stats.stderr
    assert json.loads(stats.stdout)["pending"] == 51
    assert _shadows(empty_dsn) == {"outbox_p1": (1, None), "outbox_p2": (1, None)}


def test_the_layouts_table_is_read_in_the_tables_schema(empty_dsn: str) -> None:
    """A table of the layout table's name before it along the search_path, recording
    another partition size: the commands read the table's own (size 100), so `outbox
    maintain` makes p3 and p4 of 100 ids and retires p0 and p1 (read as partitions of 1,000
    ids, p0 was in the way of itself)."""
    _table(empty_dsn)
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        conn.execute("CREATE SCHEMA AUTHORIZATION CURRENT_USER")
        conn.execute("CREATE TABLE outbox_layout (LIKE public.outbox_layout INCLUDING ALL)")
        conn.execute("INSERT INTO outbox_layout VALUES (true, 1000, 50)")
    done = outbox(empty_dsn, "maintain", "--retention", "0s")
    assert done.returncode == 0, (done.stdout, done.stderr)
    assert "made 2 partitions ahead, retired 2 (" in done.stdout, done.stdout
    assert _partitions(empty_dsn) == [f"public.outbox_p{k}" for k in (2, 3, 4)]


async def test_a_workers_check_and_keeper_use_the_tables_own_layout_and_partitions(
    empty_dsn: str,
) -> None:
    """A worker's check reads the layout in the table's schema (size 100, not the 1,000 a
    table of the layout table's name before it records), and its keeper makes p3 there and
    attaches that one, past an empty table of p3's name before it along the search_path
    (named without its schema, that table was attached)."""
    _table(empty_dsn)
    _shadow(empty_dsn, "outbox_p3", rows=False)
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE outbox_layout (LIKE public.outbox_layout INCLUDING ALL)")
        conn.execute("INSERT INTO outbox_layout VALUES (true, 1000, 50)")
    async with await psycopg.AsyncConnection.connect(empty_dsn, autocommit=True) as aconn:
        layout = await check(aconn, TABLE)
        assert layout is not None and layout.schema == "public"
        assert (layout.partition_size, layout.partitions_ahead) == (100, 2)
        kept = await keep_ahead(aconn, TABLE, layout)
    assert kept.made == 2
    assert _partitions(empty_dsn) == [f"public.outbox_p{k}" for k in range(5)]
    assert _shadows(empty_dsn) == {"outbox_p3": (0, None), "outbox_layout": (1, None)}


def test_a_replay_takes_the_note_off_the_tables_partition(empty_dsn: str) -> None:
    """A replay of p1's rows takes maintenance's note off p1 itself, past a table of its
    name before it along the search_path, so `outbox stats` counts them pending again
    (named without its schema, the other table's comment was looked at, none, and p1 stayed
    noted: its 100 replayed rows left out of every snapshot)."""
    _noted_and_shadowed(empty_dsn)
    replayed = outbox(
        empty_dsn, "replay", "--since", "1h", "--until", "0s", "--yes", "--reason", "test"
    )
    assert replayed.returncode == 0, (replayed.stdout, replayed.stderr)
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        notes = conn.execute(
            "SELECT obj_description('public.outbox_p0'::regclass, 'pg_class'),"
            " obj_description('public.outbox_p1'::regclass, 'pg_class')"
        ).fetchone()
    assert notes == (None, None)
    stats = outbox(empty_dsn, "stats", "--json")
    assert stats.returncode == 0, stats.stderr
    assert json.loads(stats.stdout)["pending"] == 250


def test_migrate_makes_and_attaches_the_tables_own_partition_past_a_shadowing_table(
    empty_dsn: str,
) -> None:
    """`outbox migrate` run again makes the partitions missing ahead as `outbox maintain`
    does: p3 in the table's schema, attached, past an empty table of its name before it
    along the search_path (named without its schema, that table was attached)."""
    _table(empty_dsn)
    _shadow(empty_dsn, "outbox_p3", rows=False)
    done = outbox(empty_dsn, "migrate", "--partition-size", "100", "--partitions-ahead", "2")
    assert done.returncode == 0, (done.stdout, done.stderr)
    assert "made 2 partitions ahead" in done.stdout, done.stdout
    assert _partitions(empty_dsn) == [f"public.outbox_p{k}" for k in range(5)]
    assert _shadows(empty_dsn) == {"outbox_p3": (0, None)}


def test_a_plain_table_converted_stays_in_its_schema_with_a_schema_of_the_roles_before_it(
    empty_dsn: str,
) -> None:
    """A plain table in public, then a schema of the role's own (first along the
    search_path, as "$user"), made after it: the conversion makes the partitioned table,
    its partitions and what goes with them in public, where the table is. Made as the
    table is named, they went to the role's schema: the new parent there, the old table
    left in public as its first partition, and the command failed after the swap."""
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        migrate(conn, TABLE)
        seed(conn, 250)
        conn.execute("CREATE SCHEMA AUTHORIZATION CURRENT_USER")
    done = outbox(empty_dsn, "migrate", "--table", "outbox", "--partition-size", "100")
    assert done.returncode == 0, (done.stdout, done.stderr)
    assert _shadows(empty_dsn) == {}
    parts = _partitions(empty_dsn)
    assert parts[0] == "public.outbox_p0" and all(p.startswith("public.") for p in parts), parts
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        assert conn.execute("SELECT count(*) FROM public.outbox").fetchone() == (250,)


def _shadow_layout(dsn: str, *rows: str) -> None:
    """A table of the layout table's name in the role's own schema, first along the
    search_path ("$user"), holding `rows`."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE SCHEMA IF NOT EXISTS AUTHORIZATION CURRENT_USER")
        conn.execute("CREATE TABLE outbox_layout (LIKE public.outbox_layout INCLUDING ALL)")
        for values in rows:
            conn.execute(f"INSERT INTO outbox_layout VALUES ({values})")


def _layouts(dsn: str) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """(the table's layout rows, the other table's), as (size, ahead)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        read = "SELECT partition_size::int, partitions_ahead FROM {}"
        return (
            conn.execute(read.format("public.outbox_layout")).fetchall(),
            conn.execute(read.format("outbox_layout")).fetchall(),
        )


def test_migrate_reads_and_records_the_tables_own_layout(empty_dsn: str) -> None:
    """`outbox migrate` run again with 3 ahead reads the table's own layout (partitions of
    100 ids) and records 3 ahead there, past a table of the layout table's name before it
    along the search_path recording partitions of 1,000 ids: named without its schema, that
    one was read (the run refused --partition-size 100 as a change of size) and written."""
    _table(empty_dsn)
    _shadow_layout(empty_dsn, "true, 1000, 50")
    done = outbox(empty_dsn, "migrate", "--partition-size", "100", "--partitions-ahead", "3")
    assert done.returncode == 0, (done.stdout, done.stderr)
    assert "recorded the layout: partitions of 100 ids, 3 kept ahead (was 2)" in done.stdout
    assert "made 3 partitions ahead" in done.stdout, done.stdout
    assert _layouts(empty_dsn) == ([(100, 3)], [(1000, 50)])
    assert _partitions(empty_dsn) == [f"public.outbox_p{k}" for k in range(6)]


async def test_the_operators_retention_retires_the_partitions_past_an_empty_layout_table(
    empty_dsn: str,
) -> None:
    """The operator's retention reads the table's own layout: past an empty table of the
    layout table's name before it along the search_path, the partitioned table is
    maintained, p0 and p1 dropped whole (named without its schema, the empty table was read,
    and the rows were deleted as from a plain table, the partitions left in place)."""
    from outbox.operations.maintenance import retire_done_async

    _table(empty_dsn)
    _shadow_layout(empty_dsn)
    async with await psycopg.AsyncConnection.connect(empty_dsn, autocommit=True) as aconn:
        assert await retire_done_async(aconn, TABLE, older_than=timedelta(0)) == 199
    assert _partitions(empty_dsn) == [f"public.outbox_p{k}" for k in (2, 3, 4)]
    assert _layouts(empty_dsn) == ([(100, 2)], [])


async def test_the_operators_retention_purges_a_plain_table_past_a_layout_tables_row(
    empty_dsn: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A plain table whose own layout table is empty is purged without a word, past a table
    of the layout table's name before it along the search_path holding a row: named without
    its schema, that row was read, and the purge warned of a conversion undone by hand."""
    from outbox.operations.maintenance import retire_done_async

    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        migrate(conn, TABLE)
        seed(conn, 10)
        conn.execute("UPDATE outbox SET status = 'done', done_at = now() WHERE id <= 4")
    _shadow_layout(empty_dsn, "true, 100, 2")
    with caplog.at_level(logging.WARNING, logger="outbox.maintenance"):
        async with await psycopg.AsyncConnection.connect(empty_dsn, autocommit=True) as aconn:
            assert await retire_done_async(aconn, TABLE, older_than=timedelta(0)) == 4
    assert [r.getMessage() for r in caplog.records] == []
