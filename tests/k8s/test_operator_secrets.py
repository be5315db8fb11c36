"""Nothing secret is echoed by the operator: every hostile value of tests/hostile.py as the
DSN key of a Secret, each with a dispatcher that points at it, one real operator (kopf)
serving them all. No 8-character piece of any secret may appear in a resource's status, in
an Event or in the operator's log; a missing key is named without the Secret's other keys.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from hostile import DSNS, PEM_KEY, assert_no_leak

from .cluster import LocalCluster
from .test_operator import (
    NS,
    Operator,
    apply,
    condition,
    dispatcher_manifest,
    events,
    get,
    secret_manifest,
    wait_for,
)

pytestmark = pytest.mark.slow
# Key names that say what their values are: not the resource author's to learn either.
OTHER_KEYS = {"api-token-for-Hunter2Payments": "x", "tls.key": PEM_KEY}


def _database(secret: str) -> dict[str, Any]:
    return {"dsnSecretRef": {"name": secret, "key": "dsn"}, "table": "outbox"}


def test_no_secret_reaches_status_events_or_the_operator_log(
    k8s: LocalCluster, operator: Operator
) -> None:
    cluster = k8s
    manifests = []
    for i, case in enumerate(DSNS):
        manifests += [
            secret_manifest(f"db-{i}", dsn=case.value),
            dispatcher_manifest(f"d-{i}", database=_database(f"db-{i}")),
        ]
    manifests += [
        secret_manifest("other", **OTHER_KEYS),
        dispatcher_manifest("missing", database=_database("other")),
    ]
    apply(cluster, *manifests)

    for i, case in enumerate(DSNS):
        # A DSN libpq parses points at 127.0.0.1 port 1: unreachable, secrets masked.
        reason = "DatabaseUnreachable" if case.parses else "InvalidDsn"
        ready = wait_for(
            f"{reason} for {case.name}",
            lambda i=i, reason=reason: (
                (c := condition(cluster, f"d-{i}", "Ready")) and c.get("reason") == reason and c
            ),
        )
        if not case.parses:
            assert ready["message"].startswith(
                f"key `dsn` of Secret `{NS}/db-{i}` is not a libpq connection string: "
            )
        else:
            assert ready["message"].startswith("cannot connect to ")
            assert "host=127.0.0.1 port=1" in ready["message"]
        wait_for(
            f"the {reason} Event of {case.name}",
            lambda i=i, reason=reason: [
                e for e in events(cluster, f"d-{i}") if e["reason"] == reason
            ],
        )
    missing = wait_for(
        "SecretKeyMissing",
        lambda: (
            (c := condition(cluster, "missing", "Ready")).get("reason") == "SecretKeyMissing" and c
        ),
    )
    assert missing["message"] == f"Secret `{NS}/other` has no key `dsn`"
    wait_for(
        "the SecretKeyMissing Event",
        lambda: [e for e in events(cluster, "missing") if e["reason"] == "SecretKeyMissing"],
    )

    shown = json.dumps(
        [
            [get(cluster, "outboxdispatchers", name), events(cluster, name)]
            for name in [*(f"d-{i}" for i in range(len(DSNS))), "missing"]
        ]
    )
    log = operator.log()
    for case in DSNS:
        assert_no_leak(shown, case.secrets, f"status or Events ({case.name})")
        assert_no_leak(log, case.secrets, f"the operator's log ({case.name})")
    for text, where in ((shown, "status or Events"), (log, "the operator's log")):
        assert "Hunter2Payments" not in text and "tls.key" not in text, where
        assert_no_leak(text, [PEM_KEY.strip()], where)
