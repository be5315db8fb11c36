"""HTTP receivers, whatever the framework: the message id, the signature, the answer.

`HttpInbox.receive(headers, body)` is the whole of it; `outbox.receiver.aiohttp` and
`outbox.receiver.asgi` only read the request and write the answer.

The message id, in this order (the first one present):

| where                                        | sent by                                   |
|----------------------------------------------|-------------------------------------------|
| `webhook-id`                                 | Standard Webhooks senders                 |
| `Idempotency-Key` (bare, or a quoted string) | the worker's http publisher, payment APIs |
| `ce-id`                                      | CloudEvents, binary mode                  |
| `id` of an `application/cloudevents+json` body | CloudEvents, structured mode            |

With secrets given, only `webhook-id` is read: it is the one the signature covers. Standard
Webhooks signs `{webhook-id}.{webhook-timestamp}.{body}` and nothing else, so every other
header (`Idempotency-Key`, CloudEvents binary mode's `ce-*`, `Outbox-Event-Type`, the row's own
headers) and the URL are the requester's to change: a request whose `Idempotency-Key` or `ce-id`
differs from its signed `webhook-id` is refused (401: it was altered on the way), a structured
CloudEvent whose signed `id` differs from it is 400, and `Delivery.attributes()` gives a verified
handler the CloudEvent's attributes from the signed body only (structured mode), never from
`ce-*` headers (binary mode): those it refuses, 400.

Answers: the handler's reply (204 when it returns None) for a first delivery whose transaction
committed; 200 with `Outbox-Inbox: duplicate` for a duplicate, without running the handler;
400 with no usable id, 401 for a missing or wrong signature, 413 past `max_body`: those are
the sender's to fix, and the worker takes a 4xx as permanent. A handler that raises is 500
and one whose reply is not 2xx keeps that reply: either way the transaction (record and
effect) is rolled back, so the sender's retry applies the message. A handler that raises
Refused (Unsigned, from `Delivery.attributes()`, is one) is answered its 4xx, rolled back too.
A database that cannot be reached is 503.
"""

from __future__ import annotations

import json
import logging
import urllib.parse
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import psycopg

from outbox import inbox
from outbox.receiver.core import DEFAULT_TRIES, AsyncConnect, AsyncConnection, apply_async
from outbox.table import Table

log = logging.getLogger("outbox.receiver")

DEFAULT_MAX_BODY = 1024 * 1024  # bytes, as aiohttp's own default request limit
CLOUDEVENTS_JSON = "application/cloudevents+json"
# The answer's header telling a first delivery from a duplicate (for people and tests; a
# sender needs only the 2xx).
INBOX_HEADER = "Outbox-Inbox"
# What a receiver does with a replay (outbox replay): absorb it as the duplicate it is (the
# default, and all a receiver could do before replays), or apply it once more.
ABSORB, APPLY = "absorb", "apply"
REPLAYS = (ABSORB, APPLY)
# A structured CloudEvent's members that are its data, not attributes.
_DATA = frozenset({"data", "data_base64"})


class Refused(Exception):
    """A request answered 4xx with nothing applied: raised before the transaction, or by a
    handler inside it (then rolled back). The sender takes a 4xx as permanent."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


class Unsigned(Refused):
    """A verified delivery's handler asked for something its signature does not cover."""

    def __init__(self, reason: str) -> None:
        super().__init__(400, reason)


@dataclass(frozen=True)
class Delivery:
    """One request, as the handler sees it."""

    message_id: str
    """The id recorded in the inbox; on a verified delivery, the signed `webhook-id`."""
    headers: Mapping[str, str]
    """Header names in lower case; the first value of a repeated header. As received: no
    signature covers a header, verified or not."""
    body: bytes
    verified: bool = False
    """The request's Standard Webhooks signature was checked: `message_id` and `body` are
    what the sender signed (and `attributes()` reads only them)."""
    replay: int | None = None
    """The number of the replay that sent the message again, from the body's `replay` field
    (the envelope's, or a structured CloudEvent's attribute: signed when `verified`); None
    for a first delivery, and in formats whose body has no place for it (CloudEvents binary
    mode). The `Outbox-Replay` header is never read: no signature covers it."""

    def json(self) -> Any:
        return json.loads(self.body)

    def attributes(self) -> dict[str, Any]:
        """The CloudEvent's context attributes (`id`, `source`, `type`, `subject`, `time`,
        extensions), where the CloudEvents SDK's `from_http` reads them: from the `ce-*`
        headers (binary mode: values percent-decoded, strings; `datacontenttype` from
        `Content-Type`) when the request has any, otherwise from the JSON body (structured
        mode: JSON values, `data` left out). Refused (400) if the request is no CloudEvent.

        On a `verified` delivery the attributes must be signed: structured mode's body, whose
        `id` is the signed `webhook-id`. Binary mode's headers are not covered by the
        signature (anyone who captured the request can send it again with another `ce-type`
        or `ce-subject`), so they raise Unsigned, answered 400 with nothing applied: sign
        structured mode (`--format cloudevents-structured`) to read them verified."""
        headers = {name.lower(): value for name, value in self.headers.items()}
        ce_headers = {name: value for name, value in headers.items() if name.startswith("ce-")}
        if ce_headers:
            if self.verified:
                raise Unsigned(
                    "CloudEvents attributes sent as ce- headers are not covered by the "
                    "signature: sign structured mode (--format cloudevents-structured)"
                )
            found: dict[str, Any] = {
                name[3:]: urllib.parse.unquote(value) for name, value in ce_headers.items()
            }
            if "content-type" in headers:
                found["datacontenttype"] = headers["content-type"]
            return found
        try:
            event = json.loads(self.body)
        except ValueError:
            event = None
        if not isinstance(event, dict) or not isinstance(event.get("specversion"), str):
            raise Refused(400, "not a CloudEvent: no ce- headers, no JSON event with specversion")
        if self.verified and event.get("id") != self.message_id:
            raise Unsigned("the CloudEvent's id differs from the signed webhook-id")
        return {name: value for name, value in event.items() if name not in _DATA}


@dataclass(frozen=True)
class Reply:
    """What to answer: a handler may return one (None means 204 No Content)."""

    status: int = 204
    body: bytes = b""
    headers: Mapping[str, str] = field(default_factory=dict)

    @property
    def success(self) -> bool:
        return 200 <= self.status < 300


Handler = Callable[[AsyncConnection, Delivery], Awaitable[Reply | None]]


def _unquoted(value: str) -> str:
    """An Idempotency-Key as the IETF draft writes it (a structured-field string, quoted)
    or bare, as most senders do: the same key either way."""
    value = value.strip()
    if len(value) >= 2 and value[0] == value[-1] == '"':
        return value[1:-1].replace('\\"', '"').replace("\\\\", "\\")
    return value


def replay_number(headers: Mapping[str, str], body: bytes, message_id: str) -> int | None:
    """The body's `replay` field when the body is a JSON object of this message (its `id` is
    `message_id`: the envelope, or a structured CloudEvent), else None. CloudEvents binary
    mode's body is the payload alone: it has no place for it (its `ce-replay` header is
    as unsigned as `Outbox-Replay`)."""
    if any(name.startswith("ce-") for name in headers):
        return None
    try:
        event = json.loads(body)
    except ValueError:
        return None
    if not isinstance(event, dict) or str(event.get("id")) != message_id:
        return None
    number = event.get("replay")
    if isinstance(number, bool) or not isinstance(number, int) or number < 1:
        return None
    return number


def message_id(headers: Mapping[str, str], body: bytes, *, signed: bool = False) -> str:
    """The delivery's message id (see the table above), or Refused(400)."""
    found: str | None
    if signed:
        found = headers.get("webhook-id")
        if found:
            _same_as_signed(found, headers, body)
    else:
        found = headers.get("webhook-id") or (
            _unquoted(headers["idempotency-key"]) if "idempotency-key" in headers else None
        )
        found = found or headers.get("ce-id") or _structured_id(headers, body)
    if not found:
        raise Refused(
            400,
            "webhook-id missing"
            if signed
            else "no message id: send Idempotency-Key, webhook-id or a CloudEvent id",
        )
    try:
        return inbox.check_key("message id", found)
    except ValueError as exc:
        raise Refused(400, str(exc)) from None


def _same_as_signed(signed_id: str, headers: Mapping[str, str], body: bytes) -> None:
    """Refused unless every other id the request states is its signed `webhook-id`. The
    worker sends one id everywhere; a header that says another was changed on the way (a
    captured request sent again as a "new" message), and a handler or a log that read it
    would be misled."""
    unsigned = {
        "Idempotency-Key": _unquoted(headers["idempotency-key"])
        if "idempotency-key" in headers
        else None,
        "ce-id": urllib.parse.unquote(headers["ce-id"]) if "ce-id" in headers else None,
    }
    for name, value in unsigned.items():
        if value is not None and value != signed_id:
            raise Refused(401, f"{name} differs from the signed webhook-id")
    if not any(name.startswith("ce-") for name in headers):
        event_id = _structured_id(headers, body)
        if event_id is not None and event_id != signed_id:
            raise Refused(400, "the CloudEvent's id differs from the signed webhook-id")


def _structured_id(headers: Mapping[str, str], body: bytes) -> str | None:
    content_type = headers.get("content-type", "").split(";")[0].strip().lower()
    if content_type != CLOUDEVENTS_JSON:
        return None
    try:
        event = json.loads(body)
    except ValueError:
        raise Refused(400, "the CloudEvent is not JSON") from None
    event_id = event.get("id") if isinstance(event, dict) else None
    if not isinstance(event_id, str):
        raise Refused(400, "the CloudEvent has no string id")
    return event_id


class Signatures:
    """Standard Webhooks verification (`webhook-id`, `webhook-timestamp`,
    `webhook-signature`) by the reference library, `standardwebhooks`: a request passes when
    one of its signatures is valid under one of the secrets (several secrets: key rotation).
    A timestamp more than five minutes off is refused (the library's tolerance)."""

    def __init__(self, secrets: Sequence[str]) -> None:
        from standardwebhooks import Webhook  # only a receiver that verifies needs it

        self._webhooks: list[Webhook] = []
        for n, secret in enumerate(secrets, 1):
            try:
                self._webhooks.append(Webhook(secret))
            except Exception as exc:  # binascii.Error, EmptyWebhookSecretError, ...
                # Never the value: it is a secret.
                raise ValueError(
                    f"signing secret #{n} is not a Standard Webhooks secret "
                    f"(whsec_ then base64): {type(exc).__name__}"
                ) from None
        if not self._webhooks:
            raise ValueError("no signing secret given")

    def verify(self, headers: Mapping[str, str], body: bytes) -> None:
        from standardwebhooks import WebhookVerificationError

        reason = "missing signature headers"
        for webhook in self._webhooks:
            try:
                webhook.verify(body, dict(headers), json_parse=False)
                return
            except WebhookVerificationError as exc:
                reason = str(exc)
            except ValueError:  # a malformed signature entry, a body that is not UTF-8
                reason = "malformed signature"
        raise Refused(401, f"signature refused: {reason}")


class HttpInbox:
    """Applies each request once through the inbox; see the module's docstring."""

    def __init__(
        self,
        handler: Handler,
        *,
        connect: AsyncConnect,
        consumer: str,
        table: str | Table = inbox.DEFAULT_INBOX_TABLE,
        secrets: Sequence[str] = (),
        max_body: int = DEFAULT_MAX_BODY,
        tries: int = DEFAULT_TRIES,
        replays: str = ABSORB,
    ) -> None:
        if replays not in REPLAYS:
            raise ValueError(f"replays must be one of {', '.join(REPLAYS)}, got {replays!r}")
        self.replays = replays
        self.handler = handler
        self.connect = connect
        self.consumer = inbox.check_key("consumer", consumer)
        self.table = table if isinstance(table, Table) else Table.parse(table)
        self.signatures = Signatures(secrets) if secrets else None
        self.max_body = max_body
        self.tries = tries

    def too_large(self) -> Reply:
        return _refusal(Refused(413, f"body larger than {self.max_body} bytes"))

    async def receive(self, headers: Mapping[str, str], body: bytes) -> Reply:
        """The answer to one request; `headers` with lower-case names."""
        try:
            if len(body) > self.max_body:
                return self.too_large()
            verified = self.signatures is not None
            if self.signatures is not None:
                self.signatures.verify(headers, body)
            found = message_id(headers, body, signed=verified)
            replay = replay_number(headers, body, found) if self.replays == APPLY else None
            delivery = Delivery(found, headers, body, verified=verified, replay=replay)
        except Refused as refused:
            return _refusal(refused)

        async def effect(conn: AsyncConnection) -> Reply:
            return await self.handler(conn, delivery) or Reply()

        try:
            applied = await apply_async(
                self.connect,
                effect,
                consumer=self.consumer,
                message_id=delivery.message_id,
                table=self.table,
                keep=lambda reply: reply.success,
                tries=self.tries,
                replay=delivery.replay,
            )
        except Refused as refused:  # the handler's own 4xx (Unsigned, say): rolled back
            log.warning("delivery %s refused: %s", delivery.message_id, refused.reason)
            return _refusal(refused)
        except psycopg.OperationalError as exc:
            log.warning("delivery %s: database unavailable: %s", delivery.message_id, exc)
            return Reply(503, b"database unavailable\n", {"Retry-After": "1"})
        except psycopg.errors.UndefinedTable as exc:
            if self.table.name not in str(exc):  # one of the handler's own tables
                log.exception("delivery %s: the handler failed; rolled back", delivery.message_id)
                return Reply(500, b"handler failed\n")
            log.error(
                "inbox table %s does not exist; run `outbox inbox migrate --table %s`",
                self.table,
                self.table.argument,
            )
            return Reply(500, b"inbox table missing\n")
        except Exception:
            log.exception("delivery %s: the handler failed; rolled back", delivery.message_id)
            return Reply(500, b"handler failed\n")
        if applied.duplicate:
            return Reply(200, b"", {INBOX_HEADER: "duplicate"})
        reply = applied.value
        assert reply is not None
        if not applied.committed:
            return reply
        return Reply(reply.status, reply.body, {**reply.headers, INBOX_HEADER: "applied"})


def _refusal(refused: Refused) -> Reply:
    return Reply(refused.status, (refused.reason + "\n").encode(), {"Content-Type": "text/plain"})


def lower_headers(pairs: Sequence[tuple[str, str]]) -> dict[str, str]:
    """Header pairs as a dict with lower-case names, the first value of a repeated one."""
    headers: dict[str, str] = {}
    for name, value in pairs:
        headers.setdefault(name.lower(), value)
    return headers


__all__ = [
    "ABSORB",
    "APPLY",
    "CLOUDEVENTS_JSON",
    "DEFAULT_MAX_BODY",
    "INBOX_HEADER",
    "Delivery",
    "Handler",
    "HttpInbox",
    "Refused",
    "Reply",
    "Signatures",
    "Unsigned",
    "lower_headers",
    "message_id",
    "replay_number",
]
