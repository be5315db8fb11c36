"""libpq connection strings (DSNs): checking one, and the connection options every component
takes from it.

A DSN libpq cannot parse is reported by what is wrong and where (which parameter), never by
any piece of it: the value may be anything but a DSN (a Secret's other key, a token, a
private key) or a password typed after a misspelt keyword, and the message goes to
terminals, logs, Kubernetes status and Events. libpq's own messages quote the DSN
(`missing "=" after "eyJhbGci…"`), so none of their words is passed on. How a DSN that does
parse may be shown is outbox.redact's concern.
"""

from __future__ import annotations

import os
import re
import urllib.parse
from typing import Any

import psycopg
from psycopg import pq
from psycopg.conninfo import conninfo_to_dict

from outbox.errors import SettingError

URL_SCHEMES = ("postgresql://", "postgres://")
DEFAULT_CONNECT_TIMEOUT = 10  # seconds; libpq's own default is to wait for ever

# Every keyword the loaded libpq knows; `requiressl` is an old spelling it still takes (as
# sslmode=require), and `ssl=true` a URL-only one.
KEYWORDS = frozenset(o.keyword.decode() for o in pq.Conninfo.get_defaults()) | {"requiressl"}
_SPACE = " \t\n\v\f\r"  # C's isspace(), which libpq's parser uses; not Unicode's spaces


class DsnError(SettingError):
    """A DSN that cannot be used. `reason` says what is wrong in words that quote nothing of
    the DSN; the message is `invalid DSN (<reason>)`."""

    def __init__(self, reason: str) -> None:
        super().__init__(f"invalid DSN ({reason})")
        self.reason = reason


def is_url(dsn: str) -> bool:
    return dsn.startswith(URL_SCHEMES)


def url_authority(url: str) -> str:
    """The `user:password@host:port` part of a URL: up to the first `/` or `?`."""
    rest = url.partition("://")[2]
    ends = [i for i in (rest.find("/"), rest.find("?")) if i >= 0]
    return rest[: min(ends, default=len(rest))]


def check_dsn(dsn: str) -> str:
    """Return the DSN unchanged if libpq can parse it and would read it as written; raise
    DsnError (a SettingError) saying what is wrong otherwise, quoting none of it."""
    try:
        conninfo_to_dict(dsn)
    except psycopg.ProgrammingError as exc:
        raise DsnError(_what_is_wrong(dsn, str(exc))) from None
    if is_url(dsn) and url_authority(dsn).count("@") > 1:
        # libpq would end the password at its first @ and take the rest for the host: a
        # connection to the wrong place, whose errors then quote the password's tail.
        raise DsnError("an @ in the password must be written %40")
    return dsn


# libpq's parse errors, by their first words: what we say instead, with the number of the
# parameter at fault (found by parsing the DSN the way libpq does) and without it (should our
# reading ever disagree with libpq's). libpq's words after these are never kept: they quote
# the DSN.
_KEY_VALUE_REASONS = (
    (
        'missing "="',
        'missing "=" after the keyword of parameter {n}',
        'missing "=" after a keyword',
    ),
    (
        "invalid connection option",
        "parameter {n} has a keyword libpq does not know",
        "a keyword libpq does not know",
    ),
    (
        "unterminated quoted string",
        "unterminated quoted value in parameter {n}",
        "an unterminated quoted value",
    ),
)
_URL_REASONS = (
    (
        "missing key/value separator",
        'missing key/value separator "=" in query parameter {n}',
        'a query parameter without "="',
    ),
    (
        "extra key/value separator",
        'extra key/value separator "=" in query parameter {n}',
        'a query parameter with two "="',
    ),
    (
        "invalid URI query parameter",
        "query parameter {n} has a keyword libpq does not know",
        "a query parameter libpq does not know",
    ),
)
# URL errors no parameter is at fault for.
_URL_FORM_REASONS = (
    ("invalid percent-encoded token", "a % not followed by two hexadecimal digits"),
    ("forbidden value %00", "a percent-encoded NUL (%00)"),
    ("unexpected spaces", "spaces in the URL (write them %20)"),
    ("end of string reached when looking for matching", 'an IPv6 host address without its "]"'),
    ("IPv6 host address may not be empty", "an empty IPv6 host address"),
    ("unexpected character", "an unexpected character in the URL"),
)


def _what_is_wrong(dsn: str, libpq: str) -> str:
    url = is_url(dsn)
    for start, where, what in _URL_REASONS if url else _KEY_VALUE_REASONS:
        if libpq.startswith(start):
            n = _query_fault(dsn) if url else _key_value_fault(dsn)
            return what if n is None else where.format(n=n)
    for start, what in _URL_FORM_REASONS if url else ():
        if libpq.startswith(start):
            # libpq's character position is a number it counted, not a piece of the DSN.
            position = re.search(r"at position (\d+)", libpq)
            return f"{what} at position {position[1]}" if position else what
    return "libpq cannot parse it"


def _key_value_fault(dsn: str) -> int | None:
    """The number of the first parameter libpq's key/value parser refuses (conninfo_parse in
    libpq's fe-connect.c, followed step by step), or None if it refuses none."""
    i, n, end = 0, 0, len(dsn)
    while i < end:
        if dsn[i] in _SPACE:
            i += 1
            continue
        n += 1
        start = i
        while i < end and dsn[i] != "=" and dsn[i] not in _SPACE:
            i += 1
        keyword = dsn[start:i]
        while i < end and dsn[i] in _SPACE:
            i += 1
        if i >= end or dsn[i] != "=":
            return n  # no "=" after the keyword
        i += 1
        while i < end and dsn[i] in _SPACE:
            i += 1
        if i < end and dsn[i] == "'":
            i += 1
            while True:
                if i >= end:
                    return n  # the quoted value never ends
                if dsn[i] == "'":
                    i += 1
                    break
                i += 2 if dsn[i] == "\\" else 1
        else:
            while i < end and dsn[i] not in _SPACE:
                i += 2 if dsn[i] == "\\" else 1
        if keyword not in KEYWORDS:
            return n
    return None


def _query_fault(url: str) -> int | None:
    """The number of the first query parameter of a URL libpq refuses, or None."""
    query = url.partition("?")[2]
    if not query:
        return None
    for n, item in enumerate(query.split("&"), 1):
        keyword, sep, value = item.partition("=")
        if not sep or "=" in value:
            return n
        keyword = urllib.parse.unquote(keyword)
        if keyword not in KEYWORDS and not (keyword == "ssl" and value == "true"):
            return n
    return None


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


__all__ = [
    "DEFAULT_CONNECT_TIMEOUT",
    "KEYWORDS",
    "URL_SCHEMES",
    "DsnError",
    "check_dsn",
    "connect_options",
    "connect_timeout",
    "is_url",
    "url_authority",
]
