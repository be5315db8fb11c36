"""Signed CloudEvents at the receiving end: what a captured request can and cannot be made to
say when it is sent again.

Standard Webhooks signs `{webhook-id}.{webhook-timestamp}.{body}` and nothing else: in
CloudEvents binary mode the attributes (`ce-id`, `ce-type`, `ce-subject`, ...) are headers no
signature covers, and the CloudEvents SDK reads a request as binary mode as soon as it has any
`ce-` header, even a structured one. A request a real worker signed (verified by the
`standardwebhooks` library, parsed by the `cloudevents` SDK) is captured, then sent again with
other attributes: neither the helpers nor the recipe of docs/receiving.md may apply it a second
time, or under an attribute the signature does not cover."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import psycopg
import pytest
import test_receiver_http as http_tests
from cloudevents.core.bindings.http import HTTPMessage, from_http
from cloudevents.core.formats.json import JSONFormat
from standardwebhooks import Webhook
from test_receiver_http import FORMS, SECRET, effects, post, receiver, recorded
from wire import Received, Receiver
from workers import dispatching, settings

from outbox import Event, enqueue_many, inbox
from outbox.receiver.http import Delivery, Handler, Reply
from outbox.signing_keys import signing_key
from outbox.worker.publishers.http import HttpPublisher

MODES = ["cloudevents-binary", "cloudevents-structured"]
SOURCE = "/outbox/orders"
EVENT = Event("order", "o-1", "OrderPaid", {"total": 12})
# The receiving database and its pool, as the HTTP receiver's tests make them.
receiver_dsn = http_tests.receiver_dsn
pool = http_tests.pool
# Headers the client writes for each request: not part of what is sent again.
_HOP = {"host", "content-length", "transfer-encoding", "connection", "user-agent"}


async def capture(conn: psycopg.Connection[Any], dsn: str, mode: str, *secrets: str,
                  event: Event = EVENT) -> tuple[str, Received]:  # fmt: skip
    """One message sent by a real worker in `mode`, signed with `secrets`: its id and the
    request as the receiving end got it."""
    with conn.transaction():
        [message_id] = enqueue_many(conn, [event], trace_context=False)
    publisher = HttpPublisher(
        (receiving := Receiver()).url,
        owner="test",
        signing_keys=[signing_key(s) for s in secrets],
        wire_format=mode,
        source=SOURCE,
    )
    async with receiving, dispatching(settings(dsn), publisher):
        [request] = await receiving.wait_for(1)
    return str(message_id), request


def sent(request: Received, **changed: str | None) -> dict[str, str]:
    """The captured request's headers as sent again, with `changed` ones (None: removed)."""
    headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP}
    for name, value in changed.items():
        name = name.replace("_", "-")
        headers = {k: v for k, v in headers.items() if k.lower() != name}
        if value is not None:
            headers[name] = value
    return headers


def tampered(request: Received) -> dict[str, str]:
    """The request under another type and subject, as an attacker sends it: binary mode's
    headers changed; a structured request given `ce-` headers, which makes the SDK read it as
    binary mode (the body, signed, becomes the data). The id stays the signed one."""
    return sent(request, ce_type="RefundIssued", ce_subject="o-2", ce_specversion="1.0",
                ce_source=SOURCE, ce_id=request.headers["webhook-id"])  # fmt: skip


def recording_type() -> Handler:
    """A handler that applies under the event's type, as `delivery.attributes()` gives it."""

    async def apply(conn: psycopg.AsyncConnection[Any], delivery: Delivery) -> Reply | None:
        attributes = delivery.attributes()
        await conn.execute(
            "INSERT INTO effects VALUES (%s, %s, %s)",
            (delivery.message_id, json.dumps(attributes), attributes["type"]),
        )
        return None

    return apply


def applying_body() -> Handler:
    """A handler that reads only what a signature covers: the id and the body."""

    async def apply(conn: psycopg.AsyncConnection[Any], delivery: Delivery) -> Reply | None:
        assert delivery.verified
        await conn.execute(
            "INSERT INTO effects VALUES (%s, %s, %s)",
            (delivery.message_id, delivery.body.decode(), "body"),
        )
        return None

    return apply


# -- the helpers -------------------------------------------------------------------------------


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("mode", MODES)
async def test_a_captured_request_sent_again_under_another_id_is_refused(
    form, mode, conn, dsn, pool, receiver_dsn
):
    message_id, request = await capture(conn, dsn, mode, SECRET)
    assert Webhook(SECRET).verify(request.body, dict(request.headers))  # the library's check
    async with receiver(
        form, applying_body(), connect=pool.connection, consumer="c", secrets=[SECRET]
    ) as url:
        first = await post(url, request.body, sent(request))
        other_ce_id = await post(url, request.body, {**tampered(request), "ce-id": "999"})
        other_key = await post(url, request.body, sent(request, idempotency_key="999"))
        again = await post(url, request.body, sent(request))
    assert first[0] == 204
    assert (other_ce_id[0], other_ce_id[2]) == (401, b"ce-id differs from the signed webhook-id\n")
    assert (other_key[0], other_key[2]) == (
        401,
        b"Idempotency-Key differs from the signed webhook-id\n",
    )
    assert (again[0], again[1]["Outbox-Inbox"]) == (200, "duplicate")
    assert effects(receiver_dsn) == [(message_id, "body")]
    assert recorded(receiver_dsn) == [message_id]


@pytest.mark.parametrize("form", FORMS)
async def test_a_verified_handler_gets_the_signed_attributes_of_structured_mode_only(
    form, conn, dsn, pool, receiver_dsn
):
    """The tampered copy arrives first (its id is the signed one): the handler is refused
    the attributes it would apply under, nothing is recorded, and the original then applies
    under its own type, the one the SDK reads from the signed body."""
    message_id, request = await capture(conn, dsn, "cloudevents-structured", SECRET)
    forged = from_http(HTTPMessage(tampered(request), request.body), JSONFormat())
    assert (forged.get_id(), forged.get_type()) == (
        message_id,
        "RefundIssued",
    )  # as the SDK reads it
    async with receiver(
        form, recording_type(), connect=pool.connection, consumer="c", secrets=[SECRET]
    ) as url:
        refused = await post(url, request.body, tampered(request))
        assert (effects(receiver_dsn), recorded(receiver_dsn)) == ([], [])
        first = await post(url, request.body, sent(request))
    assert refused[0] == 400
    assert b"ce- headers are not covered by the signature" in refused[2]
    assert first[0] == 204
    event = from_http(HTTPMessage(dict(request.headers), request.body), JSONFormat())
    assert effects(receiver_dsn) == [(message_id, event.get_type())] == [(message_id, "OrderPaid")]
    with psycopg.connect(receiver_dsn) as c:
        [(stored,)] = c.execute("SELECT body FROM effects").fetchall()
    attributes = json.loads(stored)
    assert (attributes["id"], attributes["subject"], attributes["source"]) == (
        event.get_id(),
        event.get_subject(),
        event.get_source(),
    )
    assert "data" not in attributes


@pytest.mark.parametrize("form", FORMS)
async def test_binary_mode_attributes_are_never_handed_over_as_verified(
    form, conn, dsn, pool, receiver_dsn
):
    """Binary mode signed: no attribute but the id is covered, so a handler that asks for
    them is refused (400, naming the fix), the original and the tampered copy alike."""
    _, request = await capture(conn, dsn, "cloudevents-binary", SECRET)
    async with receiver(
        form, recording_type(), connect=pool.connection, consumer="c", secrets=[SECRET]
    ) as url:
        forged = await post(url, request.body, tampered(request))
        original = await post(url, request.body, sent(request))
    for status, _, text in (forged, original):
        assert status == 400
        assert text.decode().endswith("sign structured mode (--format cloudevents-structured)\n")
    assert (effects(receiver_dsn), recorded(receiver_dsn)) == ([], [])


@pytest.mark.parametrize("mode", MODES)
async def test_unverified_attributes_are_what_the_cloudevents_sdk_reads(
    mode, conn, dsn, pool, receiver_dsn
):
    """Without secrets, nothing is verified and the attributes come from where the SDK
    reads them, percent-decoded in binary mode."""
    event = Event("order", 'ö 1/"50%"', "order.paid v2", {"note": "é"})
    message_id, request = await capture(conn, dsn, mode, event=event)
    async with receiver("aiohttp", recording_type(), connect=pool.connection, consumer="c") as url:
        assert (await post(url, request.body, sent(request)))[0] == 204
    parsed = from_http(HTTPMessage(dict(request.headers), request.body), JSONFormat())
    with psycopg.connect(receiver_dsn) as c:
        [(stored,)] = c.execute("SELECT body FROM effects").fetchall()
    attributes = json.loads(stored)
    assert attributes["type"] == parsed.get_type() == "order.paid v2"
    assert attributes["subject"] == parsed.get_subject() == 'ö 1/"50%"'
    assert attributes["id"] == parsed.get_id() == message_id
    assert attributes["source"] == parsed.get_source()
    assert attributes["aggregatetype"] == parsed.get_extension("aggregatetype")
    assert attributes["datacontenttype"] == parsed.get_datacontenttype()


def test_a_request_that_is_no_cloudevent_has_no_attributes():
    from outbox.receiver.http import Refused

    with pytest.raises(Refused) as refused:
        Delivery("1", {"content-type": "application/json"}, b'{"id": "1"}').attributes()
    assert refused.value.status == 400


# -- the recipe of docs/receiving.md -----------------------------------------------------------


def documented_recipe() -> Any:
    doc = (Path(__file__).parent.parent / "docs" / "receiving.md").read_text()
    section = doc[doc.index("### A signed CloudEvent in a few lines") :]
    start = section.index("```python\n") + len("```python\n")
    code = section[start : section.index("\n```", start)]
    namespace: dict[str, Any] = {}
    exec(compile(code, "docs/receiving.md", "exec"), namespace)  # our own docs' code
    return namespace["signed_cloudevent"]


@pytest.mark.parametrize("mode", MODES)
async def test_the_recipe_applies_a_captured_request_once_under_its_signed_type(
    mode, conn, dsn, receiver_dsn
):
    """The recipe as written, recording what it says to record: the original and a copy
    under another ce-id and ce-type, in either order. One record, under the signed type, or
    none at all where nothing but the id is signed."""
    signed_cloudevent = documented_recipe()
    message_id, request = await capture(conn, dsn, mode, SECRET)
    copy = {**tampered(request), "ce-id": "999"}
    applied: list[tuple[str, str]] = []
    for headers in (copy, sent(request)):
        try:
            event = signed_cloudevent(request.body, headers, SECRET)
        except ValueError:  # refused by the recipe (the signature itself verifies)
            continue
        with psycopg.connect(receiver_dsn) as c, c.transaction():
            if inbox.record(c, consumer="c", message_id=event.get_id()):
                applied.append((event.get_id(), event.get_type()))
    if mode == "cloudevents-structured":
        assert applied == [(message_id, "OrderPaid")]
    else:  # binary mode: its type is in a header nobody signed
        assert applied == []
