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
from outbox.plumbing.text import first_unsafe, printable, printable_name
from outbox.schema import migrate
from outbox.table import Table, shown_argument

# Line breaks end lines; the bidirectional overrides reorder them; the format characters
# (zero-width, marks, BOM, soft hyphen, tags) and separators are invisible or break lines.
CONTROL = re.compile(
    r"[\x00-\x09\x0b-\x1f\x7f-\xa0\xad\u061c\u200b-\u200f\u2028-\u202e\u2060-\u2069\ufeff"
    r"\U000e0000-\U000e007f\ud800-\udfff]"
)


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
# escaped, and so does a right-to-left override (which would show `xob` for `box`) and a
# zero-width space; a backslash shows doubled, so that the four characters `\x07` do not show
# as the BEL. `--json` keeps the name exact.
ODD = "out\nbox\x1b[2J\u202exob\u200b\\x07"
ODD_SHOWN = r"out\nbox\x1b[2J\u202exob\u200b\\x07"


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


def test_a_table_name_with_a_variation_selector_does_not_read_as_another(empty_dsn):
    """`outbox\ufe0f` shows as nothing more than `outbox` where printed raw."""
    table = Table(None, "outbox\ufe0f")
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        migrate(conn, table)
    done = outbox(empty_dsn, "stats", "--table", table.name)
    assert done.returncode == 0, done.stderr
    assert r"outbox\ufe0f" in done.stdout and "\ufe0f" not in done.stdout, done.stdout


def test_json_keeps_a_table_name_exact(empty_dsn):
    table = Table(None, ODD)
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        migrate(conn, table, layout=Layout(100, 2))
    listing = outbox(empty_dsn, "partitions", "--json", "--table", ODD)
    assert listing.returncode == 0, listing.stderr
    found = json.loads(listing.stdout)
    assert found["table"] == ODD
    assert found["partitions"][0]["name"] == f"{ODD}_p0"


@pytest.mark.parametrize(
    "name", [ODD, "plain", "it's\t\\x\x85", 'app."a.b\nc"', "tag\U000e0041\u200d\xa0end"]
)
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


def test_an_error_line_keeps_the_escapes_of_the_command_it_suggests(empty_dsn):
    """The error line escapes what it says as a message: the `--table` argument it suggests,
    written already in the shell's quotes, keeps its escapes (escaped again, its `\\\\x07`
    would read back as another name), and nothing it quotes reaches the terminal raw."""
    missing = outbox(empty_dsn, "stats", "--table", ODD)
    assert missing.returncode == 1, missing
    [line] = missing.stderr.splitlines()
    assert not CONTROL.search(line), repr(line)
    suggested = re.search(r"--table (\$'.*')`$", line)
    assert suggested is not None, line
    read = subprocess.run(
        ["bash", "-c", f"printf %s {suggested[1]}"], capture_output=True, check=True
    ).stdout.decode()
    assert read == ODD


# What a terminal would not show as itself, and how a line shows it.
HIDDEN = [
    ("\u202e", r"\u202e"),  # right-to-left override: `xob` shows as `box`
    ("\u2067", r"\u2067"),  # right-to-left isolate
    ("\u200b", r"\u200b"),  # zero-width space: `ord\u200bers` shows as `orders`
    ("\u200d", r"\u200d"),  # zero-width joiner
    ("\u200f", r"\u200f"),  # right-to-left mark
    ("\u061c", r"\u061c"),  # Arabic letter mark
    ("\ufeff", r"\ufeff"),  # byte order mark
    ("\xad", r"\xad"),  # soft hyphen
    ("\U000e0041", r"\U000e0041"),  # tag A: invisible, smuggles ASCII
    ("\u2028", r"\u2028"),  # line separator
    ("\u2029", r"\u2029"),  # paragraph separator
    ("\xa0", r"\xa0"),  # no-break space: reads as a space
    ("\ue000", r"\ue000"),  # private use
    ("\udcff", r"\udcff"),  # a lone surrogate (an argument's undecodable byte): unwritable
    # Default-ignorable, shown as nothing, yet letters or marks that repr keeps:
    ("\ufe0f", r"\ufe0f"),  # variation selector 16: `outbox\ufe0f` reads as `outbox`
    ("\ufe00", r"\ufe00"),  # variation selector 1
    ("\U000e0100", r"\U000e0100"),  # variation selector 17
    ("\U000e01ef", r"\U000e01ef"),  # variation selector 256
    ("\u034f", r"\u034f"),  # combining grapheme joiner
    ("\u115f", r"\u115f"),  # Hangul choseong filler
    ("\u1160", r"\u1160"),  # Hangul jungseong filler
    ("\u3164", r"\u3164"),  # Hangul filler
    ("\uffa0", r"\uffa0"),  # halfwidth Hangul filler
    ("\u17b4", r"\u17b4"),  # Khmer vowel inherent aq
    ("\u17b5", r"\u17b5"),  # Khmer vowel inherent aa
    ("\u180b", r"\u180b"),  # Mongolian free variation selector one
    ("\u180f", r"\u180f"),  # Mongolian free variation selector four
    ("\\", "\\\\"),  # the escapes' own mark
]


@pytest.mark.parametrize(("char", "escape"), HIDDEN, ids=[e for _, e in HIDDEN])
def test_a_character_a_terminal_would_not_show_as_itself_is_shown_escaped(char, escape):
    name = printable_name(f"ord{char}ers")
    assert name == f"ord{escape}ers"
    name.encode()  # writable to a UTF-8 terminal
    if char != "\\":
        assert printable(f"ord{char}ers") == name


@pytest.mark.parametrize(
    "text",
    ["a\x01", "a\\x01", "a\\\\x01", "\\", "\\\\", "x\u202e\\u202e", "\\U000e0041\U000e0041",
     "é ü 名前 \u0301 \xa0\t\n", "\\N{BEL}\x07", "outbox\ufe0f\U000e0100\u3164"],
)  # fmt: skip
def test_a_name_shown_reads_back_as_the_name(text):
    """Unambiguous: the escapes read back (as Python reads them) as the name, so no two
    names show alike: the four characters `\\x01` and the character U+0001 differ."""
    shown = printable_name(text)
    assert shown.isprintable()
    assert shown.encode("latin-1", "backslashreplace").decode("unicode_escape") == text


def test_a_literal_escape_and_the_character_it_names_show_differently():
    assert printable_name("a\\x01") == r"a\\x01"
    assert printable_name("a\x01") == r"a\x01"
    assert printable_name("app\\u202e") != printable_name("app\u202e")


def test_a_message_keeps_the_escapes_of_the_names_it_quotes():
    """A message quoting a name shown already, or text stored escaped, is escaped again as
    a whole: its escapes stay as they are, its own controls do not pass."""
    name = printable_name("out\x1bbox\\x07")
    message = f"table {name} is gone\x1b[2J\u202e"
    assert printable(message) == r"table out\x1bbox\\x07 is gone\x1b[2J\u202e"
    assert printable(printable(message)) == printable(message)


# What an input (an event type, an aggregate, a reason, an actor, a destination) may not
# hold, and how the refusal says it; everything else is text a row may hold.
UNSAFE = [
    ("\x1b", r"a control character (\x1b)"),
    ("\n", r"a control character (\n)"),
    ("\x7f", r"a control character (\x7f)"),
    ("\x9b", r"a control character (\x9b)"),
    ("\u202a", r"a bidirectional embedding, override or isolate (\u202a)"),
    ("\u202e", r"a bidirectional embedding, override or isolate (\u202e)"),
    ("\u2066", r"a bidirectional embedding, override or isolate (\u2066)"),
    ("\u2069", r"a bidirectional embedding, override or isolate (\u2069)"),
    ("\udcff", r"a lone surrogate (\udcff)"),
]


@pytest.mark.parametrize(("char", "said"), UNSAFE, ids=[s for _, s in UNSAFE])
def test_an_input_refuses_what_is_unsafe_to_store_or_compare_saying_what_it_is(char, said):
    assert first_unsafe(f"ord{char}ers{char}") == said


@pytest.mark.parametrize(
    "char", ["\xa0", "\u200d", "\u200e", "\u200f", "\u061c", "\ue000", "\u200b", "\xad",
             "\u2028", "\U000e0041", "\ufe0f", "\\", "é", "名"],
)  # fmt: skip
def test_an_input_takes_ordinary_text_a_line_shows_escaped(char):
    assert first_unsafe(f"ord{char}ers") is None
