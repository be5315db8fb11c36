"""Dead letters for people: pages, counts, error groups, and one message in full.

Everything that reads dead rows walks the `outbox_dead` partial index (newest first,
keyset-paged on id), so a table with millions of done rows costs no more than one with
none. Each read is a `Query` (outbox.runner): the CLI and the TUI run the same definitions.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from psycopg import sql

from outbox.operations.repair import Seen
from outbox.plumbing.jsontext import loads_bounded
from outbox.runner import Query, Row
from outbox.stats import Window
from outbox.table import Table
from outbox.views.error_groups import ERROR_GROUP
from outbox.views.filters import DeadFilter, where
from outbox.views.window import within

MAX_ID = 2**63 - 1
PAGE_SIZE = 50


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
    window: Window | None = None,
) -> Query[DeadPage]:
    """A page of matching dead messages, newest first, keyset-paged on id.

    `before=None` is the newest page; `before=<last id shown>` the next older one;
    `after=<first id shown>` the page just newer than it (read upwards, shown newest first).
    Within a partitioned table's `window` if given (outbox.views.window).
    """
    clause, params = where(f or DeadFilter(), window)
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
        where=clause,
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


def dead_count(
    table: Table, f: DeadFilter | None = None, *, window: Window | None = None
) -> Query[int]:
    clause, params = where(f or DeadFilter(), window)
    statement = sql.SQL("SELECT count(*) FROM {t} WHERE {where}").format(
        t=table.ident, where=clause
    )
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
    window: Window | None = None,
) -> Query[list[ErrorGroup]]:
    """Matching dead messages grouped by normalised error, biggest group first."""
    clause, params = where(f or DeadFilter(), window)
    statement = sql.SQL(
        """SELECT g.key, g.n, (SELECT last_error FROM {t} WHERE id = g.newest{ids}), g.newest,
       g.oldest_at, g.newest_at
  FROM (SELECT {group} AS key, count(*) AS n, max(id) AS newest,
               min(created_at) AS oldest_at, max(created_at) AS newest_at
          FROM {t} WHERE {where} GROUP BY 1) AS g
 ORDER BY g.n DESC, g.newest DESC
 LIMIT %(limit)s::int"""
    ).format(t=table.ident, group=ERROR_GROUP, where=clause, ids=within(window))
    return Query(
        statement,
        {**params, "limit": limit},
        lambda rows: [ErrorGroup(str(r[0]), int(r[1]), r[2], int(r[3]), r[4], r[5]) for r in rows],
    )


# A message's payload is shown from its first characters only: a screen has no use for more,
# and a payload may be many megabytes (or nested deeper than anything decodes).
PAYLOAD_PREVIEW = 65_536


@dataclass(frozen=True)
class MessageDetail:
    # Every column of the row, extra ones included, in table order. json and jsonb columns
    # are their text as PostgreSQL writes it (never decoded: they may be nested thousands
    # deep), but for `errors`, decoded when it is shallow enough; `payload` is not here,
    # but below, bounded.
    columns: dict[str, Any]
    error_group: str
    # Its place in its aggregate, None on a table without ordered mode's index (reading it
    # there would scan the table).
    is_head: bool | None  # no earlier unfinished message of its aggregate (ordered mode's head)
    waiting_behind: int | None  # unfinished messages of its aggregate after it
    next_id: int | None = None  # the first of those, which a skip or requeue lets go next
    next_status: str | None = None
    payload_text: str | None = None  # the first PAYLOAD_PREVIEW characters of its text
    payload_bytes: int | None = None  # the length of its whole text, in bytes

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


_PLACE_IN_AGGREGATE = """NOT EXISTS (SELECT 1 FROM {t} AS p WHERE p.aggregate_id = o.aggregate_id
                     AND p.id < o.id AND p.status <> 'done'{p_ids}),
       (SELECT count(*) FROM {t} AS w WHERE w.aggregate_id = o.aggregate_id
                     AND w.id > o.id AND w.status <> 'done'{w_ids}),
       n.id, n.status"""
_NEXT_IN_AGGREGATE = """LEFT JOIN LATERAL (SELECT id, status FROM {t} AS w
                     WHERE w.aggregate_id = o.aggregate_id AND w.id > o.id
                       AND w.status <> 'done'{w_ids} ORDER BY w.id LIMIT 1) AS n ON true"""


def message(
    table: Table, message_id: int, *, ordered: bool = True, window: Window | None = None
) -> Query[MessageDetail | None]:
    """One message, every column; with `ordered` (the table has ordered mode's index, whose
    probes these are) also its place in its aggregate. The payload comes bounded, as text:
    its first characters (PAYLOAD_PREVIEW) and its length; the row's other columns come
    from a copy of the row without it (`jsonb_populate_record` keeps every column's type).
    The unfinished messages around it are looked for within a partitioned table's `window`
    if given (outbox.views.window): the row itself is found by its id, wherever it is."""
    place = sql.SQL(_PLACE_IN_AGGREGATE if ordered else "NULL, NULL, NULL, NULL")
    join = sql.SQL(_NEXT_IN_AGGREGATE if ordered else "")
    statement = sql.SQL(
        """SELECT {group}, {place},
       left(p.body, %(preview)s::int), octet_length(p.body),
       (SELECT array_agg(attname::text ORDER BY attnum) FROM pg_attribute
         WHERE attrelid = {rc}::regclass AND attnum > 0 AND NOT attisdropped),
       (r.copy).*
  FROM {t} AS o
  CROSS JOIN LATERAL (SELECT o.payload::text AS body OFFSET 0) AS p
  CROSS JOIN LATERAL (SELECT jsonb_populate_record(o, '{{"payload": null}}') AS copy
                      OFFSET 0) AS r
  {join}
 WHERE o.id = %(id)s::bigint"""
    ).format(
        place=place.format(t=table.ident, p_ids=within(window, "p"), w_ids=within(window, "w")),
        join=join.format(t=table.ident, w_ids=within(window, "w")),
        t=table.ident,
        group=ERROR_GROUP,
        rc=table.regclass_literal,
    )

    def parse(rows: list[Row]) -> MessageDetail | None:
        if not rows:
            return None
        group, is_head, behind, next_id, next_status, preview, size, names, *values = rows[0]
        # `(r.copy).*` lists the columns in attnum order, as pg_attribute does: every column,
        # also ones the application added, with its Python type (json as text).
        columns = dict(zip(names, values, strict=True))
        del columns["payload"]
        if isinstance(columns.get("errors"), str):
            with contextlib.suppress(ValueError):  # too deep, or not ours: shown as text
                columns["errors"] = loads_bounded(columns["errors"])
        return MessageDetail(
            columns,
            str(group),
            None if is_head is None else bool(is_head),
            None if behind is None else int(behind),
            next_id,
            next_status,
            payload_text=preview,
            payload_bytes=size,
        )

    params = {"id": message_id, "preview": PAYLOAD_PREVIEW}
    return Query(statement, params, parse, json_as_text=True)
