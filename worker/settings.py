"""The worker's settings: one frozen model, read from flags and OUTBOX_* variables."""

from __future__ import annotations

import os
import socket
import urllib.parse
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import timedelta

from outbox.cliutil import ArgumentParser, add_dsn_and_table, port, positive_int, resolve
from outbox.settings import SettingError, check_dsn, format_duration, parse_duration
from outbox.table import Table

PUBLISHERS = ("http", "log", "null")
ORDERINGS = ("none", "aggregate")


def default_owner() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


@dataclass(frozen=True)
class WorkerSettings:
    dsn: str
    """libpq connection string; empty means libpq's PG* variables and defaults."""
    table: Table = field(default_factory=lambda: Table.parse("outbox"))
    """The outbox table, optionally schema-qualified."""
    publisher: str = "log"
    """Where messages go: http, log (JSON lines on stdout) or null (discard)."""
    http_url: str | None = None
    """The URL the http publisher POSTs to."""
    http_headers: tuple[tuple[str, str], ...] = ()
    """Extra request headers for the http publisher (e.g. Authorization); never logged."""
    lease: timedelta = timedelta(seconds=60)
    """How long a claim owns a message before others may take it over."""
    batch: int = 100
    """Most messages taken by one claim."""
    concurrency: int = 32
    """Most publishes in flight at once."""
    publish_timeout: timedelta = timedelta(seconds=10)
    """Deadline for one publish; keep it well under the lease."""
    max_attempts: int = 12
    """Claims a message may use before it goes dead (a crash counts as one)."""
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


def _publisher(text: str) -> str:
    if text not in PUBLISHERS:
        raise ValueError(f"{text!r} is not one of {', '.join(PUBLISHERS)}")
    return text


def _url(text: str) -> str:
    parts = urllib.parse.urlsplit(text)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"{text!r} is not an http:// or https:// URL")
    return text


def _header(text: str) -> tuple[str, str]:
    name, sep, value = text.partition(":")
    if not sep or not name.strip():
        raise ValueError("expected 'Name: value'")
    return name.strip(), value.strip()


def _log_format(text: str) -> str:
    if text not in ("auto", "json", "text"):
        raise ValueError(f"{text!r} is not one of auto, json, text")
    return text


def build_parser() -> ArgumentParser:
    parser = ArgumentParser(
        prog="outbox-worker",
        description="Deliver outbox rows to HTTP APIs or brokers, safely with many replicas. "
        "Every flag can also be set with an OUTBOX_* environment variable "
        "(--publish-timeout = OUTBOX_PUBLISH_TIMEOUT). Durations: 250ms, 60s, 5m.",
    )
    add_dsn_and_table(parser)
    parser.add_argument("--publisher", help=f"one of {', '.join(PUBLISHERS)} (default log)")
    parser.add_argument("--http-url", help="URL the http publisher POSTs to")
    parser.add_argument(
        "--http-header", action="append", metavar="'NAME: VALUE'",
        help="extra header for the http publisher, repeatable (env: one per line)",
    )  # fmt: skip
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
    return parser


def load_settings(
    argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None
) -> WorkerSettings:
    """Parse flags and environment; raises SettingError naming the bad setting."""
    env = os.environ if env is None else env
    args = build_parser().parse_args(argv)
    defaults = WorkerSettings(dsn="")

    def get(flag: str, convert, default):  # type: ignore[no-untyped-def]
        return resolve(args, flag, convert, default, env)

    if args.http_header is None and env.get("OUTBOX_HTTP_HEADER"):
        args.http_header = env["OUTBOX_HTTP_HEADER"].splitlines()
    try:
        headers = tuple(_header(h) for h in args.http_header or ())
    except ValueError as exc:
        raise SettingError(f"--http-header: {exc}") from None
    settings = WorkerSettings(
        dsn=get("--dsn", check_dsn, ""),
        table=get("--table", Table.parse, defaults.table),
        publisher=get("--publisher", _publisher, defaults.publisher),
        http_url=get("--http-url", _url, None),
        http_headers=headers,
        lease=get("--lease", parse_duration, defaults.lease),
        batch=get("--batch", positive_int, defaults.batch),
        concurrency=get("--concurrency", positive_int, defaults.concurrency),
        publish_timeout=get("--publish-timeout", parse_duration, defaults.publish_timeout),
        max_attempts=get("--max-attempts", positive_int, defaults.max_attempts),
        ordering=get("--ordering", _ordering, defaults.ordering),
        owner=get("--owner", str, defaults.owner),
        metrics_port=get("--metrics-port", port, None),
        poll_interval=get("--poll-interval", parse_duration, defaults.poll_interval),
        shutdown_grace=get("--shutdown-grace", parse_duration, defaults.shutdown_grace),
        backoff_base=get("--backoff-base", parse_duration, defaults.backoff_base),
        backoff_cap=get("--backoff-cap", parse_duration, defaults.backoff_cap),
        max_defer_age=get("--max-defer-age", parse_duration, defaults.max_defer_age),
        log_format=get("--log-format", _log_format, defaults.log_format),
        log_level=get("--log-level", str.upper, defaults.log_level),
    )
    _check(settings)
    return settings


def _check(settings: WorkerSettings) -> None:
    if settings.publisher == "http" and not settings.http_url:
        raise SettingError("--http-url (or OUTBOX_HTTP_URL) is required with --publisher http")
    for name in ("lease", "publish_timeout", "poll_interval"):
        if getattr(settings, name) <= timedelta(0):
            raise SettingError(f"--{name.replace('_', '-')}: must be greater than zero")
    if settings.log_level not in ("DEBUG", "INFO", "WARNING", "ERROR"):
        raise SettingError(
            f"--log-level: {settings.log_level!r} is not DEBUG, INFO, WARNING or ERROR"
        )


__all__ = ["WorkerSettings", "build_parser", "load_settings"]
