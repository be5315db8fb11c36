"""The operator's door to the outbox databases: one small interface, `Database`.

A pass asks it two things: read a table (`read`: is it usable, its backlog, which table it
is) and purge done rows (`purge`). `Connections` answers with a connection per call, closed
after; a pool kept per database would answer the same two calls, and only `Context`'s
`database` would change (the statements are in `outbox.operator_reads` and
`outbox.maintenance`).

Every failure becomes a `Problem` with a precise reason; messages never carry anything secret
of the DSN: one that does not parse is named by where it came from and what is wrong, never
by any piece of it (it may be any Secret's value), and every other message is shown through
outbox.redact (the DSN redacted, its secret values masked wherever a driver quotes them).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from datetime import timedelta
from typing import Protocol

import psycopg

from outbox import dberrors, operator_reads
from outbox.controller.problem import Problem
from outbox.dsn import DsnError, check_dsn
from outbox.maintenance import purge_done
from outbox.operator_reads import TableIdentity
from outbox.redact import redact_dsn, redact_text
from outbox.schema import SchemaError
from outbox.stats import QueueStats
from outbox.table import Table

CONNECT_TIMEOUT_SECONDS = 5
APPLICATION_NAME = "outbox-controller"


@dataclass(frozen=True)
class TableReading:
    """What one read of a table found."""

    stats: QueueStats
    identity: TableIdentity


class Database(Protocol):
    """What a pass asks of the outbox databases (see the module)."""

    async def read(self, dsn: str, table: Table, *, ordered: bool) -> TableReading:
        """The table checked, its backlog and identity; a Problem when it cannot be."""
        ...

    async def purge(self, dsn: str, table: Table, older_than: timedelta) -> int:
        """Done rows older than `older_than` deleted; how many went; a Problem on failure."""
        ...


class Connections:
    """`Database` with a connection per call, closed after."""

    async def read(self, dsn: str, table: Table, *, ordered: bool) -> TableReading:
        stats, identity = await read_table(dsn, table, ordered=ordered)
        return TableReading(stats, identity)

    async def purge(self, dsn: str, table: Table, older_than: timedelta) -> int:
        return await purge(dsn, table, older_than)


def parse_dsn(dsn: str, source: str) -> str:
    """The DSN if libpq can use it; else a Problem naming `source` (e.g. "key `dsn` of Secret
    `ns/orders-db`") and what is wrong, quoting none of the value."""
    try:
        return check_dsn(dsn)
    except DsnError as exc:
        raise Problem(
            "InvalidDsn", f"{source} is not a libpq connection string: {exc.reason}"
        ) from None


def _database_problem(exc: psycopg.Error, dsn: str) -> Problem:
    """The one classification every component uses (outbox.dberrors), as a condition reason:
    refused for good (a person must fix the Secret or the database), unreachable for now,
    or a statement that failed."""
    message = dberrors.describe(exc).strip()
    # A driver message may quote the DSN or one of its values: shown through redact_text.
    reason = redact_text(message.splitlines()[0] if message else "unknown error", dsn=dsn)
    if dberrors.is_permanent_connection_failure(exc):
        return Problem(
            "DatabaseRefused",
            f"{redact_dsn(dsn)} refused the connection (waiting will not fix it): {reason}",
            database=True,
        )
    if isinstance(exc, psycopg.OperationalError) and dberrors.is_transient(exc):
        return Problem(
            "DatabaseUnreachable", f"cannot connect to {redact_dsn(dsn)}: {reason}", database=True
        )
    return Problem("DatabaseError", reason, database=True)


async def read_table(
    dsn: str, table: Table, *, ordered: bool = False
) -> tuple[QueueStats, TableIdentity]:
    """Check the table is a usable outbox table, read its backlog and which table it is, in
    one connection.

    `ordered` (spec.ordering aggregate) adds the claimable heads the scaling policy sizes on.
    """
    try:
        async with await psycopg.AsyncConnection.connect(
            dsn,
            autocommit=True,
            connect_timeout=CONNECT_TIMEOUT_SECONDS,
            application_name=APPLICATION_NAME,
        ) as conn:
            try:
                return await operator_reads.read_table(conn, table, ordered=ordered)
            except SchemaError as exc:
                missing = "does not exist" in str(exc)
                reason = "TableMissing" if missing else "TableInvalid"
                raise Problem(reason, str(exc), database=True) from None
    except psycopg.Error as exc:
        raise _database_problem(exc, dsn) from None


def _purge(dsn: str, table: Table, older_than: timedelta) -> int:
    with psycopg.connect(
        dsn,
        autocommit=True,
        connect_timeout=CONNECT_TIMEOUT_SECONDS,
        application_name=APPLICATION_NAME,
    ) as conn:
        return purge_done(conn, table, older_than=older_than)


async def purge(dsn: str, table: Table, older_than: timedelta) -> int:
    """Delete done rows older than `older_than` (bounded batches); how many went."""
    try:
        return await asyncio.to_thread(_purge, dsn, table, older_than)
    except psycopg.Error as exc:
        raise _database_problem(exc, dsn) from None


__all__ = [
    "Connections",
    "Database",
    "TableIdentity",
    "TableReading",
    "parse_dsn",
    "purge",
    "read_table",
]
