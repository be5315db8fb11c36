"""How the commands write an error and an age for people: one way everywhere."""

from __future__ import annotations

import re
from collections.abc import Container, Sequence


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


# C0 (newline and tab included), DEL and C1: what a terminal or a log reader takes for a
# command (ESC starts a sequence that can retitle, clear or recolour a terminal; CR and LF
# forge a line) rather than for text.
# The bidirectional embeddings, overrides and isolates too: not controls of the terminal, but
# they reorder what follows them on the line, so that a name holding one can show as another
# (CVE-2021-42574, "Trojan Source"). The marks (RLM, LRM) only place the text near them, and
# right-to-left text may need them: kept.
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def printable(text: str, *, keep: str = "") -> str:
    """`text` with every control character (C0, DEL, C1) and bidirectional embedding,
    override and isolate but those in `keep` shown as its Python escape (`\\x1b`, `\\n`,
    `\\u202e`), so text from a downstream, a row or an argument prints as itself: no
    terminal command, no line break, no reordering. Nothing is dropped: the escape says
    which character was there."""
    return _CONTROL.sub(lambda m: m[0] if m[0] in keep else repr(m[0])[1:-1], text)


def first_control(text: str) -> str | None:
    """The first control character of `text`, escaped as `printable` shows it; None if none."""
    found = _CONTROL.search(text)
    return None if found is None else printable(found[0])


def aligned(rows: Sequence[Sequence[str]], *, right: Container[int] = ()) -> list[str]:
    """Rows of cells (the header first) as lines of columns two spaces apart, each as wide
    as its widest cell: the columns numbered in `right` (numbers) right-aligned, the rest
    left-aligned; no trailing blanks."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return [
        "  ".join(
            cell.rjust(width) if n in right else cell.ljust(width)
            for n, (cell, width) in enumerate(zip(row, widths, strict=True))
        ).rstrip()
        for row in rows
    ]


def counted(n: int, noun: str, plural: str | None = None) -> str:
    """A count with its noun, singular for one only: `1 partition`, `0 partitions`,
    `3 partitions`; `plural` for a noun that takes more than an s (`batch`, `batches`).
    The noun may be a phrase ending in it: `counted(2, "dead message")`."""
    return f"{n} {noun if n == 1 else plural or noun + 's'}"
