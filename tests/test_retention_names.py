"""`outbox maintain` on tables whose names need quoting (a quote, a space, a `%`): a run
killed in its DETACH ... CONCURRENTLY (its session terminated) leaves the partition pending
detach, its note marked retiring; the next run finishes it and drops it, and a partition
someone else began detaching is attached back."""

from __future__ import annotations

import re
import subprocess
import sys

import psycopg
import pytest
from helpers import wait_until_db
from psycopg import sql

from outbox import Event, enqueue_many
from outbox.partitions import RETIRING_MARK, Layout
from outbox.schema import migrate
from outbox.table import Table

_DETACHING = (
    "(SELECT pid FROM pg_stat_activity WHERE query LIKE '%DETACH PARTITION%CONCURRENTLY' "
    "AND wait_event_type = 'Lock')"
)


def _maintain(dsn: str, name: str, retention: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "outbox", "maintain", "--table", '"' + name.replace('"', '""') + '"',
         "--retention", retention,
         "--dsn", dsn],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


@pytest.mark.parametrize("name", ['ev"t', "ev t", "ev%t"])
def test_a_run_killed_in_its_detach_is_finished_by_the_next(empty_dsn: str, name: str):
    table = Table(None, name)
    leaf = Table(None, f"{name}_p0")
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        migrate(conn, table, layout=Layout(100, 2))
        with conn.transaction():
            enqueue_many(
                conn, [Event("order", "a", "Tested", {"n": i}) for i in range(150)], table=table
            )
        conn.execute(sql.SQL("UPDATE {} SET status = 'done', done_at = now()").format(table.ident))
        with psycopg.connect(empty_dsn) as reader:
            reader.execute(sql.SQL("SELECT count(*) FROM {}").format(table.ident))
            run = _maintain(empty_dsn, name, "0s")
            wait_until_db(conn, f"{_DETACHING} IS NOT NULL", timeout=60)
            conn.execute(f"SELECT pg_terminate_backend({_DETACHING})")
            assert run.wait(timeout=60) != 0
            reader.rollback()
        comment = conn.execute(
            sql.SQL(
                "SELECT obj_description({r}::regclass, 'pg_class'),"
                " (SELECT inhdetachpending FROM pg_inherits WHERE inhrelid = {r}::regclass)"
            ).format(r=leaf.regclass_literal)
        ).fetchone()
        assert comment is not None and str(comment[0]).endswith(RETIRING_MARK)
        assert comment[1] is True
        again = _maintain(empty_dsn, name, "7d")  # the run had found it old enough
        out, err = again.communicate(timeout=120)
        assert again.returncode == 0, err
        assert re.search(r"retired 1 \(~?99 rows\)", out), out
        gone = conn.execute(
            sql.SQL("SELECT to_regclass({r})").format(r=leaf.regclass_literal)
        ).fetchone()
        assert gone == (None,)
        left = conn.execute(sql.SQL("SELECT count(*) FROM {}").format(table.ident)).fetchone()
        assert left == (51,)
