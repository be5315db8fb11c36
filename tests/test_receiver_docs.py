"""docs/receiving.md's aiohttp receiver, as written: its pool opens with the application, a
real worker signs and sends to it, and each payment is applied once."""

from __future__ import annotations

import base64
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import aiohttp
import psycopg
import pytest
from aiohttp import web
from helpers import row, wait_until
from workers import dispatching, settings

from outbox import Event, enqueue_many, inbox
from outbox.signing_keys import signing_key
from outbox.worker.publishers.http import HttpPublisher

DOC = Path(__file__).resolve().parent.parent / "docs" / "receiving.md"
NEW, OLD = ("whsec_" + base64.b64encode(bytes(range(n, n + 32))).decode() for n in (3, 60))


def documented_receiver() -> str:
    """The first Python block of the aiohttp and ASGI section."""
    section = DOC.read_text().split("### HTTP: aiohttp and ASGI", 1)[1]
    [code] = re.findall(r"```python\n(.*?)```", section, flags=re.S)[:1]
    return code


@pytest.fixture
def billing(dsn: str) -> str:
    """The receiver's database: its inbox table (as `outbox inbox migrate --table
    billing_inbox` makes it) and the invoices the example pays."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        inbox.migrate(conn, "billing_inbox")
        conn.execute("CREATE TABLE invoices (id int PRIMARY KEY, paid boolean NOT NULL)")
        conn.execute("INSERT INTO invoices VALUES (7, false), (8, false)")
    return dsn


async def test_the_documented_aiohttp_receiver_opens_its_pool_and_applies_signed_payments(
    conn: psycopg.Connection[Any], billing: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RECEIVER_DSN", billing)
    monkeypatch.setenv("SIGNING_SECRETS", f"{NEW}\n{OLD}")  # rotating: both accepted
    namespace: dict[str, Any] = {"__name__": "receiving_docs"}  # not run as a script
    exec(compile(documented_receiver(), str(DOC), "exec"), namespace)  # our own docs' code
    app, pool = namespace["app"], namespace["pool"]
    assert pool.closed  # nothing opened at import: the application does

    runner = web.AppRunner(app)
    await runner.setup()  # the application's start: its cleanup context opens the pool
    try:
        assert not pool.closed
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        host, port = runner.addresses[0][:2]
        url = f"http://{host}:{port}/events"
        with conn.transaction():
            ids = enqueue_many(
                conn,
                [
                    Event("invoice", "7", "InvoicePaid", {"invoice": 7}),
                    Event("invoice", "8", "InvoicePaid", {"invoice": 8}),
                ],
            )
        publisher = HttpPublisher(url, owner="test", signing_keys=[signing_key(OLD)])
        async with dispatching(settings(billing), publisher):
            await wait_until(lambda: all(row(conn, i)["status"] == "done" for i in ids))
        unsigned = {"payload": {"invoice": 8}}  # refused, nothing applied
        async with (
            aiohttp.ClientSession() as session,
            session.post(url, json=unsigned, headers={"Idempotency-Key": "99"}) as response,
        ):
            assert response.status == 401
    finally:
        await runner.cleanup()
    assert pool.closed  # and closed with the application
    with psycopg.connect(billing) as c:
        paid = c.execute("SELECT id, paid FROM invoices ORDER BY id").fetchall()
        kept = c.execute("SELECT consumer, message_id FROM billing_inbox ORDER BY 2").fetchall()
    assert paid == [(7, True), (8, True)]
    assert kept == [("billing", str(i)) for i in sorted(ids)]


README = DOC.parent.parent / "README.md"


def test_the_readmes_inbox_snippet_records_in_the_table_its_migrate_made(empty_dsn: str) -> None:
    """README section 5 as a reader runs it: its `outbox inbox migrate` line, then its Python,
    twice with the same key: recorded in that table, applied once."""
    section = README.read_text().split("### 5. Receive each message once", 1)[1]
    section = section.split("\n## ", 1)[0]
    [commands] = re.findall(r"```sh\n(.*?)```", section, flags=re.S)
    [migrating] = [
        shlex.split(line.split("#")[0].replace('"$RECEIVER_DSN"', shlex.quote(empty_dsn)))
        for line in commands.splitlines()
        if line.startswith("outbox inbox migrate")
    ]
    [snippet] = re.findall(r"```python\n(.*?)```", section, flags=re.S)
    made = subprocess.run(
        [sys.executable, "-m", "outbox", *migrating[1:]], capture_output=True, text=True
    )
    assert made.returncode == 0, made.stderr
    applied: list[str] = []
    with psycopg.connect(empty_dsn) as conn:
        for _ in range(2):  # the first delivery, then its duplicate
            scope = {"conn": conn, "key": "42", "event": {"id": 42}}
            scope["apply"] = lambda conn, event: applied.append(str(event["id"]))
            exec(snippet, scope)  # our own docs' code
        kept = conn.execute("SELECT consumer, message_id FROM billing_inbox").fetchall()
    assert applied == ["42"]
    assert kept == [("billing", "42")]
