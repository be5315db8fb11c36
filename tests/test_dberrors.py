"""One classification of database errors, checked on errors a real server and libpq raise."""

from __future__ import annotations

import uuid

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import make_conninfo

from outbox.demo.embedded import free_port
from outbox.plumbing.dberrors import (
    describe,
    invalid_setting,
    is_permanent_connection_failure,
    is_transient,
)


def _connect_error(dsn: str, **change: str) -> psycopg.Error:
    with pytest.raises(psycopg.OperationalError) as info:
        psycopg.connect(make_conninfo(dsn, **change), connect_timeout=5)
    return info.value


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"user": "no_such_role"}, 'FATAL: role "no_such_role" does not exist'),
        ({"dbname": "no_such_db"}, 'FATAL: database "no_such_db" does not exist'),
    ],
)
def test_a_connection_refused_for_good_is_permanent(dsn, change, reason):
    exc = _connect_error(dsn, **change)
    assert is_permanent_connection_failure(exc)
    assert not is_transient(exc)
    assert describe(exc).endswith(reason) and "\n" not in describe(exc)


@pytest.mark.parametrize(
    "change",
    [
        {"sslmode": "s3cret"},
        {"require_auth": "s3cret"},
        {"require_auth": "!password,md5"},  # methods libpq knows, mixed as it refuses
        {"port": "s3cret"},
        {"keepalives": "s3cret"},
        {"target_session_attrs": "s3cret"},
    ],
)
def test_a_connection_setting_libpq_refuses_is_permanent_and_named_without_its_value(dsn, change):
    """Not transient: the worker retried these for ever. libpq's words quote the value, which
    may be a neighbour's (`sslmode= password=x` is the sslmode `password=x`)."""
    exc = _connect_error(dsn, **change)
    [(name, _)] = change.items()
    assert invalid_setting(exc) == f"invalid value for connection parameter {name}"
    assert is_permanent_connection_failure(exc) and not is_transient(exc)
    assert describe(exc) == invalid_setting(exc)


def test_psycopgs_own_check_of_connect_timeout_is_permanent(dsn, monkeypatch):
    monkeypatch.setenv("PGCONNECT_TIMEOUT", "s3cret")
    with pytest.raises(psycopg.ProgrammingError) as info:
        psycopg.connect(dsn)
    assert describe(info.value) == "invalid value for connection parameter connect_timeout"
    assert is_permanent_connection_failure(info.value) and not is_transient(info.value)


def test_a_role_that_may_not_log_in_is_permanent(conn, dsn):
    role = f"nologin_{uuid.uuid4().hex[:8]}"
    conn.execute(sql.SQL("CREATE ROLE {} NOLOGIN").format(sql.Identifier(role)))
    try:
        exc = _connect_error(dsn, user=role)
    finally:
        conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))
    assert is_permanent_connection_failure(exc) and not is_transient(exc)


@pytest.mark.parametrize(
    "change",
    [
        {"port": "closed"},  # refused: the server may be starting
        {"host": "/nonexistent-socket-dir"},  # no socket yet
        {"host": "no-such-host.invalid"},  # a service name that may appear later
    ],
)
def test_a_connection_that_may_heal_is_transient(dsn, change):
    if change.get("port") == "closed":
        change = {"port": str(free_port())}
    exc = _connect_error(dsn, **change)
    assert is_transient(exc) and not is_permanent_connection_failure(exc)
    line = describe(exc)
    assert ("\n" not in line and "failed" in line) or "resolve" in line


def test_a_missing_socket_keeps_its_reason(dsn):
    line = describe(_connect_error(dsn, host="/nonexistent-socket-dir"))
    assert line.startswith('connection to server on socket "/nonexistent-socket-dir/')
    assert line.endswith("failed: No such file or directory")


@pytest.mark.parametrize(
    ("statement", "transient"),
    [
        ("SELECT 1/0", False),  # data error
        ("SELECT no_such_column FROM outbox", False),  # an altered table
        ("SELECT * FROM no_such_table", False),
        ("INSERT INTO outbox (id) VALUES (1)", False),  # a generated identity
        ("SET statement_timeout = '1ms'; SELECT pg_sleep(1)", True),  # query cancelled
        ("SELECT pg_terminate_backend(pg_backend_pid())", True),  # admin shutdown
    ],
)
def test_statement_errors(dsn, statement, transient):
    with psycopg.connect(dsn, autocommit=True) as conn, pytest.raises(psycopg.Error) as info:
        for part in statement.split("; "):
            conn.execute(part)
    assert is_transient(info.value) is transient
    assert not is_permanent_connection_failure(info.value)


def test_a_lock_timeout_and_missing_privileges_are_transient(conn, dsn):
    role = f"noright_{uuid.uuid4().hex[:8]}"
    conn.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(role)))
    try:
        with (
            psycopg.connect(make_conninfo(dsn, user=role), autocommit=True) as other,
            pytest.raises(psycopg.errors.InsufficientPrivilege) as denied,
        ):
            other.execute("SELECT * FROM outbox")
        with conn.transaction():
            conn.execute("LOCK TABLE outbox")
            with psycopg.connect(dsn, autocommit=True) as other:
                other.execute("SET lock_timeout = '50ms'")
                with pytest.raises(psycopg.errors.LockNotAvailable) as locked:
                    other.execute("SELECT count(*) FROM outbox")
    finally:
        conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))
    # A GRANT heals the first while the program runs; the lock holder ends the second.
    assert is_transient(denied.value)
    assert is_transient(locked.value)


def test_errors_of_the_driver_itself():
    assert is_transient(psycopg.OperationalError("the connection is lost"))
    assert is_transient(psycopg.InterfaceError("the connection is closed"))
    assert is_transient(ConnectionResetError())
    assert not is_transient(psycopg.ProgrammingError("query has 2 placeholders but 1 parameter"))
    assert not is_transient(psycopg.DataError("cannot dump"))
    assert not is_transient(ValueError("not a database error"))


@pytest.mark.parametrize(
    ("message", "permanent"),
    [
        # libpq's words for failures this test server (trust authentication) cannot produce.
        ('connection to server at "h", port 5432 failed: FATAL:  password authentication '
         'failed for user "u"', True),
        ('connection to server at "h", port 5432 failed: FATAL:  no pg_hba.conf entry for host '
         '"10.0.0.1", user "u", database "d", no encryption', True),
        ('connection to server at "h", port 5432 failed: fe_sendauth: no password supplied', True),
        ('connection to server at "h", port 5432 failed: server does not support SSL, but SSL '
         "was required", True),
        ('connection to server at "h", port 5432 failed: FATAL:  the database system is '
         "starting up", False),
        ('connection to server at "h", port 5432 failed: FATAL:  sorry, too many clients '
         "already", False),
        ('connection to server at "h", port 5432 failed: FATAL:  the database system is in '
         "recovery mode", False),
        ("connection to server at \"h\", port 5432 failed: timeout expired", False),
    ],
)  # fmt: skip
def test_connection_failures_by_libpqs_words(message, permanent):
    exc = psycopg.OperationalError(f"connection failed: {message}")
    assert is_permanent_connection_failure(exc) is permanent
    assert is_transient(exc) is not permanent
    assert describe(exc) == message.replace("FATAL:  ", "FATAL: ")
