"""examples/: every object valid for its API (the CRD's schema and CEL rules for the
OutboxDispatchers, Kubernetes' for the Secrets, KEDA's CRDs for the ScaledObject), one example
per publisher with every Secret it names, and KEDA's queries right and cheap on a real table."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import psycopg
import pytest
import yaml
from helpers import seed

from chart import chart as c
from outbox.stats import queue_stats
from outbox.table import Table

EXAMPLES = c.ROOT / "examples"
# examples/kubectl/ is the operator's install manifest (test_manifest.py).
FILES = sorted(p for p in EXAMPLES.rglob("*.yaml") if "kubectl" not in p.parts)


def objects(path: Path) -> list[dict[str, Any]]:
    return [obj for obj in yaml.safe_load_all(path.read_text()) if obj]


def dispatchers() -> list[dict[str, Any]]:
    return [o for path in FILES for o in objects(path) if o["kind"] == "OutboxDispatcher"]


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(EXAMPLES)))
def test_every_example_object_is_accepted_by_its_api(path: Path) -> None:
    found = objects(path)
    assert found
    assert [error for obj in found for error in c.object_errors(obj)] == []


def test_one_example_per_publisher_except_null() -> None:
    crd = yaml.safe_load(c.CRD_SOURCE.read_text())
    [version] = crd["spec"]["versions"]
    publisher = version["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"][
        "publisher"
    ]
    # A plugin's example is its own (docs/publishers/plugins.md): no plugin ships in the image.
    types = set(publisher["properties"]["type"]["enum"]) - {"null", "plugin"}
    shown = [d["spec"]["publisher"]["type"] for d in dispatchers()]
    assert sorted(shown) == sorted(types)


@pytest.mark.parametrize("path", [p for p in FILES if "keda" not in p.parts], ids=lambda p: p.name)
def test_every_secret_an_example_names_is_in_it_with_the_key(path: Path) -> None:
    found = objects(path)
    secrets = {
        (o["metadata"]["namespace"], o["metadata"]["name"]): o["stringData"]
        for o in found
        if o["kind"] == "Secret"
    }
    [dispatcher] = [o for o in found if o["kind"] == "OutboxDispatcher"]
    namespace = dispatcher["metadata"]["namespace"]
    for ref in _secret_refs(dispatcher["spec"]):
        data = secrets.get((namespace, ref["name"]))
        assert data is not None, f"no Secret {namespace}/{ref['name']}"
        assert ref.get("key", "dsn") in data, ref


def test_the_keda_example_scales_an_example_dispatcher_within_its_bounds() -> None:
    keda = objects(EXAMPLES / "keda" / "scaledobject.yaml")
    [scaled] = [o for o in keda if o["kind"] == "ScaledObject"]
    [auth] = [o for o in keda if o["kind"] == "TriggerAuthentication"]
    target = scaled["spec"]["scaleTargetRef"]
    assert (target["apiVersion"], target["kind"]) == ("outbox.dev/v1alpha1", "OutboxDispatcher")
    [dispatcher] = [
        d
        for d in dispatchers()
        if d["metadata"]["name"] == target["name"]
        and d["metadata"]["namespace"] == scaled["metadata"]["namespace"]
    ]
    # KEDA writes spec.replicas, which the CRD refuses above scaling.maxReplicas.
    assert scaled["spec"]["maxReplicaCount"] <= dispatcher["spec"]["scaling"]["maxReplicas"]
    # The CRD's scale subresource is what KEDA's HPA reads and writes.
    crd = yaml.safe_load(c.CRD_SOURCE.read_text())
    [version] = crd["spec"]["versions"]
    assert version["subresources"]["scale"]["specReplicasPath"] == ".spec.replicas"
    assert version["subresources"]["scale"]["labelSelectorPath"]
    [secret] = auth["spec"]["secretTargetRef"]
    assert secret["parameter"] == "connection"
    assert (secret["name"], secret["key"]) == (
        dispatcher["spec"]["database"]["dsnSecretRef"]["name"],
        dispatcher["spec"]["database"]["dsnSecretRef"]["key"],
    )
    table = dispatcher["spec"]["database"]["table"]
    for trigger in scaled["spec"]["triggers"]:
        assert trigger["authenticationRef"]["name"] == auth["metadata"]["name"]
        assert f"FROM {table}" in trigger["metadata"]["query"], trigger["name"]
    # The count is bounded where the answer stops mattering: max replicas x target each.
    [backlog] = [t for t in scaled["spec"]["triggers"] if t["name"] == "ready-backlog"]
    [limit] = re.findall(r"LIMIT (\d+)", backlog["metadata"]["query"])
    assert int(limit) == scaled["spec"]["maxReplicaCount"] * int(
        backlog["metadata"]["targetQueryValue"]
    )


@pytest.fixture
def busy_table(conn: psycopg.Connection[Any]) -> psycopg.Connection[Any]:
    """Many done rows, a ready backlog, deferred and in-flight messages, fresh statistics."""
    seed(conn, 10_000 + 200 + 50 + 30, aggregates=100)
    conn.execute("UPDATE outbox SET status = 'done', done_at = now() WHERE id <= 10000")
    conn.execute(
        "UPDATE outbox SET available_at = now() - (id % 97) * interval '1 second'"
        " WHERE id > 10000 AND id <= 10200"
    )
    conn.execute(
        "UPDATE outbox SET available_at = now() + interval '1 hour'"
        " WHERE id > 10200 AND id <= 10250"
    )
    conn.execute(
        "UPDATE outbox SET status = 'processing', lease_until = now() + interval '1 minute',"
        " attempts = 1, lease_version = 1 WHERE id > 10250"
    )
    conn.execute("VACUUM ANALYZE outbox")
    return conn


def keda_queries() -> dict[str, str]:
    [scaled] = [
        o for o in objects(EXAMPLES / "keda" / "scaledobject.yaml") if o["kind"] == "ScaledObject"
    ]
    return {t["name"]: t["metadata"]["query"] for t in scaled["spec"]["triggers"]}


def test_the_keda_queries_answer_what_the_operator_reads(
    busy_table: psycopg.Connection[Any],
) -> None:
    queries = keda_queries()
    with busy_table.transaction():  # one now() for the three reads
        stats = queue_stats(busy_table, Table.parse("public.outbox"))
        [(ready,)] = busy_table.execute(queries["ready-backlog"]).fetchall()
        [(age,)] = busy_table.execute(queries["oldest-ready-age"]).fetchall()
    assert ready == stats.ready == 200
    assert stats.oldest_ready_age is not None
    assert float(age) == pytest.approx(stats.oldest_ready_age)
    assert float(age) >= 96  # the oldest was made ready 96 s ago


# The table's partial indexes over unfinished rows: done rows, however many, are never read.
UNFINISHED_INDEXES = ("outbox_ready", "outbox_waiting")


def test_the_keda_queries_read_only_unfinished_rows(busy_table: psycopg.Connection[Any]) -> None:
    for name, query in keda_queries().items():
        plan = "\n".join(row[0] for row in busy_table.execute(f"EXPLAIN {query}").fetchall())
        assert any(f"using {index} " in plan for index in UNFINISHED_INDEXES), (name, plan)
        assert "Seq Scan" not in plan, (name, plan)


def test_an_empty_queue_answers_zero_for_keda(conn: psycopg.Connection[Any]) -> None:
    for name, query in keda_queries().items():
        [(value,)] = conn.execute(query).fetchall()
        assert float(value) == 0, name


def _secret_refs(spec: Any) -> list[dict[str, Any]]:
    found = []
    if isinstance(spec, dict):
        for key, value in spec.items():
            if key.endswith("SecretRef") and isinstance(value, dict):
                found.append(value)
            else:
                found += _secret_refs(value)
    elif isinstance(spec, list):
        for item in spec:
            found += _secret_refs(item)
    return found
