"""A database that stops answering under a running dispatcher (its server frozen, or the
network between them dropping every packet while the connections stay open) is that
dispatcher's problem only, and is said: its next pass ends at the pass's deadline and
reports `DatabaseUnreachable`, the other dispatchers go on, and once the database answers
again the stalled one recovers by itself.
"""

from __future__ import annotations

from collections.abc import Callable

import psycopg
import pytest
from chaos.proxy import Proxy
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from outbox.producer import Event, enqueue_many
from outbox.table import Table

from .cluster import LocalCluster
from .test_operator import (
    Operator,
    apply,
    condition,
    dispatcher_manifest,
    get,
    own_table,
    secret_manifest,
    wait_for,
)

pytestmark = pytest.mark.slow


def _reachable(cluster: LocalCluster, name: str) -> dict[str, object] | None:
    found = condition(cluster, name, "DatabaseReachable")
    return found if found.get("status") == "True" else None


def test_a_database_that_stops_answering_is_said_and_the_others_go_on(
    cluster: LocalCluster, operators: Callable[..., Operator], dsn: str
) -> None:
    port = int(conninfo_to_dict(dsn).get("port") or 5432)
    with Proxy(port) as proxy:
        held = make_conninfo(dsn, host="127.0.0.1", port=str(proxy.port))
        apply(
            cluster,
            secret_manifest("orders-db", dsn=held),
            secret_manifest("billing-db", dsn=dsn),
            dispatcher_manifest("orders"),
            dispatcher_manifest("billing", database=own_table(dsn, "billing", "billing-db")),
        )
        operators()
        for name in ("orders", "billing"):
            wait_for(f"{name}'s database checked", lambda name=name: _reachable(cluster, name))
        # The pool keeps orders' connection open between passes: from now on nothing it
        # sends is answered, and nothing resets it.
        proxy.stall()
        stalled = wait_for(
            "DatabaseReachable=False for the stalled database",
            lambda: (
                (c := condition(cluster, "orders", "DatabaseReachable")).get("status") == "False"
                and c
            ),
            timeout=90,
        )
        assert stalled["reason"] == "DatabaseUnreachable", stalled
        assert condition(cluster, "orders", "Ready")["status"] == "False"
        # billing's passes went on meanwhile: a new row shows in its status.
        with psycopg.connect(dsn, autocommit=True) as conn:
            enqueue_many(conn, [Event("order", "1", "created", {})], table=Table.parse("billing"))
        wait_for(
            "billing's backlog read while orders' database stalls",
            lambda: (
                ((get(cluster, "outboxdispatchers", "billing") or {}).get("status") or {})
                .get("backlog", {})
                .get("pending")
            ),
        )
        proxy.resume()
        wait_for("orders recovered", lambda: _reachable(cluster, "orders"), timeout=90)
