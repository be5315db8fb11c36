"""The operator's repairs: requeue or skip dead messages, fenced on what the operator saw,
and the audit log that records each one.

`select_targets` captures `(id, status, lease_version)` of the rows a person is about to
change, the confirmation shows that count, and `repair` changes a row only if it is still
`dead` at that same `lease_version`. Every state a dead row can leave to (requeued, skipped,
re-claimed and failed again) changes its status or bumps its version, so nothing the
operator did not see is touched. The same statement writes one row to the table's audit log
(`<table>_actions`, schema v2). The CLI (`outbox requeue`/`skip`) and the TUI use the same
queries (`outbox.runner`).
"""

from __future__ import annotations

import getpass
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

from psycopg import sql
from psycopg.types.json import Jsonb

from outbox import queries
from outbox.runner import Query, Row
from outbox.stats import Window
from outbox.table import Table
from outbox.views.filters import DeadFilter, where

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
    window: Window | None = None,
) -> Query[list[Seen]]:
    """The current (id, status, lease_version) of the rows an action would touch: the dead
    rows matching `f`, or the rows `ids` names (whatever their status, to report them).

    `window`: a partitioned table's `outbox.stats.unfinished_window`, which every dead row
    is in; the dead rows matching `f` are read within it, as constants the planner prunes
    the other partitions by (outbox.views.window). None (a plain table) leaves the
    statement as it was. The rows `ids` names are read wherever they are."""
    if ids is not None:
        statement = sql.SQL(
            "SELECT id, status, lease_version FROM {t} WHERE id = ANY(%(ids)s::bigint[]) "
            "ORDER BY id DESC"
        ).format(t=table.ident)
        params: dict[str, Any] = {"ids": list(ids)}
    else:
        clause, params = where(f or DeadFilter(), window)
        statement = sql.SQL(
            "SELECT id, status, lease_version FROM {t} WHERE {where} ORDER BY id DESC"
        ).format(t=table.ident, where=clause)
    return Query(
        statement, params, lambda rows: [Seen(int(r[0]), str(r[1]), int(r[2])) for r in rows]
    )


def repair(
    table: Table,
    action: Action,
    seen: Sequence[Seen],
    *,
    actor: str | None = None,
    filter: Mapping[str, Any] | None = None,
    partitioned: bool = False,
) -> Query[ActionResult]:
    """Requeue or skip the rows the operator saw, fenced, and record it: one statement.

    `actor` None records the database's current_user; `filter` is what the audit log
    keeps besides the ids (the filter or selection the rows came from). `partitioned`: the
    statement names the range of the rows' own ids as constants, so that only the partitions
    they are in are planned and locked (the unfinished rows' window may have moved past a
    row the operator saw since: it bounds the reads, never this); a plain table's statement
    is unchanged."""
    dead = [s for s in seen if s.status == "dead"]
    params = {
        "ids": [s.id for s in dead],
        "versions": [s.lease_version for s in dead],
        "actor": actor,
        "action": action,
        "filter": Jsonb(dict(filter)) if filter is not None else None,
        "requested": len(seen),
    }

    def parse(rows: list[Row]) -> ActionResult:
        changed, audit_id = rows[0]
        done = {int(i) for i in changed}
        return ActionResult(
            action,
            requested=len(seen),
            changed=sorted(done),
            changed_meanwhile=sorted(s.id for s in dead if s.id not in done),
            not_dead=sorted(s.id for s in seen if s.status != "dead"),
            audit_id=int(audit_id) if audit_id is not None else None,
        )

    statement = queries.repair(table, action)
    if partitioned and dead:
        ids = [s.id for s in dead]
        statement = queries.repair_between(table, action, min(ids), max(ids) + 1)
    return Query(statement, params, parse)


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

    @property
    def via(self) -> str:
        """Where it came from: `outbox-tui`, `outbox requeue`, ... (`?` if not recorded)."""
        return str((self.filter or {}).get("via", "?"))

    @property
    def by(self) -> str:
        """The OS user, and the database role when it is another name."""
        return self.actor + (f" ({self.db_user})" if self.db_user != self.actor else "")


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
