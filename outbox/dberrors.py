"""Which database errors pass by themselves and which need a person: one classification for
every component (the worker's claim, heartbeat, listener and finalizer, the TUI, the operator).

- `is_transient(exc)`: the same operation, tried again later, may succeed without anyone
  restarting anything: the connection broke or was refused, a timeout, the server is
  starting, stopping or out of connections, a serialization failure or deadlock, a lock or
  statement timeout, a read-only server during a failover, missing privileges (a `GRANT`
  heals those while the program runs). Retry with back-off and say so.
- anything else is not transient: the statement itself cannot work (a data or integrity
  error, an undefined column of an altered table, a bug). Retrying the same statement
  changes nothing.
- `is_permanent_connection_failure(exc)`: a connection attempt that waiting will not fix:
  the role or the database does not exist, authentication failed, no `pg_hba.conf` entry,
  a TLS or client configuration error. A program starting up should stop with one line
  naming it (the worker exits 2) rather than retry for ever. Such an error is never
  transient. (A host name that does not resolve is retried: in a cluster the database's
  service may appear after its workers.)
- `describe(exc)`: the error as one line that keeps the reason (libpq's message spans
  several lines, hints included, and may list one failure per host).

libpq reports a failed connection without an SQLSTATE, so connection failures are told apart
by libpq's and the server's own words (English: a server whose `lc_messages` is another
language is seen as transient, which is the old, safe behaviour: retried with a warning).
"""

from __future__ import annotations

import re

import psycopg

# SQLSTATE classes and codes of errors that pass by themselves (or by a GRANT).
_TRANSIENT_CLASSES = frozenset({
    "08",  # connection exception
    "40",  # transaction rollback: serialization failure, deadlock
    "53",  # insufficient resources: too many connections, out of memory, disk full
    "57",  # operator intervention: shutdown, crash, starting up, query cancelled / timed out
    "58",  # system error: I/O error
})  # fmt: skip
_TRANSIENT_CODES = frozenset({
    "55P03",  # lock_not_available (lock_timeout)
    "55006",  # object_in_use
    "25006",  # read_only_sql_transaction: connected to a standby, e.g. during a failover
    "42501",  # insufficient_privilege: healed by a GRANT while the program runs
})  # fmt: skip
# SQLSTATEs of a refused connection, for servers and drivers that report one.
_PERMANENT_CONNECTION_CODES = frozenset({"28000", "28P01", "3D000"})

# What libpq and the server say when a connection is refused for good. Anything else at
# connection time (refused, timed out, starting up, too many clients) may heal.
_PERMANENT_CONNECTION = re.compile(
    "|".join(
        [
            r'role "[^"]*" does not exist',
            r'database "[^"]*" does not exist',
            r"password authentication failed",
            r"authentication failed for user",
            r"no pg_hba\.conf entry",
            r"pg_hba\.conf rejects connection",
            r"is not permitted to log in",
            r"permission denied for database",
            r"no password supplied",
            r"password is required",
            r"server does not support SSL",
            r"SSL error",
            r"certificate",
            r"invalid sslmode",
        ]
    ),
    re.IGNORECASE,
)


def is_permanent_connection_failure(exc: BaseException) -> bool:
    """A connection refused for a reason that waiting will not fix (see the module doc)."""
    if not isinstance(exc, psycopg.OperationalError):
        return False
    if exc.sqlstate in _PERMANENT_CONNECTION_CODES:
        return True
    if exc.sqlstate is not None:
        return False  # an error of a live connection, not of connecting
    return bool(_PERMANENT_CONNECTION.search(str(exc)))


def is_transient(exc: BaseException) -> bool:
    """The operation may succeed when tried again later (see the module doc)."""
    if isinstance(exc, OSError | TimeoutError):
        return True  # a socket error below the driver
    if not isinstance(exc, psycopg.Error):
        return False
    if is_permanent_connection_failure(exc):
        return False
    state = exc.sqlstate
    if state is None:
        # No SQLSTATE: the driver's own verdict. Operational and interface errors are
        # connections failing or breaking (a pool timeout is one); the others (a value that
        # cannot be sent, a misused cursor) fail the same way every time.
        return isinstance(exc, psycopg.OperationalError | psycopg.InterfaceError)
    return state[:2] in _TRANSIENT_CLASSES or state in _TRANSIENT_CODES


def describe(exc: BaseException) -> str:
    """The error on one line, reason kept: `connection to server at "h", port 5432 failed:
    FATAL: role "x" does not exist`, one clause per host tried, libpq's hints left out."""
    text = str(exc).strip()
    for prefix in ("connection failed: ", "connection is bad: "):
        text = text.removeprefix(prefix)
    lines = [line.strip() for line in text.splitlines() if line and not line[0].isspace()]
    line = "; ".join(lines)
    line = re.sub(r"\b(FATAL|ERROR):\s+", r"\1: ", line)
    return line or type(exc).__name__
