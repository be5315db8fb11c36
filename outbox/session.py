"""A session's settings, set once it connects: the bounded waits of the tools people run
against a table (`outbox`, `outbox-tui`), the TUI's read-only session, and the time zone of
the worker's pooled sessions."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import psycopg
from psycopg import sql

from outbox.runner import Query, fetch_async, no_rows

# Other names of UTC (initdb takes the system's zone, often "Etc/UTC"). psycopg makes the
# timestamps of a session in "UTC" datetime.timezone.utc ones and those of any other zone
# ZoneInfo ones, converted through the zone one by one: a tenth of a claim's row decoding,
# and isoformat() of such a datetime costs several times more. A session whose zone is one
# of these is set to "UTC": the same instants and offsets, the same text.
UTC_ALIASES = frozenset({
    "Etc/UTC", "Etc/UCT", "Etc/Universal", "Etc/Zulu", "UCT", "Universal", "Zulu",
    "Etc/GMT", "Etc/GMT0", "Etc/GMT+0", "Etc/GMT-0", "Etc/Greenwich", "GMT", "GMT0", "GMT+0",
    "GMT-0", "Greenwich",
})  # fmt: skip


def session_settings(values: Mapping[str, str]) -> Query[None]:
    """One statement that sets each of `values` (a setting's name: its value, as PostgreSQL
    reads it: `15s`, `on`) for the rest of the session. Names and values are parameters, so
    neither is ever read as SQL."""
    calls = sql.SQL(", ").join(
        sql.SQL("set_config({name}, {value}, false)").format(
            name=sql.Placeholder(f"name{i}"), value=sql.Placeholder(f"value{i}")
        )
        for i in range(len(values))
    )
    params: dict[str, str] = {}
    for i, (name, value) in enumerate(values.items()):
        params |= {f"name{i}": name, f"value{i}": value}
    return Query(sql.SQL("SELECT {calls}").format(calls=calls), params, no_rows)


async def utc_by_name(conn: psycopg.AsyncConnection[Any]) -> None:
    """A session in another name of UTC is set to "UTC" (the worker's pool runs this on each
    new connection); a session in any other zone is left as it is."""
    if conn.info.parameter_status("TimeZone") in UTC_ALIASES:
        await fetch_async(conn, session_settings({"TimeZone": "UTC"}))
