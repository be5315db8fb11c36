"""`outbox maintain` meeting a partition it did not begin to retire: one someone began to
detach by hand (`DETACH ... CONCURRENTLY` cancelled, left pending detach) or detached by
hand. Only a run marks a partition retiring (in its note) before it detaches it; a run
finishes and drops what a run began, and nothing else. A run read the note alone, which the
workers' keepers write on every finished partition: a partition begun detaching by hand a
minute after it was noted was finished and dropped at the next run whatever the retention,
and one detached by hand to keep was dropped too."""

from __future__ import annotations

import json
import re
from typing import Any

import psycopg
import pytest
from helpers import outbox_on as outbox
from helpers import seed
from test_replay_preview_detaching import _left_half_detached

from outbox.operations.partition_maintenance import _note_finished
from outbox.partitions import RETIRING_MARK, Layout
from outbox.runner import perform, step
from outbox.schema import migrate
from outbox.table import Table

TABLE = Table.parse("outbox")
Conn = psycopg.Connection[tuple[object, ...]]


@pytest.fixture
def noted(empty_dsn: str) -> Any:
    """Partitions of 100 ids, rows 1 to 250 done a moment ago, p0 and p1 noted finished by
    a run whose retention (7 days) keeps them."""
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        migrate(conn, TABLE, layout=Layout(100, 2))
        seed(conn, 250)
        conn.execute("UPDATE outbox SET status = 'done', done_at = now()")
        kept = outbox(empty_dsn, "maintain", "--retention", "7d")
        assert kept.returncode == 0 and "retired 0" in kept.stdout, kept.stdout + kept.stderr
        assert _comment(conn, "outbox_p0").startswith("outbox-dispatcher: nothing unfinished")
        yield conn


def _comment(conn: Conn, name: str) -> str:
    row = conn.execute("SELECT obj_description(%s::regclass, 'pg_class')", (name,)).fetchone()
    return str(row[0] if row else None)


def _attached(conn: Conn, name: str) -> bool:
    row = conn.execute(
        "SELECT EXISTS (SELECT FROM pg_inherits WHERE inhrelid = to_regclass(%s)"
        " AND NOT inhdetachpending)",
        (name,),
    ).fetchone()
    return bool(row and row[0])


def _count(conn: Conn, relation: str) -> int:
    row = conn.execute(f"SELECT count(*) FROM {relation}").fetchone()
    return int(row[0]) if row else -1


def test_a_partition_begun_detaching_by_hand_is_attached_back_not_dropped(noted, empty_dsn):
    _left_half_detached(empty_dsn, noted, "outbox_p0", by_run=False)
    result = outbox(empty_dsn, "maintain", "--retention", "7d")
    assert result.returncode == 0, result.stderr
    assert "retired 0 (0 rows), 2 finished but within the retention of 7d" in result.stdout
    assert _attached(noted, "outbox_p0")
    assert _count(noted, "outbox") == 250


def test_a_partition_detached_by_hand_is_left_detached_not_dropped(noted, empty_dsn):
    noted.execute("ALTER TABLE outbox DETACH PARTITION outbox_p1")
    for retention in ("7d", "0s"):
        result = outbox(empty_dsn, "maintain", "--retention", retention)
        assert result.returncode == 0, result.stderr
        assert _count(noted, "outbox_p1") == 100  # still there, whole, for its owner
        assert not _attached(noted, "outbox_p1")
    assert re.search(r"retired 1 \(~?99 rows\)", result.stdout), result.stdout  # p0 only


def test_a_partition_begun_detaching_by_hand_with_a_pending_row_keeps_it(noted, empty_dsn):
    noted.execute("UPDATE outbox SET status = 'pending', done_at = NULL WHERE id = 50")
    _left_half_detached(empty_dsn, noted, "outbox_p0", by_run=False)
    result = outbox(empty_dsn, "maintain", "--retention", "0s")
    assert result.returncode == 0, result.stderr
    assert re.search(r"retired 1 \(~?100 rows\)", result.stdout), result.stdout  # p1 only
    assert "outbox: attached back outbox_p0, found detached" in result.stdout, result.stdout
    assert _attached(noted, "outbox_p0")
    assert noted.execute("SELECT status FROM outbox WHERE id = 50").fetchone() == ("pending",)
    assert not _comment(noted, "outbox_p0").startswith("outbox-dispatcher")  # no note on it


def test_a_partition_a_run_left_half_detached_is_checked_before_the_drop(noted, empty_dsn):
    """What a run leaves when it is stopped in its detach (its note marked retiring), with a
    row in it unfinished again: attached back, never dropped."""
    noted.execute("UPDATE outbox SET status = 'dead', done_at = NULL WHERE id = 7")
    _left_half_detached(empty_dsn, noted, "outbox_p0")  # marked as a run marks it
    result = outbox(empty_dsn, "maintain", "--retention", "0s")
    assert result.returncode == 0, result.stderr
    assert _attached(noted, "outbox_p0")
    assert noted.execute("SELECT status FROM outbox WHERE id = 7").fetchone() == ("dead",)
    assert _count(noted, "outbox") == 150  # p1 retired, p0's 99 done rows and its dead one kept


def test_a_note_marked_retiring_on_an_attached_partition_is_read_as_its_note(noted, empty_dsn):
    """A run stopped between marking the note and its detach leaves the partition attached,
    its note marked: read as the note (its time kept), so the retention still holds it."""
    since = _comment(noted, "outbox_p0")
    noted.execute(f"COMMENT ON TABLE outbox_p0 IS '{since}{RETIRING_MARK}'")
    kept = outbox(empty_dsn, "maintain", "--retention", "7d")
    assert kept.returncode == 0, kept.stderr
    assert "retired 0 (0 rows), 2 finished but within the retention of 7d" in kept.stdout
    listed = outbox(empty_dsn, "partitions", "--json")
    assert listed.returncode == 0, listed.stderr
    assert since.endswith(
        next(p["done_since"] for p in json.loads(listed.stdout)["partitions"] if p["low"] == 0)
    )
    gone = outbox(empty_dsn, "maintain", "--retention", "0s")
    assert re.search(r"retired 2 \(~?199 rows\)", gone.stdout), gone.stdout + gone.stderr
    assert _count(noted, "outbox") == 51  # p2, the newest ids


def test_noting_a_partition_finished_keeps_a_runs_retiring_mark(noted):
    """A worker's keeper that read the partitions before a run marked and detached one notes
    it after: its note must not take the mark off, or the run's leftover is never dropped."""
    marked = f"{_comment(noted, 'outbox_p0')}{RETIRING_MARK}"
    noted.execute(f"COMMENT ON TABLE outbox_p0 IS '{marked}'")
    noted.execute("ALTER TABLE outbox DETACH PARTITION outbox_p0")
    perform(noted, step(_note_finished(TABLE, "outbox_p0")))
    assert _comment(noted, "outbox_p0") == marked
