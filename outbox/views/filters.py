"""The filter language of dead letters (the TUI's `/`, also for scripts) and its SQL.

`parse_filter` reads a line into a `DeadFilter`; `where` turns one into the WHERE clause of
dead rows, always led by the `outbox_dead` partial index's predicate. `by_type_and_aggregate`
is the part every filter of messages shares (a replay's window too).
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from psycopg import sql
from psycopg.types.json import Jsonb

from outbox.runner import Query
from outbox.stats import Window
from outbox.views.error_groups import ERROR_GROUP
from outbox.views.window import within


class FilterError(ValueError):
    """A filter expression that cannot be parsed; the message says where."""


@dataclass(frozen=True)
class DeadFilter:
    """Which dead messages: every set field must match (AND)."""

    event_type: str | None = None  # exact
    aggregate_type: str | None = None  # exact
    aggregate_id: str | None = None  # exact
    error: str | None = None  # last_error contains it, case-insensitive
    error_group: str | None = None  # the normalised last_error, exact
    payload: Any = None  # JSON the payload contains (jsonb @>)
    payload_path: str | None = None  # SQL/JSON path: a predicate, or a path that must exist

    def is_empty(self) -> bool:
        return self == DeadFilter()

    def to_json(self) -> dict[str, Any]:
        """The set fields, for the audit log."""
        data = {
            "event_type": self.event_type,
            "aggregate_type": self.aggregate_type,
            "aggregate_id": self.aggregate_id,
            "error": self.error,
            "error_group": self.error_group,
            "payload": self.payload,
            "payload_path": self.payload_path,
        }
        return {k: v for k, v in data.items() if v is not None}

    def describe(self) -> str:
        """The filter in the syntax `parse_filter` reads (round-trips)."""
        parts: list[str] = []
        for key, value in (
            ("type", self.event_type),
            ("aggtype", self.aggregate_type),
            ("agg", self.aggregate_id),
            ("error", self.error),
            ("group", self.error_group),
        ):
            if value is not None:
                parts.append(f"{key}:{_quote(value)}")
        if self.payload is not None:
            parts.append(json.dumps(self.payload, separators=(", ", ": ")))
        if self.payload_path is not None:
            parts.append(self.payload_path)  # a path takes the rest of the line: last
        return " ".join(parts)


_KEYS = {
    "type": "event_type",
    "event": "event_type",
    "aggtype": "aggregate_type",
    "agg": "aggregate_id",
    "aggregate": "aggregate_id",
    "error": "error",
    "err": "error",
    "group": "error_group",
}
_TOKEN = re.compile(r'\s*(?:(\w+):)?("(?:[^"\\]|\\.)*"|\S+)')


def _quote(value: str) -> str:
    if value and not re.search(r'[\s"\\]', value):
        return value
    return json.dumps(value)


def _unquote(raw: str, rest: str) -> str:
    """A quoted value, read as a JSON string (backslash escapes as in JSON); `rest` is the
    line from the quote on, for the message."""
    try:
        value = json.loads(raw)
    except json.JSONDecodeError as exc:
        if exc.msg.startswith("Unterminated") or len(raw) == 1:
            raise FilterError(f"unterminated quote: {rest}") from None
        raise FilterError(f"{raw}: {exc.msg} (a backslash is written \\\\)") from None
    if not isinstance(value, str):
        raise FilterError(f"{raw}: not a quoted value")
    return value


def parse_filter(text: str) -> DeadFilter:
    """Parse the filter line of the TUI (`/`), also accepted by scripts.

    `type:OrderPaid agg:order-42 aggtype:order error:"connection refused"` (AND), bare words
    search the error text, `group:"..."` is an exact error group, a JSON object or array is
    a payload containment (`{"customer": "c-1"}`), and `$...` is an SQL/JSON path filter
    that takes the rest of the line (`$.amount > 100`, `$.items[*] ? (@.sku == "x")`).
    """
    values: dict[str, Any] = {}
    words: list[str] = []
    pos = 0
    text = text.strip()
    while pos < len(text):
        if text[pos].isspace():
            pos += 1
            continue
        if text[pos] in "{[":
            try:
                payload, end = json.JSONDecoder().raw_decode(text, pos)
            except json.JSONDecodeError as exc:
                raise FilterError(f"payload filter is not valid JSON: {exc.msg}") from None
            if "payload" in values:
                raise FilterError("only one payload containment filter")
            values["payload"] = payload
            pos = end
            continue
        if text[pos] == "$":
            values["payload_path"] = text[pos:].strip()
            break
        match = _TOKEN.match(text, pos)
        assert match is not None  # \S+ always matches a non-space character
        key, raw = match.group(1), match.group(2)
        value = _unquote(raw, text[match.start(2) :]) if raw.startswith('"') else raw
        if key is None:
            words.append(value)
        elif key.lower() in _KEYS:
            name = _KEYS[key.lower()]
            if name in values:
                raise FilterError(f"{key}: given twice")
            values[name] = value
        else:
            known = ", ".join(sorted({f"{k}:" for k in _KEYS}))
            raise FilterError(f"unknown filter {key}: (use {known}, JSON or a $ path)")
        pos = match.end()
    if words:
        if "error" in values:
            raise FilterError("error: given twice (bare words search the error text too)")
        values["error"] = " ".join(words)
    return DeadFilter(**values)


def path_check(f: DeadFilter) -> Query[None]:
    """Let the database read the filter's SQL/JSON path: a syntax error raises."""
    statement = sql.SQL("SELECT %(f_path)s::jsonpath").format()
    return Query(statement, {"f_path": f.payload_path}, lambda rows: None)


def _like(text: str) -> str:
    return "%" + re.sub(r"([\\%_])", r"\\\1", text) + "%"


def by_type_and_aggregate(
    event_types: Sequence[str], aggregate_type: str | None, aggregate_id: str | None
) -> tuple[list[sql.Composable], dict[str, Any]]:
    """The clauses that choose messages by event type (any of `event_types`), aggregate type
    and aggregate, each exact, for what is given; their parameters are named `f_*`, apart
    from those of the statement around them."""
    clauses: list[sql.Composable] = []
    params: dict[str, Any] = {}
    if event_types:
        clauses.append(sql.SQL("event_type = ANY(%(f_event_types)s::text[])"))
        params["f_event_types"] = list(event_types)
    for column, value in (("aggregate_type", aggregate_type), ("aggregate_id", aggregate_id)):
        if value is not None:
            name = f"f_{column}"
            clauses.append(
                sql.SQL("{c} = {v}").format(c=sql.Identifier(column), v=sql.Placeholder(name))
            )
            params[name] = value
    return clauses, params


def where(f: DeadFilter, window: Window | None = None) -> tuple[sql.Composable, dict[str, Any]]:
    """The WHERE clause for dead rows matching `f`; always led by the partial index's
    predicate so that the planner walks `outbox_dead`; within a partitioned table's
    `window` if given (outbox.views.window)."""
    event_types = () if f.event_type is None else (f.event_type,)
    chosen, params = by_type_and_aggregate(event_types, f.aggregate_type, f.aggregate_id)
    clauses: list[sql.Composable] = [sql.SQL("status = 'dead'") + within(window), *chosen]
    if f.error is not None:
        clauses.append(sql.SQL("last_error ILIKE %(f_error)s"))
        params["f_error"] = _like(f.error)
    if f.error_group is not None:
        clauses.append(sql.SQL("{g} = %(f_group)s").format(g=ERROR_GROUP))
        params["f_group"] = f.error_group
    if f.payload is not None:
        clauses.append(sql.SQL("payload @> %(f_payload)s::jsonb"))
        params["f_payload"] = Jsonb(f.payload)
    if f.payload_path is not None:
        # A predicate (`$.amount > 100`) is matched with @@; any other path must select
        # something (@?). @@ yields NULL for a path that is not a predicate.
        clauses.append(
            sql.SQL("coalesce(payload @@ %(f_path)s::jsonpath, payload @? %(f_path)s::jsonpath)")
        )
        params["f_path"] = f.payload_path
    return sql.SQL(" AND ").join(clauses), params
