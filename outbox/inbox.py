"""The receiving end: an inbox table that turns at-least-once delivery into one effect.

A receiver records each message id in the same transaction as the effect the message has:

    with conn.transaction():
        if inbox.record(conn, consumer="billing", message_id=key):
            conn.execute("UPDATE accounts SET balance = balance + %s WHERE id = %s", (...))

`record` is one `INSERT … ON CONFLICT DO NOTHING`: it says whether this delivery is the
first, and the id and the effect commit or roll back together. A duplicate that arrives while
the first delivery's transaction is still open waits on the key's index entry until that one
ends: if it committed the duplicate is dropped, if it rolled back the duplicate applies. There
is no window between a check and an insert (no select-then-insert), no row lock taken on a
key that exists (the conflict is read, not locked), and no isolation level above READ
COMMITTED is needed. At REPEATABLE READ or SERIALIZABLE, a duplicate racing a first delivery
that commits meanwhile fails with a serialization failure (40001): rolled back, the retried
transaction sees the key (the receiver helpers retry).

The table is keyed by (consumer, message id): several consumers (handlers) may share one
table, each applying a message once. It must stay one plain table with that primary key:
partitioned by time or by anything else, the key would only be unique within a partition
and a redelivery landing in another partition would apply twice.

Retention (`purge`): keys are kept at least as long as the message can be delivered again
(`redelivery_window`, docs/receiving.md), then deleted oldest first in bounded batches, one
purger at a time (a transaction-scoped advisory lock), rows others have locked skipped:
each batch is an index range from where the last one ended, so its cost does not grow with
the table and it never waits on a receiver.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, overload

import psycopg
from psycopg import sql

from outbox.operations.maintenance import PURGE_BATCH
from outbox.partitions import table_lock_key
from outbox.runner import Query, Row, fetch, first_row, run
from outbox.schema import SchemaError
from outbox.table import Table, shown, shown_argument, text_constant

DEFAULT_INBOX_TABLE = "outbox_inbox"  # `outbox inbox …`'s and `record`'s default table
INBOX_VERSION = 2  # v2: `replay`, the last replay applied (record's `replay`)
_VERSION_COMMENT = re.compile(r"^outbox-dispatcher inbox v(\d+)$")
# Longest consumer name and message id accepted, in bytes: far more than any id a sender
# makes (an outbox id is at most 19 digits, a UUID 36 characters), well under what a btree
# entry may hold, and a bound on what a hostile sender makes the table store.
MAX_KEY_BYTES = 512
# How long `outbox inbox purge` keeps a key unless told otherwise: the worker's redelivery
# window at its default settings is about 25 hours (docs/receiving.md); the rest covers an outage
# ridden out with the breaker open and dead messages a person requeues within the week the
# done rows themselves are kept for (`outbox purge`).
DEFAULT_RETENTION = timedelta(days=14)
DEFAULT_PURGE_BATCH = PURGE_BATCH  # rows per DELETE, as the outbox's own purge

# Migrations take the same lock as `outbox migrate`: one schema change at a time, whichever.
_MIGRATE_LOCK = "SELECT pg_advisory_xact_lock(hashtextextended('outbox-dispatcher migrate', 0))"


def _table(table: str | Table) -> Table:
    return table if isinstance(table, Table) else Table.parse(table)


# -- schema ------------------------------------------------------------------------------


def migration_statements(table: Table) -> list[sql.Composed]:
    """What `outbox inbox migrate` runs on a new table (and `--print` shows)."""
    t = table.ident
    return [
        *table.create_schema(),
        sql.SQL(
            """CREATE TABLE IF NOT EXISTS {t} (
    consumer    text        NOT NULL,
    message_id  text        NOT NULL,
    received_at timestamptz NOT NULL DEFAULT now(),
    -- The last replay of the message applied (docs/replay.md); NULL: none.
    replay      integer,
    -- One row per message a consumer applied: the conflict target of every delivery.
    -- Never partition this table: the key must be unique across the whole of it.
    PRIMARY KEY (consumer, message_id)
)"""
        ).format(t=t),
        _purge_index_statement(table),
        _version_comment(table),
    ]


def _version_comment(table: Table) -> sql.Composed:
    return sql.SQL("COMMENT ON TABLE {t} IS {c}").format(
        t=table.ident, c=sql.Literal(f"outbox-dispatcher inbox v{INBOX_VERSION}")
    )


def upgrade_statements(table: Table) -> list[sql.Composed]:
    """What brings a v1 inbox table to v2: a nullable column, a catalog change only (no
    rewrite, no long lock)."""
    return [
        sql.SQL("ALTER TABLE {t} ADD COLUMN IF NOT EXISTS replay integer").format(t=table.ident),
        _version_comment(table),
    ]


def render_migration(table: str | Table = DEFAULT_INBOX_TABLE) -> str:
    """The migration as SQL text, for `outbox inbox migrate --print` and for review."""
    return "".join(f"{s.as_string(None)};\n\n" for s in migration_statements(_table(table)))


@dataclass(frozen=True)
class _State:
    exists: bool
    comment: str  # the version comment, '' for none
    # An index the purge can walk: a valid btree index, whole (not partial), led by
    # received_at, whatever its name (one built by hand CONCURRENTLY counts).
    purge_index: bool
    # Another relation (an invalid or other index) holds the name migrate gives the index.
    index_name_taken: bool


def _purge_index_name(table: Table) -> str:
    return table.derived_name("received")


def _state(table: Table) -> Query[_State]:
    statement = sql.SQL(
        """SELECT to_regclass({t}) IS NOT NULL,
       coalesce(obj_description(to_regclass({t}), 'pg_class'), ''),
       EXISTS (SELECT FROM pg_index i
                 JOIN pg_class c ON c.oid = i.indexrelid
                 JOIN pg_am am ON am.oid = c.relam AND am.amname = 'btree'
                 JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = i.indkey[0]
                WHERE i.indrelid = to_regclass({t}) AND i.indisvalid AND i.indpred IS NULL
                  AND a.attname = 'received_at'),
       EXISTS (SELECT FROM pg_class c
                WHERE c.relname = {name}
                  AND c.relnamespace = (SELECT relnamespace FROM pg_class
                                         WHERE oid = to_regclass({t})))"""
    ).format(t=table.regclass_literal, name=text_constant(_purge_index_name(table)))
    return Query(statement, None, first_row(_parse_state))


def _parse_state(row: Row | None) -> _State:
    assert row is not None
    return _State(bool(row[0]), str(row[1]), bool(row[2]), bool(row[3]))


def _no_purge_index(table: Table, state: _State) -> str | None:
    """Why the purge has no index to walk, with the fix; None when it has one."""
    if state.purge_index:
        return None
    name = _purge_index_name(table)
    if state.index_name_taken:
        return (
            f"inbox table {shown(table)} has no usable index on received_at for `outbox inbox "
            f"purge`: {shown(name)} is not one (invalid, as a failed CREATE INDEX CONCURRENTLY "
            f"leaves it, or on other columns); drop it, then run `outbox inbox migrate --table "
            f"{shown_argument(table)}`"
        )
    return (
        f"inbox table {shown(table)} lacks the index on received_at that `outbox inbox purge` "
        f"walks (without it every batch reads the whole table); run `outbox inbox migrate "
        f"--table {shown_argument(table)}` (it builds {shown(name)}; on a large table in use, "
        f"CREATE INDEX CONCURRENTLY {shown(name)} ON {shown(table)} (received_at) first)"
    )


def _purge_index_statement(table: Table) -> sql.Composed:
    # The purge walks this index from the oldest key: each batch costs its own size.
    return sql.SQL("CREATE INDEX IF NOT EXISTS {i} ON {t} (received_at)").format(
        i=table.index_name("received"), t=table.ident
    )


def migrate(conn: psycopg.Connection[Any], table: str | Table = DEFAULT_INBOX_TABLE) -> bool:
    """Create the inbox table if it does not exist, or bring an older one to INBOX_VERSION;
    True if it was created. A table without the purge's index on received_at gets it.

    Safe to run concurrently and repeatedly (every receiver replica may run it at start-up):
    an existing table is written to only for what it lacks (even `CREATE INDEX IF NOT
    EXISTS` takes a lock that blocks deliveries). Refuses a table of that name that is not an
    inbox table (an outbox table, say).
    """
    return migrated(conn, table) == [CREATED]


CREATED = "created"


def migrated(conn: psycopg.Connection[Any], table: str | Table = DEFAULT_INBOX_TABLE) -> list[str]:
    """`migrate`, saying what it did: [CREATED], or what an existing table was given (its
    upgrade from an older version, the purge's index), or nothing when it lacked nothing."""
    t = _table(table)
    with conn.transaction():
        conn.execute(_MIGRATE_LOCK)
        state = fetch(conn, _state(t))
        if not state.exists:
            for statement in migration_statements(t):
                conn.execute(statement)
            return [CREATED]
        done = []
        version = _check_comment(t, state.comment, upgradable=True)
        if version < INBOX_VERSION:
            for statement in upgrade_statements(t):
                conn.execute(statement)
            done.append(f"upgraded from v{version}")
        missing = _no_purge_index(t, state)
        if missing is not None and state.index_name_taken:
            raise SchemaError(missing)  # IF NOT EXISTS would keep what holds the name
        if missing is not None:
            conn.execute(_purge_index_statement(t))
            done.append(f"built the purge's index {shown(t.derived_name('received'))}")
        return done


def _check_comment(table: Table, comment: str, *, upgradable: bool = False) -> int:
    """The inbox table's version; SchemaError if it is no inbox table, newer than this code,
    or (unless `upgradable`) older."""
    match = _VERSION_COMMENT.match(comment)
    if match is None:
        what = "an outbox table" if comment.startswith("outbox-dispatcher schema") else "a table"
        raise SchemaError(
            f"{shown(table)} is {what}, not an inbox table (made by `outbox inbox migrate`); "
            "choose another --table"
        )
    version = int(match.group(1))
    if version > INBOX_VERSION:
        raise SchemaError(
            f"inbox table {shown(table)} is at v{version}, newer than this outbox-dispatcher "
            f"supports (v{INBOX_VERSION}); upgrade outbox-dispatcher"
        )
    if version < INBOX_VERSION and not upgradable:
        raise SchemaError(
            f"inbox table {shown(table)} is at v{version}, this outbox-dispatcher needs "
            f"v{INBOX_VERSION}; run `outbox inbox migrate --table {shown_argument(table)}`"
        )
    return version


@overload
def check(conn: psycopg.Connection[Any], table: str | Table = ...) -> None: ...
@overload
def check(conn: psycopg.AsyncConnection[Any], table: str | Table = ...) -> Awaitable[None]: ...
def check(
    conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any],
    table: str | Table = DEFAULT_INBOX_TABLE,
) -> Awaitable[None] | None:
    """Raise SchemaError unless the inbox table exists and this code can use it, its purge
    index included: what a receiver runs at start-up, so a missing table is one clear line,
    not an error answered to every delivery, and a table the purge would read whole at every
    batch is named before it grows."""
    t = _table(table)

    def parse(rows: list[Row]) -> None:
        state = _parse_state(rows[0] if rows else None)
        if not state.exists:
            raise SchemaError(
                f"inbox table {shown(t)} does not exist; run `outbox inbox migrate --table "
                f"{shown_argument(t)}`"
            )
        _check_comment(t, state.comment)
        missing = _no_purge_index(t, state)
        if missing is not None:
            raise SchemaError(missing)

    query = _state(t)
    return run(conn, Query(query.statement, query.params, parse))


# -- the one call a receiver makes -------------------------------------------------------


_RECORD = sql.SQL(
    "INSERT INTO {t} (consumer, message_id) VALUES (%(consumer)s, %(message_id)s) "
    "ON CONFLICT (consumer, message_id) DO NOTHING RETURNING true"
)
# A replay the application chose to apply again: first if the key is new, or if it records
# an earlier replay (or none); the same replay delivered twice is a duplicate like any other.
# The key is the message id as before: `outbox reconcile` reads it. On a conflict the row is
# locked (DO UPDATE), so two deliveries of one replay still apply once.
_RECORD_REPLAY = sql.SQL(
    "INSERT INTO {t} AS i (consumer, message_id, replay) "
    "VALUES (%(consumer)s, %(message_id)s, %(replay)s) "
    "ON CONFLICT (consumer, message_id) DO UPDATE SET replay = excluded.replay, "
    "received_at = now() WHERE i.replay IS NULL OR i.replay < excluded.replay RETURNING true"
)


def check_key(what: str, value: str) -> str:
    """A consumer name or a message id, or ValueError saying why it cannot be one."""
    if not isinstance(value, str):
        raise TypeError(f"{what} must be text, got {type(value).__name__}")
    if not value:
        raise ValueError(f"{what} is empty")
    if "\x00" in value:
        raise ValueError(f"{what} holds a NUL character")
    if len(value.encode()) > MAX_KEY_BYTES:
        raise ValueError(f"{what} is longer than {MAX_KEY_BYTES} bytes")
    return value


def record_query(
    *,
    consumer: str,
    message_id: str,
    table: str | Table = DEFAULT_INBOX_TABLE,
    replay: int | None = None,
) -> Query[bool]:
    """`record`'s statement: True when this delivery is the first (of the message, or of
    replay `replay` of it)."""
    params: dict[str, Any] = {
        "consumer": check_key("consumer", consumer),
        "message_id": check_key("message id", message_id),
    }
    if replay is None:
        return Query(_RECORD.format(t=_table(table).ident), params, bool)
    if isinstance(replay, bool) or not isinstance(replay, int) or replay < 1:
        raise ValueError(f"replay must be a replay's number (1, 2, ...), got {replay!r}")
    return Query(_RECORD_REPLAY.format(t=_table(table).ident), {**params, "replay": replay}, bool)


def _in_transaction(conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any]) -> None:
    """An autocommit connection outside a transaction block would commit the key on its own,
    before (and whatever becomes of) the effect: the one misuse that silently loses messages."""
    idle = conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
    if conn.autocommit and idle:
        raise RuntimeError(
            "inbox.record must run inside the receiver's transaction (with conn.transaction()): "
            "on its own it would commit the message id before the effect"
        )


@overload
def record(
    conn: psycopg.Connection[Any],
    *,
    consumer: str,
    message_id: str,
    table: str | Table = ...,
    replay: int | None = ...,
) -> bool: ...
@overload
def record(
    conn: psycopg.AsyncConnection[Any],
    *,
    consumer: str,
    message_id: str,
    table: str | Table = ...,
    replay: int | None = ...,
) -> Awaitable[bool]: ...
def record(
    conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any],
    *,
    consumer: str,
    message_id: str,
    table: str | Table = DEFAULT_INBOX_TABLE,
    replay: int | None = None,
) -> bool | Awaitable[bool]:
    """Record `message_id` for `consumer` in the caller's transaction; True if this delivery
    is the first (apply the effect), False if the id was already recorded (a duplicate:
    skip it). With an async connection it returns an awaitable.

    `replay`, the number of the replay that sent the message again (from a field the
    sender's signature covers, never from a header: docs/replay.md), applies a replay again:
    True once per replay. Without it a replay is absorbed as a duplicate.

    Nothing here commits: the record becomes durable exactly when the effect does.
    """
    _in_transaction(conn)
    query = record_query(consumer=consumer, message_id=message_id, table=table, replay=replay)
    return run(conn, query)


# -- retention ---------------------------------------------------------------------------


def redelivery_window(
    *, max_attempts: int, lease: timedelta, backoff_cap: timedelta, max_defer_age: timedelta
) -> timedelta:
    """The longest time a worker with these settings may go on delivering one message on its
    own: each attempt ends at worst with its lease expiring or with a backoff up to the cap,
    and business defers (which refund the attempt) end at `max_defer_age`. Not counted, and
    to be added: the time a destination stays open or paused (held messages keep their
    attempts) and how long a dead message may wait before a person requeues it."""
    return max_attempts * (lease + backoff_cap) + max_defer_age


@dataclass(frozen=True)
class PurgeResult:
    deleted: int
    cutoff: datetime
    # Another purge of the same table held the lock: this one stopped (it is not needed).
    busy: bool = False


_CUTOFF = sql.SQL("SELECT now() - %(age)s::interval")
_TRY_LOCK = sql.SQL("SELECT pg_try_advisory_xact_lock({key})")
# The key names the table as the catalog does, resolved in the statement that takes the lock:
# keyed by the name as given, purges of `inbox` and `public.inbox` both ran, twice the work.
_PURGE_LOCK = "outbox-dispatcher inbox purge "
# A batch: the oldest keys from where the last batch ended, as physical row addresses (a TID
# scan deletes them without a second index probe). Rows someone else locked are skipped, not
# waited for: the purge never takes part in a lock cycle.
_PURGE_BATCH = sql.SQL(
    """WITH gone AS (
    DELETE FROM {t} WHERE ctid = ANY (ARRAY(
        SELECT ctid FROM {t}
         WHERE received_at >= %(after)s AND received_at < %(cutoff)s
         ORDER BY received_at
         LIMIT %(batch)s
           FOR UPDATE SKIP LOCKED))
    RETURNING received_at)
SELECT count(*), max(received_at) FROM gone"""
)
# Where the first batch starts: before any key. In UTC, a day past the smallest datetime, so
# no time zone's offset takes it out of range when it is sent.
_BEFORE_ANY_KEY = datetime(1, 1, 2, tzinfo=UTC)
_PURGE_COUNT = sql.SQL("SELECT count(*) FROM {t} WHERE received_at < %(cutoff)s")


def purge_batch_query(table: Table, *, after: datetime, cutoff: datetime, batch: int) -> Query[Row]:
    """One bounded batch: (rows deleted, newest received_at among them)."""
    return Query(
        _PURGE_BATCH.format(t=table.ident),
        {"after": after, "cutoff": cutoff, "batch": batch},
        first_row(lambda row: row or (0, None)),
    )


def purge(
    conn: psycopg.Connection[Any],
    table: str | Table = DEFAULT_INBOX_TABLE,
    *,
    older_than: timedelta = DEFAULT_RETENTION,
    batch: int = DEFAULT_PURGE_BATCH,
    dry_run: bool = False,
) -> PurgeResult:
    """Delete keys received more than `older_than` ago, `batch` rows per transaction.

    The cutoff is fixed when the purge starts, so a purge under a steady stream of deliveries
    ends. Each batch first takes the table's purge lock without waiting: if another purge
    holds it, this one stops and says so (one purger at a time is enough; two would only
    contend). `conn` must be in autocommit mode: each batch is its own transaction, so no lock
    is held between batches.
    """
    t = _table(table)
    if batch < 1:
        raise ValueError("batch must be at least 1")
    cutoff = _fetch_cutoff(conn, older_than)
    if dry_run:
        row = conn.execute(_PURGE_COUNT.format(t=t.ident), {"cutoff": cutoff}).fetchone()
        return PurgeResult(int(row[0]) if row else 0, cutoff)
    lock = _TRY_LOCK.format(key=table_lock_key(t, _PURGE_LOCK))
    after = _BEFORE_ANY_KEY
    total = 0
    while True:
        with conn.transaction():
            got = conn.execute(lock).fetchone()
            if not got or not got[0]:
                return PurgeResult(total, cutoff, busy=True)
            deleted, newest = fetch(
                conn, purge_batch_query(t, after=after, cutoff=cutoff, batch=batch)
            )
        total += int(deleted)
        if deleted < batch or newest is None:
            return PurgeResult(total, cutoff)
        # Ties at `newest` not deleted yet are read again; everything before it is gone.
        after = newest


def _fetch_cutoff(conn: psycopg.Connection[Any], older_than: timedelta) -> datetime:
    row = conn.execute(_CUTOFF, {"age": older_than}).fetchone()
    assert row is not None
    cutoff = row[0]
    assert isinstance(cutoff, datetime)
    return cutoff


__all__ = [
    "DEFAULT_INBOX_TABLE",
    "DEFAULT_PURGE_BATCH",
    "DEFAULT_RETENTION",
    "INBOX_VERSION",
    "MAX_KEY_BYTES",
    "PurgeResult",
    "check",
    "check_key",
    "migrate",
    "migration_statements",
    "purge",
    "purge_batch_query",
    "record",
    "record_query",
    "redelivery_window",
    "render_migration",
    "upgrade_statements",
]
