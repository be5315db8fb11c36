"""Parsing and presenting settings shared by every component: durations, DSNs, table names."""

from __future__ import annotations

import re
from datetime import timedelta

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*$")
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


class SettingError(ValueError):
    """A setting has a value that cannot be used; the message names the setting."""


def parse_duration(text: str) -> timedelta:
    """Parse `250ms`, `60s`, `5m`, `2h`, `7d`; a bare number means seconds."""
    match = _DURATION.match(text)
    if match is None:
        raise ValueError(f"{text!r} is not a duration (use e.g. 250ms, 60s, 5m, 2h, 7d)")
    number, unit = match.groups()
    return timedelta(seconds=float(number) * _UNIT_SECONDS[unit or "s"])


def format_duration(value: timedelta) -> str:
    seconds = value.total_seconds()
    if seconds < 1:
        return f"{seconds * 1000:g}ms"
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{seconds / size:g}{unit}"
    return f"{seconds:g}s"


def check_dsn(dsn: str) -> str:
    """Return the DSN unchanged if libpq can parse it; raise SettingError otherwise."""
    try:
        conninfo_to_dict(dsn)
    except psycopg.ProgrammingError as exc:
        # libpq's message can quote the DSN, password included: keep only its first clause,
        # and only the quoted fragments that the redacted DSN shows anyway.
        reason = str(exc).split(":")[0].strip() or "cannot be parsed"
        safe = redact_dsn(dsn)
        reason = re.sub(r'"([^"]*)"', lambda m: m[0] if m[1] in safe else '"***"', reason)
        raise SettingError(f"invalid DSN ({reason}): {safe}") from None
    return dsn


def redact_dsn(dsn: str) -> str:
    """The DSN with any password replaced by `***`, safe to log."""
    try:
        params = conninfo_to_dict(dsn)
    except psycopg.ProgrammingError:
        # Unparseable: show only what cannot hold a secret (any case of the key, any `@` in
        # a URL's password).
        head = re.split("password", dsn, maxsplit=1, flags=re.IGNORECASE)[0]
        return re.sub(r"(://[^:/@]*:).*@", r"\1***@", head) + (
            " (password hidden)" if head != dsn else ""
        )
    if "password" in params:
        params["password"] = "***"
    return make_conninfo("", **params)
