"""What the operator asks of the outbox database: is the table usable, the backlog, the purge.

Every failure becomes a `Problem` with a precise reason; messages never carry anything secret
of the DSN: one that does not parse is named by where it came from and what is wrong, never
by any piece of it (it may be any Secret's value), and every other message is shown through
outbox.redact (the DSN redacted, its secret values masked wherever a driver quotes them).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from datetime import timedelta

import psycopg
from psycopg import sql

from outbox import dberrors
from outbox.controller.problem import Problem
from outbox.dsn import DsnError, check_dsn
from outbox.durations import parse_duration
from outbox.errors import SettingError
from outbox.maintenance import purge_done
from outbox.redact import redact_dsn, redact_text
from outbox.schema import SchemaError, check_table
from outbox.signing_keys import signing_keys
from outbox.stats import QueueStats, queue_stats_async
from outbox.table import Table

CONNECT_TIMEOUT_SECONDS = 5
APPLICATION_NAME = "outbox-controller"


def parse_dsn(dsn: str, source: str) -> str:
    """The DSN if libpq can use it; else a Problem naming `source` (e.g. "key `dsn` of Secret
    `ns/orders-db`") and what is wrong, quoting none of the value."""
    try:
        return check_dsn(dsn)
    except DsnError as exc:
        raise Problem(
            "InvalidDsn", f"{source} is not a libpq connection string: {exc.reason}"
        ) from None


def parse_signing_secret(text: str, source: str) -> None:
    """A Problem unless `text` holds Standard Webhooks signing secrets the worker starts with
    (outbox.signing_keys: one `whsec_<base64>` a line, blank lines skipped): named by
    `source` and the line, quoting none of the value."""
    try:
        signing_keys(text)
    except ValueError as exc:
        raise Problem("InvalidSigningSecret", f"{source}: {exc}") from None


def parse_table(text: str) -> Table:
    try:
        return Table.parse(text)
    except SettingError as exc:
        raise Problem("InvalidTable", str(exc)) from None


def parse_retention(text: str | None) -> timedelta | None:
    """spec.retention, None when absent (done rows are kept). Zero or less is refused as the
    CRD refuses it (a CRD from an older release admitted `0s`): it would delete every done
    row as soon as it is done, the recent history people read in an incident."""
    if text is None:
        return None
    try:
        retention = parse_duration(text)
    except ValueError as exc:
        raise Problem("InvalidRetention", f"spec.retention {text!r}: {exc}") from None
    if retention <= timedelta(0):
        raise Problem(
            "InvalidRetention",
            f"spec.retention {text!r} must be more than zero: it would purge every done row "
            "at once; set a period (7d, 12h) or remove it to keep them",
        )
    return retention


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


@dataclass(frozen=True)
class TableIdentity:
    """Which table a DSN and a table name reach, as the server knows it: the server, the
    database's oid and the table's oid (found through the search_path when unqualified). Two
    DSNs that differ in text (host alias, port spelled out, options, another role) reach the
    same table iff their identities are equal.

    The server is named by what every role may read, so that two roles agree whatever their
    grants: its start time (`pg_postmaster_start_time()`) and its port. The cluster's
    `system_identifier` would be steadier, but `pg_control_system()` is often not granted
    (managed services revoke it), and a role that cannot read it would key the same table
    otherwise; `data_directory` is for superusers only; the address a client reached
    (`inet_server_addr()`) depends on the route. The limits: the key changes when the server
    restarts (`Tables` has whoever shared the old key read again before anyone on the new one
    runs workers); a server and its standbys differ (the operator only writes to a primary);
    a role an administrator denied `pg_postmaster_start_time()` names its server by port
    only, comparable only with roles denied it too."""

    key: str  # compared, never shown
    text: str  # for people: `table public.outbox of database orders`


# Asked first, so a role denied the function makes no failing call (PostgreSQL would log an
# ERROR on every pass; the executor checks EXECUTE on every call in a plan, even in a CASE
# branch not taken).
_MAY_READ_START = "SELECT has_function_privilege('pg_postmaster_start_time()', 'execute')"
_STARTED = sql.SQL("(extract(epoch FROM pg_postmaster_start_time()) * 1000000)::bigint::text")
_UNKNOWN = sql.SQL("'unknown'")
_IDENTITY = sql.SQL(
    "SELECT {started} || '@' || current_setting('port'), d.oid::text, c.oid::text, "
    "d.datname, n.nspname, c.relname "
    "FROM pg_database d, pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
    "WHERE d.datname = current_database() AND c.oid = to_regclass({t})"
)


async def table_identity(
    conn: psycopg.AsyncConnection[tuple[object, ...]], table: Table
) -> TableIdentity:
    allowed = await (await conn.execute(_MAY_READ_START)).fetchone()
    started = _STARTED if allowed is not None and allowed[0] else _UNKNOWN
    cursor = await conn.execute(_IDENTITY.format(started=started, t=table.regclass_literal))
    row = await cursor.fetchone()
    if row is None:  # checked just before, so only a concurrent drop: the next pass says so
        raise Problem("TableMissing", f"table {table} does not exist", database=True)
    server, database_oid, table_oid, database, schema, name = (str(v) for v in row)
    return TableIdentity(
        f"{server}/{database_oid}/{table_oid}",
        f"table {schema}.{name} of database {database}",
    )


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
                await check_table(conn, table, ordered=ordered)
            except SchemaError as exc:
                missing = "does not exist" in str(exc)
                reason = "TableMissing" if missing else "TableInvalid"
                raise Problem(reason, str(exc), database=True) from None
            stats = await queue_stats_async(conn, table, ordered=ordered)
            return stats, await table_identity(conn, table)
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


__all__ = ["TableIdentity", "parse_dsn", "parse_table", "purge", "read_table"]
