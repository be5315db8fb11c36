"""Settings for the TUI's interactive sessions."""

from __future__ import annotations

from typing import Any

import psycopg

from outbox.runner import fetch_async
from outbox.session import session_settings

STATEMENT_TIMEOUT = "15s"  # no poll can hang for ever
LOCK_TIMEOUT = "5s"  # an action waits this long at most for a row a worker is finalizing


async def configure_session(conn: psycopg.AsyncConnection[Any], *, read_only: bool) -> None:
    """Bounded waits for every query and action, and a read-only session that cannot write
    even through a bug (`default_transaction_read_only`)."""
    settings = {
        "statement_timeout": STATEMENT_TIMEOUT,
        "lock_timeout": LOCK_TIMEOUT,
        "default_transaction_read_only": "on" if read_only else "off",
    }
    await fetch_async(conn, session_settings(settings))
