"""Signed webhooks: what a real HTTP server received verifies with the `standardwebhooks`
reference library (`Webhook.verify`), with one secret and with two (rotation), on every
attempt of a message that is retried; secrets are refused at start naming the flag only."""

from __future__ import annotations

import base64
import os
import subprocess
import sys

import pytest
from helpers import row, wait_until
from standardwebhooks import Webhook
from standardwebhooks.webhooks import WebhookVerificationError
from wire import Receiver
from workers import dispatching, settings

from outbox import Event, enqueue_many
from outbox.plumbing.errors import SettingError
from outbox.signing_keys import signing_key as signing_secret
from outbox.worker.publishers.http import HttpPublisher
from outbox.worker.publishers.registry import shown_values
from outbox.worker.settings import load_settings


def _secret(seed: int) -> str:
    return "whsec_" + base64.b64encode(bytes(range(seed, seed + 32))).decode()


OLD, NEW, OTHER = _secret(1), _secret(100), _secret(200)


def _publisher(receiver: Receiver, *secrets: str, **kwargs: object) -> HttpPublisher:
    return HttpPublisher(
        receiver.url,
        owner="test",
        signing_keys=[signing_secret(s) for s in secrets],
        **kwargs,  # type: ignore[arg-type]
    )


def _verify(secret: str, request) -> object:
    return Webhook(secret).verify(request.body, dict(request.headers))


@pytest.mark.parametrize("secrets", [(OLD,), (OLD, NEW)], ids=["one secret", "two secrets"])
async def test_every_attempt_verifies_with_each_secret(conn, dsn, secrets):
    with conn.transaction():
        [message_id] = enqueue_many(conn, [Event("order", "o-1", "OrderPaid", {"total": 12})])
    # The first attempt is answered 500: the retry is signed anew, with the same webhook-id.
    async with (
        Receiver(answer=lambda n: 500 if n == 0 else 200) as receiver,
        dispatching(settings(dsn), _publisher(receiver, *secrets)),
    ):
        first, second = await receiver.wait_for(2)
        await wait_until(lambda: row(conn, message_id)["status"] == "done")
    assert row(conn, message_id)["attempts"] == 2
    for request in (first, second):
        assert request.headers["webhook-id"] == str(message_id)
        assert request.headers["Idempotency-Key"] == str(message_id)
        entries = request.headers["webhook-signature"].split(" ")
        assert len(entries) == len(secrets) and all(e.startswith("v1,") for e in entries)
        for secret in secrets:  # a receiver that knows any one of them accepts it
            assert _verify(secret, request)["payload"] == {"total": 12}
        with pytest.raises(WebhookVerificationError):
            _verify(OTHER, request)
    assert second.headers["Outbox-Attempt"] == "2"
    # The timestamp is the attempt's: never earlier than the first attempt's.
    assert int(second.headers["webhook-timestamp"]) >= int(first.headers["webhook-timestamp"])


async def test_a_signed_request_whose_body_changed_does_not_verify(conn, dsn):
    with conn.transaction():
        enqueue_many(conn, [Event("order", "o-1", "OrderPaid", {"total": 12})])
    async with Receiver() as receiver, dispatching(settings(dsn), _publisher(receiver, OLD)):
        [request] = await receiver.wait_for(1)
    assert _verify(OLD, request) is not None
    request.body = request.body.replace(b"12", b"13")
    with pytest.raises(WebhookVerificationError):
        _verify(OLD, request)


async def test_signed_cloudevents_and_row_headers_verify(conn, dsn):
    """The signature covers the body as sent in every format; the row's headers ride along."""
    with conn.transaction():
        enqueue_many(
            conn,
            [Event("order", "o-1", "OrderPaid", {"total": 12}, headers={"tenant": "t-9"})],
            trace_context=False,
        )
    publisher = _publisher(receiver := Receiver(), OLD, wire_format="cloudevents-structured")
    async with receiver, dispatching(settings(dsn), publisher):
        [request] = await receiver.wait_for(1)
    assert request.headers["tenant"] == "t-9"
    assert _verify(OLD, request)["data"] == {"total": 12}


# -- settings ----------------------------------------------------------------------------------

HTTP = ["--publisher", "http", "--http-url", "http://127.0.0.1:1/hooks"]


def test_secrets_come_from_flags_or_from_the_variable_one_per_line():
    flags = load_settings([*HTTP, "--http-signing-secret", OLD, "--http-signing-secret", NEW], {})
    variable = load_settings(HTTP, {"OUTBOX_HTTP_SIGNING_SECRET": f"{OLD}\n{NEW}\n"})
    keys = (signing_secret(OLD), signing_secret(NEW))
    assert flags.publisher_options["http_signing_secret"] == keys
    assert variable.publisher_options["http_signing_secret"] == keys
    shown = shown_values(HttpPublisher.options, flags.publisher_options)
    assert "http-signing-secret=" in shown
    assert OLD not in shown and "AQID" not in shown  # neither the secret nor its base64


def test_blank_lines_in_the_variable_are_skipped():
    """A Secret's value often ends with a newline, or has one between two secrets: the
    worker starts with the secrets it holds."""
    for text in (f"{OLD}\n\n", f"\n{OLD}\n\n  \n{NEW}\r\n\t\n", f"{OLD}\n \n{NEW}"):
        given = load_settings(HTTP, {"OUTBOX_HTTP_SIGNING_SECRET": text})
        expected = tuple(signing_secret(s) for s in (OLD, NEW) if s in text)
        assert given.publisher_options["http_signing_secret"] == expected


@pytest.mark.parametrize(
    ("value", "why"),
    [
        ("c2VjcmV0LXNlY3JldC1zZWNyZXQtc2VjcmV0", "starts with 'whsec_'"),
        ("whsec_not*base64!!", "not valid base64"),
        ("whsec_" + base64.b64encode(b"short").decode(), "the key is 5 bytes"),
    ],
)
def test_a_malformed_secret_is_refused_naming_the_flag_not_the_value(value, why):
    with pytest.raises(SettingError) as info:
        load_settings([*HTTP, "--http-signing-secret", value], {})
    message = str(info.value)
    assert message.startswith("--http-signing-secret: ") and why in message
    assert value not in message and value.removeprefix("whsec_") not in message


def test_a_malformed_secret_in_the_variable_ends_the_worker_with_exit_2():
    bad = "whsec_!!" + "x" * 30
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OUTBOX_", "PG"))}
    done = subprocess.run(
        [sys.executable, "-m", "outbox.worker", *HTTP],
        env={**env, "OUTBOX_HTTP_SIGNING_SECRET": bad, "OUTBOX_DSN": "host=/nonexistent"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert "OUTBOX_HTTP_SIGNING_SECRET" in done.stderr and "base64" in done.stderr
    assert bad not in done.stderr + done.stdout and "x" * 30 not in done.stderr


# -- the operator: from a Secret, by consent, never inline -------------------------------------


def test_the_crd_takes_the_secrets_from_a_secret_reference_with_its_consent():
    from test_controller_render import env_of, render, resource

    from outbox.controller.consent import secret_uses

    ref = {"name": "webhook-signing", "key": "secrets"}
    body = resource(
        publisher={"type": "http", "http": {"url": "http://e.example/in", "signingSecretRef": ref}}
    )
    env = env_of(render(body))
    assert env["OUTBOX_HTTP_SIGNING_SECRET"] == {"secretKeyRef": ref}  # never a value
    uses = {(use.field, use.name) for use in secret_uses(body["spec"])}
    assert ("spec.publisher.http.signingSecretRef", "webhook-signing") in uses


def test_the_crd_has_no_inline_secret():
    from test_controller_crd import _body, _crd_errors

    inline = _body(
        {
            "publisher.type": "http",
            "publisher.http": {"url": "http://e.example/in", "signingSecret": OLD},
        }
    )
    assert _crd_errors(inline)
    ref = {"url": "http://e.example/in", "signingSecretRef": {"name": "s", "key": "k"}}
    assert _crd_errors(_body({"publisher.type": "http", "publisher.http": ref})) == []


# -- the receiver in docs/receiving.md ---------------------------------------------------------


def _documented_receiver():
    from pathlib import Path

    doc = (Path(__file__).parent.parent / "docs" / "receiving.md").read_text()
    section = doc[doc.index("### A signed CloudEvent in a few lines") :]
    start = section.index("```python\n") + len("```python\n")
    code = section[start : section.index("\n```", start)]
    namespace: dict[str, object] = {}
    exec(compile(code, "docs/receiving.md", "exec"), namespace)  # our own docs' code
    return namespace["signed_cloudevent"]


@pytest.mark.parametrize("mode", ["cloudevents-binary", "cloudevents-structured"])
async def test_the_documented_receiver_verifies_a_signed_cloudevent(conn, dsn, mode):
    signed_cloudevent = _documented_receiver()
    with conn.transaction():
        [message_id] = enqueue_many(conn, [Event("order", "o-1", "OrderPaid", {"total": 12})])
    publisher = _publisher(receiver := Receiver(), NEW, OLD, wire_format=mode, source="/shop")
    async with receiver, dispatching(settings(dsn), publisher):
        [request] = await receiver.wait_for(1)
    headers = dict(request.headers)
    if mode == "cloudevents-binary":  # its attributes are headers, which no signature covers
        with pytest.raises(ValueError, match="not signed: send structured mode"):
            signed_cloudevent(request.body, headers, OLD)
        return
    event = signed_cloudevent(request.body, headers, OLD)
    assert (event.get_id(), event.get_type(), event.get_source()) == (
        str(message_id),
        "OrderPaid",
        "/shop",
    )
    assert event.get_data() == {"total": 12}
    with pytest.raises(WebhookVerificationError):
        signed_cloudevent(request.body, headers, OTHER)
    with pytest.raises(WebhookVerificationError):
        signed_cloudevent(request.body.replace(b"12", b"13"), headers, NEW)


async def test_a_real_worker_signs_and_never_logs_its_secrets(conn, dsn, tmp_path):
    from workers import spawn_worker, stop_worker

    with conn.transaction():
        [message_id] = enqueue_many(conn, [Event("order", "o-1", "OrderPaid", {"total": 12})])
    log = tmp_path / "worker.log"
    async with Receiver() as receiver:
        proc = spawn_worker(
            dsn,
            *("--publisher", "http", "--http-url", receiver.url),
            *("--http-signing-secret", OLD, "--format", "cloudevents-binary"),
            owner="signer",
            log_path=str(log),
        )
        try:
            [request] = await receiver.wait_for(1, timeout=60)
            await wait_until(lambda: row(conn, message_id)["status"] == "done", timeout=60)
        finally:
            assert stop_worker(proc) == 0
    assert Webhook(OLD).verify(request.body, dict(request.headers)) == {"total": 12}
    text = log.read_text()
    assert "http-signing-secret=***" in text
    key = OLD.removeprefix("whsec_")
    assert key not in text and repr(signing_secret(OLD))[2:20] not in text


@pytest.mark.parametrize(
    ("wire_format", "warned"),
    [("cloudevents-binary", True), ("cloudevents-structured", False), ("envelope", False)],
)
def test_signing_binary_cloudevents_warns_that_their_attributes_are_not_signed(
    caplog, wire_format, warned
):
    """A signed binary-mode CloudEvent carries its type and subject in ce- headers that no
    signature covers: the worker says so at start (the receiving helpers refuse them)."""
    with caplog.at_level("WARNING", logger="outbox.worker"):
        HttpPublisher("http://api.test/hook", owner="test", wire_format=wire_format,
                      signing_keys=[signing_secret(OLD)])  # fmt: skip
    said = [r.getMessage() for r in caplog.records if "ce- headers" in r.getMessage()]
    assert bool(said) == warned, said
    assert all(OLD not in line for line in said)
