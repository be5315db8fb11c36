"""How numbers, ages and times are written on screen: short, stable widths, no locale."""

from __future__ import annotations

from datetime import datetime


def count(n: int) -> str:
    return f"{n:,}"


def short_count(n: float) -> str:
    """1234 -> 1.2k, 1234567 -> 1.2M: for cramped panels."""
    for size, unit in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(n) >= size:
            return f"{n / size:.1f}{unit}"
    return f"{n:.0f}"


def age(seconds: float | None) -> str:
    """A duration as its two largest units: 45s, 3m 12s, 2h 05m, 3d 04h."""
    if seconds is None:
        return "-"
    s = max(int(seconds), 0)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m {s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h {s % 3600 // 60:02d}m"
    return f"{s // 86400}d {s % 86400 // 3600:02d}h"


def since(moment: datetime | None, now: datetime) -> str:
    """Age of a timestamp relative to `now` (the injected clock)."""
    if moment is None:
        return "-"
    return age((now - moment).total_seconds())


def until(moment: datetime | None, now: datetime) -> str:
    """`in 41s` for a future moment, `3m 02s ago` for a past one (lease expiries)."""
    if moment is None:
        return "-"
    seconds = (moment - now).total_seconds()
    return f"in {age(seconds)}" if seconds >= 0 else f"{age(-seconds)} ago"


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
    """The first line of a (possibly multi-line) error, cut to `width` with an ellipsis."""
    if not text:
        return ""
    line = " ".join(text.split())
    return line if len(line) <= width else line[: max(width - 1, 0)] + "…"
