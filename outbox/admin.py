"""Dead letters for people: list, search, group by error, requeue, skip, and the audit log.

Used by `outbox-tui` and by `outbox requeue` / `outbox skip`. Everything that reads dead
rows walks the `outbox_dead` partial index (newest first, keyset-paged on id), so a table
with millions of done rows costs no more than one with none.

Every read is a `Query`: a composed statement, its parameters and a parser, run with
`fetch` (sync) or `fetch_async`; the same definition serves the CLI and the TUI.

Actions are fenced on what the operator saw: `select_targets` captures `(id, status,
lease_version)` of the rows a person is about to change, the confirmation shows that
count, and `requeue`/`skip` change a row only if it is still `dead` at that same
`lease_version`. Every state a dead row can leave to (requeued, skipped, re-claimed and
failed again) changes its status or bumps its version, so nothing the operator did not see
is touched. Each action writes one row to the table's audit log (`<table>_actions`,
schema v2) in the same transaction.
"""

from __future__ import annotations

import getpass
import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Generic, Literal, TypeVar

import psycopg
from psycopg import sql
from psycopg.types.json import Jsonb

from outbox.table import Table

T = TypeVar("T")
Row = tuple[Any, ...]
MAX_ID = 2**63 - 1
PAGE_SIZE = 50

# -- the error normaliser --------------------------------------------------------------------

# Applied in order by `regexp_replace(..., 'g')` (PostgreSQL's regular expressions): what
# varies between two occurrences of the same failure becomes a placeholder, so that
# "timeout after 10.2s for order 41" and "... 10.7s for order 97" are one group. HTTP status
# codes are kept on purpose: "HTTP 422" and "HTTP 503" are different failures, not values.
ERROR_RULES: tuple[tuple[str, str], ...] = (
    (r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}", "<uuid>"),
    # JSON keys ("status": ...) are structure, not values: park their quotes on \x01 so the
    # next rule, which blanks quoted values, pairs quotes correctly.
    (r'"((?:[^"\\]|\\.)*)"(\s*:)', "\x01\\1\x01\\2"),
    (r'"(?:[^"\\]|\\.)*"', "<str>"),
    # Single-quoted values, but not apostrophes inside words (can't, worker's).
    (r"(?<![[:alnum:]])'[^']*'(?![[:alnum:]])", "<str>"),
    ("\x01", '"'),
    (
        r"\m0[xX][0-9a-fA-F]+\M"
        r"|\m(?=[0-9a-fA-F]*[a-fA-F])(?=[0-9a-fA-F]*[0-9])[0-9a-fA-F]{8,}\M",
        "<hex>",
    ),
    # Numbers, also inside ids (order-42, req_7) and dotted (10.0.0.5, 1.5s).
    (r"(?<![0-9])(?<!HTTP )[0-9]+(?:\.[0-9]+)*", "<n>"),
    (r"\s+", " "),
)
GROUP_KEY_LENGTH = 240  # long error bodies group on their beginning


def _normalised_error(column: sql.Composable) -> sql.Composable:
    expression: sql.Composable = sql.SQL("coalesce({c}, '')").format(c=column)
    for pattern, replacement in ERROR_RULES:
        expression = sql.SQL("regexp_replace({e}, {p}, {r}, 'g')").format(
            e=expression, p=sql.Literal(pattern), r=sql.Literal(replacement)
        )
    return sql.SQL("left(btrim({e}), {n})").format(e=expression, n=sql.Literal(GROUP_KEY_LENGTH))


ERROR_GROUP = _normalised_error(sql.Identifier("last_error"))

# -- filters ---------------------------------------------------------------------------------


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
        value = json.loads(raw) if raw.startswith('"') and len(raw) > 1 else raw
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


def _like(text: str) -> str:
    return "%" + re.sub(r"([\\%_])", r"\\\1", text) + "%"


def _where(f: DeadFilter) -> tuple[sql.Composable, dict[str, Any]]:
    """The WHERE clause for dead rows matching `f`; always led by the partial index's
    predicate so that the planner walks `outbox_dead`."""
    clauses: list[sql.Composable] = [sql.SQL("status = 'dead'")]
    params: dict[str, Any] = {}
    if f.event_type is not None:
        clauses.append(sql.SQL("event_type = %(f_event_type)s"))
        params["f_event_type"] = f.event_type
    if f.aggregate_type is not None:
        clauses.append(sql.SQL("aggregate_type = %(f_aggregate_type)s"))
        params["f_aggregate_type"] = f.aggregate_type
    if f.aggregate_id is not None:
        clauses.append(sql.SQL("aggregate_id = %(f_aggregate_id)s"))
        params["f_aggregate_id"] = f.aggregate_id
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


# -- queries ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Query(Generic[T]):
    """A composed statement, its parameters and how to turn its rows into a value."""

    statement: sql.Composed
    params: Mapping[str, Any]
    parse: Callable[[list[Row]], T]


def fetch(conn: psycopg.Connection[Any], query: Query[T]) -> T:
    return query.parse(conn.execute(query.statement, query.params).fetchall())


async def fetch_async(conn: psycopg.AsyncConnection[Any], query: Query[T]) -> T:
    cursor = await conn.execute(query.statement, query.params)
    return query.parse(await cursor.fetchall())


@dataclass(frozen=True)
class DeadMessage:
    id: int
    aggregate_type: str
    aggregate_id: str
    event_type: str
    attempts: int
    created_at: datetime
    last_error: str | None
    lease_version: int

    @property
    def seen(self) -> Seen:
        return Seen(self.id, "dead", self.lease_version)


@dataclass(frozen=True)
class DeadPage:
    messages: list[DeadMessage]
    has_newer: bool  # matching dead rows above the first one shown
    has_older: bool  # ... below the last one shown


_DEAD_COLUMNS = sql.SQL(
    "id, aggregate_type, aggregate_id, event_type, attempts, created_at, last_error, lease_version"
)


def dead_page(
    table: Table,
    f: DeadFilter | None = None,
    *,
    before: int | None = None,
    after: int | None = None,
    limit: int = PAGE_SIZE,
) -> Query[DeadPage]:
    """A page of matching dead messages, newest first, keyset-paged on id.

    `before=None` is the newest page; `before=<last id shown>` the next older one;
    `after=<first id shown>` the page just newer than it (read upwards, shown newest first).
    """
    where, params = _where(f or DeadFilter())
    upwards = after is not None
    statement = sql.SQL(
        """SELECT {columns}, (SELECT EXISTS (SELECT 1 FROM {t} WHERE {where} AND {other_side}))
  FROM {t}
 WHERE {where} AND {this_side}
 ORDER BY id {direction}
 LIMIT %(limit)s::int + 1"""
    ).format(
        columns=_DEAD_COLUMNS,
        t=table.ident,
        where=where,
        this_side=sql.SQL("id > %(after)s::bigint" if upwards else "id < %(before)s::bigint"),
        other_side=sql.SQL("id <= %(after)s::bigint" if upwards else "id >= %(before)s::bigint"),
        direction=sql.SQL("ASC" if upwards else "DESC"),
    )
    params = {
        **params,
        "limit": limit,
        "before": MAX_ID if before is None else before,
        "after": after if after is not None else 0,
    }

    def parse(rows: list[Row]) -> DeadPage:
        more = len(rows) > limit
        other = bool(rows[0][-1]) if rows else False
        messages = [DeadMessage(*r[:-1]) for r in rows[:limit]]
        if upwards:
            return DeadPage(messages[::-1], has_newer=more, has_older=other)
        return DeadPage(messages, has_newer=other, has_older=more)

    return Query(statement, params, parse)


def dead_count(table: Table, f: DeadFilter | None = None) -> Query[int]:
    where, params = _where(f or DeadFilter())
    statement = sql.SQL("SELECT count(*) FROM {t} WHERE {where}").format(t=table.ident, where=where)
    return Query(statement, params, lambda rows: int(rows[0][0]))


@dataclass(frozen=True)
class ErrorGroup:
    key: str  # the normalised error; "" for dead rows without an error
    count: int
    example: str | None  # the newest full error of the group
    newest_id: int
    oldest_created_at: datetime
    newest_created_at: datetime


def error_groups(
    table: Table,
    f: DeadFilter | None = None,
    *,
    limit: int = 200,
) -> Query[list[ErrorGroup]]:
    """Matching dead messages grouped by normalised error, biggest group first."""
    where, params = _where(f or DeadFilter())
    statement = sql.SQL(
        """SELECT g.key, g.n, (SELECT last_error FROM {t} WHERE id = g.newest), g.newest,
       g.oldest_at, g.newest_at
  FROM (SELECT {group} AS key, count(*) AS n, max(id) AS newest,
               min(created_at) AS oldest_at, max(created_at) AS newest_at
          FROM {t} WHERE {where} GROUP BY 1) AS g
 ORDER BY g.n DESC, g.newest DESC
 LIMIT %(limit)s::int"""
    ).format(t=table.ident, group=ERROR_GROUP, where=where)
    return Query(
        statement,
        {**params, "limit": limit},
        lambda rows: [ErrorGroup(str(r[0]), int(r[1]), r[2], int(r[3]), r[4], r[5]) for r in rows],
    )


@dataclass(frozen=True)
class LeaseHolder:
    owner: str  # lease_owner; "" when a row is processing without one
    held: int
    expired: int
    earliest_expiry: datetime  # the lease that runs out first (or ran out longest ago)


def lease_holders(table: Table, *, limit: int = 100) -> Query[list[LeaseHolder]]:
    """Processing rows per lease_owner (over the `outbox_leased` index)."""
    statement = sql.SQL(
        """SELECT coalesce(lease_owner, ''), count(*),
       count(*) FILTER (WHERE lease_until < now()), min(lease_until)
  FROM {t} WHERE status = 'processing'
 GROUP BY 1 ORDER BY 2 DESC, 1
 LIMIT %(limit)s::int"""
    ).format(t=table.ident)
    return Query(
        statement,
        {"limit": limit},
        lambda rows: [LeaseHolder(str(r[0]), int(r[1]), int(r[2]), r[3]) for r in rows],
    )


@dataclass(frozen=True)
class Blocked:
    aggregates: int  # aggregates whose head (first unfinished message) is dead
    waiting: int  # pending or processing messages queued behind those heads


def blocked_aggregates(table: Table) -> Query[Blocked]:
    """Ordered mode: aggregates stopped by a dead head. Dead rows come from `outbox_dead`,
    each aggregate is probed on `outbox_aggregate`."""
    statement = sql.SQL(
        """SELECT count(*), coalesce(sum(
         (SELECT count(*) FROM {t} AS w
           WHERE w.aggregate_id = h.aggregate_id AND w.id > h.head
             AND w.status IN ('pending', 'processing'))), 0)
  FROM (SELECT aggregate_id, min(id) AS head FROM {t}
         WHERE status = 'dead' GROUP BY aggregate_id) AS h
 WHERE NOT EXISTS (SELECT 1 FROM {t} AS p
                    WHERE p.aggregate_id = h.aggregate_id AND p.id < h.head
                      AND p.status <> 'done')"""
    ).format(t=table.ident)
    return Query(statement, {}, lambda rows: Blocked(int(rows[0][0]), int(rows[0][1])))


@dataclass(frozen=True)
class MessageDetail:
    columns: dict[str, Any]  # every column of the row, extra ones included, in table order
    error_group: str
    is_head: bool  # no earlier unfinished message of its aggregate (ordered mode's head)
    waiting_behind: int  # unfinished messages of its aggregate after it

    @property
    def id(self) -> int:
        return int(self.columns["id"])

    @property
    def status(self) -> str:
        return str(self.columns["status"])

    @property
    def lease_version(self) -> int:
        return int(self.columns["lease_version"])

    @property
    def seen(self) -> Seen:
        return Seen(self.id, self.status, self.lease_version)


def message(table: Table, message_id: int) -> Query[MessageDetail | None]:
    statement = sql.SQL(
        """SELECT {group},
       NOT EXISTS (SELECT 1 FROM {t} AS p WHERE p.aggregate_id = o.aggregate_id
                     AND p.id < o.id AND p.status <> 'done'),
       (SELECT count(*) FROM {t} AS w WHERE w.aggregate_id = o.aggregate_id
                     AND w.id > o.id AND w.status <> 'done'),
       (SELECT array_agg(attname::text ORDER BY attnum) FROM pg_attribute
         WHERE attrelid = {rc}::regclass AND attnum > 0 AND NOT attisdropped),
       o.*
  FROM {t} AS o WHERE o.id = %(id)s::bigint"""
    ).format(t=table.ident, group=ERROR_GROUP, rc=table.regclass_literal)

    def parse(rows: list[Row]) -> MessageDetail | None:
        if not rows:
            return None
        group, is_head, behind, names, *values = rows[0]
        # `o.*` lists the columns in attnum order, as pg_attribute does: every column,
        # also ones the application added, with its Python type (payload decoded).
        columns = dict(zip(names, values, strict=True))
        return MessageDetail(columns, str(group), bool(is_head), int(behind))

    return Query(statement, {"id": message_id}, parse)


# -- actions ---------------------------------------------------------------------------------

Action = Literal["requeue", "skip"]


@dataclass(frozen=True)
class Seen:
    """A row as the operator saw it; an action changes it only if it is still so."""

    id: int
    status: str
    lease_version: int


@dataclass(frozen=True)
class ActionResult:
    action: Action
    requested: int  # rows the operator confirmed
    changed: list[int]  # ids actually changed (and recorded)
    changed_meanwhile: list[int]  # seen dead, but no longer in that state: left alone
    not_dead: list[int] = field(default_factory=list)  # asked for, but not dead: left alone
    audit_id: int | None = None

    @property
    def count(self) -> int:
        return len(self.changed)

    def summary(self) -> str:
        verb = "requeued" if self.action == "requeue" else "skipped"
        text = f"{verb} {self.count} of {self.requested}"
        if self.changed_meanwhile:
            text += f"; {len(self.changed_meanwhile)} changed since shown, left alone"
        if self.not_dead:
            text += f"; {len(self.not_dead)} not dead, left alone"
        return text


def select_targets(
    table: Table,
    f: DeadFilter | None = None,
    *,
    ids: Sequence[int] | None = None,
) -> Query[list[Seen]]:
    """The current (id, status, lease_version) of the rows an action would touch: the dead
    rows matching `f`, or the rows `ids` names (whatever their status, to report them)."""
    if ids is not None:
        statement = sql.SQL(
            "SELECT id, status, lease_version FROM {t} WHERE id = ANY(%(ids)s::bigint[]) "
            "ORDER BY id DESC"
        ).format(t=table.ident)
        params: dict[str, Any] = {"ids": list(ids)}
    else:
        where, params = _where(f or DeadFilter())
        statement = sql.SQL(
            "SELECT id, status, lease_version FROM {t} WHERE {where} ORDER BY id DESC"
        ).format(t=table.ident, where=where)
    return Query(
        statement, params, lambda rows: [Seen(int(r[0]), str(r[1]), int(r[2])) for r in rows]
    )


_SET = {
    # Back to the queue as if new: claimable now, every attempt available again. The last
    # error stays until the next attempt overwrites it, so people can still see it.
    "requeue": "status = 'pending', available_at = now(), attempts = 0, "
    "lease_owner = NULL, lease_until = NULL",
    # Done on purpose: unblocks an ordered aggregate; the audit log says it was skipped.
    "skip": "status = 'done', done_at = now(), lease_owner = NULL, lease_until = NULL",
}


def _action_statements(table: Table, action: Action) -> tuple[sql.Composed, sql.Composed]:
    update = sql.SQL(
        """UPDATE {t} AS o SET {set}
  FROM unnest(%(ids)s::bigint[], %(versions)s::bigint[]) AS f(id, version)
 WHERE o.id = f.id AND o.status = 'dead' AND o.lease_version = f.version
RETURNING o.id"""
    ).format(t=table.ident, set=sql.SQL(_SET[action]))
    audit = sql.SQL(
        """INSERT INTO {a} (actor, action, message_ids, filter, requested, count)
VALUES (coalesce(%(actor)s, current_user), %(action)s, %(ids)s::bigint[], %(filter)s::jsonb,
        %(requested)s::int, %(count)s::int)
RETURNING id"""
    ).format(a=table.sibling("actions"))
    return update, audit


def _partition(seen: Sequence[Seen]) -> tuple[list[Seen], list[int]]:
    dead = [s for s in seen if s.status == "dead"]
    return dead, [s.id for s in seen if s.status != "dead"]


def _audit_params(
    action: Action,
    requested: int,
    changed: list[int],
    actor: str | None,
    filter: Mapping[str, Any] | None,
) -> dict[str, Any]:
    return {
        "actor": actor,
        "action": action,
        "ids": sorted(changed),
        "filter": Jsonb(dict(filter)) if filter is not None else None,
        "requested": requested,
        "count": len(changed),
    }


def _result(
    action: Action, seen: Sequence[Seen], changed: list[int], audit_id: int | None
) -> ActionResult:
    dead, not_dead = _partition(seen)
    done = set(changed)
    return ActionResult(
        action,
        requested=len(seen),
        changed=sorted(done),
        changed_meanwhile=sorted(s.id for s in dead if s.id not in done),
        not_dead=sorted(not_dead),
        audit_id=audit_id,
    )


def apply(
    conn: psycopg.Connection[Any],
    table: Table,
    action: Action,
    seen: Sequence[Seen],
    *,
    actor: str | None = None,
    filter: Mapping[str, Any] | None = None,
) -> ActionResult:
    """Requeue or skip the rows the operator saw, fenced, and record it; one transaction."""
    update, audit = _action_statements(table, action)
    dead, _ = _partition(seen)
    with conn.transaction():
        rows = conn.execute(
            update, {"ids": [s.id for s in dead], "versions": [s.lease_version for s in dead]}
        ).fetchall()
        changed = [int(r[0]) for r in rows]
        row = conn.execute(
            audit, _audit_params(action, len(seen), changed, actor, filter)
        ).fetchone()
    return _result(action, seen, changed, int(row[0]) if row else None)


async def apply_async(
    conn: psycopg.AsyncConnection[Any],
    table: Table,
    action: Action,
    seen: Sequence[Seen],
    *,
    actor: str | None = None,
    filter: Mapping[str, Any] | None = None,
) -> ActionResult:
    """`apply` on an async connection."""
    update, audit = _action_statements(table, action)
    dead, _ = _partition(seen)
    async with conn.transaction():
        cursor = await conn.execute(
            update, {"ids": [s.id for s in dead], "versions": [s.lease_version for s in dead]}
        )
        changed = [int(r[0]) for r in await cursor.fetchall()]
        cursor = await conn.execute(audit, _audit_params(action, len(seen), changed, actor, filter))
        row = await cursor.fetchone()
    return _result(action, seen, changed, int(row[0]) if row else None)


def default_actor() -> str | None:
    """The operating-system user; None lets the database record current_user instead."""
    try:
        return getpass.getuser()
    except (OSError, KeyError):
        return None


# -- the audit log ---------------------------------------------------------------------------


@dataclass(frozen=True)
class ActionRecord:
    id: int
    at: datetime
    actor: str
    db_user: str
    action: str
    message_ids: list[int]
    filter: dict[str, Any] | None
    requested: int
    count: int


_RECORD_COLUMNS = sql.SQL("id, at, actor, db_user, action, message_ids, filter, requested, count")


def _records(rows: list[Row]) -> list[ActionRecord]:
    return [
        ActionRecord(
            id=int(r[0]),
            at=r[1],
            actor=str(r[2]),
            db_user=str(r[3]),
            action=str(r[4]),
            message_ids=[int(i) for i in r[5]],
            filter=r[6],
            requested=int(r[7]),
            count=int(r[8]),
        )
        for r in rows
    ]


def history(table: Table, message_id: int, *, limit: int = 50) -> Query[list[ActionRecord]]:
    """Actions that changed this message, newest first (a GIN probe on message_ids)."""
    statement = sql.SQL(
        "SELECT {columns} FROM {a} WHERE message_ids @> ARRAY[%(id)s::bigint] "
        "ORDER BY id DESC LIMIT %(limit)s::int"
    ).format(columns=_RECORD_COLUMNS, a=table.sibling("actions"))
    return Query(statement, {"id": message_id, "limit": limit}, _records)


def recent_actions(table: Table, *, limit: int = 100) -> Query[list[ActionRecord]]:
    statement = sql.SQL("SELECT {columns} FROM {a} ORDER BY id DESC LIMIT %(limit)s::int").format(
        columns=_RECORD_COLUMNS, a=table.sibling("actions")
    )
    return Query(statement, {"limit": limit}, _records)


# -- sessions --------------------------------------------------------------------------------


async def configure_session_async(
    conn: psycopg.AsyncConnection[Any],
    *,
    read_only: bool,
    statement_timeout: str = "15s",
    lock_timeout: str = "5s",
) -> None:
    """Settings for an interactive session: no query can hang a poller for ever, an action
    waits only briefly for a row a worker holds, and a read-only session cannot write even
    through a bug (`default_transaction_read_only`)."""
    await conn.execute(
        "SELECT set_config('statement_timeout', %(st)s, false), "
        "set_config('lock_timeout', %(lt)s, false), "
        "set_config('default_transaction_read_only', %(ro)s, false)",
        {"st": statement_timeout, "lt": lock_timeout, "ro": "on" if read_only else "off"},
    )
