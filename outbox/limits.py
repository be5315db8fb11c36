"""How big a message may be: one source for each default and each limit.

The rule: **a row can never crash a worker, and can never cost another row anything.** Every
column a worker loads is bounded, and measured by the claim in the database before it is
loaded (outbox/queries.py): a row past a limit goes `dead` in the claim's own statement, with a
reason that names the column and the limit, and is never sent to the worker. The producer API
refuses what a worker would kill, so what a producer accepts with the defaults is delivered.

- `payload`: its JSON text; the producer refuses more than MAX_PAYLOAD_BYTES (per call or per
  process), the claim more than WORKER_MAX_PAYLOAD_BYTES (`--max-payload-bytes`);
- `event_type`, `aggregate_type`, `aggregate_id`: MAX_NAME_BYTES each, on both sides;
- `headers`: a JSON object of at most MAX_HEADER_COUNT string values and MAX_HEADERS_BYTES of
  text, on both sides (flat by construction: no depth reaches a JSON decoder).

A payload is measured as JSON text, in bytes (UTF-8): that is what a worker receives and holds
in memory, and what a destination is sent. The size stored on disk says little about it:
PostgreSQL compresses a large payload, often many times over. Headers are measured as
PostgreSQL renders the stored value (`headers::text`), on both sides.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from outbox.plumbing.ranges import within

KIB, MIB, GIB = 1 << 10, 1 << 20, 1 << 30

MAX_PAYLOAD_BYTES = 1 * MIB
"""The producer API refuses a payload whose JSON text is longer (`enqueue`, `enqueue_many`;
per call with `max_payload_bytes=`, for the process with `set_max_payload_bytes`). Many
destinations stop near here anyway (Kafka's and NATS's default maximum message is 1 MB)."""

MAX_HEADERS_BYTES = 16 * KIB
"""A message's `headers` whose JSON text is longer are refused by the producer API and sent to
`dead` by the claim, trace context included. Measured as PostgreSQL renders the stored value
(`headers::text`: `{"a": "b", "c": "d"}`, characters outside ASCII as themselves), which the
producer reproduces, so the two agree to the byte. Room for W3C trace context at its largest
(`baggage` may hold 8192 bytes, `tracestate` 512) and a few ids beside it; headers travel with
every attempt and many HTTP servers refuse a request whose headers pass 8 to 16 KiB in all."""

MAX_HEADER_COUNT = 64
"""Entries a message's `headers` may hold (producer and claim). Trace context is three; the
rest is tenant and correlation ids. Apache refuses a request of more than 100 header fields by
default, and the project's own take up to 15 of them."""

MAX_NAME_BYTES = 1 * KIB
"""Longest `event_type`, `aggregate_type` and `aggregate_id`, each, in bytes (UTF-8); longer
ones are refused by the producer API and sent to `dead` by the claim. They are type names and
keys, and each becomes part of a NATS subject, a Kafka topic or key, a URL and several headers
(percent-encoded in CloudEvents' HTTP headers: three times as long, still well within the 8 KiB
a header line may take in common servers). A destination may take less (a Kafka topic holds
249 characters): a message whose name cannot become its subject, topic or URL is permanent
there, alone."""

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
worker's payload limit; a larger limit raises it to the limit. Each message held has at most
3 * MAX_NAME_BYTES + MAX_HEADERS_BYTES (19 KiB) in its other columns, whatever the table
holds: a replica's memory is bounded by its settings alone."""

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
    "MAX_HEADER_COUNT",
    "MAX_NAME_BYTES",
    "MAX_PAYLOAD_BYTES",
    "WORKER_MAX_PAYLOAD_BYTES",
    "bytes_between",
    "format_bytes",
    "parse_bytes",
]
