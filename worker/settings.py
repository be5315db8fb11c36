"""The worker's settings: one frozen model, read from flags and OUTBOX_* variables."""

from __future__ import annotations

import argparse
import os
import socket
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from outbox.cliutil import (
    ArgumentParser,
    add_dsn_and_table,
    env_name,
    int_between,
    port,
    resolve,
)
from outbox.settings import (
    SettingError,
    check_dsn,
    duration_between,
    format_duration,
    parse_duration,
)
from outbox.table import Table
from outbox.worker.publishers.registry import Option, PublisherFactory, load_publisher

# Built-in publishers whose options every `--help` lists; a plugin's appear once selected.
BUILTIN_PUBLISHERS = ("http", "kafka", "log", "nats", "null")
ORDERINGS = ("none", "aggregate")
# What a setting may be; beyond these a value fails at every claim (the database cannot hold
# it) or makes the worker hold more than it can. A lease under a second expires before it
# can be renewed (the heartbeat renews at a third of it, after database round trips).
MAX_BATCH = 10_000
MAX_CONCURRENCY = 10_000
MAX_ATTEMPTS = 2**31 - 1  # the `attempts` column is an integer
LEASE_RANGE = (timedelta(seconds=1), timedelta(days=1))
PUBLISH_TIMEOUT_RANGE = (timedelta(milliseconds=1), timedelta(days=1))
POLL_INTERVAL_RANGE = (timedelta(milliseconds=1), timedelta(hours=1))
EVENT_LOOPS = ("auto", "uvloop", "asyncio")


def default_owner() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


@dataclass(frozen=True)
class WorkerSettings:
    dsn: str
    """libpq connection string; empty means libpq's PG* variables and defaults."""
    table: Table = field(default_factory=lambda: Table.parse("outbox"))
    """The outbox table, optionally schema-qualified."""
    publisher: str = "log"
    """Where messages go: a registered publisher name (http, log, null, or a plugin's) or a
    `package.module:Class` path."""
    publisher_options: Mapping[str, Any] = field(default_factory=dict)
    """The selected publisher's own settings, by option name (e.g. `http_url`)."""
    lease: timedelta = timedelta(seconds=60)
    """How long a claim owns a message before others may take it over (1s to 1d)."""
    batch: int = 100
    """Most messages taken by one claim (1 to 10,000)."""
    concurrency: int = 32
    """Most publishes in flight at once (1 to 10,000)."""
    publish_timeout: timedelta = timedelta(seconds=10)
    """Deadline for one publish; keep it well under the lease."""
    max_attempts: int = 12
    """Claims a message may use before it goes dead (a crash counts as one; 1 to 2**31 - 1)."""
    ordering: str = "none"
    """`aggregate`: only the oldest unfinished message of an aggregate is claimable."""
    owner: str = field(default_factory=default_owner)
    """Written to lease_owner for people to read; correctness rests on lease_version."""
    metrics_port: int | None = None
    """Serve /metrics, /healthz and /readyz on this port (0 = any free port)."""
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
    prepared_statements: bool = True
    """Send the claim as a prepared statement; off for PgBouncer before 1.21 in transaction
    pooling mode, which cannot keep prepared statements."""
    event_loop: str = "auto"
    """`auto` (uvloop when it is installed, else asyncio's own), `uvloop` or `asyncio`."""

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


def _ordering(text: str) -> str:
    if text not in ORDERINGS:
        raise ValueError(f"{text!r} is not one of {', '.join(ORDERINGS)}")
    return text


def _on_off(text: str) -> bool:
    if text not in ("on", "off"):
        raise ValueError(f"{text!r} is not on or off")
    return text == "on"


def _event_loop(text: str) -> str:
    if text not in EVENT_LOOPS:
        raise ValueError(f"{text!r} is not one of {', '.join(EVENT_LOOPS)}")
    return text


def _log_format(text: str) -> str:
    if text not in ("auto", "json", "text"):
        raise ValueError(f"{text!r} is not one of auto, json, text")
    return text


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
        help=f"{', '.join(BUILTIN_PUBLISHERS)}, a plugin's name, or package.module:Class "
        "(default log)",
    )
    parser.add_argument("--lease", help="lease length (default 60s)")
    parser.add_argument("--batch", help="most messages per claim (default 100)")
    parser.add_argument("--concurrency", help="most publishes in flight (default 32)")
    parser.add_argument("--publish-timeout", help="deadline of one publish (default 10s)")
    parser.add_argument("--max-attempts", help="claims before a message goes dead (default 12)")
    parser.add_argument("--ordering", help="none (default) or aggregate (per-aggregate order)")
    parser.add_argument("--owner", help="lease_owner written on claims (default hostname-pid)")
    parser.add_argument("--metrics-port", help="serve /metrics, /healthz, /readyz on this port")
    parser.add_argument("--poll-interval", help="longest idle wait between claims (default 1s)")
    parser.add_argument("--shutdown-grace", help="time in-flight publishes get on SIGTERM (20s)")
    parser.add_argument("--backoff-base", help="retry backoff base (default 1s)")
    parser.add_argument("--backoff-cap", help="retry backoff cap (default 5m)")
    parser.add_argument("--max-defer-age", help="deferred this long after creation: dead (1d)")
    parser.add_argument("--log-format", help="auto (default), json or text")
    parser.add_argument("--log-level", help="DEBUG, INFO (default), WARNING, ERROR")
    parser.add_argument(
        "--event-loop", help="auto (default: uvloop when installed), uvloop or asyncio"
    )
    parser.add_argument(
        "--prepared-statements",
        help="on (default: the claim is prepared once per connection) or off (PgBouncer < 1.21 "
        "in transaction pooling mode)",
    )
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
    """`--publisher X --help` shows X's options only; otherwise every built-in's too."""
    if explicit and ("-h" in argv or "--help" in argv):
        return [chosen]
    offered = [load_publisher(name) for name in BUILTIN_PUBLISHERS]
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
                raw, source = env[env_name(option.flag)].splitlines(), env_name(option.flag)
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

    def get(flag: str, convert, default):  # type: ignore[no-untyped-def]
        return resolve(args, flag, convert, default, env)

    settings = WorkerSettings(
        dsn=get("--dsn", check_dsn, ""),
        table=get("--table", Table.parse, defaults.table),
        publisher=selected,
        publisher_options=_publisher_options(factory, args, env),
        lease=get("--lease", duration_between(*LEASE_RANGE), defaults.lease),
        batch=get("--batch", int_between(1, MAX_BATCH), defaults.batch),
        concurrency=get("--concurrency", int_between(1, MAX_CONCURRENCY), defaults.concurrency),
        publish_timeout=get(
            "--publish-timeout", duration_between(*PUBLISH_TIMEOUT_RANGE), defaults.publish_timeout
        ),
        max_attempts=get("--max-attempts", int_between(1, MAX_ATTEMPTS), defaults.max_attempts),
        ordering=get("--ordering", _ordering, defaults.ordering),
        owner=get("--owner", str, defaults.owner),
        metrics_port=get("--metrics-port", port, None),
        poll_interval=get(
            "--poll-interval", duration_between(*POLL_INTERVAL_RANGE), defaults.poll_interval
        ),
        shutdown_grace=get("--shutdown-grace", parse_duration, defaults.shutdown_grace),
        backoff_base=get("--backoff-base", parse_duration, defaults.backoff_base),
        backoff_cap=get("--backoff-cap", parse_duration, defaults.backoff_cap),
        max_defer_age=get("--max-defer-age", parse_duration, defaults.max_defer_age),
        log_format=get("--log-format", _log_format, defaults.log_format),
        log_level=get("--log-level", str.upper, defaults.log_level),
        event_loop=get("--event-loop", _event_loop, defaults.event_loop),
        prepared_statements=get("--prepared-statements", _on_off, defaults.prepared_statements),
    )
    _check(settings)
    return settings


def _check(settings: WorkerSettings) -> None:
    for name in ("lease", "publish_timeout", "poll_interval"):
        if getattr(settings, name) <= timedelta(0):
            raise SettingError(f"--{name.replace('_', '-')}: must be greater than zero")
    if settings.log_level not in ("DEBUG", "INFO", "WARNING", "ERROR"):
        raise SettingError(
            f"--log-level: {settings.log_level!r} is not DEBUG, INFO, WARNING or ERROR"
        )


__all__ = ["WorkerSettings", "build_parser", "load_settings"]
