"""Ctrl-C in the `outbox` command: a real SIGINT to a real subprocess while its statement
waits on a lock the test holds. One line on stderr saying what is left, exit code 130, the
statement cancelled on the server (not left waiting to run once the lock is free), and
nothing changed beyond what the command had committed."""

from __future__ import annotations

import array
import fcntl
import signal
import subprocess
import sys
import termios
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest
from helpers import interruptible, seed, wait_until_db
from psycopg.conninfo import make_conninfo
from test_cli import BASE_ENV

from outbox import inbox
from outbox.cli import _LEFT_BY_AN_INTERRUPT, INTERRUPTED, _parser

APP = "interrupted-by-the-test"
# The test's own database only: a server serves other tests' databases, and a backend of
# theirs (a client killed while its statement waited) must not pass for this command's.
WAITING = (
    "EXISTS (SELECT FROM pg_stat_activity WHERE datname = current_database()"
    f" AND application_name = '{APP}' AND wait_event_type = 'Lock')"
)
MIGRATE_LOCK = "SELECT pg_advisory_xact_lock(hashtextextended('outbox-dispatcher migrate', 0))"
GONE = (
    "NOT EXISTS (SELECT FROM pg_stat_activity WHERE datname = current_database()"
    f" AND application_name = '{APP}')"
)


def _interrupted_while_waiting(
    dsn: str, conn: Any, hold: Callable[[Any], None], *args: str
) -> tuple[int, str, str]:
    """Run `outbox <args>`, SIGINT it once its statement waits on what `hold` takes in a
    transaction of the test's, and see its backend go before that transaction ends: (exit
    code, stdout, stderr)."""
    with psycopg.connect(dsn) as holder:
        hold(holder)
        command = subprocess.Popen(
            [sys.executable, "-m", "outbox", *args, "--lock-timeout", "0",
             "--dsn", make_conninfo(dsn, application_name=APP)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=BASE_ENV,
            preexec_fn=interruptible,
        )  # fmt: skip
        try:
            while not conn.execute(f"SELECT {WAITING}").fetchone()[0]:
                assert command.poll() is None, command.communicate()  # ended without waiting
                time.sleep(0.02)
            command.send_signal(signal.SIGINT)
            stdout, stderr = command.communicate(timeout=60)
            # Still holding: a statement left waiting would still be there, to run later.
            wait_until_db(conn, GONE)
        finally:
            command.kill()
        holder.rollback()
    return command.returncode, stdout, stderr


def _one_line(stderr: str) -> str:
    assert "Traceback" not in stderr, stderr
    assert stderr.count("\n") == 1 and stderr.endswith("\n"), stderr
    return stderr.strip()


def _done(conn: Any, count: int) -> list[int]:
    ids = seed(conn, count)
    conn.execute("UPDATE outbox SET status = 'done', done_at = now() - interval '30 days'")
    return ids


def test_a_purge_stopped_mid_way_keeps_its_committed_batches_and_no_half_batch(dsn, conn):
    """The batches are transactions of their own: those before the stop stay deleted, the
    one waiting on a locked row is rolled back whole (its other rows stay)."""
    ids = _done(conn, 10)

    def lock_the_eighth(holder: Any) -> None:
        holder.execute("SELECT FROM outbox WHERE id = %s FOR UPDATE", (ids[7],))

    code, _, stderr = _interrupted_while_waiting(
        dsn, conn, lock_the_eighth, "purge", "--older-than", "1d", "--batch", "5"
    )
    assert code == INTERRUPTED
    line = _one_line(stderr)
    assert line == f"outbox purge: interrupted; {_LEFT_BY_AN_INTERRUPT['purge']}"
    left = [row[0] for row in conn.execute("SELECT id FROM outbox ORDER BY id").fetchall()]
    assert left == ids[5:], "the first batch stays deleted, the second is whole"


@pytest.mark.parametrize(
    "command, hold",
    [
        (["migrate"], MIGRATE_LOCK),
        (["requeue", "--all-dead"], "LOCK TABLE outbox IN ACCESS EXCLUSIVE MODE"),
        (["stats"], "LOCK TABLE outbox IN ACCESS EXCLUSIVE MODE"),
        (["replay", "--status", "dead", "--since", "1h", "--until", "0s", "--yes"],
         "LOCK TABLE outbox IN ACCESS EXCLUSIVE MODE"),
        (["inbox", "purge", "--older-than", "0s"],
         "LOCK TABLE outbox_inbox IN ACCESS EXCLUSIVE MODE"),
    ],
    ids=["migrate", "requeue", "stats", "replay", "inbox-purge"],
)  # fmt: skip
def test_every_kind_of_command_ends_in_one_line_and_130(dsn, conn, command, hold):
    seed(conn, 3)
    conn.execute("UPDATE outbox SET status = 'dead'")
    inbox.migrate(conn)
    before = conn.execute("SELECT id, status, attempts FROM outbox ORDER BY id").fetchall()

    code, stdout, stderr = _interrupted_while_waiting(
        dsn, conn, lambda holder: holder.execute(hold), *command
    )
    assert code == INTERRUPTED, stderr
    name = " ".join(command[:2] if command[0] == "inbox" else command[:1])
    assert _one_line(stderr) == f"outbox {name}: interrupted; {_LEFT_BY_AN_INTERRUPT[name]}"
    assert stdout == ""
    assert conn.execute("SELECT id, status, attempts FROM outbox ORDER BY id").fetchall() == before


def test_every_command_has_its_line():
    """A command without its own words would still end in one line; each says its own."""
    commands = _parser()._subparsers._group_actions[0].choices  # type: ignore[union-attr]
    names = {f"inbox {sub}" for sub in ("migrate", "purge", "check")}
    names |= {name for name in commands if name != "inbox"}
    assert names == set(_LEFT_BY_AN_INTERRUPT)


# The command's stderr pipe, in bytes: two pages, some 80 lines of `python -v`, where the
# command's own modules write some 800 once the first module of `outbox` is done. Not one
# page: the lines read up to that module may have used most of it, and a pipe of one page
# takes no more than the rest of that page: the command then waited with a few lines in
# the pipe, never the half the test waited for (a timeout now and then).
_PIPE = 8192


_SCRIPTS = Path(sys.executable).parent


@pytest.mark.parametrize(
    ("prog", "start"),
    [
        ("outbox", ["-m", "outbox", "stats"]),
        ("outbox", [str(_SCRIPTS / "outbox"), "stats"]),
        ("outbox-worker", [str(_SCRIPTS / "outbox-worker"), "--publisher", "null"]),
        ("outbox-worker", ["-m", "outbox.worker", "--publisher", "null"]),
    ],
    ids=["-m outbox", "the installed script", "outbox-worker", "-m outbox.worker"],
)
def test_a_ctrl_c_while_the_command_is_importing_ends_it_in_one_line(dsn, prog, start):
    """Ctrl-C before the command has loaded (its imports take a few hundred milliseconds):
    one line, exit 130, as once it runs, where Python printed a KeyboardInterrupt traceback
    (the worker's, or one of the error an import cut short raised, its cause the Ctrl-C).
    `python -v` writes lines as it imports each module, to a pipe the test reads up to the
    first module of `outbox` done and then leaves: once it is full, the command waits in the
    middle of its imports, and gets the signal there."""
    command = subprocess.Popen(
        [sys.executable, "-v", *start, "--dsn", dsn],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, bufsize=0, env=BASE_ENV,
        preexec_fn=interruptible,
    )  # fmt: skip
    assert command.stderr is not None
    fcntl.fcntl(command.stderr.fileno(), fcntl.F_SETPIPE_SZ, _PIPE)
    while not (line := command.stderr.readline()).startswith(b"import 'outbox"):
        assert line, command.communicate()  # one byte at a time: nothing is read ahead
    # The command blocked on its next line: a line is written whole or not at all, so the
    # pipe's last page is all but full when its writer waits, whatever was read of the first.
    waiting = array.array("i", [0])
    while waiting[0] < _PIPE // 4:
        assert command.poll() is None, command.communicate()
        fcntl.ioctl(command.stderr.fileno(), termios.FIONREAD, waiting)
        time.sleep(0.01)
    command.send_signal(signal.SIGINT)
    stdout, err = command.communicate(timeout=60)
    rest = err.decode()
    if prog == "outbox":
        assert "import 'outbox.cli'" not in rest  # stopped before it was loaded
    # The line may follow a line of `-v` the signal cut short (its write interrupted).
    assert (command.returncode, stdout) == (INTERRUPTED, b""), rest[-2000:]
    assert rest.count(f"{prog}: interrupted; nothing was started\n") == 1, rest[-2000:]
    assert "Traceback" not in rest and "KeyboardInterrupt" not in rest, rest[-2000:]


def test_the_package_loads_its_api_and_submodules_when_first_asked_for():
    """`import outbox` loads nothing (so the command's entry point runs before its imports),
    and what it gave at once before is there when asked for: the producer API's names, and
    its submodules as attributes (`outbox.schema` came along with the names' homes)."""
    code = (
        "import sys, outbox\n"
        "assert 'psycopg' not in sys.modules, 'import outbox loaded psycopg'\n"
        "from outbox import Event, Table, enqueue, migrate\n"
        "assert outbox.schema.SCHEMA_VERSION >= 7 and outbox.table.Table is Table\n"
        "try:\n"
        "    outbox.no_such_name\n"
        "except AttributeError as exc:\n"
        "    print(exc)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "module 'outbox' has no attribute 'no_such_name'\n"


def test_a_command_started_with_ctrl_c_ignored_keeps_it_ignored():
    """Started in the background of a script, a command inherits SIGINT ignored: a Ctrl-C
    meant for the script must not stop it. The guard around the command's import put
    Python's handler in place after it, whatever was there."""
    code = (
        "import signal\n"
        "from outbox import entry\n"
        "entry._started('outbox', lambda: lambda: print("
        "signal.getsignal(signal.SIGINT) is signal.SIG_IGN))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=BASE_ENV,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
    )  # fmt: skip
    assert (result.returncode, result.stdout) == (0, "True\n"), result.stderr
