"""Routed URLs: `--http-url` with `{event_type}`, `{aggregate_type}`, `{aggregate_id}`. What a
real server received for hostile values (each stays one encoded path segment or query value),
the values that would make a dot-segment or an empty segment (dead, with the reason), and the
templates refused at start."""

from __future__ import annotations

import re
import urllib.parse

import pytest
from helpers import row, wait_until
from wire import Receiver
from workers import dispatching, settings

from outbox import Event, enqueue_many
from outbox.limits import MAX_NAME_BYTES
from outbox.plumbing.errors import SettingError
from outbox.worker.publishers.http import HttpPublisher
from outbox.worker.settings import load_settings

HOSTILE = ["../admin", "a/b", "?x=1", "#frag", "user@evil.example", "%2e%2e", "é ü", "a\r\nX: y"]


async def test_each_value_is_one_encoded_segment_on_the_wire(conn, dsn):
    with conn.transaction():
        ids = enqueue_many(
            conn, [Event("order", value, "Paid", {"n": i}) for i, value in enumerate(HOSTILE)]
        )
    async with Receiver() as receiver:
        template = receiver.origin + "/hooks/{aggregate_type}/{aggregate_id}/x?type={event_type}"
        publisher = HttpPublisher(template, owner="t")
        assert publisher.destination == receiver.origin  # one destination: the origin
        async with dispatching(settings(dsn), publisher):
            requests = await receiver.wait_for(len(HOSTILE))
            await wait_until(lambda: all(row(conn, i)["status"] == "done" for i in ids))
    by_id = {int(r.headers["Idempotency-Key"]): r for r in requests}
    for message_id, value in zip(ids, HOSTILE, strict=True):
        raw = by_id[message_id].raw_path
        path, _, query = raw.partition("?")
        segments = path.split("/")
        assert segments[:3] == ["", "hooks", "order"] and segments[4:] == ["x"], raw
        assert urllib.parse.unquote(segments[3]) == value  # the whole value, in one segment
        assert urllib.parse.parse_qs(query) == {"type": ["Paid"]}, raw


@pytest.mark.parametrize("value", ["..", ".", ""])
async def test_a_value_that_would_make_a_dot_or_empty_segment_is_dead(conn, dsn, value):
    with conn.transaction():
        [message_id] = enqueue_many(conn, [Event("order", value, "Paid", {})])
    async with Receiver() as receiver:
        publisher = HttpPublisher(receiver.origin + "/hooks/{aggregate_id}/x", owner="t")
        async with dispatching(settings(dsn), publisher):
            await wait_until(lambda: row(conn, message_id)["status"] == "dead")
        assert receiver.requests == []
    error = row(conn, message_id)["last_error"]
    assert f"the routed URL's path segment would be {value!r}" in error


async def test_a_huge_value_is_dead_not_a_414(conn, dsn):
    # Names at the producer's limit (outbox.limits.MAX_NAME_BYTES), each encoded 3 times over.
    name = "é" * (MAX_NAME_BYTES // 2)
    with conn.transaction():
        [message_id] = enqueue_many(conn, [Event(name, name, name, {})])
    async with Receiver() as receiver:
        template = "/hooks/{aggregate_type}/{event_type}/{aggregate_id}"
        publisher = HttpPublisher(receiver.origin + template, owner="t")
        async with dispatching(settings(dsn), publisher):
            await wait_until(lambda: row(conn, message_id)["status"] == "dead")
        assert receiver.requests == []
    length = len(receiver.origin + template) - 42 + 3 * 6 * len(name)
    assert f"the routed URL is {length} characters" in row(conn, message_id)["last_error"]


@pytest.mark.parametrize(
    ("template", "error"),
    [
        ("http://{aggregate_type}.example/hooks", "a placeholder in the scheme, user-info, host"),
        ("http://api.example:{event_type}/hooks", "a placeholder in the scheme, user-info, host"),
        ("http://{aggregate_id}@api.example/", "a placeholder in the scheme, user-info, host"),
        ("{event_type}://api.example/", "a placeholder in the scheme, user-info, host"),
        ("http://api.example{event_type}/", "a placeholder in the scheme, user-info, host"),
        ("http://api.example/hooks#{event_type}", "a placeholder in the fragment"),
        ("http://api.example/{tenant}", "unknown placeholder {tenant}"),
        ("http://api.example/{event_type!r}", "unknown placeholder {event_type}"),
        ("http://api.example/{event_type:>10}", "unknown placeholder {event_type}"),
        ("http://api.example/{", "is not a template"),
        ("http://api.example/{event_type} x", "contains whitespace or control characters"),
    ],
)
def test_templates_that_could_change_the_host_or_are_unknown_are_refused(template, error):
    with pytest.raises(SettingError) as info:
        load_settings(["--publisher", "http", "--http-url", template], {})
    assert str(info.value).startswith("--http-url: ") and error in str(info.value)


def test_a_template_with_credentials_is_accepted_and_never_echoed():
    chosen = load_settings(
        ["--publisher", "http", "--http-url", "https://u:s3cret@api.example/h/{event_type}"], {}
    )
    assert chosen.publisher_options["http_url"].endswith("/h/{event_type}")
    with pytest.raises(SettingError) as info:
        load_settings(["--publisher", "http", "--http-url", "https://u:s3cret@{event_type}/"], {})
    assert "s3cret" not in str(info.value)


@pytest.mark.parametrize(
    ("url", "admitted"),
    [
        ("http://e.example/in", True),
        ("https://e.example:8443", True),
        ("http://e.example/in/{event_type}/{aggregate_type}", True),
        ("http://e.example/in?type={event_type}&id={aggregate_id}", True),
        ("http://e.example?type={event_type}", True),
        ("http://e.example/in#{event_type}", False),
        ("http://{aggregate_type}.e.example/in", False),
        ("http://e.example:{event_type}/in", False),
        ("http://{aggregate_id}@e.example/in", False),
        ("http://e.example/{tenant}", False),
        ("http://e.example/{event_type!r}", False),
        ("http://e.example/{event_type", False),
        # What Python's `\s` matches and a Go API server's RE2 `\s` does not: the CRD's
        # pattern spells its classes out, so both refuse them, in the host, path and query.
        ("http://e.example/a\u00a0b/{event_type}", False),
        ("http://e.example\u0085/{event_type}", False),
        ("http://e.example/in?x=\u2028&t={event_type}", False),
        ("http://e.example/in#\u00a0", False),
        ("http://e.example/caf\u00e9", False),  # percent-encoded, it is a URL
        ("http://e.example/caf%C3%A9/{event_type}", True),
    ],
)
def test_the_crd_admits_the_url_templates_the_worker_accepts(url, admitted):
    from test_cloudevents import ENGINE_DEPENDENT, _crd_pattern
    from test_controller_crd import _body, _crd_errors, _worker_error

    pattern = _crd_pattern("spec", "publisher", "http", "url")
    assert ENGINE_DEPENDENT.search(pattern) is None, pattern  # read alike by Python and RE2
    assert (re.search(pattern, url, re.ASCII) is None) is (re.search(pattern, url) is None)
    body = _body({"publisher.type": "http", "publisher.http": {"url": url}})
    assert (_crd_errors(body) == []) is admitted, _crd_errors(body)
    assert (_worker_error(body) is None) is admitted, _worker_error(body)
