"""What `outbox` prints from the database reaches the terminal as text: a database error
quotes what it was given (a trigger's message, a value), and its control characters are
shown escaped, on the one error line every command writes."""

from __future__ import annotations

import json
import re
import subprocess

import psycopg
import pytest
from helpers import outbox_on as outbox
from helpers import seed

from outbox import enqueue
from outbox.cli import main
from outbox.partitions import Layout
from outbox.schema import migrate
from outbox.table import Table, shown_argument

# Line breaks end lines; the bidirectional overrides reorder them.
CONTROL = re.compile(r"[\x00-\x09\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def test_a_database_error_is_printed_escaped(conn, dsn, capsys):
    (message_id,) = seed(conn, 1)
    conn.execute("UPDATE outbox SET status = 'dead' WHERE id = %s", (message_id,))
    # Another tool's trigger refuses the change with a message of its own.
    conn.execute(
        "CREATE FUNCTION refuse() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
        "RAISE EXCEPTION 'frozen by %', E'ops\\x1b]0;pwned\\x07\\x1b[2J\\n'; END $$"
    )
    conn.execute(
        "CREATE TRIGGER refuse BEFORE UPDATE ON outbox FOR EACH ROW EXECUTE FUNCTION refuse()"
    )
    with pytest.raises(SystemExit) as exited:
        main(["requeue", "--dsn", dsn, "--id", str(message_id)])
    assert exited.value.code == 1
    err = capsys.readouterr().err
    assert r"frozen by ops\x1b]0;pwned\x07\x1b[2J" in err, err
    assert not CONTROL.search(err) and err.count("\n") == 1, repr(err)


# A quoted identifier may hold any character but NUL: a line break and an ESC in a table's
# name are legal, and every line that names the table (or one of its partitions) shows them
# escaped, and so does a right-to-left override (which would show `xob` for `box`).
# `--json` keeps the name exact.
ODD = "out\nbox\x1b[2J\u202exob"
ODD_SHOWN = r"out\nbox\x1b[2J\u202exob"


@pytest.mark.parametrize(
    "command",
    [
        ["migrate", "--partition-size", "100", "--partitions-ahead", "2"],
        ["stats"],
        ["partitions"],
        ["maintain", "--retention", "0s"],
        ["purge", "--older-than", "0s"],
        ["requeue", "--all-dead", "--dry-run"],
        ["destinations"],
        [
            "replay",
            "--since",
            "2000-01-01T00:00:00Z",
            "--until",
            "2100-01-01T12:00:00Z",
            "--dry-run",
        ],
    ],
    ids=lambda command: command[0],
)
def test_a_table_name_with_control_characters_prints_escaped(empty_dsn, command):
    table = Table(None, ODD)
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        migrate(conn, table, layout=Layout(100, 2))
        enqueue(conn, aggregate_type="a", aggregate_id="1", event_type="E", payload={},
                table=table)  # fmt: skip
    done = outbox(empty_dsn, *command, "--table", ODD)
    assert done.returncode == 0, done.stderr
    assert ODD_SHOWN in done.stdout, done.stdout
    assert not CONTROL.search(done.stdout), repr(done.stdout)
    assert "\nbox" not in done.stdout, done.stdout  # no line begins inside the name


def test_json_keeps_a_table_name_exact(empty_dsn):
    table = Table(None, ODD)
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        migrate(conn, table, layout=Layout(100, 2))
    listing = outbox(empty_dsn, "partitions", "--json", "--table", ODD)
    assert listing.returncode == 0, listing.stderr
    found = json.loads(listing.stdout)
    assert found["table"] == ODD
    assert found["partitions"][0]["name"] == f"{ODD}_p0"


@pytest.mark.parametrize("name", [ODD, "plain", "it's\t\\x\x85", 'app."a.b\nc"'])
def test_a_table_argument_shown_is_read_back_by_the_shell_as_the_table(name):
    """The `--table` argument a line suggests prints no control character, and bash reads
    it back as the same table."""
    table = Table.parse(name)
    argument = shown_argument(table)
    assert not CONTROL.search(argument) and "\n" not in argument
    read = subprocess.run(
        ["bash", "-c", f"printf %s {argument}"], capture_output=True, check=True
    ).stdout.decode()
    assert Table.parse(read) == table
