"""Settings for the TUI's interactive sessions."""

from __future__ import annotations

from typing import Any

import psycopg

STATEMENT_TIMEOUT = "15s"  # no poll can hang for ever
LOCK_TIMEOUT = "5s"  # an action waits this long at most for a row a worker is finalizing


async def configure_session(conn: psycopg.AsyncConnection[Any], *, read_only: bool) -> None:
    """Bounded waits for every query and action, and a read-only session that cannot write
    even through a bug (`default_transaction_read_only`)."""
    await conn.execute(
        "SELECT set_config('statement_timeout', %(st)s, false), "
        "set_config('lock_timeout', %(lt)s, false), "
        "set_config('default_transaction_read_only', %(ro)s, false)",
        {"st": STATEMENT_TIMEOUT, "lt": LOCK_TIMEOUT, "ro": "on" if read_only else "off"},
    )
