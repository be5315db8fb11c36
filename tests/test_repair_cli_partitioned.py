"""`outbox requeue` and `outbox skip` on a partitioned table made with hundreds of partitions
ahead (`outbox migrate --partition-size N --partitions-ahead 200`): their statements plan
the partitions the rows they select can be in, as the TUI's `R` does, not every partition;
and every dead row, in the oldest unfinished partition or the newest, is still acted on."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from helpers import outbox_on, seed, statuses

from outbox.cli import main as cli_main
from outbox.partitions import FINISHED_NOTE, Layout
from outbox.schema import migrate
from outbox.table import Table

TABLE = Table.parse("outbox")
PARTITION = 100
AHEAD = 200
ROWS = 1000  # ids 1-1000: partitions 0-10 hold rows, 200 made ahead of them are empty
FINISHED = (0, 1, 2)  # noted finished by `outbox maintain`: done rows only
EARLY = (310, 320)  # dead, in partition 3: the oldest one not noted finished
LATE = (990, 1000)  # dead, in partition 9 and in 10, the newest id's
PAST = 15_050  # a row written with an id of its own, in partition 150 of those made ahead
# The partitions the unfinished rows' window spans (outbox.stats.unfinished_window).
WINDOW = {f"outbox_p{n}" for n in range(3, 11)}


@pytest.fixture
def pconn(empty_dsn: str) -> Iterator[psycopg.Connection[Any]]:
    """Dead rows in the oldest unfinished partition and in the newest, `HTTP 503` on one of
    each; every other row done, the first three partitions noted finished."""
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        migrate(conn, TABLE, layout=Layout(PARTITION, AHEAD))
        seed(conn, ROWS)
        conn.execute("UPDATE outbox SET status = 'done', done_at = now()")
        for n in FINISHED:
            conn.execute(f"COMMENT ON TABLE outbox_p{n} IS '{FINISHED_NOTE}2026-01-01'")
        conn.execute(
            "UPDATE outbox SET status = 'dead', attempts = 12, done_at = NULL, "
            "last_error = CASE WHEN id IN (%s, %s) THEN 'HTTP 503' ELSE 'timeout' END "
            "WHERE id = ANY(%s)",
            (EARLY[0], LATE[1], [*EARLY, *LATE]),
        )
        conn.execute("ANALYZE outbox")
        yield conn


def _status(conn: psycopg.Connection[Any], ids: tuple[int, ...]) -> dict[int, str]:
    rows = conn.execute("SELECT id, status FROM outbox WHERE id = ANY(%s)", (list(ids),))
    return {int(i): str(s) for i, s in rows.fetchall()}


@pytest.fixture
def statements(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, Any]]:
    """Every statement the command runs in this process, with its values."""
    ran: list[tuple[str, Any]] = []
    execute = psycopg.Cursor.execute

    def recorded(self: Any, query: Any, params: Any = None, **kw: Any) -> Any:
        text = query if isinstance(query, str | bytes) else query.as_string(self.connection)
        ran.append((text.decode() if isinstance(text, bytes) else text, params))
        return execute(self, query, params, **kw)

    monkeypatch.setattr(psycopg.Cursor, "execute", recorded)
    return ran


def _planned(conn: psycopg.Connection[Any], ran: list[tuple[str, Any]]) -> dict[str, set[str]]:
    """The partitions each of the command's statements on the table's rows plans: its
    selection (`SELECT id, status, lease_version`) and its fenced UPDATE."""
    found: dict[str, set[str]] = {}
    for text, params in list(ran):  # the EXPLAINs are recorded too
        flat = " ".join(text.split())
        if "SELECT id, status, lease_version FROM" in flat or "UPDATE" in flat:
            cursor = psycopg.RawCursor(conn) if isinstance(params, list) else conn.cursor()
            plan = cursor.execute("EXPLAIN " + text, params).fetchall()
            named = re.findall(r"\boutbox_p\d+\b", "\n".join(r[0] for r in plan))
            found["UPDATE" if "UPDATE" in flat else "SELECT"] = set(named)
    return found


def _partitions(first: int, last: int) -> set[str]:
    return {f"outbox_p{n}" for n in range(first, last + 1)}


@pytest.mark.parametrize(
    ("args", "acted_on", "selected", "changed"),
    [
        # The dead rows are read within the window, and changed within their own ids' range.
        (["requeue", "--all-dead"], (*EARLY, *LATE), WINDOW, _partitions(3, 10)),
        (["requeue", "--error", "503"], (EARLY[0], LATE[1]), WINDOW, _partitions(3, 10)),
        # Rows named by id: read in their own partitions, changed within their ids' range.
        (
            ["skip", "--id", f"{LATE[0]},{EARLY[1]}"],
            (EARLY[1], LATE[0]),
            {"outbox_p3", "outbox_p9"},
            _partitions(3, 9),
        ),
    ],
    ids=["all-dead", "error", "skip-ids"],
)
def test_requeue_and_skip_plan_only_the_partitions_their_rows_can_be_in(
    pconn, empty_dsn, statements, capsys, args, acted_on, selected, changed
):
    total = pconn.execute("SELECT count(*) FROM pg_inherits").fetchone()
    assert total is not None and total[0] > AHEAD
    cli_main([*args, "--dsn", empty_dsn])
    assert f" {len(acted_on)} dead messages\n" in capsys.readouterr().out
    assert set(_status(pconn, acted_on).values()) == {"done" if args[0] == "skip" else "pending"}
    planned = _planned(pconn, statements)
    assert planned == {"SELECT": selected, "UPDATE": changed}, {
        statement: sorted(partitions, key=lambda p: int(p.removeprefix("outbox_p")))[:20]
        for statement, partitions in planned.items()
    }


def test_requeue_and_skip_act_on_every_dead_row_and_only_those(pconn, empty_dsn):
    requeued = outbox_on(empty_dsn, "requeue", "--error", "HTTP 503")
    assert requeued.returncode == 0, requeued.stderr
    assert requeued.stdout == "outbox: requeued 2 dead messages\n"
    assert _status(pconn, (*EARLY, *LATE)) == {
        EARLY[0]: "pending", EARLY[1]: "dead", LATE[0]: "dead", LATE[1]: "pending"
    }  # fmt: skip
    skipped = outbox_on(empty_dsn, "skip", "--id", f"{EARLY[1]},{LATE[0]}")
    assert skipped.returncode == 0, skipped.stderr
    assert skipped.stdout == "outbox: skipped 2 dead messages\n"
    assert _status(pconn, (EARLY[1], LATE[0])) == {EARLY[1]: "done", LATE[0]: "done"}
    # Dead again, and one more a producer wrote with an id of its own far past the
    # sequence's, in a partition made ahead: --all-dead finds all five, touches nothing else.
    pconn.execute(
        "UPDATE outbox SET status = 'dead', attempts = 12, done_at = NULL WHERE id = ANY(%s)",
        ([*EARLY, *LATE],),
    )
    pconn.execute(
        "INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, payload, status,"
        " attempts, last_error) VALUES (%s, 'order', 'x', 'Tested', '{}', 'dead', 12, 'gone')",
        (PAST,),
    )
    everything = outbox_on(empty_dsn, "requeue", "--all-dead")
    assert everything.returncode == 0, everything.stderr
    assert everything.stdout == "outbox: requeued 5 dead messages\n"
    assert statuses(pconn) == {"pending": 5, "done": ROWS - 4}
    assert _status(pconn, (*EARLY, *LATE, PAST)) == dict.fromkeys((*EARLY, *LATE, PAST), "pending")
    again = outbox_on(empty_dsn, "requeue", "--all-dead")
    assert again.stdout == "outbox: requeued 0 dead messages\n"


def test_a_table_with_a_default_partition_still_gets_its_dead_rows_requeued(
    pconn: psycopg.Connection[Any], empty_dsn: str
) -> None:
    """A DEFAULT partition someone added by hand: the workers refuse the table (the check's
    reason), and the window cannot be read, but its dead rows are still put right, through
    the parent, as before the window: the commands that repair must not be refused too."""
    pconn.execute("CREATE TABLE outbox_rest PARTITION OF outbox DEFAULT")
    ran = outbox_on(empty_dsn, "requeue", "--all-dead")
    assert ran.returncode == 0, ran.stderr
    assert "requeued 4" in ran.stdout, ran.stdout
    assert set(_status(pconn, (*EARLY, *LATE)).values()) == {"pending"}
