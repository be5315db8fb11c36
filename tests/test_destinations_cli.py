"""`outbox destinations`, `outbox pause` and `outbox resume` as subprocesses against real
PostgreSQL: what each destination's row says, who paused it and why, the audit log written in
the same transaction, "nothing changed" told apart by its exit code; and `outbox stats`
telling an outage apart from a healthy queue."""

from __future__ import annotations

import getpass
import json
import os
import subprocess
import sys
from datetime import timedelta

import pytest
from helpers import seed

from outbox import destinations as dest
from outbox import repair
from outbox.cli import NOTHING_CHANGED
from outbox.runner import fetch

BASE_ENV = {k: v for k, v in os.environ.items() if not k.startswith(("OUTBOX_", "PG"))}
API = "https://api.test"


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


def _open(conn, table, destination: str, error: str) -> None:
    """The breaker opened by a failure with a Retry-After of 30 s, as a worker reports it."""

    def fail(row: dest.Destination, now) -> dest.Destination:
        failure = dest.Failure(1, error, retry_after=timedelta(seconds=30))
        return dest.failed(row, failure, owner="w1", now=now, policy=dest.Policy())

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
        f"outbox: error: {API} is not paused (no destination of that name has a row)\n"
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
    assert f"{API} is not paused: it is closed for 0s; nothing changed" in closed.stderr
    assert [a.action for a in fetch(conn, repair.recent_actions(table))] == ["resume", "pause"]


def test_an_open_breaker_is_not_resumed_by_hand_but_can_be_paused(conn, dsn, table):
    _open(conn, table, API, "HTTP 503: down")
    resumed = outbox("resume", API, "--dsn", dsn)
    assert resumed.returncode == 3
    assert "it is open for 0s (the breaker: it closes by itself" in resumed.stderr
    assert _rows(conn)[API][0] == "open"

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
    ],
)
def test_usage_errors_exit_2_with_one_line(args, env, named):
    result = outbox(*args, "--dsn", "host=nowhere.invalid", env=env)
    assert result.returncode == 2, result
    assert result.stdout == ""
    [line] = result.stderr.splitlines()
    assert line.startswith("outbox: error: ") and named in line


def test_destinations_on_a_table_without_the_destinations_table(conn, dsn):
    conn.execute("DROP TABLE outbox_destinations")
    result = outbox("destinations", "--dsn", dsn)
    assert result.returncode == 1
    assert result.stderr == (
        'outbox: error: table outbox is at an older schema (relation "outbox_destinations" '
        "does not exist); run `outbox migrate --table outbox`\n"
    )


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
    assert rows["oldest unfinished age"].split()[3:] in (["10m", "00s"], ["10m", "01s"])
    assert rows["destinations"].endswith(
        f"2: {API} open, kafka k1:9092 paused (see outbox destinations)"
    )
