"""Chaos fixtures: the scale, a scenario runner, and the report printed after the session.

OUTBOX_CHAOS_SCALE=1 (the default, what `make test` runs) keeps every scenario to a few
seconds; `make chaos` runs a larger scale: more messages, more faults, longer outages.
"""

from __future__ import annotations

import os
import pickle
import random
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from chaos.cluster import Run
from chaos.report import ScenarioReport, table

_REPORTS = pytest.StashKey[list[ScenarioReport]]()


@pytest.fixture(scope="session")
def scale() -> int:
    value = int(os.environ.get("OUTBOX_CHAOS_SCALE", "1"))
    assert value >= 1, "OUTBOX_CHAOS_SCALE must be at least 1"
    return value


@pytest.fixture
def rng() -> random.Random:
    """Where random faults strike; OUTBOX_CHAOS_SEED=N replays a run's choices."""
    seed = int(os.environ.get("OUTBOX_CHAOS_SEED") or random.randrange(2**32))
    print(f"chaos seed: {seed} (OUTBOX_CHAOS_SEED={seed} replays it)")
    return random.Random(seed)


@pytest.fixture
def new_run(
    request: pytest.FixtureRequest, tmp_path: Path, admin_dsn: str
) -> Iterator[Callable[..., Run]]:
    """Make scenario runs; each is torn down (workers, sink, producer) even when the test
    fails, and its checked numbers go to the session report. Each run's sink applies what it
    receives in a fresh database on the session's server (never the one a scenario faults)."""
    runs: list[Run] = []
    databases: list[str] = []
    reports = request.config.stash.setdefault(_REPORTS, [])

    def make(name: str, dsn: str, **options: Any) -> Run:
        database = f"outbox_receiver_{uuid.uuid4().hex[:12]}"
        with psycopg.connect(admin_dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(database)))
        databases.append(database)
        receiver_dsn = make_conninfo("", **{**conninfo_to_dict(admin_dsn), "dbname": database})
        run = Run(
            name, dsn, tmp_path / name, on_report=reports.append, receiver_dsn=receiver_dsn,
            **options,
        )  # fmt: skip
        runs.append(run)
        return run

    yield make
    for run in runs:
        run.close()
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        for database in databases:
            drop = sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)")
            conn.execute(drop.format(sql.Identifier(database)))


def pytest_sessionfinish(session: pytest.Session) -> None:
    """Under pytest-xdist, a worker hands its reports to the controller, which prints them."""
    output = getattr(session.config, "workeroutput", None)
    if output is not None:
        output["chaos_reports"] = pickle.dumps(session.config.stash.get(_REPORTS, []))


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: object) -> None:
    data = getattr(node, "workeroutput", {}).get("chaos_reports")
    if data:
        node.config.stash.setdefault(_REPORTS, []).extend(pickle.loads(data))


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    reports = terminalreporter.config.stash.get(_REPORTS, [])
    if not reports:
        return
    scale = os.environ.get("OUTBOX_CHAOS_SCALE", "1")
    terminalreporter.section(f"chaos report (OUTBOX_CHAOS_SCALE={scale})")
    for line in table(reports):
        terminalreporter.write_line(line)
