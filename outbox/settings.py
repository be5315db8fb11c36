"""Parsing and presenting settings shared by every component: durations, DSNs, table names."""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import psycopg
from psycopg import pq
from psycopg.conninfo import conninfo_to_dict, make_conninfo

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*$")
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


class SettingError(ValueError):
    """A setting has a value that cannot be used; the message names the setting."""


# The longest duration any setting accepts: far beyond any sensible one, and well inside
# what Python's timedelta and PostgreSQL's timestamps can add to now().
MAX_DURATION = timedelta(days=36500)


def parse_duration(text: str) -> timedelta:
    """Parse `250ms`, `60s`, `5m`, `2h`, `7d`; a bare number means seconds."""
    match = _DURATION.match(text)
    if match is None:
        raise ValueError(f"{text!r} is not a duration (use e.g. 250ms, 60s, 5m, 2h, 7d)")
    number, unit = match.groups()
    seconds = float(number) * _UNIT_SECONDS[unit or "s"]
    if seconds > MAX_DURATION.total_seconds():
        raise ValueError(f"{text!r} is longer than {format_duration(MAX_DURATION)}")
    return timedelta(seconds=seconds)


def duration_between(low: timedelta, high: timedelta) -> Callable[[str], timedelta]:
    """A parser of durations from `low` to `high`, for settings with a sensible range."""

    def parse(text: str) -> timedelta:
        value = parse_duration(text)
        if not low <= value <= high:
            raise ValueError(
                f"{text!r} is out of range ({format_duration(low)} to {format_duration(high)})"
            )
        return value

    return parse


def format_duration(value: timedelta) -> str:
    seconds = value.total_seconds()
    if seconds < 1:
        return f"{seconds * 1000:g}ms"
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{seconds / size:g}{unit}"
    return f"{seconds:g}s"


# libpq's parameters whose values are secrets: those its own option table marks for hiding
# (`dispchar` "*": password, sslpassword, oauth_client_secret in libpq 18), and these in any
# case, whatever libpq version is loaded.
_KNOWN_SECRET_PARAMETERS = frozenset({"password", "sslpassword", "oauth_client_secret"})
_URL_SCHEMES = ("postgresql://", "postgres://")
MASK = "***"


def _secret_parameters() -> frozenset[str]:
    marked = {o.keyword.decode() for o in pq.Conninfo.get_defaults() if o.dispchar == b"*"}
    return _KNOWN_SECRET_PARAMETERS | marked


SECRET_PARAMETERS = _secret_parameters()
# Text that may begin a secret in a DSN libpq cannot parse: everything from there is hidden.
_SECRET_START = re.compile(r"\b\w*(password|secret)", re.IGNORECASE)


def check_dsn(dsn: str) -> str:
    """Return the DSN unchanged if libpq can parse it; raise SettingError otherwise."""
    try:
        conninfo_to_dict(dsn)
    except psycopg.ProgrammingError as exc:
        raise SettingError(f"invalid DSN ({_parse_error(exc, dsn)}): {redact_dsn(dsn)}") from None
    if dsn.startswith(_URL_SCHEMES) and _authority(dsn).count("@") > 1:
        # libpq would end the password at its first @ and take the rest for the host: a
        # connection to the wrong place, whose errors then quote the password's tail.
        raise SettingError(
            f"invalid DSN (an @ in the password must be written %40): {redact_dsn(dsn)}"
        )
    return dsn


def _authority(url: str) -> str:
    """The `user:password@host:port` part of a URL: up to the first `/` or `?`."""
    rest = url.partition("://")[2]
    ends = [i for i in (rest.find("/"), rest.find("?")) if i >= 0]
    return rest[: min(ends, default=len(rest))]


def _parse_error(exc: psycopg.ProgrammingError, dsn: str) -> str:
    """libpq's reason, without any fragment of the DSN that the redacted DSN hides.

    libpq quotes pieces of the DSN (`missing "=" after "not"`): a quoted fragment is masked
    only if it is part of the DSN and absent from its redacted form, so syntax such as `"="`
    and the keywords stay readable while a secret never shows.
    """
    reason = " ".join(str(exc).split()).removesuffix(" in connection info string")
    safe = redact_dsn(dsn)

    def shown(match: re.Match[str]) -> str:
        fragment = match[1]
        hidden = fragment and fragment in dsn and fragment not in safe
        return f'"{MASK}"' if hidden else match[0]

    return re.sub(r'"([^"]*)"', shown, reason) or "cannot be parsed"


def _mask_url_userinfo(dsn: str) -> str:
    """A URL DSN with the password part of its user-info replaced by the mask.

    libpq ends the user-info at the first `@`, so a password with an unencoded `@` would
    leave its tail in the host: the user-info is taken up to the last `@` of the authority
    (before the first `/` or `?`), which hides the whole password in both readings.
    """
    scheme, _, rest = dsn.partition("://")
    authority = _authority(dsn)
    tail = rest[len(authority) :]
    userinfo, at, host = authority.rpartition("@")
    if not at:
        return dsn
    user, colon, _ = userinfo.partition(":")
    return f"{scheme}://{user}{colon and ':' + MASK}@{host}{tail}"


def redact_dsn(dsn: str) -> str:
    """The DSN with every secret (password, sslpassword, ...) replaced by `***`, safe to log.

    Both forms are covered: key/value (`password=...`) and URL (user-info and query
    parameters). What cannot be parsed shows only what precedes anything secret-looking.
    """
    is_url = dsn.startswith(_URL_SCHEMES)
    masked = _mask_url_userinfo(dsn) if is_url else dsn
    try:
        params = conninfo_to_dict(masked)
    except psycopg.ProgrammingError:
        head = _SECRET_START.split(masked, maxsplit=1)[0]
        return head if head == masked else f"{head.rstrip()} (secrets hidden)"
    for key in params.keys() & SECRET_PARAMETERS:
        params[key] = MASK
    return make_conninfo("", **params)


def describe_dsn(dsn: str) -> str:
    """Where a DSN points, for messages: `host:port/dbname as user`, nothing secret."""
    try:
        params = conninfo_to_dict(_mask_url_userinfo(dsn) if dsn.startswith(_URL_SCHEMES) else dsn)
    except psycopg.ProgrammingError:
        return redact_dsn(dsn)
    host = params.get("host") or params.get("hostaddr") or "the local socket"
    port = params.get("port") or "5432"
    extra = [f"{label} {params[key]}" for key, label in (("dbname", "database"), ("user", "user"))
             if params.get(key)]  # fmt: skip
    return f"{host} port {port}" + (f" ({', '.join(extra)})" if extra else "")


DEFAULT_CONNECT_TIMEOUT = 10  # seconds; libpq's own default is to wait for ever


def connect_timeout(dsn: str) -> int:
    """Seconds a connection attempt may take: the DSN's `connect_timeout` (or PGCONNECT_TIMEOUT)
    when it sets one, else DEFAULT_CONNECT_TIMEOUT. libpq counts it per host; 0 means for ever."""
    try:
        given = conninfo_to_dict(dsn).get("connect_timeout") if dsn else None
    except psycopg.ProgrammingError:
        given = None
    given = given if given not in (None, "") else os.environ.get("PGCONNECT_TIMEOUT")
    try:
        return int(given) if given not in (None, "") else DEFAULT_CONNECT_TIMEOUT
    except ValueError:
        return DEFAULT_CONNECT_TIMEOUT  # libpq itself refuses it when connecting, and says why


def connect_options(dsn: str) -> dict[str, Any]:
    """Keyword arguments for psycopg's connect: a timeout unless the DSN chose its own."""
    try:
        chosen = bool(dsn) and "connect_timeout" in conninfo_to_dict(dsn)
    except psycopg.ProgrammingError:
        chosen = False
    if chosen or os.environ.get("PGCONNECT_TIMEOUT"):
        return {}
    return {"connect_timeout": DEFAULT_CONNECT_TIMEOUT}


# Any URL inside a text: a scheme, `://`, then everything up to whitespace or a quote.
_URL_IN_TEXT = re.compile(r"\b[A-Za-z][A-Za-z0-9+.-]*://[^\s'\"<>]+")


def redact_url(url: str) -> str:
    """The URL with its user-info (`user:password@`, or a token as user) and the values of
    its query and fragment replaced by `***`: scheme, host, port and path stay readable."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return url
    rest, hash_sign, fragment = rest.partition("#")
    rest, question, query = rest.partition("?")
    slash = rest.find("/")
    authority, path = (rest, "") if slash < 0 else (rest[:slash], rest[slash:])
    if "@" in authority:
        authority = f"{MASK}@{authority.rpartition('@')[2]}"
    if question:
        query = "&".join(
            f"{key}={MASK}" if has_value else key
            for key, has_value, _ in (item.partition("=") for item in query.split("&"))
        )
    return f"{scheme}://{authority}{path}{question}{query}{hash_sign}{MASK if fragment else ''}"


def redact_urls(text: str) -> str:
    """`text` with every URL in it redacted (see redact_url), for messages and stored errors."""
    return _URL_IN_TEXT.sub(lambda match: redact_url(match[0]), text)
