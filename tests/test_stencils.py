"""A partition's statements filled in from stencils (outbox.stencils) are the statements
composed for it, byte for byte as a connection renders them, whatever the tables are named."""

from __future__ import annotations

import psycopg
import pytest

from outbox.partitions import partition_table
from outbox.queries import Queries, queries
from outbox.runner import rendered
from outbox.table import Table

STATEMENTS = ("claim", "claim_ordered", "claim_heads", "finalize_done", "finalize", "extend")
NAMES = (
    "outbox",
    "app.outbox",
    '"we""ird %s {x}"."t %(a)s"',  # quotes, placeholders and braces in both parts
    '"ñandú"',
    '"outbox stand-in 0"',  # a stencil's own stand-in name, as a user's table
)


def _shapes(table: Table) -> list[tuple[object, ...]]:
    """A table's statements, a partition's own, and a partition's with its ordered checks
    looking in the partitions below it."""
    leaf, below = partition_table(table, 3), (partition_table(table, 1), partition_table(table, 2))
    return [(table,), (leaf,), (leaf, None, None, (table, (1000, 4000), (*below, leaf)))]


@pytest.mark.parametrize("encoding", ["UTF8", "LATIN1"])
def test_a_statement_filled_from_its_stencil_renders_as_the_one_composed_for_it(dsn, encoding):
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"SET client_encoding TO '{encoding}'")
        for name in NAMES:
            table = Table.parse(name)
            for args in _shapes(table):
                filled = queries(*args)  # type: ignore[arg-type]
                composed = Queries(*args, *(None,) * (4 - len(args)), stencilled=False)  # type: ignore[arg-type]
                for statement in STATEMENTS:
                    ours = rendered(conn, getattr(filled, statement)).text
                    theirs = rendered(conn, getattr(composed, statement)).text
                    assert ours == theirs, (name, statement)


def test_a_partitions_statement_is_its_stencil_with_the_partitions_named_in_between():
    """Made per partition from a few parts, not composed from the statement's hundreds: the
    window moves to a new partition every claim or two."""
    table = Table.parse("outbox")
    for k in (5, 6):
        parts = list(queries(partition_table(table, k)).claim)
        assert len(parts) < 20
        assert partition_table(table, k).ident in parts
