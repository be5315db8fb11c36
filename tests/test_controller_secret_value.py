"""A Secret key's value as the operator reads it: a value that is not text is refused under
the reason of what it is for (the DSN's `InvalidDsn`, a publisher option's own), naming the
key and never the value."""

from __future__ import annotations

import base64

import pytest

from outbox.controller.kube import Secret
from outbox.controller.problem import Problem

NOT_TEXT = b"\xff\xfehunter2"


def _secret(value: bytes) -> Secret:
    data = {"k": base64.b64encode(value).decode()}
    return Secret("shop", "orders", annotations={}, data=data, version="1")


def test_a_text_value_is_decoded() -> None:
    assert _secret("pässwort".encode()).value("k", refused_as="InvalidDsn") == "pässwort"


REASONS = ["InvalidDsn", "InvalidSigningSecret", "InvalidPublisherOptions"]


@pytest.mark.parametrize("reason", REASONS)
def test_a_value_that_is_not_text_is_refused_under_the_readers_reason(reason: str) -> None:
    with pytest.raises(Problem) as refused:
        _secret(NOT_TEXT).value("k", refused_as=reason)
    assert refused.value.reason == reason
    assert refused.value.message == "key `k` of Secret `shop/orders` is not UTF-8 text"


def test_a_missing_key_is_missing_whatever_it_is_for() -> None:
    with pytest.raises(Problem) as refused:
        _secret(b"x").value("dsn", refused_as="InvalidDsn")
    assert refused.value.reason == "SecretKeyMissing"
    assert refused.value.message == "Secret `shop/orders` has no key `dsn`"
