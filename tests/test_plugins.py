"""Third-party publishers: found by entry point or dotted path, with their own options."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from helpers import seed, wait_until
from workers import stop_worker

PLUGIN = textwrap.dedent(
    '''
    """A plugin publisher that appends each message id to a file."""
    from pathlib import Path
    from typing import Any

    from outbox.worker.plugin import Option


    class FilePublisher:
        name = "file"
        options = (Option("--file-path", "where ids are appended", required=True),)

        def __init__(self, path: str) -> None:
            self.path = Path(path)

        @classmethod
        def create(cls, values: dict[str, Any], context: Any) -> "FilePublisher":
            return cls(values["file_path"])

        async def start(self) -> None: ...

        async def close(self) -> None: ...

        async def publish(self, message: Any) -> None:
            with self.path.open("a") as out:
                out.write(f"{message.id}\\n")
    '''
)


@pytest.fixture
def plugin_path(tmp_path: Path) -> Path:
    """A directory that holds the plugin module and, like an installed package, its entry point."""
    (tmp_path / "outbox_file_publisher.py").write_text(PLUGIN)
    dist = tmp_path / "outbox_file_publisher-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: outbox-file-publisher\nVersion: 1.0\n"
    )
    (dist / "entry_points.txt").write_text(
        "[outbox.publishers]\nfile = outbox_file_publisher:FilePublisher\n"
    )
    return tmp_path


def _env(plugin_path: Path) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(plugin_path)}


@pytest.mark.parametrize("name", ["file", "outbox_file_publisher:FilePublisher"])
async def test_a_plugin_publisher_delivers_by_entry_point_or_dotted_path(
    conn, dsn, plugin_path, name, tmp_path
):
    ids = seed(conn, 20)
    out = tmp_path / "published.txt"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "outbox.worker",
            "--dsn",
            dsn,
            "--publisher",
            name,
            "--file-path",
            str(out),
        ],
        env=_env(plugin_path),
        stderr=subprocess.DEVNULL,
    )
    try:
        await wait_until(lambda: out.exists() and len(out.read_text().split()) == 20)
    finally:
        assert stop_worker(proc) == 0
    assert sorted(int(i) for i in out.read_text().split()) == ids


def test_publisher_help_shows_the_plugins_options(plugin_path):
    result = subprocess.run(
        [sys.executable, "-m", "outbox.worker", "--publisher", "file", "--help"],
        env=_env(plugin_path), capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert "file publisher options" in result.stdout and "--file-path" in result.stdout
    assert "--http-url" not in result.stdout  # only the selected publisher's options


def test_plugin_options_are_required_and_named(plugin_path):
    result = subprocess.run(
        [sys.executable, "-m", "outbox.worker", "--publisher", "file"],
        env=_env(plugin_path), capture_output=True, text=True,
    )  # fmt: skip
    assert result.returncode == 2
    assert result.stderr.strip() == (
        "outbox-worker: error: --file-path (or OUTBOX_FILE_PATH) is required with --publisher file"
    )


def test_unknown_publishers_list_what_is_installed(plugin_path):
    result = subprocess.run(
        [sys.executable, "-m", "outbox.worker", "--publisher", "carrier-pigeon"],
        env=_env(plugin_path), capture_output=True, text=True,
    )  # fmt: skip
    assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1
    for known in ("file", "http", "kafka", "nats", "log", "null"):
        assert known in result.stderr
