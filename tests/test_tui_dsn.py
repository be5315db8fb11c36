"""outbox-tui's connection settings: what can never work ends it at once with one line
naming the parameter, never its value, as `outbox` and `outbox-worker` do."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from outbox.tui.config import parse_args


@pytest.mark.parametrize(
    ("dsn", "named"),
    [
        # libpq ends a URL's authority at its first /: the title showed the password as port.
        ("postgresql://u:s3cret/pw@127.0.0.1:1/db", "--dsn"),
        ("host=127.0.0.1 connect_timeout=s3cret", "connect_timeout"),
        ("host=127.0.0.1 port= password=s3cret", "parameter 2"),
    ],
)
def test_a_dsn_that_can_never_work_is_a_usage_error(dsn, named, capsys):
    with pytest.raises(SystemExit) as exit_info:
        parse_args(["--dsn", dsn])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and err.startswith("outbox-tui: error: --dsn: ")
    assert named in err and "s3cret" not in err


@pytest.mark.parametrize(
    ("dsn", "env", "named"),
    [
        ("host=127.0.0.1 port=1 sslmode=s3cret", {}, "sslmode"),
        ("host=127.0.0.1 port=1 require_auth=s3cret", {}, "require_auth"),
        ("host=127.0.0.1 port=abc password=s3cret", {}, "port"),
        ("host=127.0.0.1 port=1", {"PGSSLMODE": "s3cret"}, "sslmode"),
    ],
)
def test_a_setting_libpq_refuses_when_connecting_ends_the_real_tui(dsn, env, named):
    """libpq checks these only when connecting: the app showed its words (which quote the
    value) in the status line and polled for ever."""
    base = {k: v for k, v in os.environ.items() if not k.startswith(("OUTBOX_", "PG"))}
    result = subprocess.run(
        [sys.executable, "-m", "outbox.tui", "--dsn", dsn], stdin=subprocess.DEVNULL,
        capture_output=True, text=True, timeout=30, env={**base, **env},
    )  # fmt: skip
    assert result.returncode == 2, result
    # Before the line, the terminal's set-up, maybe a first frame, and its restoring; the
    # error is the last line, one line.
    line = result.stderr[result.stderr.index("outbox-tui: error: ") :]
    assert line.count("\n") == 1 and line.endswith("\n")
    assert line.startswith(f"outbox-tui: error: invalid value for connection parameter {named} ")
    assert "s3cret" not in result.stdout + result.stderr
