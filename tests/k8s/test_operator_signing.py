"""The operator checks the HTTP signing Secret as the worker does (outbox.signing_keys): a
Secret the worker would refuse at start (exit 2) makes the resource Ready=False with the
reason InvalidSigningSecret, naming the Secret's key and the line, never the value; blank
lines (a trailing newline) are fine, as they are to the worker."""

from __future__ import annotations

import base64

import pytest

from .cluster import LocalCluster
from .test_operator import (
    NS,
    Operator,
    apply,
    condition,
    dispatcher_manifest,
    events,
    secret_manifest,
    wait_for,
)

pytestmark = pytest.mark.slow

GOOD = "whsec_" + base64.b64encode(bytes(range(32))).decode()
# Not a signing secret: a plain token someone pasted (the worker refuses it).
BAD = "sk_live_0123456789abcdefHunter2"


def _signed(name: str, secret: str) -> dict:
    return dispatcher_manifest(
        name,
        database={"dsnSecretRef": {"name": "db", "key": "dsn"}, "table": "outbox"},
        publisher={
            "type": "http",
            "http": {
                "url": "http://sink.example/in",
                "signingSecretRef": {"name": secret, "key": "keys"},
            },
        },
    )


def test_a_signing_secret_the_worker_would_refuse_is_reported_not_echoed(
    k8s: LocalCluster, operator: Operator
) -> None:
    apply(
        k8s,
        # libpq parses it; nothing listens there: the reason past the signing check.
        secret_manifest("db", dsn="host=127.0.0.1 port=1 dbname=x user=x connect_timeout=1"),
        secret_manifest("bad-keys", keys=f"{GOOD}\n{BAD}\n"),
        secret_manifest("good-keys", keys=f"{GOOD}\n\n"),
        _signed("bad", "bad-keys"),
        _signed("good", "good-keys"),
    )
    bad = wait_for(
        "InvalidSigningSecret",
        lambda: (c := condition(k8s, "bad", "Ready")).get("reason") == "InvalidSigningSecret" and c,
    )
    assert bad["status"] == "False"
    assert bad["message"] == (
        f"key `keys` of Secret `{NS}/bad-keys`: line 2: a signing secret starts with 'whsec_' "
        "followed by base64"
    )
    wait_for(
        "the InvalidSigningSecret Event",
        lambda: [e for e in events(k8s, "bad") if e["reason"] == "InvalidSigningSecret"],
    )
    good = wait_for(
        "the good one past the signing check",
        lambda: (c := condition(k8s, "good", "Ready")).get("reason") == "DatabaseUnreachable" and c,
    )
    assert good["status"] == "False"
    shown = str(k8s.objects("v1", "events", NS)) + operator.log() + str(bad) + str(good)
    for secret in (BAD, GOOD, GOOD.removeprefix("whsec_")):
        assert secret not in shown


def test_any_option_set_from_a_secret_is_read_by_its_own_description(
    k8s: LocalCluster, operator: Operator
) -> None:
    # The HTTP headers' Secret: a line the worker's --http-header would refuse (no colon),
    # under the generic reason; the line named, the value (a credential) never.
    token = "Bearer 0123456789abcdefHunter2"
    headers = dispatcher_manifest(
        "headers",
        database={"dsnSecretRef": {"name": "db", "key": "dsn"}, "table": "outbox"},
        publisher={
            "type": "http",
            "http": {
                "url": "http://sink.example/in",
                "headersSecretRef": {"name": "bad-headers", "key": "headers"},
            },
        },
    )
    apply(
        k8s,
        secret_manifest("db", dsn="host=127.0.0.1 port=1 dbname=x user=x connect_timeout=1"),
        secret_manifest("bad-headers", headers=f"X-Tenant: shop\nAuthorization {token}\n"),
        headers,
    )
    ready = wait_for(
        "InvalidPublisherOptions",
        lambda: (
            (c := condition(k8s, "headers", "Ready")).get("reason") == "InvalidPublisherOptions"
            and c
        ),
    )
    assert ready["message"] == (
        f"key `headers` of Secret `{NS}/bad-headers`: line 2: expected 'Name: value'"
    )
    shown = str(k8s.objects("v1", "events", NS)) + operator.log() + str(ready)
    assert token not in shown and "Hunter2" not in shown
