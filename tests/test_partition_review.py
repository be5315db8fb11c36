"""Partitioned tables met in ways the layout's own commands never make them: a DEFAULT
partition added by hand, roles granted less than the layout needs, rows written past the
sequence, partitions retired under a worker's window, partitions made by two sessions at once."""

from __future__ import annotations

import json
import logging
import threading
from datetime import timedelta
from itertools import pairwise

import psycopg
import pytest
from helpers import outbox_on as outbox
from helpers import seed, wait_until, wait_until_db
from psycopg import sql
from test_worker import Scripted
from workers import dispatching, settings

from outbox import lease
from outbox.claim_window import ClaimWindow
from outbox.models import Outcome
from outbox.operations.conversion import migrate_converting
from outbox.operations.partition_maintenance import maintain
from outbox.partitions import Layout, check, make_partition, upkeep_lock
from outbox.schema import migrate
from outbox.stats import queue_stats
from outbox.table import Table
from outbox.worker import partition_keeper

TABLE = Table.parse("outbox")


@pytest.mark.parametrize(
    "command",
    [
        ["stats"],
        ["partitions"],
        ["maintain", "--retention", "0s"],
        ["migrate", "--partition-size", "100"],
    ],
)
def test_a_default_partition_is_named_in_one_line(empty_dsn: str, command: list[str]) -> None:
    """A DEFAULT partition someone added: every command that reads the partitions' bounds says
    what the check says of it, in one line, and changes nothing."""
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        migrate(conn, TABLE, layout=Layout(100, 2))
        conn.execute("CREATE TABLE outbox_default PARTITION OF outbox DEFAULT")
    done = outbox(empty_dsn, *command)
    assert done.returncode == 1, (done.stdout, done.stderr)
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert "error: table outbox cannot be served: it has a DEFAULT partition" in lines[0]
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        partitions = conn.execute(
            "SELECT count(*) FROM pg_inherits WHERE inhparent = 'outbox'::regclass"
        ).fetchone()
    assert partitions == (4,)  # p0..p2 and the DEFAULT one: nothing made, nothing retired


def test_migrate_waits_for_a_keeper_making_the_same_partition(empty_dsn: str) -> None:
    """`outbox migrate` at a pod's start while a worker's keeper makes the partition it would
    make too: it waits for the keeper's upkeep lock, then finds the partition made, where
    both making it failed on the partition's name."""
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        migrate(conn, TABLE, layout=Layout(100, 3))  # p0..p3
        seed(conn, 150)  # the highest id is in p1: p4 is missing ahead
    lock = sql.SQL("{key}").format(key=upkeep_lock(TABLE))
    with psycopg.connect(empty_dsn, autocommit=True) as keeper:
        # What keep_ahead does: the upkeep lock, then each partition in a transaction of its
        # own, here held open between its statements.
        keeper.execute(sql.SQL("SELECT pg_advisory_lock({l})").format(l=lock))
        failure: list[BaseException] = []
        with keeper.transaction():
            for statement in make_partition(TABLE, 4, 400, 500):
                keeper.execute(statement)

            def run_migrate() -> None:
                migrating = psycopg.conninfo.make_conninfo(empty_dsn, application_name="migrating")
                with psycopg.connect(migrating, autocommit=True) as other:
                    try:
                        migrate(other, TABLE, layout=Layout(100, 3))
                    except BaseException as exc:  # reported below
                        failure.append(exc)

            thread = threading.Thread(target=run_migrate)
            thread.start()
            with psycopg.connect(empty_dsn, autocommit=True) as watcher:
                wait_until_db(
                    watcher,
                    "EXISTS (SELECT FROM pg_stat_activity"
                    " WHERE application_name = 'migrating' AND wait_event_type = 'Lock')",
                )
        keeper.execute(sql.SQL("SELECT pg_advisory_unlock({l})").format(l=lock))
        thread.join(60)
    assert not thread.is_alive()
    assert not failure, f"outbox migrate failed: {failure[0]!r}"
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        names = conn.execute(
            "SELECT array_agg(c.relname::text ORDER BY c.relname) FROM pg_inherits i"
            " JOIN pg_class c ON c.oid = i.inhrelid WHERE i.inhparent = 'outbox'::regclass"
        ).fetchone()
    assert names == ([f"outbox_p{k}" for k in range(5)],)


# -- a table in the way of a partition ----------------------------------------------------------


def _p4_in_the_way(dsn: str, *ddl: str) -> None:
    """A table of partitions p0..p3, its highest id in p1 (so p4 is made next), and `ddl`
    run to put something named outbox_p4 in the way first."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        migrate(conn, TABLE, layout=Layout(100, 3))
        seed(conn, 150)
        for statement in ddl:
            conn.execute(statement)  # type: ignore[arg-type]


def _p4(dsn: str) -> tuple[object, ...] | None:
    """(rows, attached to) of the table outbox_p4."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        return conn.execute(
            "SELECT (SELECT count(*) FROM outbox_p4),"
            " (SELECT inhparent::regclass::text FROM pg_inherits"
            "   WHERE inhrelid = 'outbox_p4'::regclass)"
        ).fetchone()


@pytest.mark.parametrize(
    ("ddl", "why", "rows"),
    [
        (
            [
                "CREATE TABLE outbox_p4 (LIKE outbox INCLUDING DEFAULTS INCLUDING CONSTRAINTS)",
                "INSERT INTO outbox_p4 (id, aggregate_type, aggregate_id, event_type, payload)"
                " VALUES (450, 'a', 'b', 'c', '{}')",
            ],
            "it holds rows",
            1,
        ),
        (["CREATE TABLE outbox_p4 (note text)"], "its columns are not those of outbox", 0),
        (
            [
                "CREATE TABLE outbox_p4 (LIKE outbox INCLUDING DEFAULTS INCLUDING CONSTRAINTS,"
                " CONSTRAINT small CHECK (id < 10))"
            ],
            "its CHECK constraints are not those of outbox",
            0,
        ),
        (
            [
                "CREATE TABLE outbox_p4 (LIKE outbox INCLUDING DEFAULTS INCLUDING CONSTRAINTS)",
                "CREATE FUNCTION outbox_p4_hook() RETURNS trigger LANGUAGE plpgsql"
                " AS 'BEGIN RETURN NEW; END'",
                "CREATE TRIGGER hook BEFORE INSERT ON outbox_p4"
                " FOR EACH ROW EXECUTE FUNCTION outbox_p4_hook()",
            ],
            "it has triggers",
            0,
        ),
        (
            [
                "CREATE TABLE outbox_p4 (LIKE outbox INCLUDING DEFAULTS INCLUDING CONSTRAINTS)",
                "CREATE INDEX ON outbox_p4 (payload)",
            ],
            "it has indexes",
            0,
        ),
        (
            [
                "CREATE TABLE outbox_p4 (LIKE outbox INCLUDING DEFAULTS INCLUDING CONSTRAINTS)",
                "ALTER TABLE outbox_p4 ENABLE ROW LEVEL SECURITY",
            ],
            "it has row security",
            0,
        ),
    ],
    ids=["rows", "columns", "checks", "triggers", "indexes", "row-security"],
)
def test_a_table_in_the_way_of_a_partition_is_refused(
    empty_dsn: str, ddl: list[str], why: str, rows: int
) -> None:
    """A table named as the next partition, made by someone else, is never adopted: the
    command says in one line which table is in the way, why, and what to do, and leaves it
    as it was (not attached, its rows its own). Adopted, one with rows was attached with
    them (ATTACH scanned it), or ATTACH failed in PostgreSQL's words."""
    _p4_in_the_way(empty_dsn, *ddl)
    done = outbox(empty_dsn, "maintain", "--retention", "7d")
    assert done.returncode == 1, (done.stdout, done.stderr)
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0] == (
        f"outbox: error: table public.outbox_p4 is in the way of partition 4 of outbox (ids 400 to "
        f"499): {why}; rename or drop it, then run this again"
    )
    assert _p4(empty_dsn) == (rows, None)


def test_a_partition_made_and_never_attached_is_attached(empty_dsn: str) -> None:
    """What an `outbox maintain` stopped between making a partition and attaching it leaves
    (each statement commits on its own there): an empty table of the partition's own shape,
    which the next run attaches."""
    made = make_partition(TABLE, 4, 400, 500)[1].as_string(None)  # its CREATE TABLE
    _p4_in_the_way(empty_dsn, made)
    done = outbox(empty_dsn, "maintain", "--retention", "7d")
    assert done.returncode == 0, done.stderr
    assert _p4(empty_dsn) == (0, "outbox")


def test_partitions_of_a_table_named_without_its_schema_go_in_its_schema(empty_dsn: str) -> None:
    """A schema named after the role, made after the table: CREATE TABLE of a name without
    its schema puts the table there (the search_path's first schema), where only that
    role's sessions find it, and a worker of another role failed every claim naming it.
    Each partition goes in its parent's schema."""
    _p4_in_the_way(empty_dsn)
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        user = conn.execute("SELECT current_user").fetchone()[0]  # type: ignore[index]
        conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(user)))
    done = outbox(empty_dsn, "maintain", "--retention", "7d")
    assert done.returncode == 0, done.stderr
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        placed = conn.execute(
            "SELECT c.relname::text, c.relnamespace::regnamespace::text FROM pg_inherits i"
            " JOIN pg_class c ON c.oid = i.inhrelid"
            " WHERE i.inhparent = 'public.outbox'::regclass ORDER BY 1"
        ).fetchall()
    assert ("outbox_p4", "public") in placed  # made after the schema was
    assert {schema for _, schema in placed} == {"public"}


async def test_a_partition_in_another_schema_is_reached_through_the_parent_and_moved_home(
    empty_dsn: str,
) -> None:
    """A partition an earlier version made in another schema than its table's: the check
    does not name the partitions (statements reach them through the parent, which finds them
    wherever they are), and `outbox migrate` moves it home, after which they are named
    again. A table of its name in the way at home is refused in one line, nothing moved."""
    _p4_in_the_way(empty_dsn)  # rows 1 to 150: p0 and p1
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        conn.execute("CREATE SCHEMA elsewhere")
        conn.execute("ALTER TABLE outbox_p1 SET SCHEMA elsewhere")
        conn.execute("CREATE TABLE outbox_p1 (note text)")  # in the way at home
    async with await psycopg.AsyncConnection.connect(empty_dsn, autocommit=True) as aconn:
        layout = await check(aconn, TABLE)
        assert layout is not None and not layout.named_leaves
        got = await lease.claim(
            aconn, TABLE, owner="w", batch=200, lease=timedelta(minutes=1), max_attempts=5,
            window=ClaimWindow(layout),
        )  # fmt: skip
        assert [m.id for m in got] == list(range(1, 151))  # p1's rows too, through the parent
        await lease.finalize(aconn, TABLE, [Outcome.done(m) for m in got[:120]], layout=layout)
    refused = outbox(empty_dsn, "migrate")
    assert refused.returncode == 1, (refused.stdout, refused.stderr)
    assert refused.stderr.strip().splitlines() == [
        "outbox: error: partition elsewhere.outbox_p1 of table outbox belongs in schema public, "
        "where "
        "another table named outbox_p1 is in the way; rename or drop one of the two"
    ]
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        conn.execute("DROP TABLE public.outbox_p1")
    done = outbox(empty_dsn, "migrate")
    assert done.returncode == 0, done.stderr
    assert "moved partition elsewhere.outbox_p1 into the table's schema" in done.stdout
    async with await psycopg.AsyncConnection.connect(empty_dsn, autocommit=True) as aconn:
        layout = await check(aconn, TABLE)
        assert layout is not None and layout.named_leaves
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        home = conn.execute(
            "SELECT count(*) FILTER (WHERE status = 'done'),"
            " count(*) FILTER (WHERE status = 'processing') FROM public.outbox_p1"
        ).fetchone()
    assert home == (21, 30)  # ids 100 to 150, moved with their rows as they were


@pytest.mark.parametrize("made", ["before the check", "after the check"])
async def test_a_table_of_a_partitions_name_along_the_search_path_takes_none_of_its_claims(
    empty_dsn: str, made: str
) -> None:
    """A table named without its schema, and a table of one of its partitions' names in a
    schema before the table's along the search_path (the role's own), made before the
    worker checked the table or while it serves it: the statements name each partition in
    the schema the check found the table in, so every row is claimed (naming them as the
    table was named, claims in batches of 30 took 99 of 150, the rest left for good)."""
    _p4_in_the_way(empty_dsn)  # rows 1 to 150: p0 and p1, in public

    def shadow() -> None:
        with psycopg.connect(empty_dsn, autocommit=True) as conn:
            conn.execute("CREATE SCHEMA AUTHORIZATION CURRENT_USER")  # first along "$user"
            conn.execute("CREATE TABLE outbox_p1 (LIKE public.outbox INCLUDING ALL)")

    async with await psycopg.AsyncConnection.connect(empty_dsn, autocommit=True) as aconn:
        if made == "before the check":
            shadow()
        layout = await check(aconn, TABLE)
        assert layout is not None and layout.named_leaves and layout.schema == "public"
        if made == "after the check":
            shadow()
        window, got = ClaimWindow(layout), []
        for _ in range(8):
            got += await lease.claim(
                aconn, TABLE, owner="w", batch=30, lease=timedelta(minutes=1),
                max_attempts=5, window=window,
            )  # fmt: skip
        assert sorted(m.id for m in got) == list(range(1, 151))


def test_outbox_maintain_moves_a_partition_home_and_partitions_lists_it_before(
    empty_dsn: str,
) -> None:
    """`outbox partitions` reads a partition left in another schema where it is (it said the
    table did not exist), and `outbox maintain`, which the operator runs on its timer, moves
    it home before anything else, saying so."""
    _p4_in_the_way(empty_dsn)
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        conn.execute("CREATE SCHEMA elsewhere")
        conn.execute("ALTER TABLE outbox_p1 SET SCHEMA elsewhere")
    listed = outbox(empty_dsn, "partitions", "--json")
    assert listed.returncode == 0, listed.stderr
    rows = {p["name"]: p for p in json.loads(listed.stdout)["partitions"]}
    assert rows["outbox_p1"]["pending"] == 51
    done = outbox(empty_dsn, "maintain", "--retention", "7d")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(
        "outbox: moved elsewhere.outbox_p1 into the table's schema; made "
    ), done.stdout
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        assert conn.execute("SELECT count(*) FROM public.outbox_p1").fetchone() == (51,)


@pytest.mark.parametrize("ordered", [False, True], ids=["unordered", "ordered"])
async def test_a_partition_retired_above_a_pinned_one_leaves_a_gap_claims_step_over(
    empty_dsn: str, ordered: bool
) -> None:
    """A dead row pins its partition while retention retires the finished ones on either side:
    a gap between partitions. Every claim named the missing partition (a reading over the
    partitions from the dead row's, a head check), met `relation does not exist`, checked the
    table again and met it again, for good: no row was delivered any more. The check notes
    the gap, and the window and the checks step over it."""
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        migrate(conn, TABLE, "aggregate" if ordered else None, layout=Layout(100, 3))
        seed(conn, 350, aggregates=7)  # p0 to p3
        conn.execute("UPDATE outbox SET status = 'done', done_at = now()")
        conn.execute("UPDATE outbox SET status = 'dead', done_at = NULL WHERE id = 150")
        done = maintain(conn, TABLE, retention=timedelta(0))
        assert sorted(done.retired) == ["outbox_p0", "outbox_p2"]  # p1 pinned, p3 the newest
        fresh = seed(conn, 30, aggregates=7)  # ids 351 to 380, in p3
    if ordered:  # the dead row's aggregate (agg-2) waits behind it, as on a plain table
        fresh = [message_id for i, message_id in enumerate(fresh) if i % 7 != 149 % 7]
    async with await psycopg.AsyncConnection.connect(empty_dsn, autocommit=True) as aconn:
        layout = await check(aconn, TABLE)
        assert layout is not None and layout.gaps == {2}
        window, taken = ClaimWindow(layout), []
        for _ in range(40):  # ordered: one message of each of the 7 aggregates a claim
            got = await lease.claim(
                aconn, TABLE, owner="w", batch=50, lease=timedelta(minutes=1),
                max_attempts=5, window=window, ordered=ordered,
            )  # fmt: skip
            taken += [m.id for m in got]
            await lease.finalize(aconn, TABLE, [Outcome.done(m) for m in got], layout=layout)
            if len(taken) == len(fresh):
                break
    assert sorted(taken) == fresh


# -- the sequence the ids come from ------------------------------------------------------------


def _role(conn: psycopg.Connection[tuple[object, ...]], name: str, *grants: str) -> str:
    """A login role (made once per cluster) with `grants` on this database's tables; its DSN
    is the connection's with the role's name and password."""
    conn.execute(
        sql.SQL(
            "DO $$BEGIN CREATE ROLE {r} LOGIN PASSWORD 'review';"
            " EXCEPTION WHEN duplicate_object THEN NULL; END$$"
        ).format(r=sql.Identifier(name))
    )
    for grant in grants:
        conn.execute(sql.SQL(grant).format(r=sql.Identifier(name)))  # type: ignore[arg-type]
    return psycopg.conninfo.make_conninfo(
        conn.info.dsn, user=name, password="review", dbname=conn.info.dbname
    )


async def _drain(dsn: str, rounds: int = 12, *, forget: bool = False) -> list[int]:
    """A worker's claims through its window (the table's checked layout), each finalized;
    with `forget`, the window forgotten after each (as after a reconnection: the next
    reading starts from the lowest partition, as one does every FLOOR_TTL)."""
    taken: list[int] = []
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as aconn:
        window = ClaimWindow(await check(aconn, TABLE))
        for _ in range(rounds):
            got = await lease.claim(
                aconn, TABLE, owner="w", batch=50, lease=timedelta(minutes=1),
                max_attempts=5, window=window,
            )  # fmt: skip
            taken += [m.id for m in got]
            await lease.finalize(aconn, TABLE, [Outcome.done(m) for m in got], layout=window.layout)
            if forget:
                window.forget()
    return taken


async def test_a_worker_role_without_the_sequence_is_refused_until_migrate_grants_it(
    empty_dsn: str,
) -> None:
    """The documented worker grant (SELECT, UPDATE) given after the table was made: the
    check refuses the role in one line naming the sequence and the GRANT (its window would
    have stopped at partition 0: PostgreSQL 18 answers NULL for the sequence's last value,
    read as 0), and `outbox migrate` run again grants it; then every row is claimed."""
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        migrate(conn, TABLE, layout=Layout(100, 3))
        seed(conn, 250)  # partitions 0, 1 and 2
        worker = _role(
            conn,
            "review_worker",
            "GRANT SELECT, UPDATE ON outbox TO {r}",
            "GRANT SELECT ON outbox_layout, outbox_destinations TO {r}",
        )
        conn.execute("REVOKE ALL ON SEQUENCE outbox_id_seq FROM review_worker")
    async with await psycopg.AsyncConnection.connect(worker, autocommit=True) as aconn:
        with pytest.raises(ValueError) as refused:
            await check(aconn, TABLE)
    assert str(refused.value) == (
        "role review_worker may not read public.outbox_id_seq, the sequence its ids come from, "
        "which the claims and the partitions ahead are read from; GRANT SELECT ON SEQUENCE "
        "public.outbox_id_seq TO review_worker (outbox migrate and outbox maintain grant it to "
        "every role that may UPDATE the table)"
    )
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        migrate(conn, TABLE, layout=Layout(100, 3))
    assert sorted(await _drain(worker)) == list(range(1, 251))


async def test_maintain_grants_the_sequence_to_the_roles_that_may_update(empty_dsn: str) -> None:
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        migrate(conn, TABLE, layout=Layout(100, 3))
        _role(conn, "review_worker", "GRANT SELECT, UPDATE ON ALL TABLES IN SCHEMA public TO {r}")
        _role(conn, "review_reader", "GRANT SELECT ON ALL TABLES IN SCHEMA public TO {r}")
        conn.execute("REVOKE ALL ON SEQUENCE outbox_id_seq FROM review_worker, review_reader")
        maintain(conn, TABLE, retention=timedelta(days=1))
        granted = conn.execute(
            "SELECT has_sequence_privilege('review_worker', 'outbox_id_seq', 'SELECT'),"
            " has_sequence_privilege('review_worker', 'outbox_id_seq', 'USAGE, UPDATE'),"
            " has_sequence_privilege('review_reader', 'outbox_id_seq', 'SELECT, USAGE')"
        ).fetchone()
    assert granted == (True, False, False)  # read only, and only to who may update the rows


async def test_a_worker_role_that_served_the_plain_table_serves_it_converted(dsn: str) -> None:
    """The documented worker grant on a plain table, which `outbox migrate --partition-size`
    converts: the conversion carries the sequence to it with the table's grants."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        worker = _role(
            conn, "review_worker", "GRANT SELECT, UPDATE ON outbox, outbox_destinations TO {r}"
        )
        seed(conn, 50)
        # `outbox migrate --partition-size 100 --partitions-ahead 2`: p0 holds ids 0..299
        migrate_converting(conn, TABLE, None, Layout(100, 2))
        seed(conn, 150)  # ids 300..449, in partitions 3 and 4
        conn.execute(
            "UPDATE outbox SET status = 'done', done_at = now() WHERE id < 300"
        )  # the plain table's rows, served before
    taken = await _drain(worker)
    assert sorted(taken) == list(range(300, 450)), f"claimed {len(taken)} of 150"


def test_stats_by_a_reader_without_the_sequence_sees_every_row(empty_dsn: str) -> None:
    """A role that may only read (`outbox stats`, the TUI) and not the sequence: the window
    cannot end at the sequence's partition, so it ends at the last partition holding a row
    (each partition's file looked at), where it stopped at partition 0 before."""
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        migrate(conn, TABLE, layout=Layout(100, 3))
        seed(conn, 250)
        reader = _role(conn, "review_reader", "GRANT SELECT ON ALL TABLES IN SCHEMA public TO {r}")
        conn.execute("REVOKE ALL ON SEQUENCE outbox_id_seq FROM review_reader")
    with psycopg.connect(reader, autocommit=True) as conn:
        stats = queue_stats(conn, TABLE)
    assert (stats.pending, stats.max_id) == (250, 250)


# -- a row written with an id of its own -------------------------------------------------------


async def test_a_row_past_the_sequence_is_claimed(empty_dsn: str) -> None:
    """A producer's row with an id of its own, past the sequence, in a partition made ahead:
    `outbox stats` counts it, and the claims find it the same way (its partition's file), at
    a reading from the lowest partition, so it is delivered after the rows below it."""
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        migrate(conn, TABLE, layout=Layout(100, 3))
        seed(conn, 10)  # ids 1..10
        conn.execute(
            "INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, payload)"
            " VALUES (250, 'order', 'x', 'Tested', '{}')"
        )
        assert queue_stats(conn, TABLE).pending == 11
    taken = await _drain(empty_dsn, rounds=3, forget=True)
    assert taken == [*range(1, 11), 250]
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        assert queue_stats(conn, TABLE).pending == 0


# -- a partition retired under a worker's window -----------------------------------------------


async def test_a_partition_retired_under_a_window_costs_its_worker_nothing(
    empty_dsn: str,
) -> None:
    """Worker 1's window names partition 0 when `outbox maintain --retention 0s` retires it
    (another replica finished its rows): worker 1's next claim meets the missing partition,
    reads its window again from the lowest partition and claims at once, its statements
    still naming partitions (they went through the parent for the process's life)."""
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        migrate(conn, TABLE, layout=Layout(100, 3))
        seed(conn, 150)  # ids 1..150: partition 0 full, partition 1 half
    async with (
        await psycopg.AsyncConnection.connect(empty_dsn, autocommit=True) as a1,
        await psycopg.AsyncConnection.connect(empty_dsn, autocommit=True) as a2,
    ):
        w1, w2 = ClaimWindow(await check(a1, TABLE)), ClaimWindow(await check(a2, TABLE))

        async def claim(
            aconn: psycopg.AsyncConnection[tuple[object, ...]], w: ClaimWindow, n: int
        ) -> list[int]:
            got = await lease.claim(
                aconn, TABLE, owner="w", batch=n, lease=timedelta(minutes=1), max_attempts=5,
                window=w,
            )  # fmt: skip
            await lease.finalize(aconn, TABLE, [Outcome.done(m) for m in got], layout=w.layout)
            return [m.id for m in got]

        assert await claim(a1, w1, 40) == list(range(1, 41))  # w1's window: partition 0
        assert await claim(a2, w2, 59) == list(range(41, 100))  # the rest of it, elsewhere
        with psycopg.connect(empty_dsn, autocommit=True) as conn:
            assert maintain(conn, TABLE, retention=timedelta(0)).retired == ["outbox_p0"]
        assert await claim(a1, w1, 40) == list(range(100, 140))
        assert w1.layout is not None and w1.layout.named_leaves
        assert w1.bounds().low == 100


# -- the partition keeper's refusals -----------------------------------------------------------


async def test_the_keeper_pauses_after_its_first_refusal(
    empty_dsn: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A worker whose role may not make partitions is told so once, and the keeper goes on at
    once to read the ids left ahead; a refusal after that (here the sequence revoked, which
    PostgreSQL 15 refused every read of) waits for the next pass like any database error,
    where it went round again at once: 59 warnings in 3 seconds."""
    monkeypatch.setattr(partition_keeper, "KEEP_INTERVAL", 0.1)
    caplog.set_level(logging.WARNING, logger="outbox.worker")
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        migrate(conn, TABLE, layout=Layout(100, 3))
        seed(conn, 150)
        worker = _role(
            conn,
            "review_keeper",
            "GRANT SELECT, UPDATE ON ALL TABLES IN SCHEMA public TO {r}",
            "REVOKE CREATE ON SCHEMA public FROM PUBLIC, {r}",
        )
        migrate(conn, TABLE, layout=Layout(100, 3))  # p0..p4, the sequence granted to it
        seed(conn, 200)  # 149 ids left ahead of a target of 300: the keeper would make more

        def told(words: str) -> list[logging.LogRecord]:
            return [r for r in caplog.records if words in r.getMessage()]

        async with dispatching(settings(worker, batch=40), Scripted(lambda m: None)):
            await wait_until(lambda: told("may not make partitions"), what="the first refusal")
            conn.execute("REVOKE SELECT ON SEQUENCE outbox_id_seq FROM review_keeper")
            await wait_until(
                lambda: len(told("could not keep partitions ahead")) >= 3,
                timeout=10,
                what="three passes refused",
            )
    assert len(told("may not make partitions")) == 1
    passes = [r.created for r in told("could not keep partitions ahead")]
    assert all(later - earlier >= 0.09 for earlier, later in pairwise(passes)), passes
