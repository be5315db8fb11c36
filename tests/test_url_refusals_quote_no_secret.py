"""A publisher URL refused: the error never quotes a value that may be a secret.

A token pasted into `--http-url` or `--nats-url` (no `scheme://`, no `@`) is no URL, and may
be the very credential meant for another flag: the refusal describes it and does not quote
it. A value with a `scheme://` or an `@` is quoted redacted, its user-info masked.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

TOKEN = "s3cr3t-Tok3n-value"
# Never contacted: each refusal comes before the worker connects.
DSN = "postgresql://nobody@127.0.0.1:1/nothing"


def _refusal(*flags: str) -> str:
    result = subprocess.run(
        [sys.executable, "-m", "outbox.worker", "--dsn", DSN, *flags],
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    return lines[0]


@pytest.mark.parametrize(
    ("flags", "says"),
    [
        (("--publisher", "http", "--http-url", TOKEN), "is not an http:// or https:// URL"),
        (("--publisher", "nats", "--nats-url", TOKEN), "needs one of nats://"),
    ],
)
def test_a_token_given_as_the_url_is_not_quoted(flags: tuple[str, ...], says: str):
    line = _refusal(*flags)
    assert TOKEN not in line
    assert "not shown" in line and says in line


@pytest.mark.parametrize(
    ("flags", "shown"),
    [
        (
            ("--publisher", "http", "--http-url", f"ftp://alice:{TOKEN}@host/x"),
            "'ftp://***@host/x'",
        ),
        (("--publisher", "nats", "--nats-url", f"ftp://{TOKEN}@host"), "'ftp://***@host'"),
        (("--publisher", "http", "--http-url", f"alice:{TOKEN}@host/x"), "'***@host/x'"),
    ],
)
def test_a_url_shaped_value_is_quoted_with_its_user_info_masked(flags: tuple[str, ...], shown: str):
    line = _refusal(*flags)
    assert TOKEN not in line
    assert shown in line
