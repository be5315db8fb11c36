"""How big a message may be: one source for each default.

A payload is measured as JSON text, in bytes (UTF-8): that is what a worker receives and holds
in memory, and what a destination is sent. The size stored on disk says little about it:
PostgreSQL compresses a large payload, often many times over.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from outbox.ranges import within

KIB, MIB, GIB = 1 << 10, 1 << 20, 1 << 30

MAX_PAYLOAD_BYTES = 1 * MIB
"""The producer API refuses a payload whose JSON text is longer (`enqueue`, `enqueue_many`;
per call with `max_payload_bytes=`, for the process with `set_max_payload_bytes`). Many
destinations stop near here anyway (Kafka's and NATS's default maximum message is 1 MB)."""

MAX_HEADERS_BYTES = 16 * KIB
"""The producer API refuses a message's `headers` whose JSON text is longer, trace context
included. Room for W3C trace context at its largest (`baggage` may hold 8192 bytes,
`tracestate` 512) and a few ids beside it; headers travel with every attempt and many HTTP
servers refuse a request whose headers pass 8 to 16 KiB in all."""

WORKER_MAX_PAYLOAD_BYTES = 2 * MAX_PAYLOAD_BYTES
"""A worker sends a row whose payload is longer to `dead` instead of delivering it
(`--max-payload-bytes`). It measures the payload as PostgreSQL renders the stored value
(`payload::text`), which spaces out what a compact encoder wrote (`[1,2]` becomes `[1, 2]`,
up to half as long again): twice the producer's limit, so that what a producer accepted with
the defaults is delivered with the defaults."""

CLAIM_BYTES = 16 * MIB
"""Payload bytes a worker replica holds at once, claimed and not yet finalized
(`--claim-bytes`): a claim takes rows while they fit what is left of it, and always one row
(within the payload limit), so a replica holds at most this plus one payload. At least the
worker's payload limit; a larger limit raises it to the limit."""

# A payload's text is a PostgreSQL `text`, which holds less than 1 GiB.
MAX_PAYLOAD_RANGE = (1, GIB - 1)
CLAIM_BYTES_RANGE = (1, 64 * GIB)

_UNITS = {"": 1, "B": 1, "KiB": KIB, "MiB": MIB, "GiB": GIB}
_SIZE = re.compile(r"^\s*(\d+)\s*([A-Za-z]*)\s*$")


def parse_bytes(text: str) -> int:
    """`1048576`, `512KiB`, `8MiB`, `1GiB`: a number of bytes. Only the binary units, so
    that nobody wonders whether `MB` means 10**6 or 2**20."""
    match = _SIZE.match(text)
    if match is None or match.group(2) not in _UNITS:
        raise ValueError(f"{text!r} is not a size (use e.g. 1048576, 512KiB, 8MiB)")
    return int(match.group(1)) * _UNITS[match.group(2)]


def bytes_between(low: int, high: int) -> Callable[[str], int]:
    """A parser of sizes from `low` to `high` bytes."""
    return within(parse_bytes, low, high, format_bytes)


def format_bytes(value: int) -> str:
    """A size as `parse_bytes` reads it: the largest binary unit that divides it."""
    for unit in ("GiB", "MiB", "KiB"):
        if value and value % _UNITS[unit] == 0:
            return f"{value // _UNITS[unit]}{unit}"
    return str(value)


__all__ = [
    "CLAIM_BYTES",
    "MAX_HEADERS_BYTES",
    "MAX_PAYLOAD_BYTES",
    "WORKER_MAX_PAYLOAD_BYTES",
    "bytes_between",
    "format_bytes",
    "parse_bytes",
]
