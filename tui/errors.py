"""Which exceptions the TUI treats as the database's trouble rather than its own bug."""

from __future__ import annotations

import psycopg

# Failures a poll or an action reports and survives: the server is gone, restarting, or
# refused a query.
DATABASE_ERRORS: tuple[type[BaseException], ...] = (psycopg.Error, OSError)

# The database refused what the operator typed (a filter's path): their error, not an outage.
INPUT_REJECTED: tuple[type[BaseException], ...] = (psycopg.DataError, psycopg.ProgrammingError)

# The connection itself is unusable: drop it, the next use reconnects.
CONNECTION_LOST: tuple[type[BaseException], ...] = (
    psycopg.OperationalError,
    psycopg.InterfaceError,
)
