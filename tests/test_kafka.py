"""The kafka publisher against librdkafka's own mock cluster (see kafka_mock.py).

The cluster listens on localhost TCP ports, so the worker (in this process or as a real
`outbox-worker` process) and a plain confluent_kafka Consumer talk to it like to any broker.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, TopicPartition
from confluent_kafka import Message as KafkaMessage
from helpers import row, seed, serve_ordering, wait_until
from kafka_mock import PRODUCE, MockCluster, mock_cluster
from workers import dispatching, settings, spawn_worker, stop_worker

from outbox import Event, enqueue_many
from outbox.models import Message
from outbox.plumbing.errors import SettingError
from outbox.worker.publishers import kafka
from outbox.worker.publishers.base import PermanentError, RetryableError
from outbox.worker.publishers.envelope import envelope
from outbox.worker.publishers.kafka import (
    KafkaPublisher,
    classify,
    is_fatal,
    render_topic,
    topic_template,
)
from outbox.worker.publishers.kafka import errors as kafka_errors
from outbox.worker.publishers.registry import PublisherContext
from outbox.worker.settings import load_settings

E = KafkaError
ROOT = Path(__file__).parent.parent
BASE_ENV = {k: v for k, v in os.environ.items() if not k.startswith(("OUTBOX_", "PG"))}


@pytest.fixture
def cluster() -> Iterator[MockCluster]:
    with mock_cluster(3) as mc:
        mc.create_topic("order", partitions=4, replication_factor=3)
        yield mc


def _publisher(cluster: MockCluster, **kwargs) -> KafkaPublisher:
    return KafkaPublisher(cluster.bootstraps, client_id="test-worker", **kwargs)


def _count(conn, where: str) -> int:
    return conn.execute(f"SELECT count(*) FROM outbox WHERE {where}").fetchone()[0]


def consume_all(bootstraps: str, topic: str, expected: int, timeout: float = 20) -> list:
    """Every message in the topic: read until each partition reports its end and at least
    `expected` arrived, so a duplicate would be counted, not missed."""
    consumer = Consumer({
        "bootstrap.servers": bootstraps, "group.id": "test", "enable.auto.commit": False,
        "enable.partition.eof": True, "logger": logging.getLogger("test.consumer"),
    })  # fmt: skip
    try:
        partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in partitions])
        got: list[KafkaMessage] = []
        at_end: set[int] = set()
        deadline = time.monotonic() + timeout
        while len(got) < expected or len(at_end) < len(partitions):
            assert time.monotonic() < deadline, f"consumed {len(got)} of {expected} from {topic}"
            message = consumer.poll(0.1)
            if message is None:
                continue
            error = message.error()
            if error is not None:
                assert error.code() == E._PARTITION_EOF, error
                at_end.add(message.partition())
                continue
            at_end.discard(message.partition())
            got.append(message)
        return got
    finally:
        consumer.close()


def _row_message(conn, message_id: int) -> Message:
    """A done row as the publisher saw it on its first attempt."""
    r = row(conn, message_id)
    payload = conn.execute("SELECT payload::text FROM outbox WHERE id = %s", (message_id,))
    return Message(
        r["id"], r["lease_version"], 1, r["aggregate_type"], r["aggregate_id"],
        r["event_type"], payload.fetchone()[0], r["created_at"],
    )  # fmt: skip


def _message(**overrides) -> Message:
    fields = dict(
        id=7, lease_version=1, attempts=1, aggregate_type="order", aggregate_id="o-1",
        event_type="OrderPaid", payload_json='{"a": 1}',
        created_at=datetime(2024, 1, 2, tzinfo=UTC),
    )  # fmt: skip
    return Message(**{**fields, **overrides})


# -- classification ------------------------------------------------------------------------

PERMANENT = [
    "UNKNOWN_TOPIC_OR_PART", "_UNKNOWN_TOPIC", "_UNKNOWN_PARTITION", "MSG_SIZE_TOO_LARGE",
    "RECORD_LIST_TOO_LARGE", "TOPIC_AUTHORIZATION_FAILED", "CLUSTER_AUTHORIZATION_FAILED",
    "TOPIC_EXCEPTION", "_INVALID_ARG",
]  # fmt: skip
RETRYABLE = [
    "_TRANSPORT", "_ALL_BROKERS_DOWN", "REQUEST_TIMED_OUT", "_MSG_TIMED_OUT",
    "NOT_ENOUGH_REPLICAS", "NOT_ENOUGH_REPLICAS_AFTER_APPEND", "LEADER_NOT_AVAILABLE",
    "NOT_LEADER_FOR_PARTITION", "_QUEUE_FULL", "_FATAL", "OUT_OF_ORDER_SEQUENCE_NUMBER",
]  # fmt: skip


@pytest.mark.parametrize("name", PERMANENT)
def test_permanent_kafka_errors_go_dead_with_the_error_named(name):
    error = KafkaError(getattr(E, name))
    failure = classify(error)
    assert type(failure) is PermanentError
    assert str(failure) == f"Kafka {name}: {error.str()}"


@pytest.mark.parametrize("name", RETRYABLE)
def test_transient_kafka_errors_are_retried(name):
    failure = classify(KafkaError(getattr(E, name)))
    assert type(failure) is RetryableError
    assert str(failure).startswith(f"Kafka {name}: ")


def test_unlisted_codes_fall_back_to_the_errors_own_flags():
    code = E.GROUP_AUTHORIZATION_FAILED
    assert code not in kafka.PERMANENT_CODES | kafka.RETRYABLE_CODES
    assert type(classify(KafkaError(code))) is PermanentError
    assert type(classify(KafkaError(code, retriable=True))) is RetryableError
    fatal = KafkaError(code, "sequence desynchronised", fatal=True)
    assert type(classify(fatal)) is RetryableError and is_fatal(fatal)
    # After a fatal error produce() raises _FATAL without the flag: still fatal.
    assert is_fatal(KafkaError(E._FATAL)) and not is_fatal(KafkaError(E._MSG_TIMED_OUT))


def test_a_fatal_error_is_found_behind_the_systemerror_a_callback_raises():
    fatal = KafkaException(KafkaError(E.OUT_OF_ORDER_SEQUENCE_NUMBER, "desync", fatal=True))
    try:
        try:
            raise fatal
        except KafkaException as exc:
            raise SystemError("returned a result with an exception set") from exc
    except SystemError as exc:
        found = kafka_errors._fatal_in(exc)
    assert found is not None and found.code() == E.OUT_OF_ORDER_SEQUENCE_NUMBER
    assert kafka_errors._fatal_in(KafkaException(KafkaError(E._TRANSPORT))) is None


def _table_codes(text: str) -> dict[str, set[str]]:
    found: dict[str, set[str]] = {"permanent": set(), "retryable": set()}
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.lstrip().startswith("|") and len(cells) == 2 and cells[1] in found:
            found[cells[1]] |= set(re.findall(r"\b_?[A-Z][A-Z0-9_]{2,}\b", cells[0]))
    return found


@pytest.mark.parametrize(
    "text",
    [kafka.__doc__, (ROOT / "docs/publishers/kafka.md").read_text()],
    ids=["docstring", "docs"],
)
def test_the_documented_table_is_the_mapping_in_code(text):
    names = _table_codes(text)
    assert names["permanent"] == {KafkaError(c).name() for c in kafka.PERMANENT_CODES}
    assert names["retryable"] == {KafkaError(c).name() for c in kafka.RETRYABLE_CODES}


# -- topics and settings -------------------------------------------------------------------


def test_topic_template_renders_sanitized_values():
    assert render_topic("{aggregate_type}", _message()) == "order"
    m = _message(aggregate_type="Order Line", aggregate_id="a/1", event_type="Paid.v2:ü")
    assert render_topic("outbox.{aggregate_type}.{event_type}", m) == (
        "outbox.Order_Line.Paid.v2__"
    )
    assert render_topic("{aggregate_type}-{aggregate_id}", m) == "Order_Line-a_1"
    assert render_topic("static-topic", m) == "static-topic"
    longest = render_topic("t.{aggregate_id}", _message(aggregate_id="x" * 247))
    assert longest == "t." + "x" * 247 and len(longest) == 249


def test_a_topic_past_249_characters_is_permanent_never_cut():
    """Cut, `t.` + 300 characters and `t.` + 247 of them and more would share one topic."""
    with pytest.raises(PermanentError, match="renders 250 characters for this message, more "):
        render_topic("t.{aggregate_id}", _message(aggregate_id="x" * 248))
    with pytest.raises(ValueError, match="longer than the 249 characters"):
        topic_template("t" * 250)


@pytest.mark.parametrize("aggregate_type", ["", ".", ".."])
def test_a_rendered_illegal_topic_is_permanent(aggregate_type):
    with pytest.raises(PermanentError, match="not a legal topic"):
        render_topic("{aggregate_type}", _message(aggregate_type=aggregate_type))


@pytest.mark.parametrize(
    ("template", "problem"),
    [
        ("", "empty topic template"),
        ("{aggregate}", "unknown placeholder {aggregate}"),
        ("{0}", "unknown placeholder {0}"),
        ("{aggregate_type!r}", "write {aggregate_type} without a conversion or format spec"),
        ("{aggregate_type:>5}", "write {aggregate_type} without a conversion or format spec"),
        ("{aggregate_type.upper}", "unknown placeholder {aggregate_type.upper}"),
        ("orders/{event_type}", "characters Kafka does not allow"),
        ("{aggregate_type", "expected '}'"),
    ],
)
def test_bad_topic_templates_are_refused(template, problem):
    with pytest.raises(SettingError) as info:
        load_settings(["--publisher", "kafka", "--kafka-bootstrap-servers", "h:9092",
                       "--kafka-topic", template], {})  # fmt: skip
    assert str(info.value).startswith("--kafka-topic: ")
    assert problem in str(info.value) and "\n" not in str(info.value)


def test_kafka_settings_from_flags_and_env():
    s = load_settings(
        ["--publisher", "kafka", "--kafka-config", "linger.ms=20"],
        {"OUTBOX_KAFKA_BOOTSTRAP_SERVERS": "b1:9092, b2:9092",
         "OUTBOX_KAFKA_TOPIC": "e.{event_type}", "OUTBOX_KAFKA_COMPRESSION": "zstd",
         "OUTBOX_KAFKA_CONFIG": "ignored=by-the-flag"},
    )  # fmt: skip
    o = s.publisher_options
    assert o["kafka_bootstrap_servers"] == "b1:9092,b2:9092"
    assert (o["kafka_topic"], o["kafka_compression"]) == ("e.{event_type}", "zstd")
    assert o["kafka_config"] == (("linger.ms", "20"),)
    s = load_settings(
        ["--publisher", "kafka"],
        {"OUTBOX_KAFKA_BOOTSTRAP_SERVERS": "b1:9092",
         "OUTBOX_KAFKA_CONFIG": "security.protocol=sasl_ssl\nsasl.mechanism=PLAIN"},
    )  # fmt: skip
    o = s.publisher_options
    assert (o["kafka_topic"], o["kafka_compression"]) == ("{aggregate_type}", "none")
    assert o["kafka_config"] == (("security.protocol", "sasl_ssl"), ("sasl.mechanism", "PLAIN"))


BOOTSTRAP = ["--kafka-bootstrap-servers", "h:9092"]
# A password given where librdkafka would read it as part of a host name, logged by it on
# every connection attempt (and the destination's name would store it).
PASSWORD = "pa55wordKafkaBootstrap"
SERVERS = "--kafka-bootstrap-servers: "
NOT_SERVERS = SERVERS + "'{}' is not [PROTOCOL://]host[:port]: expected host:port"
CREDENTIALS = "holds user-info: expected host:port[,host:port...]; credentials go in --kafka-config"


@pytest.mark.parametrize(
    ("argv", "env", "message"),
    [
        ([], {}, "--kafka-bootstrap-servers (or OUTBOX_KAFKA_BOOTSTRAP_SERVERS) is required"),
        (["--kafka-bootstrap-servers", "a:1,,b:2"], {}, "--kafka-bootstrap-servers: 'a:1,,b:2'"),
        ([*BOOTSTRAP, "--kafka-compression", "brotli"], {}, "--kafka-compression: 'brotli'"),
        (BOOTSTRAP, {"OUTBOX_KAFKA_CONFIG": "linger.ms=5\nbogus"}, "OUTBOX_KAFKA_CONFIG: "),
        # librdkafka reads `host:x` as port 0 and `host:70000` as port 4464, and retries the
        # wrong broker for ever, ten log lines a second.
        (["--kafka-bootstrap-servers", "host:notaport"], {}, NOT_SERVERS.format("host:notaport")),
        (["--kafka-bootstrap-servers", "h:1, h:"], {}, NOT_SERVERS.format("h:")),
        (["--kafka-bootstrap-servers", ":9092"], {}, NOT_SERVERS.format(":9092")),
        (["--kafka-bootstrap-servers", "h:1/x"], {}, NOT_SERVERS.format("h:1/x")),
        (["--kafka-bootstrap-servers", "SSL://h:1/x"], {}, NOT_SERVERS.format("SSL://h:1/x")),
        (["--kafka-bootstrap-servers", "a b:1"], {}, NOT_SERVERS.format("a b:1")),
        (["--kafka-bootstrap-servers", "h:0"], {}, f"{SERVERS}'h:0' has a port outside 1-65535"),
        (["--kafka-bootstrap-servers", "h:70000"], {}, f"{SERVERS}'h:70000' has a port outside"),
        (["--kafka-bootstrap-servers", "[zz]:1"], {}, f"{SERVERS}'[zz]:1' has no IPv6 address"),
        (["--kafka-bootstrap-servers", "redis://h:1"], {},
         f"{SERVERS}'redis://h:1' names no security protocol"),
        # User-info: never echoed, whichever way it is written.
        (["--kafka-bootstrap-servers", f"alice:{PASSWORD}@127.0.0.1:1"], {},
         f"--kafka-bootstrap-servers: '***@127.0.0.1:1' {CREDENTIALS}"),
        (["--kafka-bootstrap-servers", f"SASL_SSL://alice:{PASSWORD}@127.0.0.1:1"], {},
         f"--kafka-bootstrap-servers: '***@127.0.0.1:1' {CREDENTIALS}"),
        (["--kafka-bootstrap-servers", f"h:1, {PASSWORD}@h2:2"], {},
         f"--kafka-bootstrap-servers: '***@h2:2' {CREDENTIALS}"),
        # A comma in the password splits it across two "servers": neither half is shown.
        (["--kafka-bootstrap-servers", f"alice:{PASSWORD[:9]},{PASSWORD[9:]}@h:1"], {},
         f"--kafka-bootstrap-servers: '***@h:1' {CREDENTIALS}"),
        ([], {"OUTBOX_KAFKA_BOOTSTRAP_SERVERS": f"alice:{PASSWORD}@h:1"},
         f"OUTBOX_KAFKA_BOOTSTRAP_SERVERS: '***@h:1' {CREDENTIALS}"),
    ],
)  # fmt: skip
def test_bad_kafka_options_are_one_line_errors_naming_them(argv, env, message):
    with pytest.raises(SettingError) as info:
        load_settings(["--publisher", "kafka", *argv], env)
    assert str(info.value).startswith(message)
    assert "\n" not in str(info.value)
    for piece in (PASSWORD, PASSWORD[:9], PASSWORD[9:]):
        assert piece not in str(info.value)


@pytest.mark.parametrize(
    ("given", "kept"),
    [
        # What librdkafka's bootstrap.servers takes (rd_kafka_broker_name_parse): a protocol
        # prefix in any case (a path after it, which it ignores, only empty), no port (9092),
        # IPv6 bracketed or, without a port, bare; whitespace around a server is dropped.
        ("b1:9092, b2:9092", "b1:9092,b2:9092"),
        (" localhost ", "localhost"),
        ("kafka-0.kafka-headless.ns.svc.cluster.local.:9092",
         "kafka-0.kafka-headless.ns.svc.cluster.local.:9092"),
        ("my_broker:65535,10.0.0.1:1", "my_broker:65535,10.0.0.1:1"),
        ("[::1]:9092,[fe80::1%eth0],::1", "[::1]:9092,[fe80::1%eth0],::1"),
        ("PLAINTEXT://h:1, plaintext://h:2/", "PLAINTEXT://h:1,plaintext://h:2/"),
    ],
)  # fmt: skip
def test_every_form_librdkafka_takes_as_a_bootstrap_server_is_accepted(given, kept):
    s = load_settings(["--publisher", "kafka", "--kafka-bootstrap-servers", given], {})
    assert s.publisher_options["kafka_bootstrap_servers"] == kept
    context = PublisherContext(owner="w", concurrency=1, publish_timeout=1.0)
    publisher = KafkaPublisher.create(s.publisher_options, context)
    assert publisher.destination == f"kafka {kept}"


def _options(servers: str, *config: tuple[str, str]) -> dict[str, object]:
    """The kafka publisher's option values, as the worker's settings hand them over."""
    return {
        "kafka_bootstrap_servers": servers, "kafka_topic": "{aggregate_type}",
        "kafka_compression": "none", "kafka_config": config,
    }  # fmt: skip


def test_a_server_naming_another_protocol_than_security_protocol_is_refused():
    """librdkafka drops such a server (and those after it) with a warning, and never
    connects: refused at start, with the protocol security.protocol would need."""
    context = PublisherContext(owner="w", concurrency=1, publish_timeout=1.0)
    values = _options("h:1,SSL://h:2")
    with pytest.raises(SettingError) as info:
        KafkaPublisher.create(values, context)
    assert str(info.value) == (
        "--kafka-bootstrap-servers: 'SSL://h:2' names SSL but security.protocol is plaintext "
        "(--kafka-config security.protocol=...): librdkafka would not connect to it"
    )
    ssl = KafkaPublisher.create(
        {**values, "kafka_config": (("security.protocol", "SSL"),)}, context
    )
    assert ssl.config["bootstrap.servers"] == "h:1,SSL://h:2"


def test_a_publisher_made_directly_refuses_user_info_too():
    """The destination's name (stored, logged) and the start-up line come from it."""
    with pytest.raises(ValueError) as info:
        KafkaPublisher(f"alice:{PASSWORD}@127.0.0.1:1")
    assert PASSWORD not in str(info.value)


@pytest.mark.parametrize(
    ("entry", "problem"),
    [
        ("linger.ms", "expected KEY=VALUE"),
        ("lingerr.ms=5", 'No such configuration property: "lingerr.ms"'),
        ("linger.ms=soon", 'Invalid value for configuration property "queue.buffering.max.ms"'),
        ("acks=1", "acks cannot be set here: always all"),
        ("message.timeout.ms=5", "message.timeout.ms cannot be set here: derived from"),
        ("bootstrap.servers=x:1", "use --kafka-bootstrap-servers"),
        ("error_cb=x", "expected error_cb property as a callable"),
    ],
)
def test_bad_kafka_config_entries_are_refused_by_librdkafka_or_by_us(entry, problem):
    with pytest.raises(SettingError) as info:
        load_settings(["--publisher", "kafka", *BOOTSTRAP, "--kafka-config", entry], {})
    assert str(info.value).startswith("--kafka-config: ")
    assert problem in str(info.value) and "\n" not in str(info.value)


def test_a_combination_librdkafka_refuses_is_a_setting_error_without_secrets():
    context = PublisherContext(owner="w", concurrency=4, publish_timeout=1.0)
    values = _options("h:9092", ("linger.ms", "5000"), ("sasl.password", "pw-s3cret"))
    with pytest.raises(SettingError) as info:
        KafkaPublisher.create(values, context)
    assert str(info.value) == (
        "--kafka-config: Failed to create producer: `message.timeout.ms` must be greater than "
        "`linger.ms`"
    )
    # The publish timeout sets librdkafka's message timeout, under it.
    ok = KafkaPublisher.create({**values, "kafka_config": ()}, context)
    assert ok.config["message.timeout.ms"] == 500
    ten = KafkaPublisher.create(
        {**values, "kafka_config": ()}, replace(context, publish_timeout=10)
    )
    assert ten.config["message.timeout.ms"] == 8500
    assert (ok.config["enable.idempotence"], ok.config["acks"]) == (True, "all")


def _worker(*args: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "outbox.worker", *args],
        capture_output=True, text=True, timeout=timeout, env=BASE_ENV,
    )  # fmt: skip


def test_worker_help_lists_the_kafka_options():
    result = _worker("--publisher", "kafka", "--help")
    assert result.returncode == 0, result
    for flag in ("--kafka-bootstrap-servers", "--kafka-topic", "--kafka-compression",
                 "--kafka-config"):  # fmt: skip
        assert flag in result.stdout
    assert "kafka publisher options" in result.stdout
    assert "--http-url" not in result.stdout  # only the chosen publisher's options


@pytest.mark.parametrize(
    ("config", "named"),
    [
        (["--kafka-config", "lingerr.ms=5"], 'No such configuration property: "lingerr.ms"'),
        # Only librdkafka's client construction finds this one: checked when the publisher is
        # created, before any connection.
        (["--kafka-config", "security.protocol=sasl_ssl"], "No provider for SASL mechanism"),
    ],
)
def test_worker_refuses_bad_kafka_config_with_one_line_exit_2(config, named):
    secret = "pw-s3cret"
    result = _worker(
        "--dsn", "postgresql://u@127.0.0.1:1/db", "--publisher", "kafka",
        "--kafka-bootstrap-servers", "127.0.0.1:1", *config,
        "--kafka-config", f"sasl.password={secret}",
    )  # fmt: skip
    assert result.returncode == 2, result
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("outbox-worker: error: --kafka-config: ") and named in lines[0]
    assert secret not in result.stderr + result.stdout


@pytest.mark.parametrize("source", ["flag", "variable"])
@pytest.mark.parametrize(
    "servers",
    [
        f"alice:{PASSWORD}@127.0.0.1:1",
        f"SASL_SSL://alice:{PASSWORD}@127.0.0.1:1",
        "127.0.0.1:notaport",
    ],
)
def test_worker_refuses_bad_bootstrap_servers_with_one_line_exit_2(servers, source):
    """It used to start: librdkafka logged the password ~90 times in 30 s (or retried port 0
    for ever), and the destination's name held it."""
    by_flag = source == "flag"
    env = BASE_ENV if by_flag else {**BASE_ENV, "OUTBOX_KAFKA_BOOTSTRAP_SERVERS": servers}
    flag = ["--kafka-bootstrap-servers", servers] if by_flag else []
    result = subprocess.run(
        [sys.executable, "-m", "outbox.worker", "--dsn", "host=127.0.0.1 port=1",
         "--publisher", "kafka", *flag],
        capture_output=True, text=True, timeout=30, env=env,
    )  # fmt: skip
    assert result.returncode == 2, result
    lines = result.stderr.splitlines()
    named = SERVERS if by_flag else "OUTBOX_KAFKA_BOOTSTRAP_SERVERS: "
    assert len(lines) == 1 and lines[0].startswith(f"outbox-worker: error: {named}"), result
    assert "expected host:port[,host:port...]" in lines[0]
    assert PASSWORD not in result.stderr + result.stdout


# -- against the mock cluster --------------------------------------------------------------


async def test_servers_written_with_protocols_spaces_and_names_reach_the_cluster(cluster):
    """The forms the converter accepts are ones librdkafka connects with: a delivery."""
    written = ", ".join(
        f"PLAINTEXT://{server}" if i == 0 else server.replace("127.0.0.1", "localhost")
        for i, server in enumerate(cluster.bootstraps.split(","))
    )
    s = load_settings(["--publisher", "kafka", "--kafka-bootstrap-servers", written], {})
    context = PublisherContext(owner="w", concurrency=1, publish_timeout=10.0)
    publisher = KafkaPublisher.create(s.publisher_options, context)
    await publisher.start()
    try:
        assert await publisher.publish_batch([_message(id=5)]) == [None]
    finally:
        await publisher.close()
    [delivered] = consume_all(cluster.bootstraps, "order", 1)
    assert json.loads(delivered.value())["id"] == 5


@pytest.mark.slow
async def test_a_worker_process_delivers_with_keys_headers_and_per_aggregate_order(
    conn, dsn, cluster, tmp_path
):
    aggregates, per_aggregate = 6, 5
    serve_ordering(conn)
    ids = seed(conn, aggregates * per_aggregate, aggregates=aggregates)
    log = tmp_path / "worker.log"
    secret = "kafka-s3cret-pw"
    proc = spawn_worker(
        dsn, "--publisher", "kafka", "--kafka-bootstrap-servers", cluster.bootstraps,
        "--kafka-config", f"sasl.password={secret}",  # unused over PLAINTEXT; must not leak
        "--ordering", "aggregate", "--poll-interval", "100ms",
        owner="kafka-worker", log_path=str(log),
    )  # fmt: skip

    def all_done() -> bool:
        assert proc.poll() is None, log.read_text()  # the worker must not exit on its own
        return _count(conn, "status = 'done'") == len(ids)

    try:
        await wait_until(all_done, timeout=30)
    finally:
        code = stop_worker(proc, timeout=30)
    assert code == 0, log.read_text()
    assert _count(conn, "status = 'done' AND attempts = 1") == len(ids)

    consumed = consume_all(cluster.bootstraps, "order", len(ids))
    assert sorted(int(m.headers()[0][1]) for m in consumed) == ids  # each exactly once
    by_key = defaultdict(list)
    for m in consumed:
        body = json.loads(m.value())
        i = ids.index(body["id"])
        assert m.key() == f"agg-{i % aggregates}".encode() == body["aggregate_id"].encode()
        assert m.headers() == [
            ("outbox-id", str(body["id"]).encode()),
            ("outbox-event-type", b"Tested"),
            ("outbox-aggregate-type", b"order"),
            ("outbox-attempt", b"1"),
        ]
        assert body["payload"] == {"n": i, "text": "x" * 20}
        assert m.value() == envelope(_row_message(conn, body["id"])).encode()
        by_key[m.key()].append((m.partition(), m.offset(), body["id"]))
    assert len(by_key) == aggregates
    for key, placed in by_key.items():
        assert len({partition for partition, _, _ in placed}) == 1, key  # one partition
        in_log_order = [i for _, _, i in sorted(placed)]
        assert in_log_order == sorted(in_log_order), key  # in id order

    text = log.read_text()
    assert secret not in text
    started = [json.loads(line) for line in text.splitlines() if "kafka publisher:" in line]
    assert len(started) == 1 and "'sasl.password': '***'" in started[0]["message"]


async def test_topic_template_and_compression_in_process(conn, dsn, cluster):
    with conn.transaction():
        ids = enqueue_many(conn, [
            Event("Order Line", "ol-1", "Paid/v2", {"n": 1}),
            Event("Order Line", "ol-1", "Paid/v2", {"n": 2}),
        ])  # fmt: skip
    publisher = _publisher(cluster, topic="outbox.{aggregate_type}.{event_type}",
                           compression="zstd")  # fmt: skip
    async with dispatching(settings(dsn), publisher):
        await wait_until(lambda: _count(conn, "status = 'done'") == 2, timeout=20)
    consumed = consume_all(cluster.bootstraps, "outbox.Order_Line.Paid_v2", 2)
    assert sorted(json.loads(m.value())["id"] for m in consumed) == ids
    assert {json.loads(m.value())["payload"]["n"] for m in consumed} == {1, 2}


async def test_a_topic_a_row_makes_too_long_is_dead_alone_never_cut(conn, dsn, cluster):
    """Cut at 249 characters, the topic of a long aggregate type could be another one's (any
    two that differ past the cut share it): the message went where it was not meant to."""
    long_type = "order_" + "x" * 300
    cut = long_type[:249]
    cluster.create_topic(cut, partitions=1, replication_factor=3)  # where the cut sent it
    with conn.transaction():
        ids = enqueue_many(conn, [
            Event("order", "o-1", "Paid", {"n": 1}),
            Event(long_type, "o-2", "Paid", {"n": 2}),
            Event("order", "o-3", "Paid", {"n": 3}),
        ])  # fmt: skip
    async with dispatching(settings(dsn), _publisher(cluster)):
        await wait_until(lambda: _count(conn, "status IN ('done', 'dead')") == 3, timeout=20)
    dead = row(conn, ids[1])
    assert (dead["status"], dead["attempts"]) == ("dead", 1)
    assert dead["last_error"] == (
        "permanent: topic template '{aggregate_type}' renders 306 characters for this message, "
        "more than the 249 of a Kafka topic name; not sent"
    )
    assert [(row(conn, i)["status"], row(conn, i)["attempts"]) for i in ids[::2]] == [
        ("done", 1),
        ("done", 1),
    ]
    consumed = consume_all(cluster.bootstraps, "order", 2)
    assert sorted(json.loads(m.value())["id"] for m in consumed) == ids[::2]
    assert consume_all(cluster.bootstraps, cut, 0) == []


async def test_transient_broker_errors_are_retried_by_librdkafka_and_delivered_once(
    conn, dsn, cluster
):
    cluster.start_request_tracking()
    injected = [E.NOT_ENOUGH_REPLICAS, E.REQUEST_TIMED_OUT, E.NOT_ENOUGH_REPLICAS]
    cluster.push_request_errors(PRODUCE, *injected)
    [message_id] = seed(conn, 1)
    async with dispatching(settings(dsn), _publisher(cluster)):
        await wait_until(lambda: row(conn, message_id)["status"] == "done", timeout=20)
    assert row(conn, message_id)["attempts"] == 1  # the outbox never saw a failure
    assert cluster.request_count(PRODUCE) >= 1 + len(injected)  # the broker refused 3 times
    [delivered] = consume_all(cluster.bootstraps, "order", 1)  # idempotence: one copy
    assert json.loads(delivered.value())["id"] == message_id


async def test_errors_past_the_message_timeout_are_retryable_then_delivered(conn, dsn, cluster):
    # librdkafka gives up after 1.5s (plus up to 1s: it checks once a second), under the 3s
    # publish timeout: its own verdict, _MSG_TIMED_OUT, reaches the row, not a blind timeout.
    cluster.push_request_errors(PRODUCE, *[E.NOT_ENOUGH_REPLICAS] * 500)
    [message_id] = seed(conn, 1)
    publisher = _publisher(cluster, publish_timeout=3.0)
    # The dispatcher's own timeout is roomier, so a late loop cannot beat librdkafka's verdict.
    s = settings(dsn, publish_timeout=timedelta(seconds=10))
    async with dispatching(s, publisher):
        await wait_until(lambda: row(conn, message_id)["last_error"] is not None, timeout=20)
        failed = row(conn, message_id)
        assert failed["status"] in ("pending", "processing")
        assert failed["last_error"] == ("retryable: Kafka _MSG_TIMED_OUT: Local: Message timed out")
        cluster.clear_request_errors(PRODUCE)
        await wait_until(lambda: row(conn, message_id)["status"] == "done", timeout=20)
    assert row(conn, message_id)["attempts"] >= 2
    [delivered] = consume_all(cluster.bootstraps, "order", 1)
    assert json.loads(delivered.value())["id"] == message_id


async def test_topic_authorization_failure_is_dead_with_the_kafka_error(conn, dsn, cluster):
    cluster.push_request_errors(PRODUCE, E.TOPIC_AUTHORIZATION_FAILED)
    [message_id] = seed(conn, 1)
    async with dispatching(settings(dsn), _publisher(cluster)):
        await wait_until(lambda: row(conn, message_id)["status"] == "dead", timeout=20)
    r = row(conn, message_id)
    assert r["attempts"] == 1
    assert r["last_error"] == (
        "permanent: Kafka TOPIC_AUTHORIZATION_FAILED: Broker: Topic authorization failed"
    )


async def test_a_message_over_message_max_bytes_is_dead_and_others_go_through(conn, dsn, cluster):
    with conn.transaction():
        big, small = enqueue_many(conn, [
            Event("order", "o-1", "Huge", {"blob": "x" * 5000}),
            Event("order", "o-2", "Small", {"n": 1}),
        ])  # fmt: skip
    publisher = _publisher(cluster, config={"message.max.bytes": "1000"})
    async with dispatching(settings(dsn), publisher):
        await wait_until(lambda: _count(conn, "status IN ('done', 'dead')") == 2, timeout=20)
    dead = row(conn, big)
    assert dead["status"] == "dead"
    assert dead["last_error"].startswith("permanent: Kafka MSG_SIZE_TOO_LARGE: ")
    assert row(conn, small)["status"] == "done"
    [delivered] = consume_all(cluster.bootstraps, "order", 1)
    assert json.loads(delivered.value())["id"] == small


async def test_a_full_local_queue_is_retryable(conn, dsn, cluster):
    # One message in the producer at a time, lingering: concurrent publishes find it full.
    ids = seed(conn, 3, aggregates=3)
    publisher = _publisher(
        cluster, config={"queue.buffering.max.messages": "1", "linger.ms": "100"}
    )
    async with dispatching(settings(dsn, max_attempts=1000), publisher) as d:
        await wait_until(lambda: _count(conn, "status = 'done'") == 3, timeout=30)
    assert d.metrics.messages.labels("retried")._value.get() >= 1
    assert _count(conn, "attempts > 1") >= 1
    consumed = consume_all(cluster.bootstraps, "order", 3)
    assert sorted(json.loads(m.value())["id"] for m in consumed) == ids


async def test_a_fatal_producer_error_replaces_the_producer_and_retries(conn, dsn, cluster, caplog):
    [first] = seed(conn, 1)
    publisher = _publisher(cluster)
    async with dispatching(settings(dsn), publisher):
        await wait_until(lambda: row(conn, first)["status"] == "done", timeout=20)
        # A sequence number the broker does not expect: the idempotent producer can no longer
        # guarantee order or uniqueness, so librdkafka raises a fatal error.
        cluster.push_request_errors(PRODUCE, E.OUT_OF_ORDER_SEQUENCE_NUMBER)
        [second] = seed(conn, 1)
        await wait_until(lambda: row(conn, second)["status"] == "done", timeout=20)
    assert row(conn, second)["attempts"] == 2  # failed on the old producer, sent by the new
    assert any(r.getMessage() == "kafka: replacing the producer after a fatal error"
               for r in caplog.records)  # fmt: skip
    consumed = consume_all(cluster.bootstraps, "order", 2)
    assert sorted(json.loads(m.value())["id"] for m in consumed) == [first, second]


async def test_close_flushes_what_librdkafka_still_holds(cluster):
    # Held far longer than the test looks (a loop stall cannot see it sent already), and
    # sent by close()'s flush, which does not wait for the linger.
    publisher = _publisher(cluster, config={"linger.ms": "5000"})
    await publisher.start()
    publish = asyncio.create_task(publisher.publish_batch([_message(id=41)]))
    await wait_until(lambda: len(publisher._session.producer) == 1, timeout=5)
    publish.cancel()  # as when the dispatcher abandons a publish: the message is queued still
    await publisher.close()
    [delivered] = consume_all(cluster.bootstraps, "order", 1)
    assert json.loads(delivered.value())["id"] == 41


async def test_a_batch_reports_each_message_in_order(cluster):
    publisher = _publisher(cluster, topic="{event_type}", config={"message.max.bytes": "1000"})
    cluster.create_topic("Paid", partitions=2, replication_factor=3)
    await publisher.start()
    try:
        results = await publisher.publish_batch([
            _message(id=1, event_type="Paid"),
            _message(id=2, event_type=".."),  # renders an illegal topic
            _message(id=3, event_type="Paid", payload_json=json.dumps("x" * 5000)),
            _message(id=4, event_type="Paid"),
        ])  # fmt: skip
    finally:
        await publisher.close()
    kinds = [None if r is None else type(r) for r in results]
    assert kinds == [None, PermanentError, PermanentError, None]
    assert str(results[1]) == "topic template '{event_type}' renders '..', not a legal topic"
    assert str(results[2]).startswith("Kafka MSG_SIZE_TOO_LARGE: ")
    consumed = consume_all(cluster.bootstraps, "Paid", 2)
    assert sorted(json.loads(m.value())["id"] for m in consumed) == [1, 4]


# What one refused produce request sets off. librdkafka takes TOPIC_AUTHORIZATION_FAILED for a
# permanent error of the whole topic and removes all its partitions. The messages queued in a
# partition its leader's broker thread had already taken fail with the topic's error too. A
# partition whose handover to that thread was still queued is not taken ("not joining broker:
# partition removed"): its messages, never sent, fail when the partition is freed, with _DESTROY
# ("Broker handle destroyed for termination", though nothing terminates). The handover is an op
# queued to the broker thread: on a loaded machine it can still be waiting when the refusal comes.
REFUSED = (PermanentError, "Kafka TOPIC_AUTHORIZATION_FAILED: Broker: Topic authorization failed")
FREED_UNSENT = (RetryableError, "Kafka _DESTROY: Local: Broker handle destroyed for termination")


async def test_failures_reported_later_land_on_their_own_messages(cluster, caplog):
    # The broker refuses the first produce request: its messages fail in their delivery
    # reports, later than produce(), and each failure must land on its own message.
    cluster.push_request_errors(PRODUCE, E.TOPIC_AUTHORIZATION_FAILED)
    publisher = _publisher(cluster)
    await publisher.start()
    try:
        messages = [_message(id=i, aggregate_id=f"o-{i}") for i in range(1, 41)]
        results = await publisher.publish_batch(messages)
    finally:
        await publisher.close()
    failed = {m.id for m, r in zip(messages, results, strict=True) if r is not None}
    assert failed, "the injected error failed no message"
    outcomes = {(type(r), str(r)) for r in results if r is not None}
    # The refused request's messages are dead; a message the topic's removal dropped unsent
    # is retryable: the worker sends it again, and the broker decides then.
    assert REFUSED in outcomes
    assert outcomes <= {REFUSED, FREED_UNSENT}
    # Every report was placed by the outbox id in its value, none spread over the batch.
    assert "could not be placed" not in caplog.text
    # A message counted as failed never reached the topic; every other one did, once.
    consumed = consume_all(cluster.bootstraps, "order", 40 - len(failed))
    assert sorted(json.loads(m.value())["id"] for m in consumed) == sorted(
        m.id for m in messages if m.id not in failed
    )
