"""The JSON envelope every text publisher sends: the row's identity plus its payload verbatim."""

from __future__ import annotations

from datetime import datetime
from json.encoder import encode_basestring  # what json.dumps(ensure_ascii=False) quotes with

from outbox.models import Message


def envelope(message: Message) -> str:
    """{"id", "aggregate_type", "aggregate_id", "event_type", "created_at", "attempt",
    "replay" (a replay's only), "payload"}, compact, non-ASCII kept as is: byte for byte what
    json.dumps of the same dict gives. Written out by hand: a dict dump builds an encoder per
    call and costs the HTTP path more than the three quoted strings do."""
    # Once per message on every text publisher's path: the fields unpacked at once (cheaper
    # than six attribute reads), the timestamp's cache read inline (`timestamp` below).
    message_id, _, attempts, aggregate_type, aggregate_id, event_type, payload, created_at = (
        message[:8]
    )
    replay = message.replay
    last, created = _last
    # `_other` written out (None, at first, is != any datetime): the envelope is made once
    # per message, and a call costs more than the test.
    if created_at != last or created_at.tzinfo is not last.tzinfo or created_at.fold != last.fold:
        created = timestamp(created_at)
    # A replay's number (outbox.operations.replay) is in the body, where a signature covers it.
    replayed = "" if replay is None else f'"replay":{replay:d},'
    # The payload is spliced in as the jsonb text PostgreSQL produced: never decoded here.
    # ints (the row's, never bools) and an ISO timestamp need no quoting beyond their own.
    return (
        f'{{"id":{message_id},"aggregate_type":{encode_basestring(aggregate_type)},'
        f'"aggregate_id":{encode_basestring(aggregate_id)},'
        f'"event_type":{encode_basestring(event_type)},'
        f'"created_at":"{created}","attempt":{attempts},{replayed}"payload":{payload}}}'
    )


# The last created_at formatted, and its text. Messages claimed together often share one:
# every event a transaction enqueues has its start time (now()). isoformat() of an aware
# datetime was half of the envelope's cost.
_last: tuple[datetime | None, str] = (None, "")


def timestamp(created_at: datetime) -> str:
    """`created_at` in ISO 8601 (RFC 3339), the last one's text kept."""
    global _last
    last, text = _last
    if _other(created_at, last):
        text = created_at.isoformat()
        _last = (created_at, text)
    return text


def _other(created_at: datetime, last: datetime | None) -> bool:
    """Whether `created_at` may print otherwise than `last`. Equal instants print alike only
    in the same time zone; and two times of the hour a zone repeats when its clocks go back
    compare equal in that zone (Python compares their wall clocks) while `fold` tells them
    apart."""
    return (
        last is None
        or created_at != last
        or created_at.tzinfo is not last.tzinfo
        or created_at.fold != last.fold
    )
