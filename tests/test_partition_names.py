"""The names the layout derives from a table's name (a partition's range CHECK, the
conversion's bound) as PostgreSQL keeps them: cut at 63 bytes, never inside a letter, so a
name of multi-byte letters is the one the code looks for."""

from __future__ import annotations

import psycopg
import pytest
from psycopg import sql

from outbox.operations.conversion import migrate_converting
from outbox.partitions import Layout, partition_table, range_check_name, read_partitions
from outbox.runner import fetch
from outbox.schema import migrate
from outbox.table import Table, clipped

# 28 two-byte letters: the partition `<name>_p0` is 59 bytes (34 letters), so its range
# CHECK `<name>_p0_range` is 65 bytes in 40 letters, past PostgreSQL's limit of 63 bytes.
WIDE = Table.parse("ü" * 28)


@pytest.mark.parametrize(
    ("name", "kept"),
    [
        ("a" * 70, "a" * 63),
        ("ü" * 40, "ü" * 31),  # 62 bytes: a 32nd letter would not fit whole
        ("a" + "€" * 30, "a" + "€" * 20),  # 61 bytes of three-byte letters and one more
        ("short", "short"),
    ],
)
def test_a_name_is_cut_at_bytes_on_a_letter(name: str, kept: str) -> None:
    assert clipped(name) == kept
    assert len(clipped(name).encode()) <= 63


def test_a_range_check_is_named_as_postgresql_keeps_it() -> None:
    leaf = partition_table(WIDE, 0).name
    assert range_check_name(leaf) == f"{leaf}_ran"  # 63 bytes: `ge` is cut
    assert len(range_check_name(leaf).encode()) == 63


def _checks(conn: psycopg.Connection[tuple[object, ...]], leaf: str) -> list[str]:
    """The names of a partition's CHECK constraints."""
    statement = sql.SQL(
        "SELECT conname::text FROM pg_constraint WHERE conrelid = {t}::regclass AND contype = 'c'"
    ).format(t=Table(None, leaf).regclass_literal)
    return [str(name) for (name,) in conn.execute(statement).fetchall()]


def _wide_table(conn: psycopg.Connection[tuple[object, ...]]) -> None:
    migrate(conn, WIDE)
    conn.execute(
        sql.SQL(
            "INSERT INTO {t} (aggregate_type, aggregate_id, event_type, payload)"
            " SELECT 'a', 'b', 'c', '{{}}' FROM generate_series(1, 150)"
        ).format(t=WIDE.ident)
    )


@pytest.mark.parametrize("stopped_after", [None, "bound"])
def test_a_table_of_multibyte_letters_converts(empty_dsn: str, stopped_after: str | None) -> None:
    """A plain table whose first partition's CHECK name PostgreSQL cuts is converted, also
    after a run stopped once it had added that CHECK (found again by its name), and the
    command's line names that CHECK as the catalog holds it, where it named one 65 bytes
    long that no catalog holds. Its partitions carry their range CHECK under the name the
    layout looks for."""
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        _wide_table(conn)
        if stopped_after == "bound":
            conn.execute(
                sql.SQL("ALTER TABLE {t} ADD CONSTRAINT {c} CHECK (id >= 0 AND id < 400) NOT VALID")
                .format(t=WIDE.ident, c=sql.Identifier(f"{partition_table(WIDE, 0).name}_range"))
            )  # fmt: skip
        _, _, done = migrate_converting(conn, WIDE, None, Layout(100, 2))
        assert done is not None
        steps = ["validate", "swap"] if stopped_after else ["bound", "validate", "swap"]
        assert done.steps == steps
        leaves = fetch(conn, read_partitions(WIDE)) or []
        assert (leaves[0].low, leaves[0].high) == (0, 400)
        if not stopped_after:  # the command's line names the CHECK as the catalog holds it
            [added] = [line for line in done.describe() if "added CHECK" in line]
            assert f"added CHECK {range_check_name(leaves[0].name)} (ids 0 to 399)" in added
        for leaf in leaves:
            assert range_check_name(leaf.name) in _checks(conn, leaf.name)
        assert migrate_converting(conn, WIDE, None, Layout(100, 2))[2] is None  # done before
