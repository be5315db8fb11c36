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
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import psycopg
import pytest
import yaml
from helpers import seed, statuses
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from workers import spawn_worker, stop_worker
from yarl import URL

from monitoring import monitoring as m
from outbox.demo.embedded import free_port
from outbox.demo.sink import Reply, Sink
from outbox.operations.pausing import change_by_hand
from outbox.table import Table

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(300),
    pytest.mark.xdist_group("monitoring-scrape"),  # one worker: `scraped` is set up once
    pytest.mark.skipif(
        shutil.which("prometheus") is None,
        reason="needs prometheus (Debian package prometheus; .ci/run installs it)",
    ),
]

NAMESPACE = "default"  # the API emulator harness's namespace
WORKER_LABELS = {"namespace": NAMESPACE, "dispatcher": "orders", "pod": "orders-0"}
OPERATOR_LABELS = {"pod": "outbox-controller-0"}
MESSAGES = 120
REJECTED_EVERY = 10  # every 10th message is refused for good: it goes dead
OPERATOR_SKIP = (
    "the operator's series need the real operator and its API emulator (outbox.controller.cli "
    "and tests/k8s), not in this tree"
)
OPERATOR_PRESENT = (
    importlib.util.find_spec("outbox.controller.cli") is not None
    and (Path(__file__).parents[1] / "k8s" / "test_operator.py").exists()
)


# Series the alerts and the dashboard name that the operator does not export yet: the
# expired-lease count (QueueStats.expired_leases) as a backlog state.
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
    """A worker that delivered a backlog (some of it dead) and lost its database connections
    once; the operator serving its table and a second dispatcher whose database is
    unreachable; Prometheus scraping both every second and evaluating the alert rules."""
    work = tmp_path_factory.mktemp("prometheus")
    with ExitStack() as stack:
        dsn = stack.enter_context(_fresh_database(admin_dsn, template))
        operator_port = stack.enter_context(_operator(dsn, work)) if OPERATOR_PRESENT else None
        yield from _scraping(dsn, work, operator_port)


@contextmanager
def _operator(dsn: str, work: Path) -> Iterator[int]:
    """The real operator against the API emulator, serving `orders` (the worker's table) and
    `broken` (a database nobody listens on); yields its metrics port."""
    from k8s.cluster import LocalCluster
    from k8s.test_operator import CRD, Operator, apply, dispatcher_manifest, secret_manifest

    (work / "k8s").mkdir()
    cluster = LocalCluster(work / "k8s").start()
    try:
        cluster.install_crd(CRD)
        operator = Operator(cluster, work).start()
        try:
            unreachable = f"postgresql://nobody@127.0.0.1:{free_port()}/nothing?connect_timeout=2"
            apply(
                cluster,
                secret_manifest("orders-db", dsn=dsn),
                secret_manifest("broken-db", dsn=unreachable),
                dispatcher_manifest("orders"),
                dispatcher_manifest(
                    "broken", database={"dsnSecretRef": {"name": "broken-db", "key": "dsn"}}
                ),
            )
            assert operator.port is not None
            yield operator.port
        finally:
            operator.stop()
    finally:
        cluster.stop()


def _scraping(dsn: str, work: Path, operator_port: int | None) -> Iterator[Prometheus]:
    metrics_port, web_port = free_port(), free_port()
    jobs: list[dict[str, Any]] = [
        {
            "job_name": "outbox-worker",
            "static_configs": [{"targets": [f"127.0.0.1:{metrics_port}"], "labels": WORKER_LABELS}],
        }
    ]
    if operator_port is not None:
        jobs.append(
            {
                "job_name": "outbox-controller",
                # As the chart's monitors do: the series' `namespace` is the dispatcher's.
                "honor_labels": True,
                "static_configs": [
                    {"targets": [f"127.0.0.1:{operator_port}"], "labels": OPERATOR_LABELS}
                ],
            }
        )
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(m.RULES)],
        "scrape_configs": jobs,
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
            if operator_port is not None:
                prometheus.wait_for(
                    'outbox_controller_backlog_messages{dispatcher="orders", state="ready"}',
                    "the operator's view of the table",
                )
            seed(conn, MESSAGES, aggregates=12)
            dead = MESSAGES // REJECTED_EVERY
            _wait(lambda: statuses(conn) == {"done": MESSAGES - dead, "dead": dead}, "the drain")
            _pause_and_resume(conn, sink.url)
            _break_the_workers_connections(conn)
            prometheus.wait_for("outbox_database_errors_total > 0", "a counted database error")
            prometheus.wait_for(
                f'outbox_messages_total{{outcome="done"}} == {MESSAGES - dead}', "the last scrape"
            )
            if operator_port is not None:
                prometheus.wait_for(
                    f'outbox_controller_backlog_messages{{dispatcher="orders", state="dead"}}'
                    f" == {dead}",
                    "the operator's count of the dead",
                )
                prometheus.wait_for(
                    'outbox_controller_reconcile_errors_total{reason="DatabaseUnreachable"}',
                    "the unreachable database counted",
                )
                prometheus.wait_for(
                    'outbox_controller_destination_state{dispatcher="orders", state="closed"} == 1',
                    "the operator's view of the destination, closed again",
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


def _pending_on_the_operator(query: m.Query) -> None:
    """Skip what needs the operator when it is absent; mark what it does not export yet."""
    if query.needs_operator and not OPERATOR_PRESENT:
        pytest.skip(OPERATOR_SKIP)


@pytest.mark.parametrize("query", [*m.alert_queries(), *m.panel_queries()], ids=lambda q: q.origin)
def test_every_selector_has_a_series(scraped: Prometheus, query: m.Query) -> None:
    _pending_on_the_operator(query)
    missing = []
    for selector in query.selectors:
        if selector.startswith("outbox_controller_") and not OPERATOR_PRESENT:
            continue
        if not scraped.query(f"count({selector})"):
            missing.append(selector)
    assert missing == []


@pytest.mark.parametrize("query", m.panel_queries(), ids=lambda q: q.origin)
def test_every_panel_query_returns_a_series(scraped: Prometheus, query: m.Query) -> None:
    _pending_on_the_operator(query)
    result = scraped.query(query.expr)
    assert result, query.expr


@pytest.mark.parametrize("query", m.alert_queries(), ids=lambda q: q.origin)
def test_every_alert_expression_returns_a_series_with_its_threshold_opened(
    scraped: Prometheus, query: m.Query
) -> None:
    _pending_on_the_operator(query)
    if query.needs_partitioned_table:
        pytest.skip("the scraped worker serves a plain table: nothing is made ahead")
    result = scraped.query(query.opened())
    assert result, query.opened()
    if "dispatcher" in query.expr:
        # The labels the alert's summary names survive its aggregations and joins.
        for series in result:
            assert series["metric"].get("dispatcher") in ("orders", "broken"), series
            assert series["metric"].get("namespace") == NAMESPACE, series


def test_the_dead_message_alert_fires_for_the_dispatcher_that_dead_lettered(
    scraped: Prometheus,
) -> None:
    firing = _firing(scraped, "OutboxDeadMessages")
    [dead] = [a for a in firing if a["labels"]["alertname"] == "OutboxDeadMessages"]
    assert dead["labels"]["namespace"] == NAMESPACE
    assert dead["labels"]["dispatcher"] == "orders"
    assert dead["annotations"]["summary"] == f"Outbox {NAMESPACE}/orders: new dead messages"
    others = {a["labels"]["alertname"] for a in firing} - {"OutboxDeadMessages"}
    if OPERATOR_PRESENT:
        assert others <= {"OutboxOperatorDatabaseUnreachable"}, others
    else:
        assert others <= {"OutboxOperatorNotLeading"}, others  # no operator is scraped


@pytest.mark.skipif(not OPERATOR_PRESENT, reason=OPERATOR_SKIP)
def test_the_unreachable_database_alert_fires_for_that_dispatcher_only(
    scraped: Prometheus,
) -> None:
    firing = _firing(scraped, "OutboxOperatorDatabaseUnreachable")
    unreachable = [
        a for a in firing if a["labels"]["alertname"] == "OutboxOperatorDatabaseUnreachable"
    ]
    assert [a["labels"]["dispatcher"] for a in unreachable] == ["broken"]
    # The operator leads, so the leader alert stays quiet.
    assert "OutboxOperatorNotLeading" not in {a["labels"]["alertname"] for a in firing}


def _firing(prometheus: Prometheus, alertname: str, timeout: float = 60) -> list[dict[str, Any]]:
    deadline = time.monotonic() + timeout
    while True:
        alerts = prometheus.get("/api/v1/alerts")["alerts"]
        firing = [a for a in alerts if a["state"] == "firing"]
        if any(a["labels"]["alertname"] == alertname for a in firing):
            return firing
        assert time.monotonic() < deadline, alerts
        time.sleep(0.5)


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


def _pause_and_resume(conn: psycopg.Connection[Any], url: str) -> None:
    """Pause the worker's destination (its HTTP origin) and resume it, as `outbox pause` and
    `outbox resume` do: it gets a row in the table's destinations, closed again, which the
    operator exports (a destination that never failed or was paused has no row)."""
    origin = str(URL(url).origin())
    table = Table.parse("outbox")
    paused = change_by_hand(conn, table, "pause", origin, reason="scrape test", via="test")
    assert paused.changed, paused
    assert change_by_hand(conn, table, "resume", origin, via="test").changed


def _break_the_workers_connections(conn: psycopg.Connection[Any]) -> None:
    """Terminate the worker's sessions (its pool's and its listener's): its next claim fails
    once. Only the worker's: a pass of the operator reading the table then would count a
    database error for `orders` too, and fire the alert for a database that is reachable."""
    conn.execute(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
        " WHERE datname = current_database() AND application_name ~ '^orders-0( |$)'"
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
