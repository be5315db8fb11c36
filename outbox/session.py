"""A session's settings, set once it connects: the bounded waits of the tools people run
against a table (`outbox`, `outbox-tui`), and the TUI's read-only session."""

from __future__ import annotations

from collections.abc import Mapping

from psycopg import sql

from outbox.runner import Query, no_rows


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
