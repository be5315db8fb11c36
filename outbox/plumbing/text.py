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


# What a line escapes, as a terminal or a log reader would not show it as itself: first what
# Python's `repr` escapes (`str.isprintable`): the controls, C0 (newline and tab included),
# DEL and C1, which a terminal takes for commands (ESC starts a sequence that can retitle,
# clear or recolour it; CR and LF forge a line); the format characters (Cf): the bidirectional
# embeddings, overrides and isolates, which reorder what follows them so that a name shows as
# another (CVE-2021-42574, "Trojan Source"), the marks (LRM, RLM, ALM), the zero-width space and
# joiners, the BOM, the tags, all invisible, so that two names differing by one print alike;
# the line and paragraph separators (U+2028, U+2029), which some terminals and log viewers
# break lines at; the spaces other than the space (a no-break space reads as one); the
# surrogates, which no UTF-8 stream can write (an argument's undecodable bytes arrive as
# them); private-use and unassigned characters, which show as a font or a terminal pleases.
# Then the default-ignorable characters `repr` leaves as they are, being letters or marks
# rather than format characters, yet shown as nothing: the combining grapheme joiner, the
# Hangul fillers, the Khmer inherent vowels, the Mongolian variation selectors and the
# variation selectors (`outbox\ufe0f` would read as `outbox`).
# Right-to-left text and emoji sequences that need a mark, a joiner or a variation selector
# show it as its escape: a line about a table must say which table it is before it reads well.
# Characters that look like others (the Cyrillic a, U+0430, for the Latin a) are shown as they are.
_INVISIBLE_PRINTABLE = re.compile(
    "[\u034f\u115f\u1160\u17b4\u17b5\u180b-\u180f\u3164\ufe00-\ufe0f\uffa0\U000e0100-\U000e01ef]"
)


def _shows_as_itself(char: str) -> bool:
    return char.isprintable() and not _INVISIBLE_PRINTABLE.match(char)


def _escape(char: str) -> str:
    """Python's escape for the character, also for the invisible ones `repr` keeps."""
    if not _INVISIBLE_PRINTABLE.match(char):
        return repr(char)[1:-1]
    code = ord(char)
    return f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}"


def _escaped(text: str, keep: str, backslash: bool) -> str:
    if (
        text.isprintable()
        and not _INVISIBLE_PRINTABLE.search(text)
        and not (backslash and "\\" in text)
    ):
        return text
    return "".join(
        c if (_shows_as_itself(c) and not (backslash and c == "\\")) or c in keep else _escape(c)
        for c in text
    )


def printable(text: str, *, keep: str = "") -> str:
    """`text` with every character listed above but those in `keep` shown as its Python
    escape (`\\x1b`, `\\n`, `\\u202e`, `\\ufe0f`), so that text from a downstream, a row or
    an argument prints without terminal commands, line breaks or reordering, and with no
    control, format or default-ignorable character left invisible. Nothing is dropped: the
    escape says which character was there. Characters that merely look like others are
    not told apart. Backslashes are left as they are, so a message may quote what was
    shown already (a table's name, an error stored escaped) and pass through it again
    unchanged; the four characters `\\x01` and the character U+0001 read alike:
    a name shown for itself takes `printable_name`."""
    return _escaped(text, keep, backslash=False)


def printable_name(text: str) -> str:
    """A name (a table's, a destination's, an event type) as a line shows it: escaped as
    `printable` escapes it, and each backslash doubled, so that an escape and the character
    it names do not show alike (the four characters `\\x01` show as `\\\\x01`, the
    character U+0001 as `\\x01`) and the escapes read back, as Python reads them, as the
    name. Names that differ only by characters that look alike (the Cyrillic a, U+0430, for
    the Latin a) still show alike. Once, on the name itself: a message quoting it goes through
    `printable`, which leaves its escapes as they are."""
    return _escaped(text, "", backslash=True)


# What an input check refuses in text to be stored or compared (an event type, an aggregate,
# a reason, an actor, a destination's name): the controls, C0 (newline and tab included), DEL
# and C1, which a terminal or a log reader takes for commands and line breaks; the
# bidirectional embeddings, overrides and isolates, which reorder what follows them so that
# the text shows as other text (CVE-2021-42574); lone surrogates, which are no text at all
# (an argument's undecodable bytes arrive as them) and which no UTF-8 column or stream takes.
# Nothing more: a no-break space, a joiner in an emoji sequence, a left-to-right or
# right-to-left mark, a private-use character are ordinary text, which rows hold and a filter
# must match; lines for people show them escaped (`printable`), but they are not refused.
_UNSAFE = re.compile(r"[\x00-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069\ud800-\udfff]")


def _kind(char: str) -> str:
    if "\ud800" <= char <= "\udfff":
        return "a lone surrogate"
    if char in "\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069":
        return "a bidirectional embedding, override or isolate"
    return "a control character"


def first_unsafe(text: str) -> str | None:
    """The first character of `text` that an input check refuses (see above), said with
    its kind and escaped as `printable` shows it (`a control character (\\x1b)`); None if
    none."""
    found = _UNSAFE.search(text)
    return None if found is None else f"{_kind(found[0])} ({printable(found[0])})"


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
