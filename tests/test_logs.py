"""The text log format (a worker or the operator on a terminal): one record is one line,
and what a message quotes from downstreams or rows never drives the terminal."""

from __future__ import annotations

import io
import logging
import re

import pytest

from outbox.plumbing.logs import TextFormatter

EVIL = "\x1b]0;pwned\x07\x1b[2J\x1b[31mEVIL\nline2"
SHOWN = r"\x1b]0;pwned\x07\x1b[2J\x1b[31mEVIL\nline2"
# A record's first line: time, level, logger.
START = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} (INFO|WARNING|ERROR) +test\.logs: ")


def _logged(formatter: logging.Formatter, emit) -> str:
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(formatter)
    logger = logging.getLogger("test.logs")
    logger.addHandler(handler)
    logger.propagate = False
    logger.setLevel(logging.INFO)
    try:
        emit(logger)
    finally:
        logger.removeHandler(handler)
    return out.getvalue()


@pytest.mark.parametrize(
    ("emit", "message"),
    [
        (lambda log: log.warning("destination down (last: %s)", f"HTTP 500: {EVIL}"),
         f"destination down (last: HTTP 500: {SHOWN})"),
        (lambda log: log.info(f"C1 \x9b31m, DEL \x7f, tab \t, CR \r{EVIL}"),
         rf"C1 \x9b31m, DEL \x7f, tab \t, CR \r{SHOWN}"),
    ],
    ids=["argument", "message"],
)  # fmt: skip
def test_a_message_is_one_line_with_its_control_characters_escaped(emit, message):
    text = _logged(TextFormatter(), emit)
    [line] = text.splitlines()
    assert START.match(line), line
    assert line[START.match(line).end() :] == message


def test_a_traceback_keeps_its_lines_and_loses_its_escapes():
    def emit(log: logging.Logger) -> None:
        try:
            raise RuntimeError(f"refused: {EVIL}")
        except RuntimeError:
            log.exception("could not write %s", "x\ny")

    first, *traceback = _logged(TextFormatter(), emit).splitlines()
    assert first.endswith(r"could not write x\ny")
    assert traceback[0] == "Traceback (most recent call last):"
    # The exception's own line break stays (people read a traceback as lines); ESC does not.
    assert traceback[-2:] == [r"RuntimeError: refused: \x1b]0;pwned\x07\x1b[2J\x1b[31mEVIL",
                              "line2"]  # fmt: skip
    assert not any("\x1b" in line or "\x07" in line for line in traceback)
