"""The envelope every text publisher sends: exactly the JSON a dict dump of the row gives."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta, timezone
from zoneinfo import ZoneInfo

import pytest

from outbox.models import Message
from outbox.worker.publishers.envelope import envelope

AWKWARD = [
    "plain",
    "",
    'quote " and backslash \\',
    "control \x00 \x1f \x7f \t \r\n",
    "ünïcödé ✓ 注文 🙂",
    "\u2028 line separators \u2029",
    "</script>",
]


def _dict_dump(message: Message) -> str:
    """A json.dumps of the same keys, with the payload text spliced in as the envelope does."""
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


@pytest.mark.parametrize("text", AWKWARD)
@pytest.mark.parametrize(
    "created_at",
    [
        datetime(2025, 3, 14, 12, 0, 0, tzinfo=UTC),
        datetime(2025, 3, 14, 12, 0, 0, 123456, tzinfo=timezone(timedelta(hours=-5))),
    ],
)
def test_the_envelope_is_the_dict_dump_byte_for_byte(text, created_at):
    payload = json.dumps({"note": text, "n": [1, 2.5, None, True]}, separators=(",", ":"))
    message = Message(2**62, 7, 3, f"agg {text}", f"id {text}", f"Ev {text}", payload, created_at)
    body = envelope(message)
    assert body == _dict_dump(message)
    decoded = json.loads(body)
    assert decoded["aggregate_id"] == f"id {text}" and decoded["payload"]["note"] == text
    assert (decoded["id"], decoded["attempt"]) == (2**62, 3)


def test_the_payload_is_spliced_in_verbatim():
    # As PostgreSQL renders jsonb: spaces after separators, which a re-encoding would drop.
    payload = '{"a": 1, "b": [1, 2]}'
    message = Message(1, 1, 1, "order", "o-1", "OrderPaid", payload, datetime.now(UTC))
    assert envelope(message).endswith(f',"payload":{payload}}}')


def test_one_instant_in_two_time_zones_keeps_each_zones_timestamp():
    # The envelope reuses the last timestamp's text for an equal created_at: equal instants in
    # other zones, one after the other, must still print as their own.
    utc = datetime(2025, 3, 14, 12, 0, 0, tzinfo=UTC)
    same_instants = [
        utc,
        utc.astimezone(timezone(timedelta(hours=2))),
        utc,
        utc.replace(tzinfo=None),  # naive: never equal to an aware one
        utc,
    ]
    for created_at in same_instants:
        message = Message(1, 1, 1, "order", "o-1", "Paid", "{}", created_at)
        assert json.loads(envelope(message))["created_at"] == created_at.isoformat()


def test_the_two_times_of_an_hour_the_clocks_repeat_keep_their_own_offsets():
    # A session in a zone with summer time: 02:30 happens twice on the night the clocks go
    # back, and the two compare equal in that zone (Python compares their wall clocks).
    berlin = ZoneInfo("Europe/Berlin")
    summer = datetime(2025, 10, 26, 2, 30, tzinfo=berlin)  # fold 0: +02:00
    winter = summer.replace(fold=1)  # an hour later: +01:00
    assert summer == winter and summer.utcoffset() != winter.utcoffset()
    for created_at in (summer, winter, summer):
        message = Message(1, 1, 1, "order", "o-1", "Paid", "{}", created_at)
        assert json.loads(envelope(message))["created_at"] == created_at.isoformat()
