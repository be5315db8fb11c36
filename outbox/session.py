"""A session's settings, set once it connects: the bounded waits of the tools people run
against a table (`outbox`, `outbox-tui`), the TUI's read-only session, the time zone of the
worker's pooled sessions, and the table's schema first along the search_path (`home_first`)
for the commands' sessions and the worker's."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import psycopg
from psycopg import sql

from outbox.runner import Query, Steps, fetch_async, first_row, no_rows, step
from outbox.table import Table

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


def home_first(table: Table) -> Steps[str | None]:
    """For a table named without its schema, the schema it is in first along the session's
    search_path, for the rest of the session; the search_path as it was (None: nothing was
    set, for a table named with its schema or not made yet). One statement. What is named
    after the table is named as the table is (its destinations, its audit log, its replay
    counter, its layout's table, its partitions, its notify function): without a schema,
    each was the first of its name along the search_path, maybe another one in a schema
    before the table's (the role's own, "$user"), read and written in its stead, by one
    role's sessions and not another's. The table itself is found as before: it was the
    first of its name along the path. Its name as the user gave it (its NOTIFY channel, its
    metrics' labels, what is said of it) is unchanged."""
    if table.schema is not None:
        return None
    return (yield from step(_home_put_first(table)))


def _home_put_first(table: Table) -> Query[str | None]:
    # OFFSET 0: `was` is read before set_config changes it.
    statement = sql.SQL(
        "SELECT h.was, set_config('search_path', quote_ident(h.home) || ', ' || h.was, false)"
        " FROM (SELECT n.nspname::text AS home, current_setting('search_path') AS was"
        " FROM pg_class AS c JOIN pg_namespace AS n ON n.oid = c.relnamespace"
        " WHERE c.oid = to_regclass({t}) OFFSET 0) AS h"
    ).format(t=table.regclass_literal)
    return Query(statement, None, first_row(lambda row: None if row is None else str(row[0])))


# The search_path as the session began (its connection's options, the role's or the
# database's setting): what `home_first` set is undone, for a pooled connection that serves
# tables of other schemas next (the operator's).
RESET_SEARCH_PATH: Query[None] = Query(sql.Composed([sql.SQL("RESET search_path")]), None, no_rows)
