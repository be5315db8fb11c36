"""The JSON envelope every text publisher sends: the row's identity plus its payload verbatim."""

from __future__ import annotations

import json

from outbox.models import Message


def envelope(message: Message) -> str:
    # The payload is spliced in as the jsonb text PostgreSQL produced: never decoded here.
    head = json.dumps(
        {
            "id": message.id,
            "aggregate_type": message.aggregate_type,
            "aggregate_id": message.aggregate_id,
            "event_type": message.event_type,
            "created_at": message.created_at.isoformat(),
            "attempt": message.attempts,
        },
        separators=(",", ":"),
        ensure_ascii=False,
    )
    return f'{head[:-1]},"payload":{message.payload_json}}}'
