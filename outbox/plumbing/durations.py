"""Durations as settings take them: `500ms`, `60s`, `5m`, `2h`, `7d`, and back to text."""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import timedelta

from outbox.plumbing.ranges import within

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*$")
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}

# The longest duration any setting accepts: far beyond any sensible one, and well inside
# what Python's timedelta and PostgreSQL's timestamps can add to now().
MAX_DURATION = timedelta(days=36500)


def parse_duration(text: str) -> timedelta:
    """Parse `250ms`, `60s`, `5m`, `2h`, `7d`; a bare number means seconds."""
    match = _DURATION.match(text)
    if match is None and _DURATION.match(text.strip().removeprefix("-")):
        raise ValueError(f"{text!r} is negative (a duration is 0s or more)")
    if match is None:
        raise ValueError(f"{text!r} is not a duration (use e.g. 250ms, 60s, 5m, 2h, 7d)")
    number, unit = match.groups()
    seconds = float(number) * _UNIT_SECONDS[unit or "s"]
    if seconds > MAX_DURATION.total_seconds():
        raise ValueError(f"{text!r} is longer than {format_duration(MAX_DURATION)}")
    return timedelta(seconds=seconds)


def duration_between(low: timedelta, high: timedelta) -> Callable[[str], timedelta]:
    """A parser of durations from `low` to `high`, for settings with a sensible range."""
    return within(parse_duration, low, high, format_duration)


def format_duration(value: timedelta) -> str:
    """A duration as `parse_duration` reads it back, in its largest whole unit: `250ms`,
    `90s`, `5m`, `7d`; none at all is `0s`, as the settings' docs write it."""
    seconds = value.total_seconds()
    if seconds == 0:
        return "0s"
    if seconds < 1:
        return f"{seconds * 1000:g}ms"
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{seconds / size:g}{unit}"
    return f"{seconds:g}s"


__all__ = ["MAX_DURATION", "duration_between", "format_duration", "parse_duration"]
