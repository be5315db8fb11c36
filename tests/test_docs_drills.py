"""The commands of docs/partitioning.md, docs/replay.md and docs/receiving.md, taken from the
pages and run as a reader would, with what the pages say they print: a page that drifts from
the command it shows fails here.

- partitioning.md's replay of a window retention took: the command as written (its times with
  their offsets) and its answer, wrapped in the page, word for word;
- receiving.md's inbox table: the SQL the page shows is what `outbox inbox migrate --print`
  makes, comments aside;
- receiving.md's Python: the page's migrate, then its snippet, records in that table;
- replay.md's Ctrl-C: a replay stopped mid-batch prints the page's line (exit 130), and the
  page's resume command sends the rest, each message once; its reconcile without a consumer
  on an inbox of several exits 2 naming them."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import psycopg
from helpers import interrupted_on_a_locked_row, seed

from outbox import inbox

DOCS = Path(__file__).resolve().parent.parent / "docs"
# The reader's shell: no OUTBOX_* or PG* variable but those a drill sets.
BASE_ENV = {k: v for k, v in os.environ.items() if not k.startswith(("OUTBOX_", "PG"))}


def outbox(argv: list[str], dsn: str) -> subprocess.CompletedProcess[str]:
    """A documented `outbox ...` command line, run with OUTBOX_DSN exported."""
    assert argv[0] == "outbox", argv
    return subprocess.run(
        [sys.executable, "-m", "outbox", *argv[1:]],
        capture_output=True,
        text=True,
        timeout=60,
        env={**BASE_ENV, "OUTBOX_DSN": dsn},
    )


def blocks(page: str, language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", (DOCS / page).read_text(), flags=re.S)


def without_sql_comments(text: str) -> str:
    return " ".join(re.sub(r"--[^\n]*", "", text).split())


def test_partitionings_replay_of_a_retired_window_runs_as_written_and_answers_as_shown(
    conn: psycopg.Connection[Any], dsn: str
) -> None:
    [example] = [b for b in blocks("partitioning.md", "text") if b.startswith("$ outbox replay")]
    command, *shown = example.strip().splitlines()
    first, *_ = seed(conn, 3)
    conn.execute("UPDATE outbox SET status = 'done', done_at = now()")
    conn.execute("DELETE FROM outbox WHERE id = %s", [first])  # retired, as the page says
    [oldest] = conn.execute("SELECT created_at FROM outbox ORDER BY id LIMIT 1").fetchone()
    conn.commit()

    result = outbox(shlex.split(command.removeprefix("$ ")), dsn)

    assert result.returncode == 0, result.stderr
    # The page wraps the one line it prints; its oldest message is another table's.
    expected = re.sub(
        r"created at \S+:", f"created at {oldest.isoformat()}:", " ".join(shown)
    )  # fmt: skip
    assert result.stdout == expected + "\n"


def test_the_inbox_table_receiving_shows_is_the_one_inbox_migrate_makes(dsn: str) -> None:
    text = (DOCS / "receiving.md").read_text()
    section = text.split("## The table", 1)[1]
    shown = blocks("receiving.md", "sql")
    [table] = [b for b in shown if b in section and "CREATE TABLE" in b]
    [printing] = [
        shlex.split(line.split("#")[0])
        for b in blocks("receiving.md", "sh")
        for line in b.splitlines()
        if "--print" in line
    ]

    result = outbox(printing, dsn)

    assert result.returncode == 0, result.stderr
    assert without_sql_comments(table) == without_sql_comments(result.stdout)


def stopped_while_waiting_on(
    conn: psycopg.Connection[Any], dsn: str, locked: int
) -> tuple[int, str]:
    """A replay in batches of 10, Ctrl-C'd while its batch waits on a lock of row `locked`:
    its exit code and what it printed on stderr."""
    stopped = interrupted_on_a_locked_row(
        conn, dsn, locked,
        [sys.executable, "-m", "outbox", "replay", "--since", "1h", "--until", "0s",
         "--batch", "10", "--yes", "--reason", "drill"],
        env={**BASE_ENV, "OUTBOX_DSN": dsn},
    )  # fmt: skip
    conn.rollback()
    return stopped


def test_a_replay_stopped_by_ctrl_c_says_so_as_shown_and_the_shown_resume_sends_the_rest(
    conn: psycopg.Connection[Any], dsn: str
) -> None:
    """Stopped while its third batch waits on a row lock: the two batches before it are sent
    and recorded, the third rolled back; the page's resume sends the ten left, once each."""
    text = (DOCS / "replay.md").read_text()
    stopped_line = text.split("Ctrl-C prints how to go on", 1)[1].split("```")[1].strip()
    [resume] = [b.strip() for b in blocks("replay.md", "sh") if "--resume" in b]
    ids = seed(conn, 30)
    conn.execute("UPDATE outbox SET status = 'done', done_at = now()")
    conn.commit()

    returncode, stderr = stopped_while_waiting_on(conn, dsn, ids[25])

    assert returncode == 130, stderr
    pattern = re.sub(r"\d+", r"(\\d+)", re.escape(stopped_line))
    match = re.fullmatch(pattern, stderr.strip())
    assert match, stderr
    number, sent, batches, resume_number = map(int, match.groups())
    assert (sent, batches) == (20, 2)
    assert resume_number == number
    conn.rollback()
    assert conn.execute(
        "SELECT count(*) FROM outbox WHERE status = 'pending' AND replay = %s", (number,)
    ).fetchone() == (20,)

    argv = shlex.split(resume.replace('"$OUTBOX_DSN"', shlex.quote(dsn)))
    argv[argv.index("--resume") + 1] = str(number)
    result = outbox(argv, dsn)

    assert result.returncode == 0, result.stderr
    assert f"replay {number}: sent 10 messages again" in result.stdout
    assert conn.execute(
        "SELECT count(*) FROM outbox WHERE status = 'pending' AND replay = %s", (number,)
    ).fetchone() == (30,)
    batches_recorded = conn.execute(
        "SELECT count, message_ids FROM outbox_actions WHERE action = 'replay'"
    ).fetchall()
    assert sum(count for count, _ in batches_recorded) == 30
    assert sorted(i for _, sent_ids in batches_recorded for i in sent_ids) == ids


def test_receivings_python_records_in_the_table_the_shown_migrate_made(empty_dsn: str) -> None:
    """The page makes `billing_inbox` (`outbox inbox migrate --dsn ... --table billing_inbox`),
    then records in Python: twice the same key, the effect once."""
    [migrating] = [
        shlex.split(line.split("#")[0].replace('"$RECEIVER_DSN"', shlex.quote(empty_dsn)))
        for b in blocks("receiving.md", "sh")
        for line in b.splitlines()
        if line.startswith("outbox inbox migrate --dsn")
    ]
    section = (DOCS / "receiving.md").read_text().split("## In Python", 1)[1]
    [snippet] = re.findall(r"```python\n(.*?)```", section, flags=re.S)[:1]
    assert outbox(migrating, empty_dsn).returncode == 0
    with psycopg.connect(empty_dsn) as conn:
        conn.execute("CREATE TABLE invoices (id int PRIMARY KEY, paid boolean NOT NULL)")
        conn.execute("INSERT INTO invoices VALUES (7, false)")
        conn.commit()
        paid = "SELECT paid FROM invoices WHERE id = 7"
        exec(snippet, {"conn": conn, "key": "42", "invoice_id": 7})  # our own docs' code
        assert conn.execute(paid).fetchone() == (True,)  # the first delivery: applied
        conn.execute("UPDATE invoices SET paid = false")  # shows whether it applies again
        conn.commit()
        exec(snippet, {"conn": conn, "key": "42", "invoice_id": 7})  # its duplicate
        assert conn.execute(paid).fetchone() == (False,)
        assert conn.execute("SELECT consumer, message_id FROM billing_inbox").fetchall() == [
            ("billing", "42")
        ]


def test_reconcile_without_consumer_names_the_ones_it_found_and_exits_2(dsn: str) -> None:
    """replay.md: "Without `--consumer`, the inbox's one consumer is used; with several, name
    one (exit 2)": the line lists the two found, and says there are more only when there are."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        inbox.migrate(conn, "outbox_inbox")
    for consumers, shown in (
        (["billing", "email"], "(billing, email)"),
        (["audit"], "(audit, billing, ...)"),
    ):
        with psycopg.connect(dsn) as conn:
            for consumer in consumers:
                with conn.transaction():
                    inbox.record(conn, consumer=consumer, message_id="1")
        result = outbox(
            ["outbox", "reconcile", "--dsn", dsn, "--inbox-dsn", dsn,
             "--inbox-table", "outbox_inbox", "--since", "24h", "--until", "0s"],
            dsn,
        )  # fmt: skip
        assert result.returncode == 2
        assert result.stderr == (
            f"outbox: error: inbox table outbox_inbox holds several consumers {shown}: "
            "name one with --consumer\n"
        )


def test_a_replay_stopped_in_its_second_batch_counts_the_one_batch_it_sent(
    conn: psycopg.Connection[Any], dsn: str
) -> None:
    ids = seed(conn, 30)
    conn.execute("UPDATE outbox SET status = 'done', done_at = now()")
    conn.commit()

    returncode, stderr = stopped_while_waiting_on(conn, dsn, ids[15])

    assert returncode == 130, stderr
    assert "stopped after 10 messages (1 batch);" in stderr
