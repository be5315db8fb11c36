"""The worker's settings: one frozen model, read from flags and OUTBOX_* variables."""

from __future__ import annotations

import argparse
import os
import socket
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import MISSING, dataclass, field
from datetime import timedelta
from typing import Any

from outbox.destinations import MAX_FAILING_IDS, Policy
from outbox.limits import (
    CLAIM_BYTES,
    CLAIM_BYTES_RANGE,
    MAX_PAYLOAD_RANGE,
    WORKER_MAX_PAYLOAD_BYTES,
    bytes_between,
    format_bytes,
)
from outbox.plumbing.cliutil import (
    ArgumentParser,
    add_dsn_and_table,
    choice,
    env_name,
    field_help,
    int_between,
    listen_address,
    not_utf8,
    on_off,
    port,
    resolve,
    undecodable_at,
)
from outbox.plumbing.dsn import check_dsn
from outbox.plumbing.durations import (
    MAX_DURATION,
    duration_between,
    format_duration,
    parse_duration,
)
from outbox.plumbing.errors import SettingError
from outbox.publisher_options import Option
from outbox.schema import ORDERINGS
from outbox.table import Table
from outbox.worker.publishers.formats import DEFAULT_FORMAT, cloudevents_source, wire_format
from outbox.worker.publishers.registry import (
    PublisherFactory,
    builtin_installed,
    builtin_names,
    load_publisher,
)

# What a setting may be; beyond these a value fails at every claim (the database cannot hold
# it) or makes the worker hold more than it can. A lease under a second expires before it
# can be renewed (the lease keeper renews at a third of it, after database round trips).
MAX_BATCH = 10_000
MAX_CONCURRENCY = 10_000
MAX_ATTEMPTS = 2**31 - 1  # the `attempts` column is an integer
LEASE_RANGE = (timedelta(seconds=1), timedelta(days=1))
PUBLISH_TIMEOUT_RANGE = (timedelta(milliseconds=1), timedelta(days=1))
POLL_INTERVAL_RANGE = (timedelta(milliseconds=1), timedelta(hours=1))
MAX_BREAKER_FAILURES = MAX_FAILING_IDS
BREAKER_WINDOW_RANGE = (timedelta(seconds=1), timedelta(days=1))
PROBE_DELAY_MAX_RANGE = (timedelta(seconds=2), timedelta(hours=1))
# 0 would retry at once, in a loop against a failing destination; a day is the longest wait.
BACKOFF_RANGE = (timedelta(milliseconds=1), timedelta(days=1))
# 0 would send every business defer straight to dead.
MAX_DEFER_AGE_RANGE = (timedelta(seconds=1), MAX_DURATION)
RATE_RANGE = (0.01, 1_000_000.0)  # messages a second
_RATE_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0}
EVENT_LOOPS = ("auto", "uvloop", "asyncio")
LOG_FORMATS = ("auto", "json", "text")
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
OTEL_PARENTS = ("link", "parent")  # what the stored trace context is to a publish span


def parse_rate(text: str) -> float:
    """`50/s`, `600/m`, `10/h`, or a bare number a second: messages a second."""
    number, _, unit = text.strip().partition("/")
    try:
        rate = float(number) / _RATE_UNITS[unit.strip() or "s"]
    except (KeyError, ValueError):
        raise ValueError(f"{text!r} is not a rate (use e.g. 50/s, 600/m)") from None
    low, high = RATE_RANGE
    if not low <= rate <= high:
        raise ValueError(f"{text!r} is out of range ({low:g}/s to {high:g}/s)")
    return rate


def default_owner() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


@dataclass(frozen=True)
class WorkerSettings:
    dsn: str
    """libpq connection string; empty means libpq's PG* variables and defaults."""
    table: Table = field(default_factory=Table.default)
    """The outbox table, optionally schema-qualified."""
    publisher: str = "log"
    """Where messages go: a registered publisher's name (a built-in one or a plugin's) or a
    `package.module:Class` path."""
    publisher_options: Mapping[str, Any] = field(default_factory=dict)
    """The selected publisher's own settings, by option name (e.g. `http_url`)."""
    lease: timedelta = timedelta(seconds=60)
    """How long a claim owns a message before others may take it over (1s to 1d)."""
    batch: int = 100
    """Most messages taken by one claim (1 to 10,000)."""
    concurrency: int = 32
    """Most publishes in flight at once (1 to 10,000)."""
    max_payload_bytes: int = WORKER_MAX_PAYLOAD_BYTES
    """A message whose payload, as JSON text, is longer goes dead with the reason instead of
    being sent; the claim measures it in the database and never loads it (`8MiB`,
    `1048576`)."""
    claim_bytes: int = CLAIM_BYTES
    """Most payload bytes held at once, claimed and not yet finalized: a claim takes messages
    while they fit what is left, and always one (so at most this plus one payload)."""
    publish_timeout: timedelta = timedelta(seconds=10)
    """Deadline for one publish; keep it well under the lease."""
    max_attempts: int = 12
    """Claims a message may use before it goes dead (a crash counts as one; 1 to 2**31 - 1)."""
    ordering: str = "none"
    """`none`, or `aggregate`: only the oldest unfinished message of an aggregate is
    claimable (the table needs `outbox migrate --ordering aggregate`)."""
    owner: str = field(default_factory=default_owner)
    """Written to lease_owner (and the session's application_name) for people to read;
    correctness rests on lease_version."""
    metrics_port: int | None = None
    """Serve /metrics, /healthz and /readyz on this port (0 = any free port)."""
    metrics_address: str = "0.0.0.0"
    """The address they listen on: every IPv4 interface by default, which is what a pod
    needs (kubelet's probes and Prometheus come to the pod's IP; a NetworkPolicy says who
    may); `::` for IPv6, `127.0.0.1` to keep them on a shared host."""
    poll_interval: timedelta = timedelta(seconds=1)
    """Longest idle wait between claims when no notification arrives."""
    shutdown_grace: timedelta = timedelta(seconds=20)
    """On SIGTERM, how long in-flight publishes may take before they are abandoned."""
    backoff_base: timedelta = timedelta(seconds=1)
    """Full-jitter backoff: a retry waits uniform(0, min(cap, base * 2**attempt))."""
    backoff_cap: timedelta = timedelta(minutes=5)
    """Upper bound of the retry backoff (and of a honoured Retry-After)."""
    max_defer_age: timedelta = timedelta(days=1)
    """A message still deferred this long after it was created goes dead."""
    log_format: str = "auto"
    """`json`, `text`, or `auto` (text on a terminal, JSON otherwise)."""
    log_level: str = "INFO"
    """DEBUG, INFO, WARNING or ERROR."""
    prepared_statements: bool = True
    """`on`: the claim is prepared once per connection; `off` for PgBouncer before 1.21 in
    transaction pooling mode, which cannot keep prepared statements."""
    event_loop: str = "auto"
    """`auto` (uvloop when it is installed, else asyncio's own), `uvloop` or `asyncio`."""
    otel_parent: str = OTEL_PARENTS[0]
    """With OpenTelemetry tracing on (the `otel` extra and OTEL_* variables): `link`, each
    publish span links to the trace context stored with the message, or `parent`, it is the
    span's parent (docs/tracing.md)."""
    rate_limit: float | None = None
    """Most messages a second sent to each destination by all replicas of the table together
    (`50/s`, `600/m`); unset: no limit."""
    breaker_failures: int = Policy.threshold
    """Different messages failing at one destination within the breaker window that open its
    breaker for every replica (0 turns the breaker off)."""
    breaker_window: timedelta = Policy.window
    """How close together those failures must be; a success starts the count again."""
    probe_delay_max: timedelta = Policy.probe_cap
    """Longest wait between two probes of an open destination (the wait doubles from 2s)."""
    format: str = DEFAULT_FORMAT
    """What the http, nats and kafka publishers send: `envelope` (the project's JSON),
    `cloudevents-binary` (the payload as the body, CloudEvents attributes as headers) or
    `cloudevents-structured` (a JSON CloudEvent with the payload as `data`)."""
    cloudevents_source: str | None = None
    """The CloudEvents `source` attribute, a URI-reference."""

    @property
    def ordered(self) -> bool:
        return self.ordering == "aggregate"

    def warnings(self) -> list[str]:
        """Settings that make lost leases (and so duplicates) likely; warned about, not refused."""
        found = []
        if self.publish_timeout * 2 > self.lease:
            found.append(
                f"publish timeout {format_duration(self.publish_timeout)} is not well under the "
                f"lease {format_duration(self.lease)}: a slow publish may lose its lease and be "
                "sent twice; keep the timeout at most half the lease"
            )
        if self.lease < timedelta(seconds=2):
            found.append(
                f"lease {format_duration(self.lease)} is shorter than a database hiccup: "
                "leases may expire while messages are in flight"
            )
        return found


def _owner(text: str) -> str:
    # lease_owner is how people and the TUI tell replicas apart: never blank.
    if not text.strip():
        raise ValueError("must not be blank")
    # It is the session's application_name too: an undecodable byte (a lone surrogate)
    # could not be sent, and the connection would fail on it with a traceback.
    if undecodable_at(text) is not None:
        raise ValueError(not_utf8(text))
    return text


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


# How each setting's flag (or OUTBOX_* variable) becomes a value, in `--help`'s order. The
# meaning and the default of each come from WorkerSettings itself.
CONVERTERS: dict[str, Callable[[str], Any]] = {
    "lease": duration_between(*LEASE_RANGE),
    "batch": int_between(1, MAX_BATCH),
    "concurrency": int_between(1, MAX_CONCURRENCY),
    "max_payload_bytes": bytes_between(*MAX_PAYLOAD_RANGE),
    "claim_bytes": bytes_between(*CLAIM_BYTES_RANGE),
    "publish_timeout": duration_between(*PUBLISH_TIMEOUT_RANGE),
    "max_attempts": int_between(1, MAX_ATTEMPTS),
    "ordering": choice(*ORDERINGS),
    "owner": _owner,
    "metrics_port": port,
    "metrics_address": listen_address,
    "poll_interval": duration_between(*POLL_INTERVAL_RANGE),
    "shutdown_grace": parse_duration,
    "backoff_base": duration_between(*BACKOFF_RANGE),
    "backoff_cap": duration_between(*BACKOFF_RANGE),
    "max_defer_age": duration_between(*MAX_DEFER_AGE_RANGE),
    "log_format": choice(*LOG_FORMATS),
    "log_level": str.upper,
    "event_loop": choice(*EVENT_LOOPS),
    "otel_parent": choice(*OTEL_PARENTS),
    "prepared_statements": on_off,
    "rate_limit": parse_rate,
    "breaker_failures": int_between(0, MAX_BREAKER_FAILURES),
    "breaker_window": duration_between(*BREAKER_WINDOW_RANGE),
    "probe_delay_max": duration_between(*PROBE_DELAY_MAX_RANGE),
    "format": wire_format,
    "cloudevents_source": cloudevents_source,
}
# Defaults computed at start-up, shown as what they are made of; sizes as people write them.
_SHOWN_DEFAULTS = {
    "owner": "hostname-pid",
    "max_payload_bytes": format_bytes(WORKER_MAX_PAYLOAD_BYTES),
    "claim_bytes": format_bytes(CLAIM_BYTES),
    "cloudevents_source": "/outbox/<table>",
}


def build_parser(publishers: Sequence[type[PublisherFactory]] = ()) -> ArgumentParser:
    """The worker's flags, plus a group of options for each publisher given."""
    parser = ArgumentParser(
        prog="outbox-worker",
        description="Deliver outbox rows to HTTP APIs or brokers, safely with many replicas. "
        "Every flag can also be set with an OUTBOX_* environment variable "
        "(--publish-timeout = OUTBOX_PUBLISH_TIMEOUT). Durations: 250ms, 60s, 5m. "
        "`--publisher NAME --help` shows that publisher's options.",
    )
    add_dsn_and_table(parser)
    parser.add_argument(
        "--publisher",
        help=field_help(WorkerSettings, "publisher").replace(
            "(default", f"(built in: {', '.join(builtin_names())}; default", 1
        ),
    )
    for name in CONVERTERS:
        shown = _SHOWN_DEFAULTS.get(name, MISSING)
        parser.add_argument(_flag(name), help=field_help(WorkerSettings, name, shown))
    declared: list[Option] = []
    for factory in publishers:
        # A plugin may reuse another publisher's options (e.g. a subclass of the http
        # publisher): each is declared once, or argparse refuses the second.
        options = [option for option in factory.options if option not in declared]
        declared.extend(options)
        if options:
            group = parser.add_argument_group(f"{factory.name} publisher options")
            for option in options:
                group.add_argument(
                    option.flag,
                    action="append" if option.repeatable else "store",
                    help=_option_help(option),
                )
    return parser


def _option_help(option: Option) -> str:
    text = option.help + (" (repeatable)" if option.repeatable else "")
    if option.secret and option.default not in (None, ""):
        # A secret default written into the help by its author is masked too.
        text = option.masked(text, str(option.default)) + " (has a default, not shown)"
    return text


def _selected_publisher(argv: Sequence[str], env: Mapping[str, str]) -> tuple[str, bool]:
    """(--publisher value, given explicitly) read ahead of the full parse."""
    probe = argparse.ArgumentParser(add_help=False)
    probe.add_argument("--publisher")
    known, _ = probe.parse_known_args(argv)
    if known.publisher is not None:  # `--publisher ""` is refused, not taken as the default
        return str(known.publisher), True
    if env.get("OUTBOX_PUBLISHER"):
        return env["OUTBOX_PUBLISHER"], True
    return "log", False


def _publishers_to_offer(
    chosen: type[PublisherFactory], explicit: bool, argv: Sequence[str]
) -> list[type[PublisherFactory]]:
    """`--publisher X --help` shows X's options only; otherwise every installed built-in's
    too (a broker's publisher whose extra is missing is left out, not a reason to stop)."""
    if explicit and ("-h" in argv or "--help" in argv):
        return [chosen]
    offered = [load_publisher(name) for name in builtin_names() if builtin_installed(name)]
    return offered if chosen in offered else [*offered, chosen]


def _publisher_options(
    factory: type[PublisherFactory],
    args: argparse.Namespace,
    env: Mapping[str, str],
    *,
    check_required: bool = True,
) -> dict[str, Any]:
    values: dict[str, Any] = {}
    for option in factory.options:
        if option.repeatable:
            raw, source = getattr(args, option.dest), option.flag
            if raw is None and env.get(env_name(option.flag)):
                # One value a line; blank lines skipped (a Secret's value often ends with one).
                lines = env[env_name(option.flag)].splitlines()
                raw, source = [line for line in lines if line.strip()], env_name(option.flag)
            converted = []
            for item in raw or ():
                try:
                    converted.append(option.convert(item))
                except ValueError as exc:
                    raise SettingError(option.masked(f"{source}: {exc}", item)) from None
            values[option.dest] = tuple(converted)
            missing = not values[option.dest]
        else:
            try:
                values[option.dest] = resolve(
                    args, option.flag, option.convert, option.default, env
                )
            except SettingError as exc:
                given = getattr(args, option.dest)
                raw = given if given is not None else env.get(env_name(option.flag))
                raise SettingError(option.masked(str(exc), raw)) from None
            missing = values[option.dest] is None
        if check_required and option.required and missing:
            raise SettingError(
                f"{option.flag} (or {env_name(option.flag)}) is required with "
                f"--publisher {factory.name}"
            )
    return values


def load_settings(
    argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None
) -> WorkerSettings:
    """Parse flags and environment; raises SettingError naming the bad setting."""
    env = os.environ if env is None else env
    argv = list(sys.argv[1:] if argv is None else argv)
    selected, explicit = _selected_publisher(argv, env)
    factory = load_publisher(selected)
    offered = _publishers_to_offer(factory, explicit, argv)
    args = build_parser(offered).parse_args(argv)
    for other in offered:
        if other is not factory:  # flags given for another publisher must still make sense
            _publisher_options(other, args, {}, check_required=False)
    defaults = WorkerSettings(dsn="")

    settings = WorkerSettings(
        dsn=resolve(args, "--dsn", check_dsn, "", env),
        table=resolve(args, "--table", Table.parse, defaults.table, env),
        publisher=selected,
        publisher_options=_publisher_options(factory, args, env),
        **{
            name: resolve(args, _flag(name), convert, getattr(defaults, name), env)
            for name, convert in CONVERTERS.items()
        },
    )
    _check(settings)
    return settings


def _check(settings: WorkerSettings) -> None:
    for name in ("lease", "publish_timeout", "poll_interval"):
        if getattr(settings, name) <= timedelta(0):
            raise SettingError(f"--{name.replace('_', '-')}: must be greater than zero")
    if settings.backoff_base > settings.backoff_cap:
        raise SettingError(
            f"--backoff-base: {format_duration(settings.backoff_base)} is longer than "
            f"--backoff-cap ({format_duration(settings.backoff_cap)})"
        )
    if settings.log_level not in LOG_LEVELS:
        raise SettingError(f"--log-level: {settings.log_level!r} is not {', '.join(LOG_LEVELS)}")


__all__ = ["WorkerSettings", "build_parser", "load_settings"]
