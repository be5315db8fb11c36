"""HTTP receivers through the inbox: a real aiohttp server and a real ASGI server (uvicorn),
real PostgreSQL, real HTTP requests, and the real worker delivering duplicates."""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import aiohttp
import psycopg
import pytest
import uvicorn
from aiohttp import web
from helpers import seed, wait_until
from multidict import CIMultiDict
from psycopg_pool import AsyncConnectionPool
from standardwebhooks import Webhook
from workers import dispatching, settings

from outbox import inbox
from outbox.demo.embedded import free_port
from outbox.receiver import apply_async
from outbox.receiver.aiohttp import inbox_handler
from outbox.receiver.asgi import InboxEndpoint
from outbox.receiver.http import Delivery, Handler, Reply, Signatures
from outbox.worker.publishers.http import HttpPublisher

SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"  # the Standard Webhooks spec's example
OLD_SECRET = "whsec_" + "c2VjcmV0LWJlZm9yZS1yb3RhdGlvbg=="
FORMS = ["aiohttp", "asgi"]
CRASH = Path(__file__).parent / "receiver_crash.py"


@pytest.fixture
def receiver_dsn(dsn: str) -> str:
    with psycopg.connect(dsn, autocommit=True) as conn:
        inbox.migrate(conn)
        # No unique key on purpose: a second effect would show as a second row.
        conn.execute("CREATE TABLE effects (message_id text, body text, by text)")
    return dsn


@pytest.fixture
async def pool(receiver_dsn: str) -> AsyncIterator[AsyncConnectionPool]:
    async with AsyncConnectionPool(receiver_dsn, min_size=1, max_size=8, open=False) as p:
        yield p


def effects(dsn: str) -> list[tuple[str, str]]:
    with psycopg.connect(dsn) as conn:
        rows = conn.execute("SELECT message_id, by FROM effects ORDER BY 1, 2").fetchall()
    return [(str(m), str(b)) for m, b in rows]


def recorded(dsn: str) -> list[str]:
    with psycopg.connect(dsn) as conn:
        return [str(r[0]) for r in conn.execute("SELECT message_id FROM outbox_inbox ORDER BY 1")]


def applying(by: str = "r") -> Handler:
    async def apply(conn: psycopg.AsyncConnection[Any], delivery: Delivery) -> Reply | None:
        await conn.execute(
            "INSERT INTO effects VALUES (%s, %s, %s)",
            (delivery.message_id, delivery.body.decode(), by),
        )
        return None

    return apply


@asynccontextmanager
async def aiohttp_server(view: Callable[[web.Request], Awaitable[web.StreamResponse]]):
    app = web.Application()
    app.router.add_post("/events", view)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    host, port = runner.addresses[0][:2]
    try:
        yield f"http://{host}:{port}/events"
    finally:
        await runner.cleanup()


@asynccontextmanager
async def asgi_server(app: Any) -> AsyncIterator[str]:
    """uvicorn serving `app` on a socket bound here (so the port is known up front)."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(
        uvicorn.Config(app, log_level="warning", lifespan="on", timeout_graceful_shutdown=5)
    )
    task = asyncio.create_task(server.serve(sockets=[sock]))
    await wait_until(lambda: server.started or task.done(), timeout=10, what="uvicorn started")
    assert not task.done(), task
    try:
        yield f"http://127.0.0.1:{port}/events"
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, timeout=15)
        sock.close()


@asynccontextmanager
async def receiver(form: str, handler: Handler, **options: Any) -> AsyncIterator[str]:
    """A real server of `form` applying `handler` through the inbox; yields its URL."""
    if form == "aiohttp":
        async with aiohttp_server(inbox_handler(handler, **options)) as url:
            yield url
    else:
        async with asgi_server(InboxEndpoint(handler, **options)) as url:
            yield url


async def post(
    url: str, body: bytes | str = b'{"n": 1}', headers: dict[str, str] | None = None
) -> tuple[int, CIMultiDict[str], bytes]:
    async with aiohttp.ClientSession() as session:
        data = body.encode() if isinstance(body, str) else body
        async with session.post(url, data=data, headers=headers or {}) as response:
            return response.status, CIMultiDict(response.headers), await response.read()


def signed(
    secret: str, message_id: str, body: str, *, at: datetime | None = None
) -> dict[str, str]:
    at = at or datetime.now(UTC)
    return {
        "webhook-id": message_id,
        "webhook-timestamp": str(int(at.timestamp())),
        "webhook-signature": Webhook(secret).sign(message_id, at, body),
    }


# -- one delivery, its duplicates ------------------------------------------------------------


@pytest.mark.parametrize("form", FORMS)
async def test_a_duplicate_is_answered_2xx_without_running_the_handler(form, pool, receiver_dsn):
    async with receiver(form, applying(), connect=pool.connection, consumer="billing") as url:
        first = await post(url, headers={"Idempotency-Key": "41"})
        again = await post(url, headers={"Idempotency-Key": "41"})
        other = await post(url, headers={"Idempotency-Key": "42"})
    assert (first[0], first[1]["Outbox-Inbox"]) == (204, "applied")
    assert (again[0], again[1]["Outbox-Inbox"], again[2]) == (200, "duplicate", b"")
    assert other[0] == 204
    assert effects(receiver_dsn) == [("41", "r"), ("42", "r")]
    assert recorded(receiver_dsn) == ["41", "42"]


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize(
    ("headers", "body", "key"),
    [
        (
            {"webhook-id": "msg_2KWPBgLlAfxdpx2AI54pPJ85f4W"},
            "{}",
            "msg_2KWPBgLlAfxdpx2AI54pPJ85f4W",
        ),
        ({"Idempotency-Key": '"8e03978e-40d5"'}, "{}", "8e03978e-40d5"),  # the IETF draft's form
        ({"ce-id": "A234-1234", "ce-specversion": "1.0"}, "{}", "A234-1234"),  # binary mode
        (
            {"Content-Type": "application/cloudevents+json; charset=utf-8"},
            '{"specversion": "1.0", "id": "ev-9", "source": "/outbox/outbox", "type": "T"}',
            "ev-9",
        ),  # structured mode
        ({"webhook-id": "w-1", "Idempotency-Key": "i-1"}, "{}", "w-1"),
    ],
)
async def test_the_message_id_is_read_where_each_standard_puts_it(
    form, pool, receiver_dsn, headers, body, key
):
    async with receiver(form, applying(), connect=pool.connection, consumer="c") as url:
        status, _, _ = await post(url, body, headers)
        assert status == 204
        # The bare form of a quoted key is the same key.
        again = await post(url, body, {"Idempotency-Key": key})
    assert again[0] == 200
    assert effects(receiver_dsn) == [(key, "r")]


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize(
    ("headers", "body", "says"),
    [
        ({}, "{}", "no message id"),
        ({"Idempotency-Key": ""}, "{}", "no message id"),
        ({"Idempotency-Key": "x" * 513}, "{}", "longer than 512 bytes"),
        ({"Content-Type": "application/cloudevents+json"}, "not json", "not JSON"),
        ({"Content-Type": "application/cloudevents+json"}, '{"id": 7}', "no string id"),
    ],
)
async def test_a_request_without_a_usable_id_is_400_and_applies_nothing(
    form, pool, receiver_dsn, headers, body, says
):
    async with receiver(form, applying(), connect=pool.connection, consumer="c") as url:
        status, _, text = await post(url, body, headers)
    assert status == 400 and says in text.decode()
    assert effects(receiver_dsn) == [] and recorded(receiver_dsn) == []


@pytest.mark.parametrize("form", FORMS)
async def test_a_failing_handler_rolls_back_record_and_effect_and_the_retry_applies(
    form, pool, receiver_dsn
):
    calls = 0

    async def flaky(conn: psycopg.AsyncConnection[Any], delivery: Delivery) -> Reply | None:
        nonlocal calls
        calls += 1
        await applying()(conn, delivery)  # the effect is written, then the handler fails
        if calls == 1:
            raise RuntimeError("downstream of the receiver failed")
        return Reply(201, b"made")

    async with receiver(form, flaky, connect=pool.connection, consumer="c") as url:
        failed = await post(url, headers={"Idempotency-Key": "7"})
        assert failed[0] == 500
        assert effects(receiver_dsn) == [] and recorded(receiver_dsn) == []
        retried = await post(url, headers={"Idempotency-Key": "7"})
    assert (retried[0], retried[2]) == (201, b"made")
    assert effects(receiver_dsn) == [("7", "r")]


@pytest.mark.parametrize("form", FORMS)
async def test_a_non_2xx_reply_is_kept_and_rolls_back(form, pool, receiver_dsn):
    async def refuse(conn: psycopg.AsyncConnection[Any], delivery: Delivery) -> Reply:
        await applying()(conn, delivery)
        return Reply(422, b"unknown invoice", {"Content-Type": "text/plain"})

    async with receiver(form, refuse, connect=pool.connection, consumer="c") as url:
        status, headers, body = await post(url, headers={"Idempotency-Key": "9"})
    assert (status, body) == (422, b"unknown invoice")
    assert "Outbox-Inbox" not in headers
    # A person may fix the invoice and requeue: the message must not be found recorded.
    assert effects(receiver_dsn) == [] and recorded(receiver_dsn) == []


@pytest.mark.parametrize("form", FORMS)
async def test_a_body_over_the_limit_is_413(form, pool, receiver_dsn):
    async with receiver(
        form, applying(), connect=pool.connection, consumer="c", max_body=100
    ) as url:
        big = await post(url, b"x" * 101, {"Idempotency-Key": "1"})
        fits = await post(url, b"x" * 100, {"Idempotency-Key": "2"})
    assert (big[0], fits[0]) == (413, 204)
    assert effects(receiver_dsn) == [("2", "r")]


async def test_the_asgi_endpoint_answers_post_only(pool):
    endpoint = InboxEndpoint(applying(), connect=pool.connection, consumer="c")
    async with (
        asgi_server(endpoint) as url,
        aiohttp.ClientSession() as session,
        session.get(url) as response,
    ):
        assert (response.status, response.headers["Allow"]) == (405, "POST")


@pytest.mark.parametrize("form", FORMS)
async def test_a_missing_inbox_table_is_500_naming_the_command(form, pool, receiver_dsn, caplog):
    async with receiver(
        form, applying(), connect=pool.connection, consumer="c", table="nowhere"
    ) as url:
        status, _, _ = await post(url, headers={"Idempotency-Key": "1"})
    assert status == 500
    assert "run `outbox inbox migrate --table nowhere`" in caplog.text


async def test_an_unreachable_database_is_503(receiver_dsn):
    @asynccontextmanager
    async def unreachable() -> AsyncIterator[psycopg.AsyncConnection[Any]]:
        conn = await psycopg.AsyncConnection.connect("host=127.0.0.1 port=1 connect_timeout=2")
        yield conn  # never reached

    async with receiver("aiohttp", applying(), connect=unreachable, consumer="c") as url:
        status, headers, _ = await post(url, headers={"Idempotency-Key": "1"})
    assert (status, headers["Retry-After"]) == (503, "1")


# -- signatures ------------------------------------------------------------------------------


@pytest.mark.parametrize("form", FORMS)
async def test_signed_requests_are_verified_with_every_secret(form, pool, receiver_dsn):
    secrets = [SECRET, OLD_SECRET]  # rotation: both are accepted for a while
    body = '{"n": 1}'
    async with receiver(
        form, applying(), connect=pool.connection, consumer="c", secrets=secrets
    ) as url:
        new = await post(url, body, signed(SECRET, "m-1", body))
        old = await post(url, body, signed(OLD_SECRET, "m-2", body))
        # A retry: a new timestamp and signature, the same webhook-id.
        retry = await post(url, body, signed(SECRET, "m-1", body))
        # The signed id is the key: another Idempotency-Key does not make a new message, it
        # says the request was altered (tests/test_receiver_signed.py: ce-id, the attributes).
        replay = await post(url, body, {**signed(SECRET, "m-1", body), "Idempotency-Key": "m-9"})
        same = await post(url, body, {**signed(SECRET, "m-2", body), "Idempotency-Key": "m-2"})
    assert [new[0], old[0], retry[0], replay[0], same[0]] == [204, 204, 200, 401, 200]
    assert effects(receiver_dsn) == [("m-1", "r"), ("m-2", "r")]


@pytest.mark.parametrize("form", FORMS)
async def test_unsigned_forged_or_stale_requests_are_401_and_apply_nothing(
    form, pool, receiver_dsn
):
    body = '{"n": 1}'
    other = "whsec_" + "b3RoZXIta2V5LW5vdC1vdXJz"
    cases = {
        "unsigned": {"Idempotency-Key": "1"},
        "wrong key": signed(other, "2", body),
        "body changed": signed(SECRET, "3", '{"n": 2}'),
        "id changed": {**signed(SECRET, "4", body), "webhook-id": "5"},
        "stale": signed(SECRET, "6", body, at=datetime.now(UTC) - timedelta(minutes=6)),
        "malformed": {**signed(SECRET, "7", body), "webhook-signature": "v1"},
        "not base64": {**signed(SECRET, "8", body), "webhook-signature": "v1,@@@"},
    }
    async with receiver(
        form, applying(), connect=pool.connection, consumer="c", secrets=[SECRET]
    ) as url:
        answers = {name: (await post(url, body, headers))[0] for name, headers in cases.items()}
    assert answers == dict.fromkeys(cases, 401)
    assert effects(receiver_dsn) == [] and recorded(receiver_dsn) == []


def test_the_spec_example_verifies_and_a_bad_secret_is_refused_without_its_value():
    """The Standard Webhooks specification's own example request."""
    headers = {
        "webhook-id": "msg_p5jXN8AQM9LWM0D4loKWxJek",
        "webhook-timestamp": "1614265330",
        "webhook-signature": "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=",
    }
    body = b'{"test": 2432232314}'
    webhook = Webhook(SECRET)
    # The library checks the timestamp against now; the signature itself is the spec's.
    expected = webhook.sign(
        headers["webhook-id"], datetime.fromtimestamp(1614265330, UTC), body.decode()
    )
    assert expected == headers["webhook-signature"]
    with pytest.raises(ValueError) as refused:
        Signatures(["whsec_not-base64!"])
    assert "signing secret #1" in str(refused.value) and "not-base64" not in str(refused.value)


# -- in parallel -----------------------------------------------------------------------------


async def _waiting_on_a_lock(dsn: str) -> bool:
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        cur = await conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
            "AND datname = current_database()"
        )
        row = await cur.fetchone()
        return bool(row and row[0] >= 1)


async def test_two_receivers_get_the_same_message_at_the_same_instant(receiver_dsn):
    """An aiohttp and an ASGI receiver, each with its own pool (as two processes would have),
    both POSTed the same message at once: the first's handler holds its transaction open until
    the second is seen waiting on the key in PostgreSQL; one effect, both answered 2xx."""
    release = asyncio.Event()

    def holding(by: str) -> Handler:
        async def apply(conn: psycopg.AsyncConnection[Any], delivery: Delivery) -> None:
            await applying(by)(conn, delivery)
            await asyncio.wait_for(release.wait(), timeout=20)

        return apply

    async with (
        AsyncConnectionPool(receiver_dsn, min_size=1, open=False) as one,
        AsyncConnectionPool(receiver_dsn, min_size=1, open=False) as two,
        receiver("aiohttp", holding("aiohttp"), connect=one.connection, consumer="c") as a,
        receiver("asgi", holding("asgi"), connect=two.connection, consumer="c") as b,
    ):
        headers = {"Idempotency-Key": "77"}
        answers = asyncio.gather(post(a, headers=headers), post(b, headers=headers))
        await wait_until(lambda: _waiting_on_a_lock(receiver_dsn), timeout=20, what="a waiter")
        release.set()
        (s1, h1, _), (s2, h2, _) = await answers
    assert sorted([(s1, h1["Outbox-Inbox"]), (s2, h2["Outbox-Inbox"])]) == [
        (200, "duplicate"),
        (204, "applied"),
    ]
    assert len(effects(receiver_dsn)) == 1 and recorded(receiver_dsn) == ["77"]


async def test_repeatable_read_duplicates_are_rolled_back_and_run_again(receiver_dsn):
    """At REPEATABLE READ the waiting duplicate fails with a serialization failure when the
    first commits; apply_async runs it again, and then it is a duplicate."""

    @asynccontextmanager
    async def repeatable_read() -> AsyncIterator[psycopg.AsyncConnection[Any]]:
        async with await psycopg.AsyncConnection.connect(receiver_dsn) as conn:
            await conn.set_isolation_level(psycopg.IsolationLevel.REPEATABLE_READ)
            yield conn

    release = asyncio.Event()
    runs: list[str] = []

    async def effect(by: str, conn: psycopg.AsyncConnection[Any]) -> str:
        runs.append(by)
        await conn.execute("INSERT INTO effects VALUES ('k', '', %s)", (by,))
        if by == "first":
            await release.wait()
        return by

    first = asyncio.create_task(
        apply_async(repeatable_read, lambda c: effect("first", c), consumer="c", message_id="k")
    )
    await wait_until(lambda: runs == ["first"], timeout=10)
    second = asyncio.create_task(
        apply_async(repeatable_read, lambda c: effect("second", c), consumer="c", message_id="k")
    )
    await wait_until(lambda: _waiting_on_a_lock(receiver_dsn), timeout=20, what="a waiter")
    release.set()
    done_first, done_second = await asyncio.gather(first, second)
    assert (done_first.first, done_first.value) == (True, "first")
    assert done_second.duplicate and done_second.value is None
    assert runs == ["first"]
    assert effects(receiver_dsn) == [("k", "first")]


# -- duplicates from the real worker ---------------------------------------------------------


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("slow", ["after the commit", "inside the transaction"])
async def test_the_workers_retries_after_timeouts_give_one_effect_each(
    form, slow, conn, dsn, pool, receiver_dsn
):
    """The receiver answers each message's first delivery after the worker's publish timeout
    (its commit already done, or still to come): the worker retries, the receiver sees every
    message at least twice, and applies each once."""
    ids = seed(conn, 6)
    seen: dict[str, int] = {}
    hold = 0.6  # seconds; the publish timeout is 0.2 s

    async def apply(conn_: psycopg.AsyncConnection[Any], delivery: Delivery) -> None:
        await applying(form)(conn_, delivery)
        if slow == "inside the transaction":
            await asyncio.sleep(hold)  # a retry meanwhile waits on the key, then is a duplicate

    async def answer_late(view: Any, request: Any) -> Any:
        key = request.headers["Idempotency-Key"]
        seen[key] = seen.get(key, 0) + 1
        response = await view(request)
        if seen[key] == 1 and slow == "after the commit":
            await asyncio.sleep(hold)  # committed; the answer comes too late
        return response

    options = {"connect": pool.connection, "consumer": "orders"}
    if form == "aiohttp":
        view = inbox_handler(apply, **options)

        async def late(request: web.Request) -> web.StreamResponse:
            return await answer_late(view, request)

        server = aiohttp_server(late)
    else:
        endpoint = InboxEndpoint(apply, **options)

        async def app(scope: Any, receive: Any, send: Any) -> None:
            if scope["type"] == "http":
                key = dict(scope["headers"]).get(b"idempotency-key", b"").decode()
                seen[key] = seen.get(key, 0) + 1
                if seen[key] == 1 and slow == "after the commit":
                    # The response is held back after the endpoint committed.
                    held: list[Any] = []

                    async def late_send(message: Any) -> None:
                        held.append(message)

                    await endpoint(scope, receive, late_send)
                    await asyncio.sleep(hold)
                    for message in held:
                        await send(message)
                    return
            await endpoint(scope, receive, send)

        server = asgi_server(app)

    async with server as url:
        publisher = HttpPublisher(url, owner="test-worker")
        # Breaker off: every message fails its first attempt, which would open it (and
        # refund attempts); the scenario here is the plain retry.
        worker = settings(
            dsn,
            publish_timeout=timedelta(milliseconds=200),
            lease=timedelta(seconds=5),
            breaker_failures=0,
            max_attempts=1000,  # a loaded machine may time out more than the held first try
        )
        async with dispatching(worker, publisher):
            await wait_until(
                lambda: (
                    conn.execute("SELECT count(*) FROM outbox WHERE status = 'done'").fetchone()[0]  # type: ignore[index]
                    == len(ids)
                ),
                timeout=60,
            )
    assert all(seen[str(i)] >= 2 for i in ids), seen  # every message came again
    assert effects(receiver_dsn) == sorted((str(i), form) for i in ids)  # applied once each
    attempts = conn.execute("SELECT min(attempts) FROM outbox").fetchone()
    assert attempts is not None and attempts[0] >= 2
    bodies = [
        json.loads(b)
        for (b,) in psycopg.connect(receiver_dsn).execute("SELECT body FROM effects").fetchall()
    ]
    assert sorted(b["id"] for b in bodies) == ids


# -- a receiver killed mid-transaction -------------------------------------------------------


async def _backend(dsn: str, application_name: str) -> str | None:
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        cur = await conn.execute(
            "SELECT state FROM pg_stat_activity WHERE application_name = %s", (application_name,)
        )
        row = await cur.fetchone()
        return None if row is None else str(row[0])


async def test_a_receiver_killed_between_its_effect_and_its_commit_leaves_neither(
    pool, receiver_dsn
):
    """A receiver process wrote the effect and recorded the id, and is killed before its
    commit: PostgreSQL rolls both back, and the sender's retry to another receiver applies
    the message, once."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, str(CRASH), "http", receiver_dsn, str(port), "receiver-killed"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    url = f"http://127.0.0.1:{port}/events"
    try:
        await wait_until(lambda: _accepts(port), timeout=30, what="the receiver process")
        sent = asyncio.create_task(post(url, headers={"Idempotency-Key": "55"}))
        await wait_until(
            lambda: _in_transaction(receiver_dsn), timeout=20, what="the effect, uncommitted"
        )
        proc.kill()
        proc.wait(timeout=10)
        with pytest.raises(aiohttp.ClientError):
            await sent  # the sender never got an answer: it will retry
        await wait_until(
            lambda: _gone(receiver_dsn), timeout=20, what="the killed receiver's session"
        )
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
    assert effects(receiver_dsn) == [] and recorded(receiver_dsn) == []
    async with receiver("aiohttp", applying(), connect=pool.connection, consumer="billing") as u:
        assert (await post(u, headers={"Idempotency-Key": "55"}))[0] == 204
        assert (await post(u, headers={"Idempotency-Key": "55"}))[0] == 200
    assert effects(receiver_dsn) == [("55", "r")]


def _accepts(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


async def _in_transaction(dsn: str) -> bool:
    return await _backend(dsn, "receiver-killed") == "idle in transaction"


async def _gone(dsn: str) -> bool:
    return await _backend(dsn, "receiver-killed") is None
