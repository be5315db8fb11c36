"""Response classification, Retry-After parsing and retry backoff."""

from __future__ import annotations

import asyncio
import base64
import random
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime

import pytest
from aiohttp import web

from outbox.demo.embedded import free_port
from outbox.models import Message
from outbox.plumbing.errors import SettingError
from outbox.worker.backoff import full_jitter, retry_delay
from outbox.worker.cli import make_publisher
from outbox.worker.metrics import Metrics
from outbox.worker.publishers.base import PermanentError, RetryableError
from outbox.worker.publishers.envelope import envelope
from outbox.worker.publishers.http import HttpPublisher, classify, parse_retry_after
from outbox.worker.settings import load_settings

NOW = datetime(2025, 3, 14, 12, 0, 0, tzinfo=UTC)


@pytest.mark.parametrize("status", [200, 201, 202, 204, 299])
def test_2xx_is_success(status):
    assert classify(status, None, b"ignored") is None


@pytest.mark.parametrize("status", [408, 425, 429, 500, 502, 503, 504, 599])
def test_retryable_statuses(status):
    with pytest.raises(RetryableError, match=f"HTTP {status}") as info:
        classify(status, None, b"")
    assert info.value.retry_after is None


def test_retry_after_in_seconds_is_carried_on_the_error():
    with pytest.raises(RetryableError) as info:
        classify(429, "7", b"slow down")
    assert info.value.retry_after == timedelta(seconds=7)
    assert str(info.value) == "HTTP 429: slow down"


def test_retry_after_as_http_date_is_carried_on_the_error():
    when = datetime.now(UTC) + timedelta(seconds=120)
    with pytest.raises(RetryableError) as info:
        classify(503, format_datetime(when, usegmt=True), b"")
    assert info.value.retry_after is not None
    # The date has one-second resolution and some time passes before parsing.
    assert timedelta(seconds=115) <= info.value.retry_after <= timedelta(seconds=120)


@pytest.mark.parametrize("status", [400, 401, 403, 404, 409, 410, 422])
def test_other_4xx_are_permanent(status):
    with pytest.raises(PermanentError, match=f"^HTTP {status}"):
        classify(status, "5", b"")


@pytest.mark.parametrize("status", [100, 301, 302, 304, 307])
def test_1xx_and_redirects_are_permanent(status):
    with pytest.raises(PermanentError, match=f"HTTP {status}"):
        classify(status, None, b"")


def test_error_reason_holds_a_bounded_body_snippet():
    with pytest.raises(PermanentError) as info:
        classify(422, None, b'{"error": "amount must be positive"}' + b"x" * 5000)
    reason = str(info.value)
    assert reason.startswith('HTTP 422: {"error": "amount must be positive"}')
    assert len(reason) < 400


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        # An OSC retitling the terminal, a clear, a colour, then a line break forging a line.
        (
            b"\x1b]0;pwned\x07\x1b[2J\x1b[31mEVIL\nline2",
            r"HTTP 500: \x1b]0;pwned\x07\x1b[2J\x1b[31mEVIL\nline2",
        ),
        (b"a\r\nb\tc\x00d\x7fe", r"HTTP 500: a\r\nb\tc\x00d\x7fe"),
        (
            "C1 \x9b31m and \x85 (NEL) ünïcode".encode(),
            r"HTTP 500: C1 \x9b31m and \x85 (NEL) ünïcode",
        ),
        # Escaping never gets in the way of masking a URL's credentials.
        (b"see https://u:s3cret@h.test/x\nthen", r"HTTP 500: see https://***@h.test/x\nthen"),
    ],
)
def test_control_characters_of_a_body_are_escaped_in_the_reason(body, reason):
    with pytest.raises(RetryableError) as info:
        classify(500, None, body)
    assert str(info.value) == reason


def test_undecodable_body_does_not_break_classification():
    with pytest.raises(RetryableError, match="HTTP 500"):
        classify(500, None, b"\xff\xfe\x00 broken")


# -- Retry-After -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("0", timedelta(0)),
        ("120", timedelta(seconds=120)),
        (" 30 ", timedelta(seconds=30)),
        ("Fri, 14 Mar 2025 12:01:30 GMT", timedelta(seconds=90)),
        ("Fri, 14 Mar 2025 11:00:00 GMT", timedelta(0)),  # in the past: now
        ("Fri, 14 Mar 2025 13:00:00 +0100", timedelta(0)),  # the same instant as NOW
    ],
)
def test_parse_retry_after(value, expected):
    assert parse_retry_after(value, now=NOW) == expected


@pytest.mark.parametrize("value", [None, "", "soon", "-5", "1.5", "Fri, 32 Mar 2025 12:00:00 GMT"])
def test_unreadable_retry_after_is_none(value):
    assert parse_retry_after(value, now=NOW) is None


@pytest.mark.parametrize("value", ["99999999999999999999", "1" * 5000])
def test_absurd_retry_after_is_a_long_delay_not_a_crash(value):
    # A downstream's header must not make classification raise something unclassified.
    delay = parse_retry_after(value, now=NOW)
    assert delay is not None and delay > timedelta(days=365)
    with pytest.raises(RetryableError):
        classify(503, value, b"")
    # The worker caps it like any other hint.
    cap = timedelta(minutes=5)
    assert retry_delay(3, retry_after=delay, base=timedelta(seconds=1), cap=cap) == cap


def test_non_ascii_digits_are_not_seconds():
    assert parse_retry_after("\u00b2", now=NOW) is None  # "²".isdigit() is True


# -- backoff ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("attempt", "base", "cap"),
    [
        (0, timedelta(seconds=1), timedelta(minutes=5)),
        (3, timedelta(seconds=1), timedelta(minutes=5)),
        (6, timedelta(milliseconds=100), timedelta(seconds=2)),  # capped: 6.4s > 2s
        (200, timedelta(seconds=1), timedelta(minutes=5)),  # huge attempt: no overflow
    ],
)
def test_full_jitter_stays_within_bounds_and_spreads(attempt, base, cap):
    rng = random.Random(1234)
    ceiling = min(cap.total_seconds(), base.total_seconds() * 2.0 ** min(attempt, 62))
    draws = [full_jitter(attempt, base=base, cap=cap, rng=rng).total_seconds() for _ in range(2000)]
    assert all(0 <= d <= ceiling for d in draws)
    assert len(set(draws)) > 1900  # not constant
    # Spread over the whole range, not bunched at one end.
    assert min(draws) < ceiling * 0.05
    assert max(draws) > ceiling * 0.95
    assert ceiling * 0.4 < sum(draws) / len(draws) < ceiling * 0.6


def test_full_jitter_without_rng_uses_the_module_random():
    draws = {
        full_jitter(2, base=timedelta(seconds=1), cap=timedelta(seconds=10)) for _ in range(50)
    }
    assert len(draws) > 1
    assert all(timedelta(0) <= d <= timedelta(seconds=4) for d in draws)


def test_retry_delay_honours_retry_after_bounded_by_cap():
    base, cap = timedelta(seconds=1), timedelta(seconds=30)
    assert retry_delay(1, retry_after=timedelta(seconds=7), base=base, cap=cap) == timedelta(
        seconds=7
    )
    assert retry_delay(1, retry_after=timedelta(hours=1), base=base, cap=cap) == cap
    assert retry_delay(1, retry_after=None, base=base, cap=cap) <= timedelta(seconds=2)


# -- a real receiver misbehaving -----------------------------------------------------------


def _message(event_type: str = "OrderPaid", message_id: int = 1) -> Message:
    return Message(message_id, 1, 1, "order", "o-1", event_type, "{}", datetime.now(UTC))


class _Receiver:
    """A real HTTP server answering with the handler a test chooses; records what reached it."""

    def __init__(self, handler) -> None:
        self.handler = handler
        self.requests: list[str] = []
        self.cut_off = asyncio.Event()  # a streaming answer was cut by the client
        self.url = ""

    async def __aenter__(self) -> _Receiver:
        async def handle(request: web.Request) -> web.StreamResponse:
            self.requests.append(request.headers.get("Outbox-Event-Type", ""))
            return await self.handler(self, request)

        app = web.Application()
        app.router.add_post("/{tail:.*}", handle)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", 0).start()
        self.url = f"http://127.0.0.1:{self._runner.addresses[0][1]}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._runner.cleanup()


def _endless(status: int):
    async def handler(receiver: _Receiver, request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(status=status)
        await response.prepare(request)
        chunk = b"x" * 65536
        try:
            while True:  # 2.2 GB in 3 s took a worker down before the read was bounded
                await response.write(chunk)
        except (ConnectionResetError, OSError):
            receiver.cut_off.set()
        return response

    return handler


def _answer(status: int, body: str):
    async def handler(receiver: _Receiver, request: web.Request) -> web.Response:
        return web.Response(status=status, text=body)

    return handler


@pytest.mark.parametrize("status", [200, 503, 422])
async def test_an_endless_response_is_read_only_up_to_the_bound(status):
    async with _Receiver(_endless(status)) as receiver:
        publisher = HttpPublisher(receiver.url + "/events", owner="t")
        await publisher.start()
        try:
            outcome = asyncio.create_task(publisher.publish(_message()))
            done, _ = await asyncio.wait([outcome], timeout=30)
            assert done, "the publish kept reading an endless body"
            if status == 200:
                assert outcome.result() is None  # delivered
            else:
                with pytest.raises((RetryableError, PermanentError)) as info:
                    outcome.result()
                assert str(info.value).startswith(f"HTTP {status}: xxx")
                assert len(str(info.value)) < 400  # an excerpt, not the body
            # The client dropped the connection rather than drain the stream.
            await asyncio.wait_for(receiver.cut_off.wait(), 30)
        finally:
            await publisher.close()


async def test_a_long_finite_body_keeps_working_and_the_next_request_too():
    async with _Receiver(_answer(200, "y" * 1_000_000)) as receiver:
        publisher = HttpPublisher(receiver.url + "/events", owner="t")
        await publisher.start()
        try:
            for n in range(3):
                await publisher.publish(_message(message_id=n))
        finally:
            await publisher.close()
    assert len(receiver.requests) == 3


@pytest.mark.parametrize(
    "event_type",
    [
        "OrderPaid\r\nX-Injected: yes",
        "OrderPaid\nX-Injected: yes",
        "OrderPaid\rX",
        "Order\x00Paid",
        "Order\x1bPaid",
        "Order\x7fPaid",
        "Order\x0bPaid",
    ],
)
async def test_an_event_type_that_cannot_stand_in_a_header_is_permanent(event_type):
    """It used to raise an unclassified ValueError: a traceback per try, the row left to its
    lease, dead at last as "worker crashed"."""
    async with _Receiver(_answer(200, "")) as receiver:
        publisher = HttpPublisher(receiver.url + "/events", owner="t")
        await publisher.start()
        try:
            with pytest.raises(PermanentError, match=r"event_type .* cannot be sent in a header"):
                await publisher.publish(_message(event_type))
            await publisher.publish(_message("OrderPaid\tTabbed ünïcode"))  # these may
        finally:
            await publisher.close()
    assert receiver.requests == ["OrderPaid\tTabbed ünïcode"]  # nothing else was sent


async def _retryable_reason(answer: object, path: str = "/events") -> str:
    """What one publish to a receiver answering `answer` raises (retryable), as text."""
    async with _Receiver(answer) as receiver:
        publisher = HttpPublisher(receiver.url + path, owner="t")
        await publisher.start()
        try:
            with pytest.raises(RetryableError) as info:
                await publisher.publish(_message())
        finally:
            await publisher.close()
    return str(info.value)


async def test_urls_in_a_failure_reason_lose_credentials_and_query_values():
    echo = "redirect to https://admin:s3cret@internal.example/x?token=s3cret failed"
    reason = await _retryable_reason(_answer(500, echo), "/events?token=s3cret")
    assert "s3cret" not in reason
    assert "https://***@internal.example/x?token=***" in reason
    # A request that fails before any answer names the URL redacted too, if at all.
    publisher = HttpPublisher(f"http://u:s3cret@127.0.0.1:{free_port()}/e?token=s3cret", owner="t")
    await publisher.start()
    try:
        with pytest.raises(RetryableError) as info:
            await publisher.publish(_message())
    finally:
        await publisher.close()
    assert "s3cret" not in str(info.value)


async def test_a_hostile_answer_reaches_the_reason_escaped():
    """What is raised is logged and stored as `last_error`: no terminal command, one line."""
    hostile = "\x1b]0;pwned\x07\x1b[2J\x1b[31mEVIL\nline2"
    reason = await _retryable_reason(_answer(500, hostile))
    assert reason == r"HTTP 500: \x1b]0;pwned\x07\x1b[2J\x1b[31mEVIL\nline2"


async def test_a_request_carries_the_envelope_and_the_message_headers():
    seen: list[tuple[dict[str, str], bytes]] = []

    async def record(receiver: _Receiver, request: web.Request) -> web.Response:
        seen.append((dict(request.headers), await request.read()))
        return web.Response(status=204)

    message = Message(41, 3, 2, "order", "o-1", "OrderPaid", '{"total": 12}', datetime.now(UTC))
    async with _Receiver(record) as receiver:
        publisher = HttpPublisher(
            receiver.url + "/events", owner="w-7", headers={"Authorization": "Bearer t0ken"}
        )
        await publisher.start()
        try:
            await publisher.publish(message)
            await publisher.publish(message._replace(attempts=3))  # a retry: the same key
        finally:
            await publisher.close()
    (first, body), (retry, _) = seen
    assert body == envelope(message).encode()
    assert first["Content-Type"] == "application/json"
    assert first["Authorization"] == "Bearer t0ken"
    assert (first["Idempotency-Key"], retry["Idempotency-Key"]) == ("41", "41")
    assert (first["Outbox-Attempt"], retry["Outbox-Attempt"]) == ("2", "3")
    assert first["Outbox-Event-Type"] == "OrderPaid" and first["Outbox-Worker"] == "w-7"


async def test_a_redirect_is_permanent_and_not_followed():
    async def redirect(receiver: _Receiver, request: web.Request) -> web.Response:
        if request.path == "/moved":
            return web.Response(status=200)
        return web.Response(status=307, headers={"Location": "/moved"})

    async with _Receiver(redirect) as receiver:
        publisher = HttpPublisher(receiver.url + "/events", owner="t")
        await publisher.start()
        try:
            with pytest.raises(PermanentError, match="HTTP 307"):
                await publisher.publish(_message())
        finally:
            await publisher.close()
    assert len(receiver.requests) == 1  # /moved never asked


async def test_a_body_in_several_chunks_is_read_whole_within_the_bound():
    async def chunked(receiver: _Receiver, request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(status=422)
        response.enable_chunked_encoding()
        await response.prepare(request)
        for part in (b"first ", b"second ", b"third"):
            await response.write(part)
            await asyncio.sleep(0)  # let each go out as a chunk of its own
        await response.write_eof()
        return response

    async with _Receiver(chunked) as receiver:
        publisher = HttpPublisher(receiver.url + "/events", owner="t")
        await publisher.start()
        try:
            for _ in range(2):  # the connection is still good for the next request
                with pytest.raises(PermanentError) as info:
                    await publisher.publish(_message())
                assert str(info.value) == "HTTP 422: first second third"
        finally:
            await publisher.close()
    assert len(receiver.requests) == 2


# -- credentials at start --------------------------------------------------------------------

PASSWORD, TOKEN = "pa55wordInTheUrl", "tok3nInTheHeader"
BOTH = (
    "--http-url and --http-header Authorization: give the credentials in one of them, not both "
    "(the URL's user-info is sent as an Authorization header)"
)


@pytest.mark.parametrize(
    ("url", "header"),
    [
        (f"http://alice:{PASSWORD}@127.0.0.1:1/hook", f"Authorization: Bearer {TOKEN}"),
        (f"https://{PASSWORD}@api.example/hook", f"authorization: Bearer {TOKEN}"),  # token as user
        (f"https://:{PASSWORD}@api.example/hook", f"AUTHORIZATION: Basic {TOKEN}"),
        (f"https://alice:{PASSWORD}@api.example/hooks/{{event_type}}", f"Authorization: {TOKEN}"),
    ],
)
def test_credentials_in_the_url_and_an_authorization_header_are_refused_at_start(url, header):
    """aiohttp refused the pair on every request with a ValueError: each publish failed as an
    unclassified error, the message left to its lease, its attempts burnt."""
    settings = load_settings(
        ["--dsn", "host=x", "--publisher", "http", "--http-url", url, "--http-header", header], {}
    )
    with pytest.raises(SettingError) as refused:
        make_publisher(settings, Metrics())
    assert str(refused.value) == BOTH
    with pytest.raises(SettingError):  # made directly, too
        HttpPublisher(url, owner="t", headers=dict([header.split(": ", 1)]))


async def test_credentials_in_the_url_alone_are_sent_as_basic_auth():
    seen: list[str] = []

    async def record(receiver: _Receiver, request: web.Request) -> web.Response:
        seen.append(request.headers.get("Authorization", ""))
        return web.Response(status=204)

    async with _Receiver(record) as receiver:
        url = receiver.url.replace("http://", f"http://alice:{PASSWORD}@") + "/events"
        publisher = HttpPublisher(url, owner="t", headers={"X-Tenant": "acme"})
        await publisher.start()
        try:
            await publisher.publish(_message())
        finally:
            await publisher.close()
    assert seen == ["Basic " + base64.b64encode(f"alice:{PASSWORD}".encode()).decode()]


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        # No scheme, or a mistyped one: where the user-info ends cannot be told.
        (f"https//alice:{PASSWORD}@host/x", "'***@host/x' is not an http:// or https:// URL"),
        (f"//alice:{PASSWORD}@host/x", "'***@host/x' is not an http:// or https:// URL"),
        (f"http:/alice:{PASSWORD}@host/x", "'***@host/x' is not an http:// or https:// URL"),
        (f"alice:{PASSWORD}@host/x", "'***@host/x' is not an http:// or https:// URL"),
        # A `/`, `?` or `#` in the password ends the authority early: urllib took the rest of
        # the password for a port, and its error quoted it.
        (f"https://alice:{PASSWORD}/x@host/", "'https://***@host/' is not a valid URL"),
        (f"https://alice:{PASSWORD}?x@host/", "'https://***@host/' is not a valid URL"),
        (f"https://alice:{PASSWORD}#x@host/", "'https://***@host/' is not a valid URL"),
    ],
)
def test_a_bad_url_with_credentials_is_refused_without_them(url, shown):
    with pytest.raises(SettingError) as refused:
        load_settings(["--dsn", "host=x", "--publisher", "http", "--http-url", url], {})
    assert str(refused.value).startswith(f"--http-url: {shown}")
    assert PASSWORD not in str(refused.value) and "\n" not in str(refused.value)
