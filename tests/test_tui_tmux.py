"""The real `outbox-tui` console script in a real terminal: tmux runs it, send-keys types,
capture-pane reads the screen."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import seed, statuses

SOCKET = f"outbox-tui-test-{os.getpid()}"  # a private tmux server: no one else's sessions


def _tmux_available() -> str | None:
    """tmux's path, installing Debian's package when missing and allowed to."""
    if shutil.which("tmux"):
        return shutil.which("tmux")
    if os.geteuid() == 0 and shutil.which("apt-get"):
        for command in (["apt-get", "update", "-qq"], ["apt-get", "install", "-y", "-qq", "tmux"]):
            subprocess.run(command, capture_output=True, timeout=300, check=False)
    return shutil.which("tmux")


@pytest.fixture(scope="module")
def tmux() -> Iterator[list[str]]:
    path = _tmux_available()
    if path is None:
        pytest.skip("tmux is not installed and could not be installed with apt-get (not root?)")
    command = [path, "-L", SOCKET, "-f", "/dev/null"]
    yield command
    subprocess.run([*command, "kill-server"], capture_output=True, check=False)


def _screen(tmux: list[str]) -> str:
    result = subprocess.run(
        [*tmux, "capture-pane", "-p", "-t", "tui"], capture_output=True, text=True, check=False
    )
    return result.stdout


def _wait_for(tmux: list[str], pattern: str, timeout: float = 30) -> str:
    deadline = time.monotonic() + timeout
    while True:
        screen = _screen(tmux)
        if re.search(pattern, screen):
            return screen
        if time.monotonic() > deadline:
            raise AssertionError(f"{pattern!r} never appeared; the screen:\n{screen}")
        time.sleep(0.2)


def test_the_real_binary_in_tmux(tmux, dsn, conn):
    ids = seed(conn, 7)
    conn.execute("UPDATE outbox SET status = 'dead', attempts = 12, "
                 "last_error = 'HTTP 422: rejected' WHERE id = ANY(%s)", (ids[:3],))  # fmt: skip
    binary = Path(sys.executable).parent / "outbox-tui"
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("OUTBOX_", "PG"))},
        "OUTBOX_DSN": dsn,
        "TERM": "xterm-256color",
    }
    subprocess.run(
        [*tmux, "new-session", "-d", "-s", "tui", "-x", "100", "-y", "30",
         f"{binary} --refresh 300ms"],
        env=env, check=True, timeout=30,
    )  # fmt: skip
    try:
        screen = _wait_for(tmux, r"● connected")
        assert re.search(r"pending\s+4\b", screen), screen
        assert re.search(r"dead\s+3\b", screen), screen
        assert "outbox-tui" in screen.splitlines()[0]

        subprocess.run([*tmux, "send-keys", "-t", "tui", "d"], check=True)
        screen = _wait_for(tmux, r"dead letters 3")
        for message_id in ids[:3]:
            assert re.search(rf"\b{message_id}\b.*HTTP 422: rejected", screen), screen

        # Requeue the highlighted (newest) one: r, then y in the dialog.
        subprocess.run([*tmux, "send-keys", "-t", "tui", "r"], check=True)
        _wait_for(tmux, r"Requeue 1 dead message\?")
        subprocess.run([*tmux, "send-keys", "-t", "tui", "y"], check=True)
        _wait_for(tmux, r"dead letters 2")
        assert statuses(conn) == {"pending": 5, "dead": 2}

        subprocess.run([*tmux, "send-keys", "-t", "tui", "q"], check=True)
        deadline = time.monotonic() + 15
        while (
            subprocess.run([*tmux, "has-session", "-t", "tui"], capture_output=True).returncode == 0
        ):
            assert time.monotonic() < deadline, "outbox-tui did not quit on q"
            time.sleep(0.2)
    finally:
        subprocess.run([*tmux, "kill-session", "-t", "tui"], capture_output=True, check=False)
