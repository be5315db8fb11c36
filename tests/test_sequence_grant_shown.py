"""The GRANT a partitioned table's check offers a role that may not read the id's sequence
names that sequence as SQL reads it, on one line, whatever characters the table's name
holds: pasted as it is shown, it grants the sequence, and the check passes."""

from __future__ import annotations

import re

import psycopg
import pytest
from psycopg import sql
from test_partition_review import _role

from outbox.partitions import Layout, check
from outbox.plumbing.text import printable
from outbox.schema import migrate
from outbox.table import Table, shown_sql_name


@pytest.mark.parametrize(
    "name",
    ["outbox", "a\\b", "out\nbox", 'say "hi"', "ev%t", "e\x1b[31mx"],
    ids=["plain", "backslash", "newline", "quotes", "percent", "escape"],
)
async def test_the_offered_grant_names_the_sequence_and_works_pasted(
    empty_dsn: str, name: str
) -> None:
    table = Table(None, name)
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        migrate(conn, table, layout=Layout(100, 3))
        worker = _role(
            conn, "grant_shown_worker", "GRANT SELECT, UPDATE ON ALL TABLES IN SCHEMA public TO {r}"
        )
        sequence = conn.execute(
            sql.SQL("SELECT pg_get_serial_sequence({t}, 'id')").format(t=table.regclass_literal)
        ).fetchone()
        assert sequence is not None
        conn.execute(
            sql.SQL("REVOKE ALL ON SEQUENCE {} FROM grant_shown_worker").format(
                sql.SQL(sequence[0])  # pg_get_serial_sequence's text is quoted already
            )
        )
    async with await psycopg.AsyncConnection.connect(worker, autocommit=True) as aconn:
        with pytest.raises(ValueError) as refused:
            await check(aconn, table)
    line = str(refused.value)
    assert printable(line) == line and "\n" not in line, line
    grant = re.search(r"GRANT SELECT ON SEQUENCE .* TO \S+", line)
    assert grant, line
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL(grant.group(0)))  # type: ignore[arg-type]
    async with await psycopg.AsyncConnection.connect(worker, autocommit=True) as aconn:
        assert await check(aconn, table) is not None


def test_a_name_a_line_may_show_is_quoted_as_postgresql_quotes_it() -> None:
    assert shown_sql_name("outbox_id_seq", "outbox_id_seq") == "outbox_id_seq"
    assert shown_sql_name('"a\\b_id_seq"', "a\\b_id_seq") == '"a\\b_id_seq"'
    assert shown_sql_name('"out\nbox"', "out\nbox") == 'U&"out\\000abox"'
