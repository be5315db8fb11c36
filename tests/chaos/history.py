"""Recording a run's history: what was committed, what every row went through, what the
downstream saw and what the workers said.

Three independent witnesses, so the checker can catch one contradicting another:

- the database: an AFTER UPDATE trigger (installed by the test, not by the product) writes
  every change of every outbox row to `chaos.history`, with the changing session's
  `application_name` (a worker's pool sets it to the worker's owner name), in the row's
  commit order. Committed rows are read from the table itself at the end, so a rolled-back
  enqueue can never count as committed.
- the downstream: the recording sink's requests (Idempotency-Key, Outbox-Worker,
  Outbox-Attempt, status, times, whether the inbox applied or absorbed each 2xx), and the
  effects it applied, read from its own database.
- the workers: their JSON logs at DEBUG level (one line per claimed batch and per finalized
  batch, `lost lease` warnings, database errors).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from outbox.demo.sink import Request
from outbox.table import Table

# -- what the checker reads ------------------------------------------------------------------


@dataclass(frozen=True)
class Committed:
    id: int
    aggregate_id: str


@dataclass(frozen=True)
class Final:
    """A row's state after the run."""

    id: int
    status: str
    attempts: int
    lease_version: int
    last_error: str | None


@dataclass(frozen=True)
class Transition:
    """One UPDATE of one outbox row, as the trigger saw it (times: database clock, epoch s)."""

    seq: int
    id: int
    actor: str  # application_name of the session that made the change
    tx_now: float  # now(): the time every lease comparison in that statement used
    old_status: str
    new_status: str
    old_version: int
    new_version: int
    old_attempts: int
    new_attempts: int
    old_owner: str | None = None
    new_owner: str | None = None
    old_lease_until: float | None = None
    new_lease_until: float | None = None
    new_available_at: float | None = None
    new_error: str | None = None


@dataclass(frozen=True)
class Delivery:
    """One request the sink answered (2xx = delivered). Times: wall clock, epoch seconds."""

    key: int | None  # Idempotency-Key
    body_id: int | None
    worker: str | None  # Outbox-Worker
    attempt: int  # Outbox-Attempt
    status: int
    received: float
    answered: float
    # The receiver's inbox on a 2xx: True applied it, False absorbed it as a duplicate.
    applied: bool | None = None

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300


@dataclass(frozen=True)
class LogEvent:
    """One history line of one worker's log, in file order (`line`)."""

    worker: str
    line: int
    kind: str  # claimed | finalized | lost | db_error
    ids: tuple[int, ...] = ()
    versions: tuple[int, ...] = ()
    outcomes: tuple[str, ...] = ()
    applied: tuple[bool, ...] = ()
    operation: str = ""  # db_error: claim, finalize, extend leases, ...


@dataclass(frozen=True)
class Fault:
    kind: str  # SIGKILL, SIGSTOP, crash, restart, terminate, drop, stall, outage, ...
    worker: str | None = None
    at: float = 0.0


@dataclass(frozen=True)
class Config:
    max_attempts: int
    publish_timeout: float  # seconds
    ordered: bool = False
    operators: frozenset[str] = frozenset()  # application_names allowed to requeue / skip


@dataclass
class History:
    config: Config
    committed: list[Committed] = field(default_factory=list)
    final: dict[int, Final] = field(default_factory=dict)
    transitions: list[Transition] = field(default_factory=list)
    deliveries: list[Delivery] = field(default_factory=list)
    logs: list[LogEvent] = field(default_factory=list)
    faults: list[Fault] = field(default_factory=list)
    # Workers that wrote no log lines we can trust to be complete (set by the run).
    died: frozenset[str] = frozenset()
    # Effects the downstream applied through its inbox, by message id (its effects table).
    effects: dict[int, int] = field(default_factory=dict)


# -- the database witness --------------------------------------------------------------------

_INSTALL = """
CREATE SCHEMA IF NOT EXISTS chaos;
CREATE TABLE IF NOT EXISTS chaos.history (
    seq              bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    id               bigint      NOT NULL,
    actor            text        NOT NULL,
    tx_now           timestamptz NOT NULL,
    old_status       text        NOT NULL,
    new_status       text        NOT NULL,
    old_version      bigint      NOT NULL,
    new_version      bigint      NOT NULL,
    old_attempts     integer     NOT NULL,
    new_attempts     integer     NOT NULL,
    old_owner        text,
    new_owner        text,
    old_lease_until  timestamptz,
    new_lease_until  timestamptz,
    new_available_at timestamptz,
    new_error        text
);
CREATE OR REPLACE FUNCTION chaos.record() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    -- seq is drawn while the row is locked, so one row's entries are in its commit order.
    INSERT INTO chaos.history (id, actor, tx_now, old_status, new_status, old_version,
        new_version, old_attempts, new_attempts, old_owner, new_owner, old_lease_until,
        new_lease_until, new_available_at, new_error)
    VALUES (NEW.id, current_setting('application_name'), now(), OLD.status, NEW.status,
        OLD.lease_version, NEW.lease_version, OLD.attempts, NEW.attempts, OLD.lease_owner,
        NEW.lease_owner, OLD.lease_until, NEW.lease_until, NEW.available_at, NEW.last_error);
    RETURN NULL;
END
$$;
"""


def install(conn: psycopg.Connection[Any], table: Table) -> None:
    """Record every UPDATE of `table` in chaos.history (idempotent)."""
    with conn.transaction():
        conn.execute(_INSTALL)
        conn.execute(
            sql.SQL(
                "CREATE OR REPLACE TRIGGER chaos_record AFTER UPDATE ON {t} "
                "FOR EACH ROW EXECUTE FUNCTION chaos.record()"
            ).format(t=table.ident)
        )


def _epoch(column: str) -> sql.Composable:
    return sql.SQL("extract(epoch FROM {c})::float8").format(c=sql.Identifier(column))


def read_database(conn: psycopg.Connection[Any], table: Table) -> tuple[
    list[Committed], dict[int, Final], list[Transition]
]:  # fmt: skip
    committed = [
        Committed(int(i), str(a))
        for i, a in conn.execute(
            sql.SQL("SELECT id, aggregate_id FROM {t} ORDER BY id").format(t=table.ident)
        )
    ]
    final = {
        int(r[0]): Final(int(r[0]), str(r[1]), int(r[2]), int(r[3]), r[4])
        for r in conn.execute(
            sql.SQL(
                "SELECT id, status, attempts, lease_version, last_error FROM {t} ORDER BY id"
            ).format(t=table.ident)
        )
    }
    columns = sql.SQL(", ").join(
        [
            sql.SQL("seq, id, actor"),
            _epoch("tx_now"),
            sql.SQL("old_status, new_status, old_version, new_version, old_attempts"),
            sql.SQL("new_attempts, old_owner, new_owner"),
            _epoch("old_lease_until"),
            _epoch("new_lease_until"),
            _epoch("new_available_at"),
            sql.SQL("new_error"),
        ]
    )
    transitions = [
        Transition(*row)
        for row in conn.execute(
            sql.SQL("SELECT {c} FROM chaos.history ORDER BY seq").format(c=columns)
        )
    ]
    return committed, final, transitions


# -- the downstream witness ------------------------------------------------------------------


def _int(value: object) -> int | None:
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.isascii() and value.isdigit():
        return int(value)
    return None


def deliveries(requests: Iterable[Request]) -> list[Delivery]:
    """On the database's clock: the wall-clock arrival, and the answer that many monotonic
    seconds later."""
    return [
        Delivery(
            key=_int(r.key),
            body_id=_int(r.body.get("id")) if isinstance(r.body, dict) else None,
            worker=r.worker,
            attempt=r.attempt,
            status=r.status,
            received=r.received_at,
            answered=r.received_at + (r.answered - r.received),
            applied=r.applied,
        )
        for r in requests
    ]


def effects(applied: Mapping[str, int]) -> dict[int, int]:
    """The downstream's effects by message id; one whose id is no number counts as id -1,
    which no outbox row has (the checker reports it)."""
    found: dict[int, int] = {}
    for message_id, n in applied.items():
        key = _int(message_id)
        key = -1 if key is None else key
        found[key] = found.get(key, 0) + n
    return found


# -- the workers' witness --------------------------------------------------------------------


def read_log(worker: str, path: Path) -> list[LogEvent]:
    """The history lines of one worker's JSON log; other lines are skipped."""
    events: list[LogEvent] = []
    if not path.exists():
        return events
    for number, text in enumerate(path.read_text(errors="replace").splitlines()):
        if not text.startswith("{"):
            continue  # e.g. an interpreter's dying words
        try:
            entry: dict[str, Any] = json.loads(text)
        except ValueError:
            continue  # a line cut short by SIGKILL
        message = str(entry.get("message", ""))
        kind = entry.get("event")
        if kind in ("claimed", "finalized"):
            events.append(
                LogEvent(
                    worker,
                    number,
                    str(kind),
                    ids=tuple(entry["ids"]),
                    versions=tuple(entry["versions"]),
                    outcomes=tuple(entry.get("outcomes", ())),
                    applied=tuple(entry.get("applied", ())),
                )
            )
        elif message.startswith("lost lease"):
            events.append(
                LogEvent(
                    worker,
                    number,
                    "lost",
                    ids=(int(entry["outbox_id"]),),
                    versions=(int(entry["lease_version"]),),
                )
            )
        elif " failed (" in message and entry.get("level") == "warning":
            events.append(
                LogEvent(worker, number, "db_error", operation=message.split(" failed (")[0])
            )
    return events


def read_logs(paths: Mapping[str, Path]) -> list[LogEvent]:
    return [event for worker, path in paths.items() for event in read_log(worker, path)]
