"""The operator's door to the outbox databases: one small interface, `Database`.

A pass asks it two things: read a table (`read`: is it usable, its backlog, which table it
is) and purge done rows (`purge`). `Pools` answers both from kept connections:

- one small pool per database, keyed by the DSN as resolved and the version of the Secret it
  came from (`Target`): a rotated Secret gets a new pool, and the old one closes when its
  last dispatcher has moved on or gone (`release`). Every dispatcher on that database shares
  it. Bounded: at most `--database-connections` (4) connections per database, none kept
  while unused (`min_size` 0; idle ones close after `POOL_MAX_IDLE_SECONDS`), so a fleet on
  D databases holds at most 4 x D sessions (by default) whatever its size;
- a pass waits only for its own database's pool (`WAIT_SECONDS`) and its statements have
  their own deadline (`PASS_TIMEOUT_SECONDS`): an unreachable database never delays a pass
  on another. A pool whose connections are all in use while the database answers is
  `DatabaseBusy` (the pass writes nothing and runs again soon), not a database problem;
- the table's check (it exists, is migrated, has the ordered index) and its identity are
  read once and kept, keyed by what they depend on (the table, ordered mode, the Target).
  They are read again after an error, after a server restart (each new connection reads
  the server's start time: a new one starts a new era, as the identity changes with it),
  after the name comes to reach another table (a plain table converted to partitions: one
  catalog probe a pass), and at least every `RECHECK_SECONDS`; the other passes read only
  the bounded backlog query.

`read_table` is the one-shot form (a connection for one read, closed after).

Every failure becomes a `Problem` with a precise reason; messages never carry anything secret
of the DSN: one that does not parse is named by where it came from and what is wrong, never
by any piece of it (it may be any Secret's value), and every other message is shown through
outbox.plumbing.redact (the DSN redacted, its secret values masked wherever a driver quotes them).
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Protocol

import psycopg
from psycopg import sql
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from outbox import operator_reads
from outbox.controller.problem import RETENTION_FAILED, Problem
from outbox.controller.settings import DATABASE_CONNECTIONS
from outbox.operations.maintenance import retire_done_async
from outbox.operations.partition_maintenance import STATEMENT_TIMEOUT, NotTableOwner, UpkeepBusy
from outbox.operator_reads import (
    TableIdentity,
    bound_lock_waits,
    purge_privileges,
    server_started,
    still_the_table,
    table_identity,
)
from outbox.partitions import SequenceUnreadable
from outbox.plumbing import dberrors
from outbox.plumbing.dsn import DsnError, check_dsn
from outbox.plumbing.durations import format_duration
from outbox.plumbing.redact import redact_dsn, redact_text
from outbox.runner import Query, fetch_async, no_rows, perform_async
from outbox.schema import SchemaError, check_table
from outbox.session import RESET_SEARCH_PATH, home_first
from outbox.stats import QueueStats, queue_stats_async
from outbox.table import Table, shown

log = logging.getLogger("outbox.controller")

CONNECT_TIMEOUT_SECONDS = 5
APPLICATION_NAME = "outbox-controller"
POOL_MAX_CONNECTIONS = DATABASE_CONNECTIONS.default  # per database, unless set otherwise
POOL_MAX_IDLE_SECONDS = 300.0  # a connection unused this long closes
PASS_TIMEOUT_SECONDS = 10.0  # one pass's statements, once it has a connection
WAIT_SECONDS = 10.0  # the longest a pass waits for its turn on its database's pool
RECHECK_SECONDS = 300.0  # the table's check is read again at least this often
# A kept connection's check before a pass uses it (an empty statement): a server that
# answers does so at once, like a connection's start.
ALIVE_SECONDS = float(CONNECT_TIMEOUT_SECONDS)
Dispatcher = tuple[str, str]  # (namespace, name): who uses a pool
# How long a retention run's statement waits for a lock (a purge's DELETE for a row a long
# transaction holds): as long as `outbox maintain` lets each of its statements run, so that a
# plain table's purge and a partitioned table's run alike end, fail (`RETENTION_FAILED`) and
# are tried again. A lock wait only: a purge's batches may read long on a large table.
RETENTION_LOCK_WAIT = STATEMENT_TIMEOUT
CONNECTION: dict[str, Any] = {
    "autocommit": True,
    "connect_timeout": CONNECT_TIMEOUT_SECONDS,
    "application_name": APPLICATION_NAME,
}


@dataclass(frozen=True)
class TableReading:
    """What one read of a table found."""

    stats: QueueStats
    identity: TableIdentity


@dataclass(frozen=True)
class Target:
    """The database a dispatcher reaches: its DSN as resolved, and the resourceVersion of
    the Secret it came from (a rotated Secret is another target, with a pool of its own)."""

    dsn: str = field(repr=False)
    version: str


class Database(Protocol):
    """What a pass asks of the outbox databases (see the module)."""

    async def read(
        self, dispatcher: Dispatcher, target: Target, table: Table, *, ordered: bool
    ) -> TableReading:
        """The table checked, its backlog and identity; a Problem when it cannot be."""
        ...

    async def purge(
        self, dispatcher: Dispatcher, target: Target, table: Table, older_than: timedelta
    ) -> int:
        """Done rows older than `older_than` deleted (a partitioned table's finished
        partitions dropped, `outbox maintain`'s way); how many went; a Problem on failure."""
        ...

    def purged_unreported(self, dispatcher: Dispatcher) -> int:
        """Rows removed by the dispatcher's retention runs that failed or were stopped
        part-way (a purge's batches, a partitioned table's partitions dropped, before its
        failure or cancellation), not reported yet: counted once, by the caller."""
        ...

    def keep_retention(
        self, dispatcher: Dispatcher, table: Table | None, older_than: timedelta | None
    ) -> None:
        """The dispatcher's retention as its spec says now (`older_than` None: off): a run
        in flight for another table or another age is cancelled, its statement with it."""
        ...

    def release(self, dispatcher: Dispatcher) -> None:
        """The dispatcher is gone: its retention run in flight is cancelled, and a pool it
        was the last user of closes."""
        ...

    async def close(self) -> None:
        """Cancel every retention run and close every pool."""
        ...


@dataclass
class _Checked:
    identity: TableIdentity
    era: int  # the pool's era when it was read
    at: float  # monotonic


class DatabaseBusy(Exception):
    """The pass found every connection of its database's pool in use for `WAIT_SECONDS`
    while the database answers: no new fact about the table, so the pass writes nothing
    and runs again soon."""


class RetentionRunning(Exception):
    """The dispatcher's retention run (`purge`) outlasted the pass's deadline: it goes on
    beside the passes, and a later pass reports what it did."""


@dataclass
class _Run:
    """A retention run in flight: what it is for, and the rows it removed so far (a purge's
    batches, each committed on its own; a partitioned table's partitions dropped): a run
    stopped or failed after them has removed them all the same."""

    table: Table
    older_than: timedelta
    task: asyncio.Task[int] | None = None
    deleted: int = 0

    def gone(self, rows: int) -> None:
        self.deleted += max(rows, 0)


class _Pool:
    """One database's pool, who uses it, and the table checks read through it."""

    def __init__(self, target: Target, max_connections: int) -> None:
        self.target = target
        self.users: set[Dispatcher] = set()
        # When the server started, as the newest connection found it; a new value (a
        # restart) starts a new `era`, and every table's check is read again.
        self.server: str | None = None
        self.era = 0
        self.served_at = -math.inf  # monotonic: when a connection was last handed out
        # Monotonic: when a kept connection last went unanswered (`_alive`): the pool's
        # connections are then not busy but stalled, and a pass waiting for one is told so.
        self.unanswered_at = -math.inf
        self.checked: dict[tuple[Table, bool], _Checked] = {}
        # Retention runs may wait long (a DELETE or a DETACH waiting for a lock): they take
        # all but one of the pool's connections at most, so that the passes of every
        # dispatcher on the database always have one to read their backlog with.
        self.retention_turns = asyncio.Semaphore(max(1, max_connections - 1))
        self.pool: AsyncConnectionPool[Any] = AsyncConnectionPool(
            target.dsn,
            kwargs=CONNECTION,
            min_size=0,
            max_size=max_connections,
            max_idle=POOL_MAX_IDLE_SECONDS,
            timeout=WAIT_SECONDS,  # to get a connection; then DatabaseBusy or a Problem
            # A connection the server dropped (a restart), or one it no longer answers, is
            # replaced before it is used.
            check=self._alive,
            configure=self._opened,
            reset=_path_as_it_was,
            num_workers=1,
            open=False,
        )

    async def _alive(self, conn: psycopg.AsyncConnection[Any]) -> None:
        """The pool's check of a kept connection before it is handed out, bounded: a server
        frozen, or a network that drops every packet while the connection stays open,
        never answers it, and the pass waiting for it would wait for ever (the pool's own
        check has no deadline), its status left as the last answered pass wrote it. An
        unanswered check is a connection the pool closes and replaces, and the pass ends
        at its wait as for any database that does not answer (`DatabaseUnreachable`)."""
        try:
            async with asyncio.timeout(ALIVE_SECONDS):
                await AsyncConnectionPool.check_connection(conn)
        except TimeoutError:
            self.unanswered_at = time.monotonic()
            raise

    async def _opened(self, conn: psycopg.AsyncConnection[Any]) -> None:
        async with asyncio.timeout(ALIVE_SECONDS):  # a new connection's first statement
            started = await server_started(conn)
        # A role denied the start time cannot tell a restart: every new connection may be one.
        if self.server is not None and (started != self.server or started == "unknown"):
            self.era += 1
        self.server = started

    def check(self, table: Table, ordered: bool) -> TableIdentity | None:
        """The table's kept check, if it still holds (see the module)."""
        found = self.checked.get((table, ordered))
        if found is None or found.era != self.era:
            return None
        if time.monotonic() - found.at >= RECHECK_SECONDS:
            return None
        return found.identity


async def _path_as_it_was(conn: psycopg.AsyncConnection[Any]) -> None:
    """A connection back in the pool: its search_path as the session began, whatever table's
    schema `home_first` put first (the next use may serve a table of another schema), and
    its lock_timeout (a retention run's, `_retire`)."""
    await fetch_async(conn, RESET_SEARCH_PATH)
    await fetch_async(conn, _RESET_TIMEOUT)


_RESET_TIMEOUT: Query[None] = Query(sql.SQL("RESET lock_timeout").format(), None, no_rows)


@asynccontextmanager
async def _answers(target: Target, pool: _Pool | None = None) -> AsyncIterator[None]:
    """Every failure of the database work inside as a Problem (a TimeoutError: the work
    took longer than PASS_TIMEOUT_SECONDS); DatabaseBusy when `pool` gave no connection in
    time while it gave others lately."""
    try:
        yield
    except SchemaError as exc:
        missing = "does not exist" in str(exc)
        reason = "TableMissing" if missing else "TableInvalid"
        raise Problem(reason, str(exc), database=True) from None
    except PoolTimeout:
        if (
            pool is not None
            and time.monotonic() - pool.served_at < 2 * WAIT_SECONDS
            and pool.unanswered_at < pool.served_at  # its connections answer: in use
        ):
            raise DatabaseBusy(
                f"every connection to {redact_dsn(target.dsn)} was in use for {WAIT_SECONDS:g} "
                f"s (at most {pool.pool.max_size} per database)"
            ) from None
        raise await _no_connection(target) from None
    except psycopg.Error as exc:
        raise _database_problem(exc, target.dsn) from None
    except TimeoutError:
        message = f"{redact_dsn(target.dsn)} did not answer within {PASS_TIMEOUT_SECONDS:g} s"
        raise Problem("DatabaseUnreachable", message, database=True) from None


async def _no_connection(target: Target) -> Problem:
    """Why the pool has no connection to give: the pool retries in the background and keeps
    the driver's error to itself, so one connection is tried here to name it."""
    try:
        conn = await psycopg.AsyncConnection.connect(target.dsn, **CONNECTION)
    except psycopg.Error as exc:
        return _database_problem(exc, target.dsn)
    await conn.close()
    message = f"no connection to {redact_dsn(target.dsn)} within {WAIT_SECONDS:g} s"
    return Problem("DatabaseUnreachable", message, database=True)


class Pools:
    """`Database` from kept connections: one pool per `Target` (see the module)."""

    def __init__(self, max_connections: int = POOL_MAX_CONNECTIONS) -> None:
        self._max_connections = max_connections  # per database (--database-connections)
        self._pools: dict[Target, _Pool] = {}
        self._uses: dict[Dispatcher, Target] = {}
        self._closing: set[asyncio.Task[None]] = set()
        # Retention runs (`purge`), each for its table and age as the spec said at its start.
        self._retiring: dict[Dispatcher, _Run] = {}
        # Rows deleted by runs that stopped or failed part-way, for the next pass to report.
        self._unreported: dict[Dispatcher, int] = {}

    async def _pool(self, dispatcher: Dispatcher, target: Target) -> _Pool:
        if self._uses.get(dispatcher) != target:
            self._leave(dispatcher)  # its Secret rotated: the old pool may go
            self._uses[dispatcher] = target
        found = self._pools.get(target)
        if found is None:
            found = self._pools[target] = _Pool(target, self._max_connections)
            await found.pool.open(wait=False)
        found.users.add(dispatcher)
        return found

    async def read(
        self, dispatcher: Dispatcher, target: Target, table: Table, *, ordered: bool
    ) -> TableReading:
        pool = await self._pool(dispatcher, target)
        try:
            async with _answers(target, pool), pool.pool.connection() as conn:
                pool.served_at = time.monotonic()
                async with asyncio.timeout(PASS_TIMEOUT_SECONDS):
                    # What is named after the table, in the table's schema (`home_first`),
                    # until the connection goes back to the pool (`_path_as_it_was`).
                    await perform_async(conn, home_first(table))
                    identity = pool.check(table, ordered)
                    if identity is not None and not await still_the_table(conn, table, identity):
                        identity = None  # converted to partitions: a new table, checked anew
                    if identity is None:
                        era = pool.era
                        await check_table(conn, table, ordered=ordered)
                        identity = await table_identity(conn, table)
                        pool.checked[table, ordered] = _Checked(identity, era, time.monotonic())
                    stats = await queue_stats_async(conn, table, ordered=ordered)
        except Problem:
            pool.checked.pop((table, ordered), None)  # checked again after any error
            raise
        return TableReading(stats, identity)

    async def purge(
        self, dispatcher: Dispatcher, target: Target, table: Table, older_than: timedelta
    ) -> int:
        pool = await self._pool(dispatcher, target)
        # A task beside the pass: a retention run may take longer than a pass may (a DETACH
        # ... CONCURRENTLY waits for older transactions, up to the run's statement timeout;
        # a purge of many batches), and it holds one of the pool's connections, never the
        # others' passes. This pass waits for it at most PASS_TIMEOUT_SECONDS; a later pass
        # collects what it did.
        self.keep_retention(dispatcher, table, older_than)
        run = self._retiring.get(dispatcher)
        if run is None:
            run = _Run(table, older_than)
            run.task = asyncio.create_task(
                self._retire(pool, target, run),
                name=f"retention of {dispatcher[0]}/{dispatcher[1]}",
            )
            self._retiring[dispatcher] = run
        assert run.task is not None
        done, _ = await asyncio.wait({run.task}, timeout=PASS_TIMEOUT_SECONDS)
        if not done:
            raise RetentionRunning(
                f"the retention run on {shown(table)} is still going on after "
                f"{PASS_TIMEOUT_SECONDS:g} s: reported by a later pass"
            )
        if self._retiring.get(dispatcher) is run:
            del self._retiring[dispatcher]
        try:
            return run.task.result()
        except Problem:
            # What it removed before the failure is gone (a purge's batches before a
            # statement timeout on the third; partitions dropped before a failure after).
            self._unreported[dispatcher] = self._unreported.get(dispatcher, 0) + run.deleted
            raise

    def purged_unreported(self, dispatcher: Dispatcher) -> int:
        return self._unreported.pop(dispatcher, 0)

    async def _retire(self, pool: _Pool, target: Target, run: _Run) -> int:
        table = run.table
        # Its turn first (`_Pool.retention_turns`): a run waiting for one holds no connection.
        async with pool.retention_turns, _answers(target, pool), pool.pool.connection() as conn:
            pool.served_at = time.monotonic()
            # The lock timeout undone as the connection goes back to the pool
            # (`_path_as_it_was`).
            try:
                await perform_async(conn, home_first(table))  # as `read` does
                await bound_lock_waits(conn, RETENTION_LOCK_WAIT)
                return await retire_done_async(
                    conn, table, older_than=run.older_than, gone=run.gone
                )
            except UpkeepBusy as exc:
                # The workers' partition keeper holds it for a moment; `outbox maintain`
                # run by hand for its run: this round is skipped, the next pass tries again.
                raise Problem("UpkeepBusy", str(exc), database=True) from None
            except (psycopg.errors.InsufficientPrivilege, psycopg.errors.QueryCanceled,
                    psycopg.errors.LockNotAvailable,
                    psycopg.errors.UndefinedTable) as exc:  # fmt: skip
                raise await _retention_problem(conn, table, exc, target.dsn) from None
            except psycopg.Error as exc:
                if conn.closed or isinstance(exc, psycopg.OperationalError):
                    raise  # the database gone: `_answers` names it
                raise await _retention_problem(conn, table, exc, target.dsn) from None

    def keep_retention(
        self, dispatcher: Dispatcher, table: Table | None, older_than: timedelta | None
    ) -> None:
        # A run is for the spec that started it: one whose retention was shortened by
        # mistake and then put right, or taken off, must not go on deleting what the
        # spec keeps now (a batched purge of many rows, or a DELETE waiting for a lock,
        # may last long past the change).
        wanted = None if table is None or older_than is None else (table, older_than)
        running = self._retiring.get(dispatcher)
        if running is not None and (running.table, running.older_than) != wanted:
            log.info(
                "%s/%s: the retention run on %s stopped: the spec's retention changed",
                dispatcher[0], dispatcher[1], shown(running.table),
            )  # fmt: skip
            stopped = self._stop_retention(dispatcher)
            # What it removed before it stopped is reported by this pass.
            self._unreported[dispatcher] = self._unreported.get(dispatcher, 0) + stopped

    def release(self, dispatcher: Dispatcher) -> None:
        self._stop_retention(dispatcher)
        self._unreported.pop(dispatcher, None)  # nobody to report it to
        self._leave(dispatcher)

    def _stop_retention(self, dispatcher: Dispatcher) -> int:
        """Cancel the dispatcher's run in flight; the rows it removed so far."""
        run = self._retiring.pop(dispatcher, None)
        if run is None or run.task is None:
            return 0
        # Nobody serves its table any more: the run stops, at the database too (psycopg
        # sends the server a cancel for the statement in flight when its task is
        # cancelled), so no DELETE or DETACH goes on waiting or working for nobody. Once:
        # cancelled again while psycopg asks the server, that request is cut short and
        # the statement goes on (cancel_and_wait's repeats would); a run that dropped
        # this cancellation ends at its own end, bounded by its statement timeout. A batch
        # not committed is rolled back, partitions detached and not dropped yet are the
        # next run's to drop: `deleted` holds what went before.
        run.task.cancel()
        run.task.add_done_callback(lambda task: task.cancelled() or task.exception())
        return run.deleted

    def _leave(self, dispatcher: Dispatcher) -> None:
        """The dispatcher uses its pool no more (gone, or its Secret rotated): a pool left
        with no user closes."""
        target = self._uses.pop(dispatcher, None)
        pool = self._pools.get(target) if target is not None else None
        if pool is None:
            return
        pool.users.discard(dispatcher)
        if not pool.users:
            del self._pools[pool.target]
            closing = asyncio.create_task(pool.pool.close(), name="closing a database pool")
            self._closing.add(closing)
            closing.add_done_callback(self._closing.discard)

    async def close(self) -> None:
        """Close every pool, after cancelling the retention runs (as `release` does): the
        operator stops, or lost its Lease and may not act any more."""
        pools, self._pools = list(self._pools.values()), {}
        self._uses.clear()
        runs, self._retiring = list(self._retiring.values()), {}
        retiring = [run.task for run in runs if run.task is not None]
        for task in retiring:
            task.cancel()
        await asyncio.gather(*retiring, return_exceptions=True)
        await asyncio.gather(
            *(pool.pool.close() for pool in pools), *self._closing, return_exceptions=True
        )


async def _retention_problem(
    conn: psycopg.AsyncConnection[Any], table: Table, exc: psycopg.Error, dsn: str
) -> Problem:
    """A retention run's failure in one line for people (`RETENTION_FAILED`): what failed
    and how to fix it; never a piece of the DSN."""
    what = f"the retention run on {shown(table)} failed"
    said = dberrors.describe(exc).strip()
    first = redact_text(said.splitlines()[0] if said else type(exc).__name__, dsn=dsn)
    if isinstance(exc, NotTableOwner | SequenceUnreadable):
        message = f"{what}: {first}"  # outbox maintain's own words name the fix
    elif isinstance(exc, psycopg.errors.LockNotAvailable):
        message = (
            f"{what}: it waited {format_duration(RETENTION_LOCK_WAIT)} for a lock another "
            "session holds on its rows (lock_timeout), most likely a long transaction; "
            "tried again at the next pass"
        )
    elif isinstance(exc, psycopg.errors.QueryCanceled):
        limit = format_duration(STATEMENT_TIMEOUT)
        message = (
            f"{what}: a statement ran past its limit of {limit} (statement_timeout), most "
            "likely waiting for a lock another session holds on done rows (a long "
            "transaction); tried again at the next pass"
        )
    elif isinstance(exc, psycopg.errors.InsufficientPrivilege):
        message = f"{what}: {first}; {await _grant(conn, table)}"
    else:
        message = f"{what}: {first}; tried again at the next pass"
    return Problem(RETENTION_FAILED, message, database=True)


async def _grant(conn: psycopg.AsyncConnection[Any], table: Table) -> str:
    """The GRANT a purge of `table` by this connection's role lacks (it deletes the rows its
    own SELECT finds)."""
    try:
        role, select, delete = await purge_privileges(conn, table)
    except psycopg.Error:
        role, select, delete = "", False, False
    lacking = [name for name, has in (("SELECT", select), ("DELETE", delete)) if not has]
    privileges = ", ".join(lacking or ["SELECT", "DELETE"])
    grantee = sql.Identifier(str(role)).as_string(conn) if role else "<its role>"
    return (
        f"grant the dispatcher's database role what a purge needs: GRANT {privileges} ON "
        f"{table.ident.as_string(conn)} TO {grantee}"
    )


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
    """The one classification every component uses (outbox.plumbing.dberrors), as a condition
    reason: refused for good (a person must fix the Secret or the database), unreachable for now,
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
    one connection, closed after.

    `ordered` (spec.ordering aggregate) adds the claimable heads the scaling policy sizes on.
    """
    async with (
        _answers(Target(dsn, "")),
        await psycopg.AsyncConnection.connect(dsn, **CONNECTION) as conn,
    ):
        await perform_async(conn, home_first(table))  # as `Pools.read` does
        return await operator_reads.read_table(conn, table, ordered=ordered)


__all__ = [
    "RETENTION_FAILED",
    "Database",
    "DatabaseBusy",
    "Pools",
    "RetentionRunning",
    "TableIdentity",
    "TableReading",
    "Target",
    "parse_dsn",
    "read_table",
]
