"""What the operator reads of and does to an outbox table, on a connection it is given.

The operator (`outbox.controller`) keeps its connections; the statements live here, with
every other statement of the protocol. `read_table` is one pass's read (the table's check,
its backlog, which table it is); its retention is `outbox.operations.maintenance.purge_done`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta

import psycopg
from psycopg import sql

from outbox.schema import SchemaError, check_table
from outbox.stats import QueueStats, queue_stats_async
from outbox.table import Table, shown

AsyncConnection = psycopg.AsyncConnection[tuple[object, ...]]


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
    restarts (the operator has whoever shared the old key read again before anyone on the
    new one runs workers); a server and its standbys differ (the operator only writes to a
    primary); a role an administrator denied `pg_postmaster_start_time()` names its server
    by port only, comparable only with roles denied it too."""

    key: str  # compared, never shown
    text: str  # for people: `table public.outbox of database orders`
    # The table's oid, part of the key: a plain table converted to the partitioned layout is
    # a new table under the same name (`still_the_table`).
    oid: str = field(default="", compare=False)


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


async def _started(conn: AsyncConnection) -> sql.Composable:
    allowed = await (await conn.execute(_MAY_READ_START)).fetchone()
    return _STARTED if allowed is not None and allowed[0] else _UNKNOWN


async def server_started(conn: AsyncConnection) -> str:
    """When the server the connection reached started, as `TableIdentity` names it
    ("unknown" for a role denied `pg_postmaster_start_time()`): a new value means a restart,
    after which every table's identity is another."""
    row = await (await conn.execute(sql.SQL("SELECT {}").format(await _started(conn)))).fetchone()
    return str(row[0]) if row is not None else "unknown"


async def table_identity(conn: AsyncConnection, table: Table) -> TableIdentity:
    """The table's identity; SchemaError when it does not exist."""
    started = await _started(conn)
    cursor = await conn.execute(_IDENTITY.format(started=started, t=table.regclass_literal))
    row = await cursor.fetchone()
    if row is None:  # checked just before, so only a concurrent drop: the next pass says so
        raise SchemaError(f"table {shown(table)} does not exist")
    server, database_oid, table_oid, database, schema, name = (str(v) for v in row)
    return TableIdentity(
        f"{server}/{database_oid}/{table_oid}",
        f"table {shown(Table(schema, name))} of database {database}",
        table_oid,
    )


async def still_the_table(conn: AsyncConnection, table: Table, identity: TableIdentity) -> bool:
    """Whether the name still reaches the table `identity` was read of: a conversion to the
    partitioned layout (`outbox migrate --partition-size` on a plain table) puts a new table
    under the name, and the old one becomes its first partition. One catalog probe."""
    cursor = await conn.execute(
        sql.SQL("SELECT to_regclass({t})::oid::text").format(t=table.regclass_literal)
    )
    row = await cursor.fetchone()
    return row is not None and row[0] == identity.oid


async def read_table(
    conn: AsyncConnection, table: Table, *, ordered: bool = False
) -> tuple[QueueStats, TableIdentity]:
    """Check the table is a usable outbox table (SchemaError otherwise), read its backlog and
    which table it is. `ordered` (aggregate ordering) adds the claimable heads."""
    await check_table(conn, table, ordered=ordered)
    stats = await queue_stats_async(conn, table, ordered=ordered)
    return stats, await table_identity(conn, table)


async def bound_lock_waits(conn: AsyncConnection, limit: timedelta) -> None:
    """Every later statement of the session waits `limit` at most for a lock (`lock_timeout`):
    a retention run's DELETE waiting for a row lock a long transaction holds fails, and is
    tried again, instead of waiting on. Only lock waits: a purge's last batch reads the whole
    table (no index finds done rows by age), which on a large table takes longer than any
    bound that suits a lock wait. The caller puts the session back as it was (`RESET
    lock_timeout`, or its pool's reset)."""
    milliseconds = int(limit.total_seconds() * 1000)
    await conn.execute(
        sql.SQL("SELECT set_config('lock_timeout', {ms}, false)").format(
            ms=sql.Literal(f"{milliseconds}ms")
        )
    )


async def purge_privileges(conn: AsyncConnection, table: Table) -> tuple[str, bool, bool]:
    """The session's role, and whether it may SELECT and DELETE `table` (a purge deletes
    what its own SELECT finds)."""
    cursor = await conn.execute(
        sql.SQL(
            "SELECT current_user, has_table_privilege({t}::regclass, 'SELECT'),"
            " has_table_privilege({t}::regclass, 'DELETE')"
        ).format(t=table.regclass_literal)
    )
    row = await cursor.fetchone()
    if row is None:
        return "", False, False
    role, select, delete = row
    return str(role), bool(select), bool(delete)
