"""Which database errors pass by themselves and which need a person: one classification for
every component (the worker's claimer, lease keeper, listener and finalizer, the TUI, the operator).

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
- `invalid_setting(exc)`: a connection setting libpq (or psycopg) refuses before trying any
  server (`sslmode=bogus`, `port=abc`, `PGCONNECT_TIMEOUT=abc`): a usage error, named by its
  parameter. Such a failure is permanent.
- `describe(exc)`: the error as one line that keeps the reason (libpq's message spans
  several lines, hints included, and may list one failure per host).

libpq reports a failed connection without an SQLSTATE, so connection failures are told apart
by libpq's and the server's own words (English: a server whose `lc_messages` is another
language is seen as transient, which is the old, safe behaviour: retried with a warning).
"""

from __future__ import annotations

import re

import psycopg

from outbox.plumbing.dsn import KEYWORDS

# A table that is not there: its name is unknown, or so is its schema (a name like
# `app.events` read through `::regclass` before the schema was made says the latter).
MISSING_TABLE = (psycopg.errors.UndefinedTable, psycopg.errors.InvalidSchemaName)

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


# How libpq and psycopg refuse a connection setting before trying any server, with the
# parameter at fault. Their words go on to quote the value, which is never passed on: after
# `sslmode= password=x` libpq reads `password=x` as the sslmode. Line by line, to its end:
# libpq names the option after the quoted value, which may hold `for connection option "`.
_INVALID_VALUE = re.compile(
    "|".join(
        [
            r'invalid "?(\w+)"? value: "',  # invalid sslmode value: "x"
            r'invalid integer value ".*" for connection option "(\w+)"$',
            r'invalid (port) number: "',
            r"(?:negative )?(require_auth) method \"",  # mixed, or given twice
            r"^bad value for (\w+): ",  # psycopg's own check of connect_timeout
        ]
    ),
    re.MULTILINE,
)
# Settings that cannot go together, in libpq's words, which quote no value of the DSN but
# numbers and words libpq has already accepted.
_INVALID_COMBINATION = re.compile(
    r"could not match \d+ [a-z ]+ (?:to|with) \d+ [a-z ]+"
    r'|weak sslmode "[a-z-]+" may not be used with \w+=\w+ \(use [a-z", -]+\)'
    r"|invalid SSL protocol version range"
)


def invalid_setting(exc: BaseException) -> str | None:
    """What libpq or psycopg refused among the connection settings before trying any server
    (the DSN's, or a PG* variable's): `invalid value for connection parameter sslmode`,
    naming no value; None for any other error."""
    if not isinstance(exc, psycopg.OperationalError | psycopg.ProgrammingError):
        return None
    if exc.sqlstate is not None:
        return None  # the server's answer to a statement
    text = str(exc)
    match = _INVALID_VALUE.search(text)
    if match:
        name = next(group for group in match.groups() if group is not None)
        # Only a keyword libpq knows is named: never a piece of a value that looks like one.
        return f"invalid value for connection parameter {name if name in KEYWORDS else '?'}"
    combination = _INVALID_COMBINATION.search(text)
    return combination[0] if combination else None


def is_permanent_connection_failure(exc: BaseException) -> bool:
    """A connection refused for a reason that waiting will not fix (see the module doc)."""
    if invalid_setting(exc) is not None:
        return True
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
    FATAL: role "x" does not exist`, one clause per host tried, libpq's hints left out; a
    setting libpq refuses by its parameter only (invalid_setting)."""
    refused = invalid_setting(exc)
    if refused is not None:
        return refused
    text = str(exc).strip()
    for prefix in ("connection failed: ", "connection is bad: "):
        text = text.removeprefix(prefix)
    lines = [line.strip() for line in text.splitlines() if line and not line[0].isspace()]
    line = "; ".join(lines)
    line = re.sub(r"\b(FATAL|ERROR):\s+", r"\1: ", line)
    return line or type(exc).__name__
