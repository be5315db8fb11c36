"""A partitioned table's claim window while producers' transactions stay open: the floor
(where readings start and ordered mode's head check looks from) stays below a row not yet
committed, from a worker's first reading on; and maintenance when producers outran the
partitions made ahead (their failed inserts spend ids) leaves a partition to go on with."""

from __future__ import annotations

import re

import psycopg
import pytest
import test_partitions
from helpers import outbox_on as outbox
from helpers import seed, statuses
from test_partitions import SIZE, TABLE, _drain

from outbox import OutOfPartitions, enqueue
from outbox.claim_window import ClaimWindow
from outbox.partitions import Layout, read_partitions
from outbox.runner import fetch
from outbox.schema import migrate

# The partitioned table the tests of test_partitions start from.
pconn = test_partitions.pconn


@pytest.mark.parametrize("ordered", [False, True], ids=["unordered", "ordered"])
async def test_a_worker_started_while_a_producer_holds_a_lower_id_claims_it_first(
    pconn, empty_dsn, ordered
):
    """A producer's transaction takes id 1 and stays open while ids 2-251 are committed and
    delivered by one worker; a second worker starts then (or forgets its window: a replay,
    a reconnection, a retired partition). Its first reading found nothing unfinished below
    the top partition, but a transaction open during it could still commit a row there: its
    floor must stay at the lowest partition, where that reading started. It stood at the top
    partition: id 1, committed, waited for the reading from the lowest partition (30s), and
    in ordered mode its aggregate's next message went first."""
    if ordered:
        migrate(pconn, TABLE, "aggregate")
    late = {"aggregate_type": "order", "aggregate_id": "late", "event_type": "Tested"}
    with psycopg.connect(empty_dsn) as producer:
        assert enqueue(producer, **late, payload=0, lock_aggregate=True) == 1  # uncommitted
        seed(pconn, 250, aggregates=250)  # ids 2-251, committed
        async with await psycopg.AsyncConnection.connect(empty_dsn, autocommit=True) as aconn:
            first = ClaimWindow(Layout(SIZE, 3))
            drained = await _drain(aconn, ordered=ordered, batch=50, window=first)
            assert sorted(i for c in drained for i in c) == list(range(2, 252))
            started = ClaimWindow(Layout(SIZE, 3))
            started.announcing = True  # as the worker's listener sets it
            await started.read(aconn, TABLE, 50)  # its first claim's reading
            assert started.bounds().unfinished_low == 0
            producer.commit()
            # The aggregate's next message: its producer waited for the first one's lock.
            assert enqueue(pconn, **late, payload=1, lock_aggregate=True) == 252
            started.announced()  # the listener heard both
            claims = await _drain(aconn, ordered=ordered, batch=50, window=started)
            assert claims[0][0] == 1
            if ordered:
                assert claims == [[1], [252]]
    assert statuses(pconn) == {"done": 252}


def test_retention_keeps_the_highest_partition_when_producers_ran_past_every_one(pconn, empty_dsn):
    """Producers outran the partitions made ahead while rows were delivered: their inserts
    failed (OutOfPartitions), each spending its id, until the sequence lay more partitions
    past the highest made than a run makes. `outbox maintain --retention 0s` retired every
    partition, finished and old as they all seemed counted from the sequence, made none,
    and left the table without a partition: every insert and every worker's reading failed
    until one was made by hand. The highest partition made holds the newest ids then: it is
    kept, and once the sequence is set back as maintain says, inserts go on."""
    seed(pconn, 399, aggregates=7)  # ids 1-399: partitions 0-3, the ones made
    pconn.execute("UPDATE outbox SET status = 'done', lease_owner = NULL")
    spent = 0
    with psycopg.connect(empty_dsn, autocommit=True) as producer:
        while spent < 2000:
            with pytest.raises(OutOfPartitions):
                enqueue(producer, aggregate_type="o", aggregate_id="a", event_type="e", payload={})
            spent += 1
    result = outbox(empty_dsn, "maintain", "--retention", "0s")
    assert result.returncode == 1  # the sequence is too far past them to make them all
    assert "setval" in result.stderr
    left = [p.name for p in fetch(pconn, read_partitions(TABLE)) or []]
    assert left[-1:] == ["outbox_p3"], left
    listed = outbox(empty_dsn, "partitions")
    assert re.search(r"outbox_p3 .* no: it holds the newest ids", listed.stdout), listed.stdout
    pconn.execute("SELECT setval('outbox_id_seq', 399)")
    made = outbox(empty_dsn, "maintain", "--retention", "0s")
    assert made.returncode == 0, made.stderr
    assert enqueue(pconn, aggregate_type="o", aggregate_id="a", event_type="e", payload={}) == 400
