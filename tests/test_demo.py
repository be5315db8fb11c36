"""The demo and the log publisher, run as a user would run them."""

from __future__ import annotations

import json
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import interruptible, seed, wait_until
from workers import stop_worker

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]  # whole demos, a loaded machine


def test_demo_delivers_everything_and_explains_every_duplicate():
    result = subprocess.run(
        [sys.executable, "-m", "outbox", "demo", "--events", "400", "--workers", "3"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    out = result.stdout
    assert result.returncode == 0, out + result.stderr
    assert re.search(r"events committed\s+400\b", out)
    assert re.search(r"lost\s+0\b", out)
    assert re.search(r"unexpected ids at the API\s+0\b", out)
    assert "unexplained: 0" in out
    delivered = int(re.search(r"delivered \(unique ids, 2xx\)\s+(\d+)", out).group(1))
    dead = int(re.search(r"^\s+dead\s+(\d+)", out, re.MULTILINE).group(1))
    assert delivered + dead == 400 and dead >= 1  # the 422 event type goes dead
    assert "demo-worker-1: SIGKILL" in out
    # The receiving end: one effect per event delivered, every duplicate absorbed by the inbox.
    duplicates = int(re.search(r"duplicates\s+(\d+) \(unexplained", out).group(1))
    assert int(re.search(r"effects applied\s+(\d+)", out).group(1)) == delivered
    assert int(re.search(r"duplicate deliveries absorbed\s+(\d+)", out).group(1)) == duplicates
    report = out[out.index("Report (") : out.index("Result:")]
    assert report.rstrip().splitlines()[-1].split() == ["double", "effects", "0"]
    assert "Result: OK" in out


async def test_log_publisher_writes_one_json_line_per_message(conn, dsn):
    ids = seed(conn, 5)
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "outbox.worker",
            "--dsn",
            dsn,
            "--publisher",
            "log",
            "--log-format",
            "json",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    try:
        await wait_until(
            lambda: (
                conn.execute("SELECT count(*) FROM outbox WHERE status = 'done'").fetchone()[0] == 5
            )
        )
    finally:
        assert stop_worker(proc, signal.SIGTERM) == 0
    lines = [json.loads(line) for line in proc.stdout.read().decode().splitlines()]
    assert [line["id"] for line in lines] == ids
    assert lines[0]["payload"] == {"n": 0, "text": "x" * 20}
    assert {"aggregate_type", "aggregate_id", "event_type", "created_at"} <= set(lines[0])


def test_demo_keep_leaves_a_database_to_connect_to():
    import os

    import psycopg

    result = subprocess.run(
        [sys.executable, "-m", "outbox", "demo", "--events", "120", "--workers", "2", "--keep"],
        capture_output=True,
        text=True,
        timeout=300,
        preexec_fn=interruptible,  # the Ctrl-C its printed instructions give must reach it
    )
    assert result.returncode == 0, result.stdout + result.stderr
    pid = int(re.search(r"keeps running \(pid (\d+)\)", result.stdout).group(1))
    dsn = re.search(r"connect:\s+psql '([^']+)'", result.stdout).group(1)
    api_dsn = re.search(r"effects:\s+psql '([^']+)'", result.stdout).group(1)
    try:
        with psycopg.connect(dsn) as conn:
            counts = dict(conn.execute("SELECT status, count(*) FROM outbox GROUP BY 1").fetchall())
        assert sum(counts.values()) == 120 and set(counts) <= {"done", "dead"}
        # The API's own database: one effect and one inbox id per message done.
        with psycopg.connect(api_dsn) as conn:
            effects, distinct = conn.execute(
                "SELECT count(*), count(DISTINCT message_id) FROM effects"
            ).fetchone()
            ids = conn.execute("SELECT count(*) FROM outbox_inbox").fetchone()[0]
        assert effects == distinct == ids == counts["done"]
    finally:
        os.kill(pid, signal.SIGINT)  # as the printed instructions say
        data_dir = re.search(r"data in (\S+)", result.stdout).group(1)
        deadline = time.monotonic() + 30
        while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
            time.sleep(0.05)  # a server we did not start: nothing to wait() on
        shutil.rmtree(data_dir, ignore_errors=True)


def _processes_naming(text: str) -> list[int]:
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if text.encode() in cmdline.read_bytes():
                found.append(int(cmdline.parent.name))
        except OSError:
            pass  # gone meanwhile
    return found


def test_demo_stopped_by_sigterm_stops_postgres_and_its_workers():
    import os

    import psycopg

    demo = subprocess.Popen(
        [sys.executable, "-m", "outbox", "demo", "--events", "50000", "--workers", "2"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )  # fmt: skip
    try:
        assert demo.stdout is not None
        lines = iter(demo.stdout.readline, "")
        dsn = next(m.group(1) for line in lines if (m := re.search(r"embedded\) at (\S+)", line)))
        # Running: the workers are delivering (the progress line is printed).
        next(line for line in lines if "(done " in line)
        assert _processes_naming(dsn), "the workers run with the demo's DSN"
        demo.send_signal(signal.SIGTERM)
        assert demo.wait(timeout=60) == 128 + signal.SIGTERM
    finally:
        if demo.poll() is None:
            demo.kill()
            demo.wait()
    with pytest.raises(psycopg.OperationalError):
        psycopg.connect(dsn, connect_timeout=5).close()
    assert _processes_naming(dsn) == []  # no worker left behind


def test_operator_demo_scales_for_the_burst_and_back_losing_nothing():
    """`make demo`'s second part, as it runs it (its outcome against the emulator and the
    table is asserted in k8s/test_demo_story.py)."""
    import os

    if not os.access("/usr/bin/kubectl", os.X_OK):
        pytest.skip("kubectl is not installed at /usr/bin/kubectl (Debian package kubectl)")
    tests = Path(__file__).parent
    result = subprocess.run(
        [sys.executable, "-m", "k8s.demo", "--burst-seconds", "12"],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(tests)},
        cwd=tests.parent,
    )
    out = result.stdout
    assert result.returncode == 0, out + result.stderr
    assert re.search(r"NAME\s+READY\s+DESIRED\s+BACKLOG\s+OLDEST-READY", out), out
    workers = re.search(r"workers\s+(\d+) -> (\d+) -> (\d+)", out)
    assert workers and int(workers[2]) > int(workers[1]) == int(workers[3]), out
    assert re.search(r"ScaledUp .* 1 -> \d+ workers: ", out), out
    assert re.search(r"^\s+lost\s+0$", out, re.MULTILINE), out
    assert "Result: OK" in out
