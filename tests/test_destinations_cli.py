"""`outbox destinations`, `outbox pause` and `outbox resume` as subprocesses against real
PostgreSQL: what each destination's row says, who paused it and why, the audit log written in
the same transaction, "nothing changed" told apart by its exit code; and `outbox stats`
telling an outage apart from a healthy queue."""

from __future__ import annotations

import getpass
import json
import os
import re
import subprocess
import sys
import threading
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from helpers import seed, wait_until_db
from workers import spawn_worker, stop_worker

from outbox import destinations as dest
from outbox.cli import NOTHING_CHANGED
from outbox.operations import repair
from outbox.runner import fetch

BASE_ENV = {k: v for k, v in os.environ.items() if not k.startswith(("OUTBOX_", "PG"))}
API = "https://api.test"
# What no line a person reads may hold: C0 (tab too), DEL and C1.
CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def outbox(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "outbox", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**BASE_ENV, **(env or {})},
    )


def _rows(conn) -> dict[str, tuple[str, str | None, str | None]]:
    found = conn.execute("SELECT destination, state, reason, changed_by FROM outbox_destinations")
    return {r[0]: (r[1], r[2], r[3]) for r in found.fetchall()}


def _served(conn, table, *destinations: str) -> None:
    """Stamped as served, as a worker configured for them does when it starts."""
    fetch(conn, dest.served(table, list(destinations), owner="w1"))


def _open(conn, table, destination: str, error: str) -> None:
    """The breaker opened by a failure with a Retry-After of 30 s, as the worker that serves
    it reports it."""

    def fail(row: dest.Destination, now) -> dest.Destination:
        failure = dest.Failure(1, error, retry_after=timedelta(seconds=30))
        return dest.failed(row, failure, owner="w1", now=now, policy=dest.Policy())

    _served(conn, table, destination)
    dest.change_sync(conn, table, destination, fail)


def test_pause_shows_in_destinations_with_who_and_why_then_resume(conn, dsn, table):
    empty = outbox("destinations", "--dsn", dsn)
    assert empty.returncode == 0, empty.stderr
    assert empty.stdout.startswith("outbox: no destination recorded")

    paused = outbox("pause", API, "--reason", "deploy of v2", "--actor", "maria", "--dsn", dsn)
    assert paused.returncode == 0, paused.stderr
    assert paused.stdout.startswith(f"outbox: paused {API} (a name no worker has recorded")
    assert paused.stdout.rstrip().endswith("recorded as action #1")
    assert _rows(conn) == {API: ("paused", "deploy of v2", "maria")}
    _served(conn, table, API)  # a worker configured for it starts

    text = outbox("destinations", "--dsn", dsn)
    assert text.returncode == 0, text.stderr
    lines = text.stdout.splitlines()
    assert lines[0] == "outbox: 1 destination, 1 paused"
    assert lines[1].split() == ["DESTINATION", "STATE", "SINCE", "FOR", "FAILURES", "NEXT", "PROBE"]
    assert lines[2].startswith(API) and lines[2].split()[1] == "paused"
    assert lines[3] == "    paused by maria: deploy of v2"

    data = json.loads(outbox("destinations", "--json", "--dsn", dsn).stdout)
    [found] = data["destinations"]
    assert data["table"] == "outbox"
    assert (found["destination"], found["state"], found["reason"], found["changed_by"]) == (
        API, "paused", "deploy of v2", "maria"
    )  # fmt: skip
    assert found["next_probe_at"] is None and 0 <= found["for_seconds"] < 30

    # Resumed by whoever OUTBOX_ACTOR names; the row is closed and says who resumed it.
    resumed = outbox("resume", API, "--dsn", dsn, env={"OUTBOX_ACTOR": "ops-bot"})
    assert resumed.returncode == 0, resumed.stderr
    assert resumed.stdout == f"outbox: resumed {API} (it was paused), recorded as action #2\n"
    assert _rows(conn) == {API: ("closed", None, "ops-bot")}
    assert "    resumed by ops-bot" in outbox("destinations", "--dsn", dsn).stdout.splitlines()

    # The audit log has both, newest first, with no message ids and the destination recorded.
    resume, pause = fetch(conn, repair.recent_actions(table))
    assert (pause.action, pause.actor, pause.count, pause.message_ids) == ("pause", "maria", 1, [])
    assert pause.filter == {"destination": API, "reason": "deploy of v2", "was": "closed",
                            "via": "outbox pause"}  # fmt: skip
    assert (resume.action, resume.actor, resume.via) == ("resume", "ops-bot", "outbox resume")
    assert resume.filter == {"destination": API, "was": "paused", "via": "outbox resume"}


def test_nothing_to_change_says_why_and_exits_3(conn, dsn, table):
    # Resuming what no one paused: not even a row is left behind.
    unknown = outbox("resume", API, "--dsn", dsn)
    assert unknown.returncode == NOTHING_CHANGED == 3, unknown
    assert unknown.stdout == ""
    assert unknown.stderr == (
        f"outbox: error: {API} is closed (no destination of that name has a row); nothing changed\n"
    )
    assert _rows(conn) == {}

    assert outbox("pause", API, "--reason", "first", "--actor", "ann", "--dsn", dsn).returncode == 0
    again = outbox("pause", API, "--reason", "second", "--actor", "bob", "--dsn", dsn)
    assert again.returncode == 3
    assert f"{API} is already paused for 0s by ann: first; nothing changed" in again.stderr
    assert _rows(conn) == {API: ("paused", "first", "ann")}  # the first pause's who and why

    assert outbox("resume", API, "--dsn", dsn).returncode == 0
    closed = outbox("resume", API, "--dsn", dsn)
    assert closed.returncode == 3
    assert f"{API} is already closed for 0s; nothing changed" in closed.stderr
    assert [a.action for a in fetch(conn, repair.recent_actions(table))] == ["resume", "pause"]


def test_an_open_breaker_is_closed_by_hand_recorded_with_who_and_why(conn, dsn, table):
    """Someone who knows the API is back need not wait for a probe (which, for a destination
    no worker serves any more, never comes)."""
    _open(conn, table, API, "HTTP 503: down")
    resumed = outbox(
        "resume", API, "--reason", "the API is back", "--actor", "oncall", "--dsn", dsn
    )
    assert resumed.returncode == 0, resumed.stderr
    assert resumed.stdout == f"outbox: resumed {API} (it was open), recorded as action #1\n"
    assert _rows(conn)[API] == ("closed", None, "oncall")
    [found] = conn.execute(
        "SELECT failures, failing_ids, next_probe_at, probe_owner FROM outbox_destinations"
    ).fetchall()
    assert found == (0, [], None, None)  # the breaker's count starts again
    [record] = fetch(conn, repair.recent_actions(table))
    assert (record.action, record.actor, record.message_ids) == ("resume", "oncall", [])
    assert record.filter == {"destination": API, "reason": "the API is back", "was": "open",
                             "via": "outbox resume"}  # fmt: skip
    assert "    resumed by oncall" in outbox("destinations", "--dsn", dsn).stdout.splitlines()

    # Closed already: said, exit 3, nothing recorded.
    again = outbox("resume", API, "--reason", "twice", "--dsn", dsn)
    assert again.returncode == NOTHING_CHANGED, again
    assert f"{API} is already closed for " in again.stderr
    assert len(fetch(conn, repair.recent_actions(table))) == 1


def test_an_open_breaker_can_be_paused(conn, dsn, table):
    _open(conn, table, API, "HTTP 503: down")
    paused = outbox("pause", API, "--reason", "stop probing", "--dsn", dsn)
    assert paused.returncode == 0, paused.stderr
    assert paused.stdout == f"outbox: paused {API} (it was open), recorded as action #1\n"
    # Who: the OS user when no name is given, as requeue records it.
    assert _rows(conn)[API] == ("paused", "stop probing", getpass.getuser())
    [record] = fetch(conn, repair.recent_actions(table))
    assert (record.actor, record.filter["was"]) == (getpass.getuser(), "open")


def test_destinations_show_an_open_breaker_with_its_error_redacted_and_next_probe(conn, dsn, table):
    _open(conn, table, API, "HTTP 503 from https://bot:s3cret@api.test/v1?token=t0k")
    result = outbox("destinations", "--dsn", dsn)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "outbox: 1 destination, 1 open"
    cells = lines[2].split()
    assert cells[:2] == [API, "open"] and cells[-3] == "1"
    assert cells[-2] == "in" and cells[-1] in ("29s", "30s")
    assert lines[3] == "    reason: Retry-After"
    assert lines[4].startswith("    last error: HTTP 503 from https://")
    assert "s3cret" not in result.stdout and "t0k" not in result.stdout

    [found] = json.loads(outbox("destinations", "--json", "--dsn", dsn).stdout)["destinations"]
    assert found["state"] == "open" and found["failures"] == 1
    assert found["next_probe_in"] == pytest.approx(30, abs=5)
    assert "api.test" in found["last_error"] and "s3cret" not in json.dumps(found)


def test_a_destination_no_worker_serves_any_more_is_shown_idle(conn, dsn, table):
    """After a URL change the old origin's row stays open, and nothing will probe it: shown
    idle (with what its row says and who served it last), counted as held by nothing."""
    old, new, gone = "https://old.test", API, "https://never.test"
    _open(conn, table, old, "publish timed out")
    conn.execute(
        "UPDATE outbox_destinations SET served_at = now() - interval '10 minutes', "
        "served_by = 'orders-worker-0' WHERE destination = %s",
        (old,),
    )
    _served(conn, table, new)
    conn.execute(
        "INSERT INTO outbox_destinations (destination, state, since) VALUES (%s, 'open', now())",
        (gone,),
    )  # written before workers stamped (an older schema), or by another tool

    result = outbox("destinations", "--dsn", dsn)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "outbox: 3 destinations, 2 idle"
    rows = {line.split()[0]: line for line in lines[2:] if not line.startswith("    ")}
    assert rows[new].split()[1] == "closed"
    assert rows[old].split()[1] == "idle" and rows[old].split()[-1] == "-"  # no probe due
    assert rows[gone].split()[1] == "idle"
    under_old = lines[lines.index(rows[old]) + 1]
    assert under_old in (
        f"    idle: no worker has served it for {m} (last orders-worker-0); its row still "
        "says open (`outbox resume` closes it)"
        for m in ("10m 00s", "10m 01s")
    ), under_old
    assert lines[lines.index(rows[gone]) + 1] == (
        "    idle: no running worker serves it; its row still says open (`outbox resume` closes it)"
    )

    found = {
        d["destination"]: d
        for d in json.loads(outbox("destinations", "--json", "--dsn", dsn).stdout)["destinations"]
    }
    assert (found[old]["state"], found[old]["idle"], found[old]["served_by"]) == (
        "open", True, "orders-worker-0"
    )  # fmt: skip
    assert found[old]["served_ago"] == pytest.approx(600, abs=10)
    assert (found[new]["idle"], found[new]["served_by"]) == (False, "w1")
    assert found[new]["served_ago"] < dest.IDLE_AFTER.total_seconds()
    assert (found[gone]["idle"], found[gone]["served_at"]) == (True, None)

    summary = [line for line in outbox("stats", "--dsn", dsn).stdout.splitlines()
               if line.startswith("destinations")]  # fmt: skip
    assert summary[0].endswith("3, none held, 2 idle")

    # The served one opens: it is held, the idle ones still are not.
    _open(conn, table, new, "HTTP 503")
    summary = [line for line in outbox("stats", "--dsn", dsn).stdout.splitlines()
               if line.startswith("destinations")]  # fmt: skip
    assert summary[0].endswith(f"3: {new} open, 2 idle (see outbox destinations)")


def test_the_pause_and_its_record_commit_together(conn, dsn, table):
    """An audit log that refuses the record leaves the destination as it was."""
    conn.execute(
        "ALTER TABLE outbox_actions ADD CONSTRAINT no_pauses CHECK (action <> 'pause') NOT VALID"
    )
    result = outbox("pause", API, "--reason", "x", "--dsn", dsn)
    assert result.returncode == 1
    assert "no_pauses" in result.stderr and len(result.stderr.splitlines()) == 1
    assert _rows(conn) == {}
    assert fetch(conn, repair.recent_actions(table)) == []


@pytest.mark.parametrize(
    ("args", "env", "named"),
    [
        (["pause", API], {}, "--reason"),
        (["pause", API, "--reason", "  "], {}, "--reason"),
        (["pause", API, "--reason", "x" * 501], {}, "--reason"),
        (["pause", "", "--reason", "x"], {}, "DESTINATION"),
        (["resume"], {}, "DESTINATION"),
        (["resume", API, "--actor", " "], {}, "--actor"),
        (["resume", API], {"OUTBOX_ACTOR": " "}, "OUTBOX_ACTOR"),
        (["destinations", "--bogus"], {}, "--bogus"),
        # Control characters: a terminal command or a forged line wherever they are shown.
        (["pause", f"{API}\x1b[2J", "--reason", "x"], {}, "DESTINATION"),
        (["pause", f"{API}\nhttps://other.test", "--reason", "x"], {}, "DESTINATION"),
        (["resume", "kafka\tk1:9092"], {}, "DESTINATION"),
        (["pause", API, "--reason", "line1\nline2"], {}, "--reason"),
        (["pause", API, "--reason", "\x1b]0;pwned\x07"], {}, "--reason"),
        (["pause", API, "--reason", "C1 \x9b31m"], {}, "--reason"),
        (["resume", API, "--actor", "ann\x1b[31m"], {}, "--actor"),
        (["resume", API], {"OUTBOX_ACTOR": "ann\rbob"}, "OUTBOX_ACTOR"),
        (["resume", API, "--reason", " "], {}, "--reason"),
        (["resume", API, "--reason", "back\nline2"], {}, "--reason"),
    ],
)
def test_usage_errors_exit_2_with_one_line(args, env, named):
    result = outbox(*args, "--dsn", "host=nowhere.invalid", env=env)
    assert result.returncode == 2, result
    assert result.stdout == ""
    [line] = result.stderr.splitlines()
    assert line.startswith("outbox: error: ") and named in line
    assert not CONTROL.search(line), line


def test_pause_and_resume_name_a_destination_as_destinations_lists_it(conn, dsn, table):
    """A backslash shows doubled wherever the name is shown, so what `outbox pause` says
    it paused is what `outbox destinations` lists; the name is typed with one backslash
    (the escapes read back as the name), and a name typed as listed is another one."""
    name = "billing\\eu"  # the characters b i l l i n g \ e u
    listed = "billing\\\\eu"
    paused = outbox("pause", name, "--reason", "x", "--actor", "ops\\bot", "--dsn", dsn)
    assert paused.returncode == 0, paused.stderr
    assert paused.stdout.startswith(f"outbox: paused {listed} (a name no worker"), paused.stdout
    lines = outbox("destinations", "--dsn", dsn).stdout.splitlines()
    assert lines[2].split()[0] == listed and "    paused by ops\\\\bot: x" in lines, lines
    again = outbox("pause", name, "--reason", "y", "--dsn", dsn)
    assert again.returncode == NOTHING_CHANGED
    assert again.stderr.startswith(f"outbox: error: {listed} is already paused for "), again
    assert again.stderr.endswith(" by ops\\\\bot: x; nothing changed\n"), again.stderr
    as_listed = outbox("resume", listed, "--dsn", dsn)
    assert as_listed.returncode == NOTHING_CHANGED
    assert as_listed.stderr.startswith("outbox: error: billing\\\\\\\\eu is closed"), as_listed
    resumed = outbox("resume", name, "--dsn", dsn)
    assert resumed.returncode == 0, resumed.stderr
    assert resumed.stdout.startswith(f"outbox: resumed {listed} (it was paused)"), resumed.stdout


def test_a_reason_in_ordinary_text_is_taken_as_typed_and_shown_escaped(conn, dsn, table):
    """A no-break space (French puts one before a colon), a joiner or a mark are text, not
    controls: the pause takes them as typed; the listing shows them escaped."""
    reason = "en attente\xa0: incident 42 \U0001f469\u200d\U0001f4bb \u200f"
    paused = outbox("pause", API, "--reason", reason, "--actor", "zoë\xa0m", "--dsn", dsn)
    assert paused.returncode == 0, paused.stderr
    assert _rows(conn) == {API: ("paused", reason, "zoë\xa0m")}
    listed = outbox("destinations", "--dsn", dsn).stdout.splitlines()
    shown = (
        "    paused by zoë\\xa0m: en attente\\xa0: incident 42 \U0001f469\\u200d\U0001f4bb \\u200f"
    )
    assert shown in listed, listed


@pytest.mark.parametrize(
    ("destination", "shown", "secrets", "recorded"),
    [
        ("https://alice:pa55word@api.example.com", "https://***@api.example.com",
         ("alice", "pa55word"), "https://api.example.com"),
        ("https://ghp_T0kenAsUser@api.example.com", "https://***@api.example.com",
         ("ghp_T0ken",), "https://api.example.com"),
        ("https://api.example.com?token=t0k3n-v4lue", "https://api.example.com?***",
         ("t0k3n",), "https://api.example.com"),
        ("https://api.example.com/hook?T0kenAlone", "https://api.example.com/hook?***",
         ("T0ken",), "https://api.example.com"),
        # A NATS worker records its servers masked: that name is the one to pause.
        ("nats nats://u:pa55word@n1:4222, nats://n2:4222", "nats nats://***@n1:4222,",
         ("pa55word",), "nats nats://***@n1:4222, nats://n2:4222"),
    ],
)  # fmt: skip
def test_a_destination_with_credentials_is_refused_without_showing_them(
    conn, dsn, table, destination, shown, secrets, recorded
):
    """Workers record no user-info and no query (an HTTP destination is its origin): such a
    name would pause nothing, and the audit log would keep the secret."""
    for args in (["pause", destination, "--reason", "x"], ["resume", destination]):
        result = outbox(*args, "--dsn", dsn)
        assert result.returncode == 2, result
        [line] = result.stderr.splitlines()
        assert line.startswith(f"outbox: error: DESTINATION: {shown}") and "user-info" in line
        assert not any(secret in result.stderr + result.stdout for secret in secrets), line
    assert _rows(conn) == {} and fetch(conn, repair.recent_actions(table)) == []
    # The name as workers record it is paused.
    assert outbox("pause", recorded, "--reason", "x", "--dsn", dsn).returncode == 0
    assert _rows(conn)[recorded][0] == "paused"


def test_text_other_tools_stored_is_shown_escaped_one_line_each(conn, dsn, table):
    """Rows written by older versions or other tools: names, who, why and errors may hold
    ESC and line breaks; shown escaped, a row's lines are its own."""
    evil = "\x1b]0;pwned\x07\x1b[2J\x1b[31mEVIL\nline2"
    conn.execute(
        "INSERT INTO outbox_destinations "
        "(destination, state, reason, changed_by, last_error, served_at) "
        "VALUES (%s, 'paused', %s, %s, %s, now()), (%s, 'paused', 'upgrade', 'ann', NULL, now())",
        (f"https://a.test\n{evil}", f"why {evil}", "root\x1b[8m\x9b", f"HTTP 500: {evil}", API),
    )
    result = outbox("destinations", "--dsn", dsn)
    assert result.returncode == 0, result.stderr
    assert not CONTROL.search(result.stdout.replace("\n", "")), result.stdout
    # Each destination's line, then the lines under it (the order is the database's collation).
    under: dict[str, list[str]] = {}
    for line in result.stdout.splitlines()[2:]:
        if not line.startswith("    "):
            name = line.split()[0]
            under[name] = []
        under[name].append(line)
    shown = r"https://a.test\n\x1b]0;pwned\x07\x1b[2J\x1b[31mEVIL\nline2"
    assert set(under) == {shown, API}
    assert under[shown][0].split()[1] == "paused"
    assert under[shown][1:] == [
        r"    paused by root\x1b[8m\x9b: why \x1b]0;pwned\x07\x1b[2J\x1b[31mEVIL\nline2",
        r"    last error: HTTP 500: \x1b]0;pwned\x07\x1b[2J\x1b[31mEVIL\nline2",
    ]
    assert under[API][1:] == ["    paused by ann: upgrade"]

    stats = outbox("stats", "--dsn", dsn)
    assert stats.returncode == 0, stats.stderr
    [summary] = [line for line in stats.stdout.splitlines() if line.startswith("destinations")]
    assert r"https://a.test\n\x1b]0;pwned" in summary and not CONTROL.search(summary)

    # Pausing it again says who paused it and why, on one line.
    conn.execute("UPDATE outbox_destinations SET reason = 'line1' || chr(10) || 'line2' "
                 "WHERE destination = %s", (API,))  # fmt: skip
    again = outbox("pause", API, "--reason", "second", "--dsn", dsn)
    assert again.returncode == NOTHING_CHANGED, again
    [line] = again.stderr.splitlines()
    assert line.endswith(r"by ann: line1\nline2; nothing changed")


class _Hostile(BaseHTTPRequestHandler):
    """A downstream answering 500 with a body that would drive a terminal and forge a line
    (the demo's Sink answers JSON of its own: this body is the point)."""

    protocol_version = "HTTP/1.1"
    body = b"\x1b]0;pwned\x07\x1b[2J\x1b[31mEVIL\nline2"

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.send_response(500)
        self.send_header("Content-Length", str(len(self.body)))
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, format: str, *args: object) -> None:
        pass  # the test's output is the worker's log


def test_a_hostile_downstream_is_stored_shown_and_logged_escaped(conn, dsn, tmp_path):
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Hostile)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    log = tmp_path / "worker.log"
    url = f"http://127.0.0.1:{server.server_address[1]}"
    worker = spawn_worker(
        dsn, "--publisher", "http", "--http-url", f"{url}/events", "--log-format", "text",
        "--breaker-failures", "2", "--backoff-base", "10ms", "--backoff-cap", "50ms",
        owner="w1", log_path=str(log),
    )  # fmt: skip
    try:
        seed(conn, 3)
        wait_until_db(conn, "EXISTS (SELECT 1 FROM outbox_destinations WHERE state = 'open')")
    finally:
        assert stop_worker(worker) == 0
        server.shutdown()
        server.server_close()
    shown = r"HTTP 500: \x1b]0;pwned\x07\x1b[2J\x1b[31mEVIL\nline2"
    [(stored,)] = conn.execute("SELECT last_error FROM outbox_destinations").fetchall()
    assert stored == shown
    errors = {e for (e,) in conn.execute("SELECT last_error FROM outbox WHERE attempts > 0")}
    assert errors == {f"retryable: {shown}"}

    result = outbox("destinations", "--dsn", dsn)
    assert f"    last error: {shown}" in result.stdout.splitlines()
    assert not CONTROL.search(result.stdout.replace("\n", ""))

    # The breaker's warning quotes the error: one record, one line, every line a record.
    lines = log.read_text().splitlines()
    assert any(shown in line and "is down" in line for line in lines), lines
    assert all(re.match(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} ", line) for line in lines), lines
    assert not any(CONTROL.search(line) for line in lines), lines


def test_destinations_on_a_table_without_the_destinations_table(conn, dsn):
    conn.execute("DROP TABLE outbox_destinations")
    result = outbox("destinations", "--dsn", dsn)
    assert result.returncode == 1
    assert result.stderr == (
        'outbox: error: table outbox is at an older schema (relation "outbox_destinations" '
        "does not exist); run `outbox migrate --table outbox`\n"
    )


def test_destinations_on_a_v4_table_say_what_to_run_and_pause_still_works(conn, dsn):
    """Before v5 the destinations table has no stamps: listing says what to run; a pause,
    which the breaker's rules apply, works on the row as v4 has it."""
    conn.execute("ALTER TABLE outbox_destinations DROP COLUMN served_at, DROP COLUMN served_by")
    conn.execute("COMMENT ON TABLE outbox IS 'outbox-dispatcher schema v4'")
    for command in ("destinations", "stats"):
        result = outbox(command, "--dsn", dsn)
        assert result.returncode == 1, result
        assert result.stderr == (
            'outbox: error: table outbox is at an older schema (column "served_at" does not '
            "exist); run `outbox migrate --table outbox`\n"
        )
    assert outbox("pause", API, "--reason", "x", "--dsn", dsn).returncode == 0
    assert _rows(conn)[API][0] == "paused"


# -- outbox stats: an outage in backoff ------------------------------------------------------


def test_stats_show_retrying_the_oldest_unfinished_age_and_the_destinations(conn, dsn, table):
    ids = seed(conn, 4)
    conn.execute(
        "UPDATE outbox SET created_at = now() - interval '10 minutes', attempts = 3, "
        "available_at = now() + interval '1 minute' WHERE id = ANY(%s)",
        (ids[:3],),
    )
    _open(conn, table, API, "HTTP 503")
    assert outbox("pause", "kafka k1:9092", "--reason", "upgrade", "--dsn", dsn).returncode == 0
    _served(conn, table, "kafka k1:9092")

    data = json.loads(outbox("stats", "--json", "--dsn", dsn).stdout)
    assert (data["pending"], data["ready"], data["waiting"], data["retrying"]) == (4, 1, 3, 3)
    assert data["oldest_unfinished_age"] == pytest.approx(600, abs=10)
    assert data["oldest_ready_age"] < 60  # the outage does not show in the ready age
    assert [(d["destination"], d["state"]) for d in data["destinations"]] == [
        (API, "open"), ("kafka k1:9092", "paused")
    ]  # fmt: skip

    text = outbox("stats", "--dsn", dsn).stdout
    rows = {line.split("  ")[0]: line for line in text.splitlines()}
    assert rows["retrying"].split()[1:] == ["3", "(waiting", "out", "a", "backoff)"]
    # 10m and the seconds the commands took since the rows were written (a loaded machine).
    minutes, seconds = rows["oldest unfinished age"].split()[3:]
    assert minutes == "10m" and int(seconds.removesuffix("s")) < 30
    assert rows["destinations"].endswith(
        f"2: {API} open, kafka k1:9092 paused (see outbox destinations)"
    )
