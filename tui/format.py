"""How numbers, ages and times are written on screen: short, stable widths, no locale."""

from __future__ import annotations

from datetime import datetime

from outbox.plumbing.text import age as age  # the one way to write an age, shared with `outbox`
from outbox.plumbing.text import printable


def count(n: int) -> str:
    return f"{n:,}"


def short_count(n: float) -> str:
    """1234 -> 1.2k, 1234567 -> 1.2M: for cramped panels."""
    for size, unit in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(n) >= size:
            return f"{n / size:.1f}{unit}"
    return f"{n:.0f}"


def since(moment: datetime | None, now: datetime) -> str:
    """Age of a timestamp relative to `now` (the injected clock)."""
    if moment is None:
        return "-"
    return age((now - moment).total_seconds())


def relative(moment: datetime | None, now: datetime) -> str:
    """`in 41s` for a future moment, `3m 02s ago` for a past one (lease expiries)."""
    if moment is None:
        return "-"
    seconds = (moment - now).total_seconds()
    return f"in {age(seconds)}" if seconds >= 0 else f"{age(-seconds)} ago"


def duration(seconds: float) -> str:
    """A setting in its largest whole unit (0.5s, 2s, 90s, 1m, 1h), as the flags take it."""
    if seconds >= 3600 and seconds % 3600 == 0:
        return f"{seconds / 3600:g}h"
    if seconds >= 60 and seconds % 60 == 0:
        return f"{seconds / 60:g}m"
    return f"{seconds:g}s"


def rate(per_second: float | None) -> str:
    if per_second is None:
        return "-"
    if per_second >= 100:
        return f"{per_second:,.0f}/s"
    return f"{per_second:.1f}/s"


def clock_time(moment: datetime) -> str:
    return moment.strftime("%H:%M:%S")


def timestamp(moment: datetime | None) -> str:
    if moment is None:
        return "-"
    return moment.isoformat(sep=" ", timespec="seconds")


def one_line(text: str | None, width: int) -> str:
    """The first line of a (possibly multi-line) error, cut to `width` with an ellipsis;
    control characters escaped (an ESC from a downstream would drive the terminal)."""
    if not text:
        return ""
    line = printable(" ".join(text.split()))
    return line if len(line) <= width else line[: max(width - 1, 0)] + "…"
