"""The workers' partition keeper notes finished partitions as `outbox maintain` does, so that
`outbox stats` (and the operator's backlog read) on a table no maintenance has run on looks
only at the partitions that can hold unfinished rows."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
from helpers import seed, statuses, wait_until
from test_worker import Scripted
from workers import dispatching, settings

from outbox.operations.partition_maintenance import note_finished_async
from outbox.partitions import Layout
from outbox.runner import fetch
from outbox.schema import migrate
from outbox.stats import Window, queue_stats, unfinished_window
from outbox.table import Table

TABLE = Table.parse("outbox")


@pytest.fixture
def partitioned(empty_dsn: str) -> Any:
    """Partitions of 100 ids, five made ahead."""
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        migrate(conn, TABLE, layout=Layout(100, 5))
        yield conn


def _window(conn: Any) -> Window | None:
    return fetch(conn, unfinished_window(TABLE))


async def test_a_worker_notes_the_partitions_it_finished(partitioned, empty_dsn):
    """A worker drains 350 rows; its keeper (at the latest, the next worker's keeper at its
    first pass) notes partitions 0 to 2 finished, not partition 3, which holds the newest ids: the
    snapshot then names partition 3 alone, as on a plain table, and counts what is there."""
    seed(partitioned, 350)
    assert _window(partitioned) == Window(0, 400)  # nothing noted: every partition looked at
    async with dispatching(settings(empty_dsn, batch=100), Scripted(lambda m: None)):
        await wait_until(lambda: statuses(partitioned) == {"done": 350}, what="the drain")
    # The drain's own keeper may have noted them already; a keeper's first pass does.
    async with dispatching(settings(empty_dsn), Scripted(lambda m: None)):
        await wait_until(
            lambda: _window(partitioned) == Window(300, 400, "outbox_p3"),
            what="the finished partitions noted by the keeper",
        )
    seed(partitioned, 1)  # id 351, pending, in partition 3
    stats = queue_stats(partitioned, TABLE)
    assert (stats.pending, stats.max_id) == (1, 351)


async def test_noting_stops_at_the_first_partition_holding_an_unfinished_row(partitioned):
    """A dead row pins its partition: nothing above it is noted (the window of unfinished
    partitions starts there anyway), and a later pass goes on from there once it is gone."""
    seed(partitioned, 350)
    partitioned.execute("UPDATE outbox SET status = 'done', done_at = now()")
    partitioned.execute("UPDATE outbox SET status = 'dead', done_at = NULL WHERE id = 150")
    async with await psycopg.AsyncConnection.connect(partitioned.info.dsn, autocommit=True) as conn:
        assert await note_finished_async(conn, TABLE) == 1  # partition 0 only
        assert _window(partitioned) == Window(100, 400)
        assert queue_stats(partitioned, TABLE).dead == 1
        # A pass with nothing new finished looks at one partition, the one that stopped it.
        assert await note_finished_async(conn, TABLE) == 0
        partitioned.execute("UPDATE outbox SET status = 'done', done_at = now() WHERE id = 150")
        assert await note_finished_async(conn, TABLE) == 2  # partitions 1 and 2
        assert _window(partitioned) == Window(300, 400, "outbox_p3")
