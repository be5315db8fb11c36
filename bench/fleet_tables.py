"""Migrate the fleet's outbox tables with one revision's own `outbox.schema`.

Run as a script (`python bench/fleet_tables.py DSN TABLE...`, with that revision's tree first
on PYTHONPATH), never imported: each revision the fleet benchmark compares gets tables of its
own schema version, as `outbox migrate` of its release would have made them, so that neither
operator reads a table it does not know.
"""

from __future__ import annotations

import sys

import psycopg

from outbox.schema import migrate
from outbox.table import Table


def main() -> None:
    dsn, *tables = sys.argv[1:]
    with psycopg.connect(dsn, autocommit=True) as conn:
        for name in tables:
            migrate(conn, Table.parse(name))


if __name__ == "__main__":
    main()
