"""Bad input to real worker processes: a clear error, nothing lost, nothing broken.

Malformed flags and variables, unusable DSNs for the `outbox` commands, tables that are
missing or of another version are covered by tests/test_cli.py and tests/test_settings.py;
docs/reliability.md has the full table. Here: what those do not cover.
"""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid
import zlib
from pathlib import Path

import psycopg
import pytest
from helpers import seed, statuses, wait_until_db
from psycopg import sql
from psycopg.conninfo import make_conninfo
from workers import spawn_worker, stop_worker

from chaos.cluster import assert_clean
from chaos.downstream import Call
from outbox.demo.embedded import free_port
from outbox.demo.sink import Reply, Sink
from outbox.models import Event
from outbox.operations.repair import repair, select_targets
from outbox.plumbing.errors import SettingError
from outbox.producer import enqueue
from outbox.runner import fetch
from outbox.schema import SCHEMA_VERSION, migrate
from outbox.table import Table
from outbox.worker.settings import load_settings

pytestmark = [pytest.mark.chaos, pytest.mark.slow]


def _log(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.startswith("{")]


def _wait_for_log(path: Path, text: str, proc, timeout: float = 30.0) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        found = [e for e in _log(path) if text in e.get("message", "")]
        if found:
            return found[0]
        assert proc.poll() is None, f"worker exited with {proc.returncode}: {path.read_text()}"
        assert time.monotonic() < deadline, f"no log line with {text!r}: {path.read_text()}"
        time.sleep(0.05)


def _readyz(port: int) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return exc.code


def _wait(predicate, what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


# -- DSNs --------------------------------------------------------------------------------------


def test_a_role_without_rights_on_the_table_changes_nothing_then_recovers_on_grant(
    conn, dsn, sink, tmp_path
):
    role = f"chaos_norights_{uuid.uuid4().hex[:8]}"
    conn.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(role)))
    ids = seed(conn, 20)
    log, port = tmp_path / "w.log", free_port()
    proc = spawn_worker(
        make_conninfo(dsn, user=role), "--publisher", "http", "--http-url", sink.url,
        "--poll-interval", "100ms", "--metrics-port", str(port), owner="w-norights",
        log_path=str(log),
    )  # fmt: skip
    try:
        line = _wait_for_log(log, "permission denied for table outbox", proc)
        assert line["level"] == "warning" and line["message"].startswith("claim failed")
        assert proc.poll() is None and _readyz(port) == 503  # up, retrying, not ready
        assert statuses(conn) == {"pending": 20}
        assert conn.execute("SELECT max(lease_version) FROM outbox").fetchone() == (0,)
        assert sink.requests == []
        # Privileges fixed while it runs: it picks up without a restart, nothing was lost.
        conn.execute(sql.SQL("GRANT SELECT, UPDATE ON outbox TO {}").format(sql.Identifier(role)))
        _wait(lambda: statuses(conn) == {"done": 20}, "delivery after the grant")
        assert _readyz(port) == 200
    finally:
        code = stop_worker(proc)
        conn.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(role)))
        conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))
    assert code == 0
    assert sorted(sink.delivered_ids()) == ids


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"user": "chaos_no_such_role"}, 'role "chaos_no_such_role" does not exist'),
        ({"dbname": "chaos_no_such_db"}, 'database "chaos_no_such_db" does not exist'),
        ({"user": "nologin"}, "is not permitted to log in"),
    ],
)
def test_a_connection_refused_for_good_stops_the_worker_with_one_line(conn, dsn, change, reason):
    """It used to retry for ever; waiting cannot create a role or a database. Exit 2 names
    where it connected and why (an orchestrator restarts it, with its own back-off)."""
    if change.get("user") == "nologin":
        change = {"user": f"chaos_nologin_{uuid.uuid4().hex[:8]}"}
        conn.execute(sql.SQL("CREATE ROLE {} NOLOGIN").format(sql.Identifier(change["user"])))
    try:
        result = subprocess.run(
            [sys.executable, "-m", "outbox.worker", "--publisher", "null", "--dsn",
             make_conninfo(dsn, password="s3cret-pw", **change)],
            capture_output=True, text=True, timeout=30,
        )  # fmt: skip
    finally:
        if "nologin" in change.get("user", ""):
            conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(change["user"])))
    assert result.returncode == 2, result
    [line] = [ln for ln in result.stderr.splitlines() if not ln.startswith("{")]
    assert line.startswith("outbox-worker: error: --dsn: cannot connect to 127.0.0.1 port ")
    assert reason in line
    assert "s3cret-pw" not in result.stdout + result.stderr


@pytest.mark.parametrize("kind", ["closed port", "no socket", "unknown host"])
def test_a_connection_that_may_heal_keeps_the_worker_waiting_and_saying_where(dsn, tmp_path, kind):
    """A database that is not there yet is normal at start-up (it may come up after the
    workers): the worker waits, not ready, logging where it tried and why, and stops
    cleanly on SIGTERM."""
    change, where = {
        "closed port": ({"port": str(free_port())}, "on 127.0.0.1 port "),
        "no socket": ({"host": str(tmp_path / "no-socket-here")}, "no-socket-here port "),
        "unknown host": ({"host": "no-such-host.invalid"}, "on no-such-host.invalid port "),
    }[kind]
    bad = make_conninfo(dsn, password="s3cret-pw", **change)
    log, port = tmp_path / "w.log", free_port()
    proc = spawn_worker(
        bad, "--publisher", "null", "--metrics-port", str(port), owner="w-bad", log_path=str(log)
    )
    try:
        line = _wait_for_log(log, "check table failed", proc)
        assert line["level"] == "warning" and where in line["message"]
        assert "retrying in" in line["message"]
        assert _readyz(port) == 503
    finally:
        code = stop_worker(proc, timeout=30)
    assert code == 0
    assert "s3cret-pw" not in log.read_text()


@pytest.fixture
def silent_server():
    """A TCP server that accepts connections and never says a word."""
    server = socket.create_server(("127.0.0.1", 0))
    accepted: list[socket.socket] = []
    stop = threading.Event()

    def serve() -> None:
        server.settimeout(0.1)
        while not stop.is_set():
            try:
                accepted.append(server.accept()[0])
            except TimeoutError:
                continue

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield server.getsockname()[1], accepted
    stop.set()
    thread.join()
    for peer in accepted:
        peer.close()
    server.close()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
def test_a_stop_while_connecting_to_a_silent_server_is_at_once(silent_server, tmp_path, sig):
    """It used to take the whole connect timeout (12 s): now the attempt is abandoned. The
    DSN's 60 s timeout would hold an old worker past the deadline below."""
    port, accepted = silent_server
    log = tmp_path / "w.log"
    proc = spawn_worker(
        f"host=127.0.0.1 port={port} dbname=x connect_timeout=60",
        "--publisher", "null", owner="w-silent", log_path=str(log),
    )  # fmt: skip
    try:
        _wait(lambda: accepted and proc.poll() is None, "the worker to be connecting")
    finally:
        proc.send_signal(sig)
        code = proc.wait(timeout=10)
    assert code == 0, log.read_text()


def test_the_dsns_connect_timeout_is_honoured(silent_server, tmp_path):
    """It was overridden to 10 s; with connect_timeout=2 the first attempt gives up at 2 s,
    says so, and is retried."""
    port, accepted = silent_server
    log = tmp_path / "w.log"
    proc = spawn_worker(
        f"host=127.0.0.1 port={port} dbname=x connect_timeout=2",
        "--publisher", "null", owner="w-timeout", log_path=str(log),
    )  # fmt: skip
    try:
        # Timed from the first connection, not from the start of a process on a busy host:
        # within 8 s, before the old 10 s override could have expired.
        deadline = time.monotonic() + 60
        while not accepted:
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.02)
        line = _wait_for_log(log, "check table failed", proc, timeout=8)
        assert "timeout" in line["message"] and f"port {port}" in line["message"]
    finally:
        code = stop_worker(proc, timeout=10)
    assert code == 0


@pytest.mark.parametrize("sig", [signal.SIGHUP, signal.SIGINT, signal.SIGTERM])
def test_a_stop_signal_gives_back_every_held_row(conn, dsn, tmp_path, sig):
    """SIGHUP used to kill the worker on the spot, leaving its rows to their leases."""
    hang = threading.Event()

    def slow(body, nth):
        hang.wait(20)
        return Reply(200)

    ids = seed(conn, 30)
    log = tmp_path / "w.log"
    with Sink(slow) as sink:
        proc = spawn_worker(
            dsn, "--publisher", "http", "--http-url", sink.url, "--concurrency", "2",
            "--batch", "10", "--lease", "5m", "--shutdown-grace", "100ms",
            owner="w-signal", log_path=str(log),
        )  # fmt: skip
        try:
            # `_seen` counts requests as they arrive; `requests` only once answered (here,
            # after the hang): the signal must land while both publishes are in flight.
            _wait(lambda: _processing(conn) >= 10 and len(sink._seen) == 2, "claims and publishes")
        finally:
            proc.send_signal(sig)
            code = proc.wait(timeout=30)
            hang.set()
    assert code == 0, log.read_text()
    assert _processing(conn) == 0
    assert set(statuses(conn)) <= {"pending", "done"} and sum(statuses(conn).values()) == 30
    assert len(ids) == 30


def _processing(conn) -> int:
    return conn.execute("SELECT count(*) FROM outbox WHERE status = 'processing'").fetchone()[0]


# -- tables ------------------------------------------------------------------------------------


def _run_worker(dsn: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "outbox.worker", "--dsn", dsn, "--publisher", "null", *args],
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip


def test_the_worker_refuses_a_hand_made_table_of_the_wrong_shape(empty_dsn):
    with psycopg.connect(empty_dsn, autocommit=True) as c:
        c.execute("CREATE TABLE outbox (id bigint PRIMARY KEY, payload jsonb)")
    result = _run_worker(empty_dsn)
    assert result.returncode == 2, result
    assert "was not created by `outbox migrate`" in result.stderr


def test_the_worker_refuses_a_migrated_table_that_lost_a_column(empty_dsn):
    with psycopg.connect(empty_dsn, autocommit=True) as c:
        migrate(c, Table.parse("outbox"))
        c.execute("ALTER TABLE outbox DROP COLUMN lease_owner")
    result = _run_worker(empty_dsn)
    assert result.returncode == 2, result
    assert result.stderr.startswith("outbox-worker: error: ") and "lease_owner" in result.stderr


def test_an_ordered_worker_refuses_a_table_without_the_ordering_index(empty_dsn):
    with psycopg.connect(empty_dsn, autocommit=True) as c:
        migrate(c, Table.parse("outbox"))  # as `outbox migrate` with no --ordering
        c.execute(
            "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) "
            "VALUES ('a', '1', 'E', '{}')"
        )
    result = _run_worker(empty_dsn, "--ordering", "aggregate")
    assert result.returncode == 2, result
    assert result.stderr.splitlines() == [
        "outbox-worker: error: table outbox has no index outbox_aggregate, which --ordering "
        "aggregate needs; run `outbox migrate --table outbox --ordering aggregate`"
    ]
    with psycopg.connect(empty_dsn, autocommit=True) as c:
        assert statuses(c) == {"pending": 1}  # nothing claimed
        migrate(c, Table.parse("outbox"), "aggregate")
        worker = spawn_worker(
            empty_dsn, "--publisher", "null", "--ordering", "aggregate", owner="ordered"
        )
        try:
            wait_until_db(c, "(SELECT count(*) = 1 FROM outbox WHERE status = 'done')")
        finally:
            code = stop_worker(worker)
        assert code == 0


def test_a_hostile_table_name_through_real_workers(new_run, empty_dsn):
    table = Table.parse('"odd schema"."Weird ""Name""; DROP TABLE x; --"')
    with psycopg.connect(empty_dsn, autocommit=True) as c:
        migrate(c, table)
        c.execute("CREATE TABLE x (id int)")
    run = new_run("hostile-table", empty_dsn, table=table)
    run.spawn()
    run.spawn()
    run.produce(100)
    run.wait_drained()
    verdict = run.finish()
    assert_clean(verdict)
    assert verdict.delivered == 100
    with psycopg.connect(empty_dsn) as c:
        assert c.execute("SELECT to_regclass('x') IS NOT NULL").fetchone() == (True,)


def _outbox(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "outbox", *args], capture_output=True, text=True, timeout=60
    )


# psycopg reads `%` inside any statement sent with parameters, quoted identifiers included;
# `{}` are the placeholders of sql.SQL.format and str.format. Names that used to act on
# another table (`a%%b` on `"a%b"`), break every statement (`pct%`, `%(x)s`) or be read as
# parameters (`%s`, `%b`, `%t`).
PLACEHOLDER_NAMES = ["a%b", "a%%b", "pct%", "%s", "x%bx", "%t%", "%(x)s", "x{}y", "{t}", "q%.r%%"]


def test_placeholder_characters_in_table_names_hold_for_ordered_enqueue(empty_dsn):
    # The per-aggregate advisory locks are keyed on the table's name: a text constant too.
    with psycopg.connect(empty_dsn, autocommit=True) as c:
        for name in PLACEHOLDER_NAMES:
            table = Table.parse(name)
            migrate(c, table)
            with c.transaction():
                enqueue(c, aggregate_type="t", aggregate_id=name, event_type="E", payload={},
                        table=table, lock_aggregate=True)  # fmt: skip
        for name in PLACEHOLDER_NAMES:
            query = sql.SQL("SELECT aggregate_id FROM {}").format(Table.parse(name).ident)
            assert c.execute(query).fetchall() == [(name,)], name


def test_placeholder_characters_in_table_names_act_on_that_table_only(empty_dsn, sink, tmp_path):
    for name in PLACEHOLDER_NAMES:
        result = _outbox("migrate", "--dsn", empty_dsn, "--table", name)
        assert result.returncode == 0, result.stderr
        migrated = f"migrated from v0 to v{SCHEMA_VERSION}, for --ordering none"
        assert result.stdout == f"{name}: {migrated}\n"
    with psycopg.connect(empty_dsn, autocommit=True) as c:
        for name in PLACEHOLDER_NAMES:  # one row each, telling where it was written
            enqueue(c, aggregate_type="t", aggregate_id=name, event_type="E", payload={},
                    table=Table.parse(name))  # fmt: skip
        tables = {Table.parse(name): name for name in PLACEHOLDER_NAMES}
        for table, name in tables.items():
            rows = c.execute(sql.SQL("SELECT aggregate_id FROM {}").format(table.ident)).fetchall()
            assert rows == [(name,)], name
        c.execute(sql.SQL("UPDATE {} SET status = 'dead'").format(Table.parse("a%b").ident))
    # `requeue --table a%%b` used to print "requeued 1" and change "a%b".
    result = _outbox("requeue", "--dsn", empty_dsn, "--table", "a%%b", "--all-dead")
    assert result.stdout == "a%%b: requeued 0 dead messages\n", result.stderr
    stats = json.loads(_outbox("stats", "--dsn", empty_dsn, "--table", "a%b", "--json").stdout)
    assert (stats["dead"], stats["pending"]) == (1, 0)
    result = _outbox("requeue", "--dsn", empty_dsn, "--table", "a%b", "--all-dead")
    assert result.stdout == "a%b: requeued 1 dead message\n", result.stderr
    for name in PLACEHOLDER_NAMES:
        stats = json.loads(_outbox("stats", "--dsn", empty_dsn, "--table", name, "--json").stdout)
        assert stats["pending"] == 1, name
        result = _outbox("purge", "--dsn", empty_dsn, "--table", name, "--older-than", "1s")
        assert result.stdout == f"{name}: deleted 0 done rows\n", result.stderr
    # A worker on each of three names delivers that table's row, and only that one.
    for name in ("a%%b", "pct%", "x{}y"):
        log = tmp_path / f"{len(sink.requests)}.log"
        proc = spawn_worker(
            empty_dsn, "--table", name, "--publisher", "http", "--http-url", sink.url,
            "--poll-interval", "100ms", owner="w-pct", log_path=str(log),
        )  # fmt: skip
        try:
            _wait(lambda n=name: n in [r.body["aggregate_id"] for r in sink.requests], name)
            _wait(lambda n=name: _statuses_of(empty_dsn, n) == [("done",)], f"{name} done")
        finally:
            assert stop_worker(proc) == 0, log.read_text()
    assert sorted(r.body["aggregate_id"] for r in sink.requests) == sorted(["a%%b", "pct%", "x{}y"])
    with psycopg.connect(empty_dsn) as c:  # the neighbours were not touched
        for name in ("a%b", "%s", "{t}"):
            status = c.execute(sql.SQL("SELECT status FROM {}").format(Table.parse(name).ident))
            assert status.fetchall() == [("pending",)], name


def _statuses_of(dsn: str, name: str) -> list[tuple[str]]:
    with psycopg.connect(dsn) as c:
        query = sql.SQL("SELECT status FROM {}").format(Table.parse(name).ident)
        return c.execute(query).fetchall()  # type: ignore[return-value]


def test_an_event_type_that_cannot_be_a_header_goes_dead_with_its_reason(conn, dsn, sink, tmp_path):
    """A CR/LF in a value headed for a header used to raise an unclassified error: a
    traceback per try, the row left `processing` after SIGTERM, dead at last as "crashed"."""
    bad_types = ["OrderPaid\r\nX-Injected: yes", "OrderPaid\nX: y", "Order\x7fPaid", "A\x1b[2J"]
    with conn.transaction():
        bad = [
            enqueue(conn, aggregate_type="order", aggregate_id=f"a{i}", event_type=event_type,
                    payload={})
            for i, event_type in enumerate(bad_types)
        ]  # fmt: skip
    good = seed(conn, 10)
    log = tmp_path / "w.log"
    proc = spawn_worker(
        dsn, "--publisher", "http", "--http-url", sink.url, "--poll-interval", "100ms",
        owner="w-header", log_path=str(log),
    )  # fmt: skip
    try:
        _wait(lambda: statuses(conn) == {"done": 10, "dead": len(bad)}, "everything finished")
    finally:
        code = stop_worker(proc)
    assert code == 0
    assert sorted(sink.delivered_ids()) == good  # nothing else was sent
    errors = conn.execute(
        "SELECT last_error, attempts FROM outbox WHERE status = 'dead' ORDER BY id"
    ).fetchall()
    for (error, attempts), event_type in zip(errors, bad_types, strict=True):
        assert error.startswith("permanent: event_type ") and "cannot be sent in a header" in error
        assert repr(event_type) in error and attempts == 1
    assert "unclassified" not in log.read_text() and "Traceback" not in log.read_text()


def test_a_failure_reason_is_stored_without_url_credentials(conn, dsn, tmp_path):
    """A garbage reply makes the HTTP client name the whole URL in its error; the reason
    lands in last_error, readable by anyone who may SELECT the table (and in the TUI)."""
    server = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def answer_garbage() -> None:
        server.settimeout(0.1)
        while not stop.is_set():
            try:
                peer = server.accept()[0]
            except TimeoutError:
                continue
            with peer:
                peer.recv(65536)
                peer.sendall(b"GARBAGE REPLY\r\n\r\n")

    thread = threading.Thread(target=answer_garbage, daemon=True)
    thread.start()
    seed(conn, 3)
    url = f"http://user:s3cret@127.0.0.1:{server.getsockname()[1]}/events?token=s3cret&x=1"
    log = tmp_path / "w.log"
    proc = spawn_worker(
        dsn, "--publisher", "http", "--http-url", url, "--max-attempts", "1",
        "--poll-interval", "100ms", owner="w-leak", log_path=str(log),
    )  # fmt: skip
    try:
        _wait(lambda: statuses(conn) == {"dead": 3}, "the failures")
    finally:
        code = stop_worker(proc)
        stop.set()
        thread.join()
        server.close()
    assert code == 0
    stored = [r[0] for r in conn.execute("SELECT last_error FROM outbox").fetchall()]
    assert all("/events?token=***&x=***" in e and "\n" not in e for e in stored), stored
    assert "s3cret" not in "".join(stored) + log.read_text()
    assert "http://***@127.0.0.1" in log.read_text()  # the start-up line, redacted


# -- payloads ----------------------------------------------------------------------------------


def _nested(depth: int) -> object:
    value: object = []
    for _ in range(depth):
        value = [value]
    return value


def test_huge_and_deeply_nested_payloads_reach_the_sink_intact(new_run, dsn):
    # Past the default size limits (1 MiB to enqueue, 2 MiB to publish): raised on both ends.
    limit = 8 * 2**20
    run = new_run(
        "payloads", dsn, publish_timeout=1.0, worker_args=("--max-payload-bytes", str(limit))
    )
    payloads = [
        {"blob": "x" * 4_000_000},  # 4 MB in one string
        {"items": list(range(100_000))},  # 100,000 elements
        _nested(900),  # about as deep as Python's json module goes
        {"text": "ünï \u2028 \U0001f600 \\ \" ' ; DROP TABLE x; --"},
    ]
    events = [Event("doc", f"d{i}", "Big", p) for i, p in enumerate(payloads)]
    ids = run.enqueue(events, max_payload_bytes=limit)
    # Deeper than Python can encode: refused by the producer with an error, nothing committed.
    before = run.count()
    with psycopg.connect(dsn, autocommit=True) as c, pytest.raises(RecursionError):
        enqueue(c, aggregate_type="doc", aggregate_id="deep", event_type="Deep",
                payload=_nested(100_000))  # fmt: skip
    assert run.count() == before
    # Deeper still, written by something other than Python: the worker never parses it.
    depth = 10_000
    with psycopg.connect(dsn, autocommit=True) as c:
        [[deep_id]] = c.execute(
            "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) VALUES "
            "('doc', 'deep', 'Deep', (repeat('[', %(n)s) || repeat(']', %(n)s))::jsonb) "
            "RETURNING id",
            {"n": depth},
        ).fetchall()
    run.spawn()
    run.spawn()
    run.wait_drained()
    verdict = run.finish()
    assert_clean(verdict)
    assert verdict.delivered == len(payloads) + 1
    delivered = {int(r.key): r for r in run.sink.delivered()}
    for message_id, payload in zip(ids, payloads, strict=True):
        assert delivered[message_id].body["payload"] == payload
    raw = delivered[deep_id].body["invalid"]  # too deep for the sink's json module to parse
    assert '"payload":' + "[" * depth + "]" * depth + "}" in raw


# -- publisher URLs ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "url",
    [
        "ftp://example.com/x",  # scheme
        "http://",  # no host
        "example.com/events",  # no scheme
        "http://localhost:99999/events",  # port out of range
        "http://localhost:port/events",  # port not a number
        "http://exa mple.com/events",  # whitespace
        "http://[::1/events",  # broken IPv6 literal
    ],
)
def test_invalid_publisher_urls_are_refused_at_start(url):
    """Each of these used to be accepted, then failed every publish as 'retryable' until
    every message was dead: a configuration error must stop the worker at start instead."""
    with pytest.raises(SettingError) as info:
        load_settings(["--publisher", "http", "--http-url", url], {})
    assert str(info.value).startswith("--http-url: ")


# -- the operator ------------------------------------------------------------------------------


def test_an_operator_requeue_races_the_workers(new_run, dsn, scale):
    """Two operators requeue dead rows (outbox.operations.repair, as the TUI does) while workers
    claim them and fail some again: the requeue is fenced on what each operator saw."""
    total = 60 * scale

    def script(call: Call) -> Reply:
        # Up to two failures per message; with one attempt each failure is a death.
        failures = zlib.crc32(str(call.key).encode()) % 3
        return Reply(500) if call.nth <= failures else Reply()

    operators = frozenset({"operator-a", "operator-b"})
    # The requeue's fence is the subject, so the destination's breaker is off: two thirds of
    # the messages fail once or twice, which opens it whenever five failures come before a
    # success, and each probe that fails again doubles its wait (2 s up to 30 s). On a
    # suite-loaded machine the race took 40 to 53 s of its 60 (3 to 5 s alone), once more.
    run = new_run(
        "requeue-race", dsn, script=script, max_attempts=1, operators=operators,
        worker_args=("--breaker-failures", "0"),
    )  # fmt: skip
    for _ in range(2):
        run.spawn()
    run.produce(total, per_tx=10)
    table = Table.parse("outbox")
    stale = []
    with (
        psycopg.connect(dsn, autocommit=True, application_name="operator-a") as a,
        psycopg.connect(dsn, autocommit=True, application_name="operator-b") as b,
    ):

        def operate() -> None:
            seen_by_b = fetch(b, select_targets(table))  # B looks first ...
            seen_by_a = fetch(a, select_targets(table))
            if not seen_by_a:
                return
            done_by_a = fetch(a, repair(table, "requeue", seen_by_a, actor="operator-a"))
            # ... and B acts last.
            done_by_b = fetch(b, repair(table, "requeue", seen_by_b, actor="operator-b"))
            for _ in done_by_a.changed:
                run.fault("requeue")
            # B's view is older than A's action: it may change nothing A changed.
            assert done_by_b.changed == [], (seen_by_b, done_by_a, done_by_b)
            stale.extend(done_by_b.changed_meanwhile)

        run.wait_for(lambda: run.drained() and run.count("status = 'dead'") == 0, "the race",
                     tick=operate)  # fmt: skip
    verdict = run.finish()
    assert_clean(verdict)
    assert stale, "operator B never acted on a stale view: no race happened"
    assert verdict.delivered == total and verdict.dead == 0
