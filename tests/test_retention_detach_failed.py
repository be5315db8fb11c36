"""`outbox maintain` whose DETACH ... CONCURRENTLY fails at once (a lock it waited for in
vain, before the detach began): the partition stays attached, and the note the run marked
retiring just before must lose the mark. Kept, the mark made a partition someone detached by
hand later look like a run's leftover, and the next run dropped it."""

from __future__ import annotations

import re
import subprocess
import sys
from typing import Any

import psycopg
import pytest
from helpers import outbox_on as outbox
from helpers import wait_until_db
from test_replay_preview_detaching import _left_half_detached
from test_retention_half_detached import _attached, _comment, _count, noted

from outbox.partitions import FINISHED_NOTE, RETIRING_MARK

Conn = psycopg.Connection[tuple[object, ...]]

__all__ = ["noted"]  # the fixture: p0 and p1 noted finished, 250 rows done

# The run's DETACH ... CONCURRENTLY, waiting for a transaction older than it on the parent.
_DETACHING = (
    "(SELECT pid FROM pg_stat_activity WHERE query LIKE '%DETACH PARTITION%CONCURRENTLY' "
    "AND wait_event_type = 'Lock')"
)


def _maintain(dsn: str, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "outbox", "maintain", *args, "--dsn", dsn],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


def _detach_fails(conn: Conn, dsn: str) -> None:
    """A run that finds p0 (and p1) finished for the retention, whose DETACH of p0 waits in
    vain for the parent's lock: another session holds it (on the parent only, so the mark on
    the partition's note is written first, as it is when the lock comes between the two)."""
    with psycopg.connect(dsn) as holder:
        holder.execute("LOCK TABLE ONLY outbox IN SHARE UPDATE EXCLUSIVE MODE")
        run = _maintain(dsn, "--retention", "0s", "--lock-timeout", "2s")
        wait_until_db(conn, f"{_DETACHING} IS NOT NULL", timeout=60)  # it is the DETACH that waits
        out, err = run.communicate(timeout=60)
        holder.rollback()
    assert run.returncode == 1, out + err
    assert "gave up after waiting 2s for a lock" in err, err


@pytest.mark.parametrize("how", ["begun and cancelled", "whole"])
def test_a_partition_detached_by_hand_after_a_failed_detach_is_not_dropped(
    noted: Any, empty_dsn: str, how: str
):
    _detach_fails(noted, empty_dsn)
    assert _attached(noted, "outbox_p0")
    note = _comment(noted, "outbox_p0")
    assert note.startswith(FINISHED_NOTE) and not note.endswith(RETIRING_MARK), note
    if how == "whole":
        noted.execute("ALTER TABLE outbox DETACH PARTITION outbox_p0")
    else:
        _left_half_detached(empty_dsn, noted, "outbox_p0", by_run=False)
    result = outbox(empty_dsn, "maintain", "--retention", "7d")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "retired 0 (0 rows)" in result.stdout, result.stdout
    # No run meant to retire it: a detach begun by hand is finished and attached back, one
    # finished by hand is left detached, for whoever detached it; every row still there.
    assert _attached(noted, "outbox_p0") == (how == "begun and cancelled")
    assert _count(noted, "outbox_p0") == 99  # ids 1 to 99
    assert _count(noted, "outbox") == (250 if how == "begun and cancelled" else 151)


def test_a_mark_left_on_an_attached_partition_is_taken_off_by_the_next_run(
    noted: Any, empty_dsn: str
):
    """A run gone between its mark and its detach (its session ended) could not take the mark
    off: the next run does, before anything else, so a detach by hand after it is not taken
    for a run's leftover either."""
    since = _comment(noted, "outbox_p0")
    noted.execute(f"COMMENT ON TABLE outbox_p0 IS '{since}{RETIRING_MARK}'")
    kept = outbox(empty_dsn, "maintain", "--retention", "7d")
    assert kept.returncode == 0, kept.stdout + kept.stderr
    assert _comment(noted, "outbox_p0") == since
    noted.execute("ALTER TABLE outbox DETACH PARTITION outbox_p0")
    again = outbox(empty_dsn, "maintain", "--retention", "0s")
    assert again.returncode == 0, again.stdout + again.stderr
    assert _count(noted, "outbox_p0") == 99
    assert not _attached(noted, "outbox_p0")


def test_a_detach_cancelled_once_begun_keeps_its_mark_and_is_dropped_next(
    noted: Any, empty_dsn: str
):
    """Cancelled in its wait, the run's DETACH left the partition pending detach: that is the
    run's leftover, its mark kept as the run ends, and the next run finishes and drops it."""
    with psycopg.connect(empty_dsn) as reader:
        reader.execute("SELECT count(*) FROM outbox")  # a transaction the detach waits for
        run = _maintain(empty_dsn, "--retention", "0s")
        wait_until_db(noted, f"{_DETACHING} IS NOT NULL", timeout=60)
        noted.execute(f"SELECT pg_cancel_backend({_DETACHING})")
        out, err = run.communicate(timeout=60)
        reader.rollback()
    assert run.returncode == 1, out + err
    pending = noted.execute(
        "SELECT inhdetachpending FROM pg_inherits WHERE inhrelid = 'outbox_p0'::regclass"
    ).fetchone()
    assert pending == (True,)
    assert _comment(noted, "outbox_p0").endswith(RETIRING_MARK)
    again = outbox(empty_dsn, "maintain", "--retention", "7d")
    assert again.returncode == 0, again.stdout + again.stderr
    assert re.search(r"retired 1 \(~?99 rows\)", again.stdout), again.stdout
    assert noted.execute("SELECT to_regclass('outbox_p0')").fetchone() == (None,)
    assert _count(noted, "outbox") == 151


def test_outbox_maintain_bounds_its_statements_by_its_own_statement_timeout(
    noted: Any, empty_dsn: str
):
    """`--statement-timeout` is the bound of each of the run's statements: the run put its
    own minute in its place, so a DETACH held longer ran for that minute, and the error then
    said it ran for the flag's value and to raise the flag, which changed nothing."""
    with psycopg.connect(empty_dsn) as reader:
        reader.execute("SELECT count(*) FROM outbox")  # idle in transaction: holds the DETACH
        run = _maintain(
            empty_dsn, "--retention", "0s", "--lock-timeout", "0", "--statement-timeout", "2s"
        )
        wait_until_db(noted, f"{_DETACHING} IS NOT NULL", timeout=60)
        out, err = run.communicate(timeout=40)  # well before the run's own minute
        reader.rollback()
    assert run.returncode == 1, out + err
    assert "ran for 2s" in err and "raise --statement-timeout" in err, err
    # Stopped in its wait, the partition is left pending detach: the next run finishes it.
    result = outbox(empty_dsn, "maintain", "--retention", "0s")
    assert result.returncode == 0, result.stdout + result.stderr
    assert re.search(r"retired 2 \(~?199 rows\)", result.stdout), result.stdout
