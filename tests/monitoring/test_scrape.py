"""A real Prometheus (Debian's) scrapes a real `outbox-worker`: every metric the alerts and the
dashboard name exists with the labels they join on, every panel query and every alert
expression (thresholds opened) returns a series, and the dead-message alert really fires.

The worker's target carries the labels the chart's PodMonitor gives worker pods
({namespace, dispatcher, pod}), as static labels here.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg
import pytest
import yaml
from helpers import seed, statuses
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from workers import spawn_worker, stop_worker

from monitoring import monitoring as m
from outbox.demo.embedded import free_port
from outbox.demo.sink import Reply, Sink

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(300),
    pytest.mark.skipif(
        shutil.which("prometheus") is None,
        reason="needs prometheus (Debian package prometheus; .ci/run installs it)",
    ),
]

WORKER_LABELS = {"namespace": "shop", "dispatcher": "orders", "pod": "orders-0"}
MESSAGES = 120
REJECTED_EVERY = 10  # every 10th message is refused for good: it goes dead
OPERATOR_SKIP = (
    "the operator's series need the real operator and its API emulator (outbox.controller.cli), "
    "not in this tree yet"
)
OPERATOR_PRESENT = importlib.util.find_spec("outbox.controller.cli") is not None


class Prometheus:
    def __init__(self, url: str) -> None:
        self.url = url

    def get(self, path: str, **params: str) -> Any:
        query = f"?{urllib.parse.urlencode(params)}" if params else ""
        with urllib.request.urlopen(f"{self.url}{path}{query}", timeout=10) as response:
            body = json.load(response)
        assert body["status"] == "success", body
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        data = self.get("/api/v1/query", query=expr)
        assert data["resultType"] == "vector", data
        return list(data["result"])

    def wait_for(self, expr: str, what: str, timeout: float = 90.0) -> list[dict[str, Any]]:
        deadline = time.monotonic() + timeout
        while not (result := self.query(expr)):
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out waiting for {what}: {expr}")
            time.sleep(0.5)
        return result


def rejecting_some(body: dict[str, Any], nth: int) -> Reply:
    return Reply(422) if int(body["id"]) % REJECTED_EVERY == 0 else Reply()


@pytest.fixture(scope="module")
def scraped(
    admin_dsn: str, template: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Prometheus]:
    """A worker that delivered a backlog (some of it dead), lost its database connections once,
    and kept running; Prometheus scraping it every second and evaluating the alert rules."""
    work = tmp_path_factory.mktemp("prometheus")
    with _fresh_database(admin_dsn, template) as dsn:
        yield from _scraping(dsn, work)


def _scraping(dsn: str, work: Path) -> Iterator[Prometheus]:
    metrics_port, web_port = free_port(), free_port()
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(m.RULES)],
        "scrape_configs": [
            {
                "job_name": "outbox-worker",
                "static_configs": [
                    {"targets": [f"127.0.0.1:{metrics_port}"], "labels": WORKER_LABELS}
                ],
            }
        ],
    }
    (work / "prometheus.yml").write_text(yaml.safe_dump(config))
    with Sink(rejecting_some) as sink, psycopg.connect(dsn, autocommit=True) as conn:
        worker = spawn_worker(
            dsn, "--publisher", "http", "--http-url", sink.url, "--metrics-port",
            str(metrics_port), "--poll-interval", "200ms", owner="orders-0",
            log_path=str(work / "worker.log"),
        )  # fmt: skip
        server = subprocess.Popen(
            [
                "prometheus",
                f"--config.file={work / 'prometheus.yml'}",
                f"--storage.tsdb.path={work / 'data'}",
                f"--web.listen-address=127.0.0.1:{web_port}",
            ],
            stdout=subprocess.DEVNULL,
            stderr=(work / "prometheus.log").open("wb"),
        )
        try:
            prometheus = Prometheus(f"http://127.0.0.1:{web_port}")
            _wait_ready(prometheus, server, work)
            # The backlog arrives once the worker is scraped, so that its counters are seen
            # rising (an increase needs a sample from before it).
            prometheus.wait_for('up{job="outbox-worker"} == 1', "the worker scraped")
            seed(conn, MESSAGES, aggregates=12)
            dead = MESSAGES // REJECTED_EVERY
            _wait(lambda: statuses(conn) == {"done": MESSAGES - dead, "dead": dead}, "the drain")
            _break_the_workers_connections(conn)
            prometheus.wait_for("outbox_database_errors_total > 0", "a counted database error")
            prometheus.wait_for(
                f'outbox_messages_total{{outcome="done"}} == {MESSAGES - dead}', "the last scrape"
            )
            # rate() needs two samples in its window after the last change.
            prometheus.wait_for(
                "count_over_time(outbox_database_errors_total[1m]) >= 3", "samples for rate()"
            )
            yield prometheus
        finally:
            server.terminate()
            server.wait(timeout=30)
            assert stop_worker(worker) == 0, (work / "worker.log").read_text()[-3000:]


@pytest.mark.parametrize("query", [*m.alert_queries(), *m.panel_queries()], ids=lambda q: q.origin)
def test_every_selector_has_a_series(scraped: Prometheus, query: m.Query) -> None:
    for selector in query.selectors:
        if selector.startswith("outbox_controller_") and not OPERATOR_PRESENT:
            continue
        assert scraped.query(f"count({selector})"), f"no series for {selector}"
    if query.needs_operator and not OPERATOR_PRESENT:
        pytest.skip(OPERATOR_SKIP)


@pytest.mark.parametrize("query", m.panel_queries(), ids=lambda q: q.origin)
def test_every_panel_query_returns_a_series(scraped: Prometheus, query: m.Query) -> None:
    if query.needs_operator and not OPERATOR_PRESENT:
        pytest.skip(OPERATOR_SKIP)
    assert scraped.query(query.expr), query.expr


@pytest.mark.parametrize("query", m.alert_queries(), ids=lambda q: q.origin)
def test_every_alert_expression_returns_a_series_with_its_threshold_opened(
    scraped: Prometheus, query: m.Query
) -> None:
    if query.needs_operator and not OPERATOR_PRESENT:
        pytest.skip(OPERATOR_SKIP)
    result = scraped.query(query.opened())
    assert result, query.opened()
    if "dispatcher" in query.expr:
        # The labels the alert's summary names survive its aggregations and joins.
        for series in result:
            assert series["metric"].get("dispatcher") == "orders", series
            assert series["metric"].get("namespace") == "shop", series


def test_the_dead_message_alert_fires_for_the_worker_that_dead_lettered(
    scraped: Prometheus,
) -> None:
    deadline = time.monotonic() + 60
    while True:
        alerts = scraped.get("/api/v1/alerts")["alerts"]
        firing = [a for a in alerts if a["state"] == "firing"]
        if any(a["labels"]["alertname"] == "OutboxDeadMessages" for a in firing):
            break
        assert time.monotonic() < deadline, alerts
        time.sleep(0.5)
    [dead] = [a for a in firing if a["labels"]["alertname"] == "OutboxDeadMessages"]
    assert dead["labels"]["namespace"] == "shop"
    assert dead["labels"]["dispatcher"] == "orders"
    assert dead["annotations"]["summary"] == "Outbox shop/orders: new dead messages"
    # Delivering the rest fired nothing else about these workers.
    others = {a["labels"]["alertname"] for a in firing} - {"OutboxDeadMessages"}
    assert others <= {"OutboxOperatorNotLeading"}, others  # no operator is scraped here


@contextmanager
def _fresh_database(admin_dsn: str, template: str) -> Iterator[str]:
    """A migrated database for this module's worker (the `dsn` fixture is per test)."""
    name = f"outbox_scrape_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        conn.execute(
            sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(
                sql.Identifier(name), sql.Identifier(template)
            )
        )
    params = conninfo_to_dict(admin_dsn)
    params["dbname"] = name
    yield make_conninfo("", **params)
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        conn.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
        )


def _break_the_workers_connections(conn: psycopg.Connection[Any]) -> None:
    """Terminate every other session on the worker's database: its next claim fails once."""
    conn.execute(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
        " WHERE datname = current_database() AND pid <> pg_backend_pid()"
    )


def _wait_ready(prometheus: Prometheus, server: subprocess.Popen[bytes], work: Path) -> None:
    deadline = time.monotonic() + 60
    while True:
        assert server.poll() is None, (work / "prometheus.log").read_text()[-3000:]
        try:
            with urllib.request.urlopen(f"{prometheus.url}/-/ready", timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            pass
        assert time.monotonic() < deadline, "prometheus never became ready"
        time.sleep(0.2)


def _wait(predicate: Any, what: str, timeout: float = 90.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)
