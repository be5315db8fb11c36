"""libpq connection strings (DSNs): checking one, and the connection options every component
takes from it.

A DSN libpq cannot parse is reported by what is wrong and where (which parameter), never by
any piece of it: the value may be anything but a DSN (a Secret's other key, a token, a
private key) or a password typed after a misspelt keyword, and the message goes to
terminals, logs, Kubernetes status and Events. libpq's own messages quote the DSN
(`missing "=" after "eyJhbGci…"`), so none of their words is passed on. How a DSN that does
parse may be shown is outbox.plumbing.redact's concern.
"""

from __future__ import annotations

import os
import re
import urllib.parse
from collections.abc import Iterator
from typing import Any

import psycopg
from psycopg import pq
from psycopg.conninfo import conninfo_to_dict, make_conninfo, timeout_from_conninfo

from outbox.plumbing.errors import SettingError

URL_SCHEMES = ("postgresql://", "postgres://")
DEFAULT_CONNECT_TIMEOUT = 10  # seconds; libpq's own default is to wait for ever

# Every keyword the loaded libpq knows; `requiressl` is an old spelling it still takes (as
# sslmode=require), and `ssl=true` a URL-only one.
KEYWORDS = frozenset(o.keyword.decode() for o in pq.Conninfo.get_defaults()) | {"requiressl"}
# The PG* variable libpq reads for each parameter naming the server (PGHOST, PGPORT...).
_SERVER_VARIABLES = {
    o.keyword.decode(): o.envvar.decode()
    for o in pq.Conninfo.get_defaults()
    if o.envvar and o.keyword.decode() in ("host", "hostaddr", "port", "dbname", "user")
}
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
    """The `user:password@host:port` part of a URL: up to the first `/` or `?` after the last
    `@` before the query. libpq ends it at the first `/` or `?`; running on to the last `@`
    keeps a password with an unencoded `/` or `@` whole in the user-info, so that whatever
    masks the user-info masks all of it (check_dsn refuses such a URL)."""
    rest = url.partition("://")[2]
    after = rest.partition("?")[0].rfind("@") + 1
    ends = [i for i in (rest.find("/", after), rest.find("?", after)) if i >= 0]
    return rest[: min(ends, default=len(rest))]


def check_dsn(dsn: str) -> str:
    """Return the DSN unchanged if libpq can parse it and would read it as written; raise
    DsnError (a SettingError) saying what is wrong otherwise, quoting none of it."""
    try:
        params = conninfo_to_dict(dsn)
    except psycopg.ProgrammingError as exc:
        raise DsnError(_what_is_wrong(dsn, str(exc))) from None
    if is_url(dsn) and "/" in url_authority(dsn):
        # libpq ends the authority at the first /: the password's tail would be read as the
        # port and the database, and every message naming the server would show it.
        raise DsnError("a / or @ in the user name or password must be percent-encoded: %2F, %40")
    if is_url(dsn) and url_authority(dsn).count("@") > 1:
        # libpq would end the password at its first @ and take the rest for the host: a
        # connection to the wrong place, whose errors then quote the password's tail.
        raise DsnError("an @ in the password must be written %40")
    n = None if is_url(dsn) else _value_taken_from_the_next(dsn)
    if n is not None:
        # `port= password=x`: libpq skips the space and reads `password=x` as the port, which
        # its errors (and any description of the server) would then show.
        raise DsnError(
            f"parameter {n} has no value: libpq would read the next parameter as its value; "
            "write '' for an empty one"
        )
    if "connect_timeout" in params:
        try:  # psycopg's own check, which it makes before every connection attempt
            timeout_from_conninfo({"connect_timeout": params["connect_timeout"]})
        except psycopg.ProgrammingError:
            raise DsnError("connect_timeout is not a number of seconds") from None
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
    """The number of the first parameter libpq's key/value parser refuses, or None if it
    refuses none."""
    for n, keyword, _, fault in _key_value_parameters(dsn):
        if fault or keyword not in KEYWORDS:
            return n
    return None


def _value_taken_from_the_next(dsn: str) -> int | None:
    """The number of the first parameter whose value, after a space, is the next parameter
    (`keyword=value`, with a keyword libpq knows), or None."""
    for n, _, value, _ in _key_value_parameters(dsn):
        keyword, equals, _ = value.partition("=")
        if equals and keyword in KEYWORDS:
            return n
    return None


def _key_value_parameters(dsn: str) -> Iterator[tuple[int, str, str, bool]]:
    """Each parameter of a key/value DSN as libpq's parser reads it (conninfo_parse in
    libpq's fe-connect.c, followed step by step): its number, keyword, its value when that is
    unquoted and follows a space after the "=" (else ""), and whether the parser refuses it
    (no "=", a quoted value never closed); nothing more is read after a refused one."""
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
            yield n, keyword, "", True  # no "=" after the keyword
            return
        i += 1
        equals = i
        while i < end and dsn[i] in _SPACE:
            i += 1
        spaced = i > equals
        if i < end and dsn[i] == "'":
            i += 1
            while True:
                if i >= end:
                    yield n, keyword, "", True  # the quoted value never ends
                    return
                if dsn[i] == "'":
                    i += 1
                    break
                i += 2 if dsn[i] == "\\" else 1
            yield n, keyword, "", False
        else:
            value = i
            while i < end and dsn[i] not in _SPACE:
                i += 2 if dsn[i] == "\\" else 1
            yield n, keyword, dsn[value:i] if spaced else "", False


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


def with_pg_environment(dsn: str) -> str:
    """The DSN with the server's host, address, port, database and user taken from libpq's
    PG* variables where it leaves them out, as libpq itself does when connecting: what a
    message naming the server describes (outbox.plumbing.redact.describe_dsn reads the DSN alone,
    and would say "the local socket" for PGHOST=db). A DSN that does not parse is
    returned unchanged."""
    try:
        given = conninfo_to_dict(dsn)
    except psycopg.ProgrammingError:
        return dsn
    taken = {
        # libpq reads a variable's bytes as they are; one that is no UTF-8 (PGDATABASE=$'\xff')
        # is shown with its bytes escaped, not refused by the UTF-8 a DSN is written in.
        keyword: _shown_bytes(os.environ[variable])
        for keyword, variable in _SERVER_VARIABLES.items()
        if not given.get(keyword) and os.environ.get(variable)
    }
    return make_conninfo(dsn, **taken) if taken else dsn


def _shown_bytes(value: str) -> str:
    """A variable's value with its undecodable bytes (lone surrogates) as `\\xff` escapes."""
    return value.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


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
    "with_pg_environment",
]
