"""Logging for every component: JSON lines in containers, readable lines on a terminal."""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from outbox.plumbing.text import printable

_STANDARD = set(logging.makeLogRecord({}).__dict__) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        entry.update({k: v for k, v in record.__dict__.items() if k not in _STANDARD})
        if record.exc_info:
            entry["traceback"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


class TextFormatter(logging.Formatter):
    """`time level logger: message`, one record one line: a message quotes what downstreams
    and rows hold, whose ESC would drive the terminal and whose line break would forge a
    record; their control characters are shown escaped (outbox.plumbing.text.printable)."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)-7s %(name)s: %(message)s")

    def formatMessage(self, record: logging.LogRecord) -> str:
        # A copy: other handlers of the record see it as it was logged.
        safe = logging.makeLogRecord({**record.__dict__, "message": printable(record.message)})
        return super().formatMessage(safe)

    def formatException(self, ei: Any) -> str:
        # A traceback keeps its lines (people read it under its record); nothing else passes.
        return printable(super().formatException(ei), keep="\n")

    def formatStack(self, stack_info: str) -> str:
        return printable(super().formatStack(stack_info), keep="\n")


def configure(log_format: str, level: str, quieter: Mapping[str, int] | None = None) -> None:
    """Log to stderr; `quieter` raises the level of a component's chattier libraries."""
    handler = logging.StreamHandler(sys.stderr)
    use_json = log_format == "json" or (log_format == "auto" and not sys.stderr.isatty())
    handler.setFormatter(JsonFormatter() if use_json else TextFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
    for name, floor in (quieter or {}).items():
        logging.getLogger(name).setLevel(max(floor, logging.getLevelName(level)))
