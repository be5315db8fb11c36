"""`outbox migrate --partition-size` run again after a conversion that stopped before its swap,
as an operator meets it: the run that goes on is not always the one that stopped."""

from __future__ import annotations

import re

import psycopg
import pytest
from helpers import outbox_on, seed, statuses

from outbox import enqueue
from outbox.operations.conversion import convert
from outbox.partitions import Layout, read_partitions
from outbox.runner import fetch
from outbox.table import Table

TABLE = Table.parse("outbox")


class Killed(BaseException):
    """The command's process gone at that moment: nothing of it runs after."""


def _stopped_before_its_swap(conn: psycopg.Connection[tuple[object, ...]], layout: Layout) -> int:
    """A conversion to `layout` whose process died once its CHECK was valid, before the swap:
    the bound it left."""

    def die() -> None:
        raise Killed

    with pytest.raises(Killed):
        convert(conn, TABLE, layout, before_swap=die)
    row = conn.execute(
        "SELECT pg_get_constraintdef(oid), convalidated FROM pg_constraint "
        "WHERE conname = 'outbox_p0_range'"
    ).fetchone()
    assert row is not None and row[1], row  # left valid, as a kill leaves it
    found = re.search(r"id < '?(\d+)", str(row[0]))
    assert found is not None, row
    return int(found.group(1))


@pytest.mark.parametrize("size", [300, 700])
def test_run_again_with_another_partition_size_it_converts(dsn: str, size: int) -> None:
    """The first run asked for partitions of 1,000 ids and left the bound 17,000; the run
    again asks for `size`, of which 17,000 is no multiple: the first partition would end
    inside the one made next. It failed after its swap's attempt in PostgreSQL's words
    (partition "outbox_p56" would overlap partition "outbox_p0"), exit code 1, however often
    it was run again. Now the bound is replaced by one of the layout asked for."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        ids = seed(conn, 150)
        assert _stopped_before_its_swap(conn, Layout(1000, 16)) == 17000
        ids += seed(conn, 10)  # producers went on meanwhile
        again = outbox_on(dsn, "migrate", "--partition-size", str(size))
        assert again.returncode == 0, again.stderr
        assert "converted to the partitioned layout" in again.stdout, again.stdout
        leaves = [(p.name, p.low, p.high) for p in fetch(conn, read_partitions(TABLE)) or []]
        first_high = (160 // size + 1 + 16) * size  # 16 partitions of `size` past the ids
        assert leaves[0] == ("outbox_p0", 0, first_high), leaves
        assert all(high - low == size for _, low, high in leaves[1:]), leaves
        assert all(low % size == 0 for _, low, _ in leaves), leaves
        assert statuses(conn) == {"pending": 160}
        assert conn.execute("SELECT count(*) FROM outbox_p0").fetchone() == (160,)
        new = enqueue(conn, aggregate_type="a", aggregate_id="1", event_type="E", payload={})
        assert new == first_high  # new ids start past the first partition
        assert sorted(r[0] for r in conn.execute("SELECT id FROM outbox")) == [*ids, new]
