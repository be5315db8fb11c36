"""How the commands write an error and an age for people: one way everywhere."""

from __future__ import annotations


def first_line(error: BaseException | str) -> str:
    """The first non-blank line of an error's text; an exception without text gives its
    class name."""
    text = str(error)
    for line in text.splitlines():
        if line.strip():
            return line.strip()
    return type(error).__name__ if isinstance(error, BaseException) else ""


def age(seconds: float | None) -> str:
    """A duration as its two largest units: 45s, 3m 12s, 2h 05m, 3d 04h; `-` for none."""
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


def storable(text: str, limit: int) -> str:
    """Text PostgreSQL will take: bounded, no NUL, no lone surrogates.

    Errors quote what downstreams sent back, binary bodies included; a text column refuses
    NUL, and a statement refused would never be written.
    """
    text = text[:limit].replace("\x00", "\\0")
    return text.encode("utf-8", "backslashreplace").decode("utf-8")
