"""The worker's start-up line says what goes on the wire and what else is on: the format,
whether requests are signed (how many secrets, never one of them), and whether publish spans
are made and where they go (credentials masked). Real worker processes."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from workers import stop_worker


def _secret(seed: int) -> str:
    return "whsec_" + base64.b64encode(bytes(range(seed, seed + 32))).decode()


def _start_line(dsn: str, args: list[str], env: dict[str, str], log: Path) -> dict[str, Any]:
    """The worker's `dispatching` line, read as the worker writes it, then the worker stopped."""
    base = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "OUTBOX_"))}
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "outbox.worker", "--log-format", "json", "--metrics-port",
             "0", *args],
            env={**base, "OUTBOX_DSN": dsn, **env},
            stdout=out,
            stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while True:
            lines = [json.loads(line) for line in log.read_text().splitlines() if line]
            started = [e for e in lines if "dispatching" in e["message"]]
            if started:
                return started[0]
            assert proc.poll() is None, log.read_text()
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.05)
    finally:
        assert stop_worker(proc, timeout=30) == 0, log.read_text()


def test_the_start_line_shows_the_format_signing_and_traces_never_a_secret(dsn, tmp_path):
    first, second = _secret(1), _secret(40)
    log = tmp_path / "worker.log"
    line = _start_line(
        dsn,
        ["--publisher", "http", "--http-url", "http://127.0.0.1:9/in",
         "--http-signing-secret", first, "--http-signing-secret", second,
         "--format", "cloudevents-binary", "--otel-parent", "parent"],
        {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector-user:collector-pw@127.0.0.1:9/otlp"},
        log,
    )  # fmt: skip
    message = line["message"]
    assert "format cloudevents-binary" in message
    assert "signed with 2 secrets" in message
    assert "traces otlp to http://***@127.0.0.1:9/otlp (parent)" in message
    text = log.read_text()
    for secret in (first, second, first.removeprefix("whsec_"), "collector-pw", "collector-user"):
        assert secret not in text


def test_the_start_line_says_so_when_nothing_is_on(dsn, tmp_path):
    line = _start_line(dsn, ["--publisher", "null"], {}, tmp_path / "worker.log")
    message = line["message"]
    assert "format envelope" in message
    assert "signed" not in message
    assert "no traces" in message
