"""Arguments and variables holding bytes that are no UTF-8 (`$'\\xff'` in a shell): Python
hands them over as lone surrogates, which no query, DSN or connection can carry. Each
command says which setting holds one, on one line, exit 2, quoting nothing of a DSN; none
fails with a traceback as it did (`outbox requeue --error`, `OUTBOX_INBOX_TABLE`, a PG*
variable describing the server, `outbox-worker --owner`)."""

from __future__ import annotations

import os
import subprocess
import sys

UNDECODABLE = b"a\xffb"
PASSWORD = "s3cretPW"


def _run(module: str, *args: str | bytes, env: dict[bytes, bytes] | None = None):
    environ = {k: v for k, v in os.environb.items() if not k.startswith(b"OUTBOX_")}
    environ.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", module, *args],
        capture_output=True,
        env=environ,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )


def _one_line(result: subprocess.CompletedProcess[bytes], code: int) -> str:
    err = result.stderr.decode()
    assert (result.returncode, result.stdout) == (code, b""), err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    return err


def test_requeue_error_text_with_an_undecodable_byte_is_refused(dsn: str):
    result = _run("outbox", "requeue", "--error", UNDECODABLE, "--dry-run", "--dsn", dsn)
    err = _one_line(result, 2)
    assert err == (
        "outbox: error: argument --error: not UTF-8 text (an undecodable byte at character 2); "
        "no error text holds one\n"
    )


def test_an_inbox_table_variable_with_an_undecodable_byte_is_named(dsn: str):
    result = _run(
        "outbox", "inbox", "check", "--dsn", dsn, env={b"OUTBOX_INBOX_TABLE": UNDECODABLE}
    )
    err = _one_line(result, 2)
    assert err == (
        "outbox: error: OUTBOX_INBOX_TABLE: not UTF-8 text (an undecodable byte at character 2)\n"
    )


def test_a_dsn_with_an_undecodable_byte_is_refused_without_quoting_it():
    dsn = f"postgresql://alice:{PASSWORD}@127.0.0.1:1/db".encode() + b"\xff"
    result = _run("outbox", "stats", "--dsn", dsn)
    err = _one_line(result, 2)
    assert err == "outbox: error: --dsn: not UTF-8 text (an undecodable byte at character 43)\n"
    assert PASSWORD not in err


def test_a_pg_variable_with_an_undecodable_byte_is_shown_escaped_when_connecting_fails():
    """libpq takes PGDATABASE's bytes as they are; the line naming the server shows them."""
    result = _run(
        "outbox",
        "stats",
        "--dsn",
        f"host=127.0.0.1 port=1 user=alice password={PASSWORD}",
        env={b"PGDATABASE": UNDECODABLE},
    )
    err = _one_line(result, 1)
    assert err.startswith(
        "outbox: error: cannot connect to 127.0.0.1 port 1 (database a\\xffb, user alice): "
    ), err
    assert PASSWORD not in err


def test_worker_owner_with_an_undecodable_byte_is_refused_before_connecting(dsn: str):
    result = _run("worker", "--owner", UNDECODABLE, "--dsn", dsn)
    err = _one_line(result, 2)
    assert err == (
        "outbox-worker: error: --owner: not UTF-8 text (an undecodable byte at character 2)\n"
    )


def test_an_undecodable_byte_after_a_control_character_is_found_too(dsn: str):
    """The check looks for an undecodable byte itself, not at the first character a line
    must not show raw (an ESC before it hid it, and the connection failed on it)."""
    result = _run("worker", "--owner", b"w\x1b" + UNDECODABLE, "--dsn", dsn)
    err = _one_line(result, 2)
    assert err == (
        "outbox-worker: error: --owner: not UTF-8 text (an undecodable byte at character 4)\n"
    )
