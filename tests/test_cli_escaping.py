"""What `outbox` prints from the database reaches the terminal as text: a database error
quotes what it was given (a trigger's message, a value), and its control characters are
shown escaped, on the one error line every command writes."""

from __future__ import annotations

import re

import pytest
from helpers import seed

from outbox.cli import main

CONTROL = re.compile(r"[\x00-\x09\x0b-\x1f\x7f-\x9f]")  # line breaks end lines


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
