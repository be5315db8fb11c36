"""JSON text for people, bounded: however deep or long a value is, nothing here recurses.

PostgreSQL takes jsonb nested far deeper than Python's `json` module decodes (which raises
RecursionError near a thousand levels) or any screen shows, and payloads come from
applications: one 15,000 levels deep must not crash a tool that looks at it. So values that
are only shown are kept as text (as PostgreSQL writes them), laid out by a loop over their
tokens, and only small values of the project's own are decoded, after their depth is known.
"""

from __future__ import annotations

import json
import re
from typing import Any

# Decoding is refused past this depth: far below Python's recursion limit, far above any
# value the project writes (`errors`: a list of flat objects).
MAX_DECODE_DEPTH = 64
# Laying out: levels deeper than this stay on one line, inside their parent's line.
MAX_LAYOUT_DEPTH = 24

# A string (possibly cut short at the end of the text), a punctuation mark, or a run of
# anything else (numbers, true, false, null; garbage is passed through as it is).
_TOKEN = re.compile(r'"(?:[^"\\]|\\.)*(?:"|\\?$)|[{}\[\],:]|[^\s{}\[\],:"]+')


def nesting_depth(text: str) -> int:
    """How deep the arrays and objects of a JSON text go (0 for a scalar)."""
    depth = deepest = 0
    for match in _TOKEN.finditer(text):
        token = match.group()
        if token in ("{", "["):
            depth += 1
            deepest = max(deepest, depth)
        elif token in ("}", "]"):
            depth -= 1
    return deepest


def loads_bounded(text: str, max_depth: int = MAX_DECODE_DEPTH) -> Any:
    """`json.loads`, for a value no deeper than `max_depth`; ValueError otherwise."""
    depth = nesting_depth(text)
    if depth > max_depth:
        raise ValueError(f"JSON nested {depth} deep (at most {max_depth} is decoded)")
    return json.loads(text)


def layout(text: str, *, indent: int = 2, max_depth: int = MAX_LAYOUT_DEPTH) -> str:
    """JSON text indented for reading, one member per line, in the order written.

    Levels deeper than `max_depth` stay on their parent's line. A text cut short (a bounded
    preview) is laid out as far as it goes; one that is not JSON comes back much as it was.
    """
    out: list[str] = []
    depth = 0
    tokens = [m.group() for m in _TOKEN.finditer(text)]
    n = len(tokens)
    i = 0
    while i < n:
        token = tokens[i]
        if token in ("{", "["):
            closer = "}" if token == "{" else "]"
            if i + 1 < n and tokens[i + 1] == closer:  # empty: [] and {} stay whole
                out.append(token + closer)
                i += 2
                continue
            depth += 1
            out.append(token)
            if depth <= max_depth:
                out.append("\n" + " " * (indent * depth))
        elif token in ("}", "]"):
            if 0 < depth <= max_depth:
                out.append("\n" + " " * (indent * (depth - 1)))
            depth = max(depth - 1, 0)
            out.append(token)
        elif token == ",":
            out.append("," + ("\n" + " " * (indent * depth) if depth <= max_depth else " "))
        elif token == ":":
            out.append(": ")
        else:
            out.append(token)
        i += 1
    return "".join(out)


__all__ = ["MAX_DECODE_DEPTH", "MAX_LAYOUT_DEPTH", "layout", "loads_bounded", "nesting_depth"]
