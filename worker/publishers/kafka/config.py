"""The publisher's settings: bootstrap servers, compression, librdkafka properties."""

from __future__ import annotations

import contextlib
import ipaddress
import re

from confluent_kafka import KafkaException, Producer

from outbox.plumbing.redact import is_secret_name, mask_userinfo, mask_values
from outbox.publisher_options import Keys
from outbox.worker.publishers.kafka.errors import (
    _error_of,
    log,
)

COMPRESSIONS = ("none", "gzip", "snappy", "lz4", "zstd")
# librdkafka's security protocols: a bootstrap server may name one (`SSL://h:9093`, any case),
# and librdkafka drops a server whose protocol is not security.protocol's.
PROTOCOLS = ("plaintext", "ssl", "sasl_plaintext", "sasl_ssl")
# One bootstrap server as librdkafka reads it (rd_kafka_broker_name_parse): an optional
# `PROTOCOL://` (then a path, ignored by librdkafka, may follow: only an empty one is taken),
# a host, then `:port` unless the host is an IPv6 address written without brackets.
_BOOTSTRAP_SERVER = re.compile(
    r"(?:(?P<protocol>[A-Za-z_]+)://)?"
    r"(?:(?P<name>[A-Za-z0-9_-]+(?:\.[A-Za-z0-9_-]+)*\.?)|\[(?P<ipv6>[^\]]+)\])"
    r"(?::(?P<port>[0-9]+))?"
    r"(?(protocol)/?)"
)
BOOTSTRAP_EXPECTED = (
    "expected host:port[,host:port...] (host a name, an IPv4 or a [bracketed] IPv6 address; "
    "port 1-65535; optionally PROTOCOL:// first)"
)

# What spec.publisher.kafka.config of a resource may hold (the operator checks it; the
# resource's author is not the Kafka Secret's owner). Its keys are librdkafka's property
# names: with one KEY=VALUE a line in the worker's variable, another key could add a
# property the author did not write as one. The properties that load code or run a command
# in the worker process, whose environment holds the DSN, are refused whatever the admin
# allows, by the CRD too (one list: tests/test_controller_policy.py compares); a Kafka
# Secret's owner, who consents to it, may still set them through configSecretRef.
RESOURCE_CONFIG_KEYS = Keys(
    re.compile(r"^[a-z0-9][a-z0-9._]*\Z"),
    "a librdkafka property name (a-z, 0-9, dots and underscores)",
    {
        "plugin.library.paths": "librdkafka loads the libraries it names",
        "sasl.kerberos.kinit.cmd": "librdkafka runs it through a shell",
        "ssl.engine.location": "OpenSSL loads the engine library it names",
        "ssl.engine.id": "OpenSSL loads the engine it names",
        "ssl.providers": "OpenSSL loads the providers it names",
    },
)

# Set by this publisher (or by another flag); a passthrough value would break its guarantees.
RESERVED_CONFIG = {
    "bootstrap.servers": "use --kafka-bootstrap-servers",
    "metadata.broker.list": "use --kafka-bootstrap-servers",
    "enable.idempotence": "always true",
    "acks": "always all",
    "request.required.acks": "always all",
    "message.timeout.ms": "derived from --publish-timeout",
    "delivery.timeout.ms": "derived from --publish-timeout",
    "compression.type": "use --kafka-compression",
    "compression.codec": "use --kafka-compression",
    "transactional.id": "transactions are not supported",
    "delivery.report.only.error": "every delivery report is needed",
}

# How much earlier than the worker's publish timeout librdkafka gives up on a message.
MESSAGE_TIMEOUT_MARGIN = 1.5


def bootstrap_server_list(text: str) -> str:
    """A comma-separated list of `[PROTOCOL://]host[:port]`, whitespace around each server
    dropped: what librdkafka's bootstrap.servers takes, and nothing else.

    librdkafka checks none of it: it reads `user:password@host:port` as a host name, and logs
    it, password and all, on every connection attempt (the destination's name would store it
    too), and it reads `host:x` as port 0 and `host:70000` as port 4464. The value is quoted
    in the error only without an `@`: with one, all before the last `@` is masked (a password
    may hold a comma, which would split it across two servers).
    """
    servers = [server.strip() for server in text.split(",")]
    if "@" in text:
        raise ValueError(
            f"{mask_userinfo(text)!r} holds user-info: expected host:port[,host:port...]; "
            "credentials go in --kafka-config sasl.username/sasl.password"
        )
    if not all(servers):
        raise ValueError(f"{text!r} has an empty entry: {BOOTSTRAP_EXPECTED}")
    for server in servers:
        problem = _bootstrap_server_problem(server)
        if problem:
            raise ValueError(f"{server!r} {problem}: {BOOTSTRAP_EXPECTED}")
    return ",".join(servers)


def _bootstrap_server_problem(server: str) -> str | None:
    """What is wrong with one bootstrap server, or None."""
    match = _BOOTSTRAP_SERVER.fullmatch(server)
    if match is None:
        with contextlib.suppress(ValueError):
            # librdkafka takes an IPv6 address without brackets, and then no port.
            ipaddress.IPv6Address(server.rpartition("://")[2])
            return _protocol_problem(server.rpartition("://")[0] or None)
        return "is not [PROTOCOL://]host[:port]"
    if match["ipv6"] is not None:
        try:
            ipaddress.IPv6Address(match["ipv6"])
        except ValueError:
            return "has no IPv6 address between its brackets"
    if match["port"] is not None and not 1 <= int(match["port"]) <= 65535:
        return "has a port outside 1-65535"
    return _protocol_problem(match["protocol"])


def _protocol_problem(protocol: str | None) -> str | None:
    if protocol is not None and protocol.lower() not in PROTOCOLS:
        return f"names no security protocol of librdkafka's ({', '.join(PROTOCOLS)})"
    return None


def _protocol(server: str) -> str | None:
    """The protocol a (checked) bootstrap server names, lower case; None if none."""
    protocol, sep, _ = server.partition("://")
    return protocol.lower() if sep else None


def compression(text: str) -> str:
    if text not in COMPRESSIONS:
        raise ValueError(f"{text!r} is not one of {', '.join(COMPRESSIONS)}")
    return text


def config_entry(text: str) -> tuple[str, str]:
    """One `KEY=VALUE` librdkafka property, checked by librdkafka itself."""
    key, sep, value = text.partition("=")
    key = key.strip()
    if not sep or not key:
        raise ValueError("expected KEY=VALUE, a librdkafka property such as security.protocol=ssl")
    if key in RESERVED_CONFIG:
        raise ValueError(f"{key} cannot be set here: {RESERVED_CONFIG[key]}")
    try:
        # Building a client checks the name and the value's syntax. No bootstrap servers: it
        # connects nowhere, and its log lines stay in a queue nobody polls.
        Producer({key: value, "logger": log})
    except (KafkaException, TypeError) as exc:
        reason = str(_error_of(exc).str() if isinstance(exc, KafkaException) else exc)
        # Errors only rd_kafka_new finds depend on the other properties (security.protocol
        # alone wants a SASL mechanism): the whole configuration is checked at start.
        if not reason.startswith("Failed to create producer"):
            if is_secret_name(key):
                reason = mask_values(reason, [value])
            raise ValueError(reason) from None
    return key, value


def message_timeout_ms(publish_timeout: float) -> int:
    """librdkafka's own deadline, under the worker's so that its verdict comes first.

    librdkafka looks for timed-out messages once a second, so its report may come up to a
    second late: 1.5 s of margin covers that for publish timeouts of 3 s and more.
    """
    margin = min(MESSAGE_TIMEOUT_MARGIN, publish_timeout / 2)
    return max(1, int((publish_timeout - margin) * 1000))
