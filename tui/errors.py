"""Which exceptions the TUI treats as the database's trouble rather than its own bug."""

from __future__ import annotations

import psycopg

# Failures a poll or an action reports and survives: the server is gone, restarting, or
# refused a query.
DATABASE_ERRORS: tuple[type[BaseException], ...] = (psycopg.Error, OSError)

# The connection itself is unusable: drop it, the next use reconnects.
CONNECTION_LOST: tuple[type[BaseException], ...] = (
    psycopg.OperationalError,
    psycopg.InterfaceError,
)
