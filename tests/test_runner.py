"""outbox.runner's operations of several statements: one generator of steps, run alike on a
sync and an async connection, in one transaction when asked."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import psycopg
import pytest
from psycopg import sql

from outbox.runner import (
    Query,
    Rollback,
    Steps,
    fetch,
    fetch_async,
    first_row,
    no_rows,
    observe,
    perform,
    perform_async,
    step,
)


def _value(expression: str) -> Query[int]:
    return Query(sql.SQL(f"SELECT {expression}"), None, first_row(lambda row: int(row[0])))


def _add_one(table: str) -> Query[None]:
    return Query(sql.SQL("INSERT INTO {} VALUES (1)").format(sql.Identifier(table)), None, no_rows)


def _count(table: str) -> Query[int]:
    statement = sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(table))
    return Query(statement, None, first_row(lambda row: int(row[0])))


def _doubled_sum() -> Steps[int]:
    # The second statement depends on the first's result, as a lock-then-write does.
    first = yield from step(_value("20"))
    second = yield from step(_value(f"{first} + 1"))
    return first + second


def _write_then_refuse(table: str) -> Steps[None]:
    yield from step(_add_one(table))
    raise LookupError("refused after the write")


def test_an_operation_runs_alike_on_sync_and_async_connections(conn, dsn):
    assert perform(conn, _doubled_sum()) == 41

    async def run() -> int:
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as aconn:
            return await perform_async(aconn, _doubled_sum())

    assert asyncio.run(run()) == 41


def test_an_operation_that_raises_rolls_its_transaction_back(conn, dsn):
    conn.execute("CREATE TABLE marks (n int)")
    with pytest.raises(LookupError):
        perform(conn, _write_then_refuse("marks"), transaction=True)
    assert perform(conn, step(_count("marks"))) == 0

    async def run() -> None:
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as aconn:
            await perform_async(aconn, _write_then_refuse("marks"), transaction=True)

    with pytest.raises(LookupError):
        asyncio.run(run())
    assert perform(conn, step(_count("marks"))) == 0
    # Without a transaction of its own, the write stands (autocommit).
    with pytest.raises(LookupError):
        perform(conn, _write_then_refuse("marks"))
    assert perform(conn, step(_count("marks"))) == 1


def test_an_operation_that_finds_nothing_to_do_rolls_back_and_returns_a_value(conn, dsn):
    conn.execute("CREATE TABLE marks (n int)")

    def write_then_undo() -> Steps[str]:
        yield from step(_add_one("marks"))
        raise Rollback("nothing to do")

    assert perform(conn, write_then_undo(), transaction=True) == "nothing to do"

    async def run() -> str:
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as aconn:
            return await perform_async(aconn, write_then_undo(), transaction=True)

    assert asyncio.run(run()) == "nothing to do"
    assert perform(conn, step(_count("marks"))) == 0


def test_a_failing_statement_ends_the_operation_and_closes_it(conn):
    closed = []

    def steps() -> Steps[int]:
        try:
            return (yield from step(_value("1 / 0")))
        finally:
            closed.append(True)

    with pytest.raises(psycopg.errors.DivisionByZero):
        perform(conn, steps())
    assert closed == [True]


def test_a_stop_iteration_raised_while_parsing_is_an_error_not_the_end(conn):
    def parse(rows: list[tuple[object, ...]]) -> int:
        return int(next(iter([])))

    with pytest.raises(StopIteration):
        perform(conn, step(Query(sql.SQL("SELECT 1"), None, parse)))


class _Counted(sql.Composed):
    """A composed statement that counts its renderings."""

    renderings = 0

    def as_bytes(self, context: object = None) -> bytes:
        type(self).renderings += 1
        return super().as_bytes(context)  # type: ignore[arg-type]


def test_a_statement_is_rendered_once_per_connection_however_often_it_runs(conn, dsn):
    """psycopg renders a composed statement at every execute (the claim's rendering cost
    more than the rest of its execute in Python): it is rendered once per connection, and
    each connection's rendering is its own (its encoding and adapters render literals)."""
    _Counted.renderings = 0
    query = Query(
        _Counted([sql.SQL("SELECT "), sql.Literal("it's"), sql.SQL(", %(n)s::int")]),
        {"n": 0},
        lambda rows: [tuple(row) for row in rows],
    )
    for n in range(3):
        assert fetch(conn, replace(query, params={"n": n})) == [("it's", n)]
    assert _Counted.renderings == 1

    async def run() -> list[tuple[object, ...]]:
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as aconn:
            await fetch_async(aconn, query)
            return await fetch_async(aconn, replace(query, params={"n": 7}))

    assert asyncio.run(run()) == [("it's", 7)]
    assert _Counted.renderings == 2


def test_a_statement_is_rendered_again_when_its_connection_changes_encoding(dsn):
    """A connection's encoding renders its identifiers and literals: an application's own
    connection (enqueue, queue_stats) may `SET client_encoding` between two runs of the
    same statement, and the text kept for the first encoding named another table."""
    query = Query(
        sql.SQL("SELECT {}, {} FROM (SELECT 1) AS {}").format(
            sql.Literal("ñandú"), sql.Literal("x"), sql.Identifier("ñandú")
        ),
        None,
        lambda rows: rows[0][0],
    )
    with psycopg.connect(dsn, autocommit=True) as conn:
        assert fetch(conn, query) == "ñandú"
        conn.execute("SET client_encoding TO 'LATIN1'")
        assert fetch(conn, query) == "ñandú"


def test_a_statements_values_go_by_position_as_psycopg_would_send_them_by_name(conn, dsn):
    """Numbered once with its rendering (psycopg finds a long statement's placeholders anew
    at every execute): a name used twice is one value, `%%` is a `%`, a value missing is
    psycopg's error, and a statement without values is sent as it is."""
    query = Query(
        sql.SQL("SELECT %(n)s::int + %(n)s::int, '50%%', %(name)s::text"),
        {"n": 2, "name": "it's", "unused": 0},
        lambda rows: [tuple(row) for row in rows],
    )
    assert fetch(conn, query) == [(4, "50%", "it's")]
    with pytest.raises(psycopg.ProgrammingError, match="query parameter missing: name"):
        fetch(conn, replace(query, params={"n": 1}))
    assert fetch(conn, Query(sql.SQL("SELECT '50%%'"), None, lambda rows: rows[0][0])) == "50%%"

    async def run() -> list[tuple[object, ...]]:
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as aconn:
            return await fetch_async(aconn, replace(query, prepare=True, binary=True))

    assert asyncio.run(run()) == [(4, "50%", "it's")]


def test_an_observer_is_told_of_each_statement_the_runner_runs_on_its_connection(conn, dsn):
    """The runner runs statements on cursors of its own, which a connection's `execute`
    never sees: a benchmark's breakdown by statement is told of each one, failed ones too,
    on the connection observed only, until it stops observing."""
    seen: list[tuple[bytes, float]] = []
    observe(conn, lambda text, seconds: seen.append((text, seconds)))
    query = Query(sql.SQL("SELECT %(n)s::int"), {"n": 1}, lambda rows: rows[0][0])
    assert fetch(conn, query) == 1
    with pytest.raises(psycopg.errors.DivisionByZero):
        fetch(conn, replace(query, statement=sql.SQL("SELECT 1 / %(n)s::int"), params={"n": 0}))
    with psycopg.connect(dsn, autocommit=True) as other:
        assert fetch(other, query) == 1
    observe(conn, None)
    assert fetch(conn, query) == 1
    assert [text for text, _ in seen] == [b"SELECT $1::int", b"SELECT 1 / $1::int"]
    assert all(seconds >= 0 for _, seconds in seen)
