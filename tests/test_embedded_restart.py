"""A test server restarted on its data starts though a directory above it was closed to
others meanwhile: run as root, the server runs as an unprivileged user that must pass through
every directory above its data, and a pytest session starting takes its temporary root back to
0700 (a second session on the machine, while a test's server was down, failed its restart with
"Permission denied")."""

from __future__ import annotations

import os
from pathlib import Path

import psycopg
import pytest

from outbox.demo.embedded import EmbeddedPostgres


@pytest.mark.skipif(os.geteuid() != 0, reason="the server runs as another user only under root")
def test_a_server_restarts_after_a_directory_above_its_data_was_closed(tmp_path: Path) -> None:
    server = EmbeddedPostgres(tmp_path / "closed" / "pg").start()
    try:
        (tmp_path / "closed").chmod(0o700)
        server.stop(mode="immediate", remove=False)
        server.start()
        with psycopg.connect(server.dsn()) as conn:
            assert conn.execute("SELECT 1").fetchone() == (1,)
    finally:
        server.stop()
