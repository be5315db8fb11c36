"""Command-line plumbing shared by every entry point: flags backed by OUTBOX_* variables,
one-line errors, exit code 2 for usage errors."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Mapping
from typing import NoReturn, TypeVar

from outbox.settings import SettingError

T = TypeVar("T")
USAGE_ERROR = 2


class ArgumentParser(argparse.ArgumentParser):
    """argparse with a one-line error (no usage dump) and exit code 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(USAGE_ERROR, f"{self.prog}: error: {message}\n")


def env_name(flag: str) -> str:
    return "OUTBOX_" + flag.lstrip("-").replace("-", "_").upper()


def resolve(
    args: argparse.Namespace,
    flag: str,
    convert: Callable[[str], T],
    default: T,
    env: Mapping[str, str] | None = None,
) -> T:
    """A setting from its flag, else its OUTBOX_* variable, else the default.

    Conversion errors name where the bad value came from.
    """
    env = os.environ if env is None else env
    raw = getattr(args, flag.lstrip("-").replace("-", "_"))
    source = flag
    if raw is None:
        name = env_name(flag)
        if name not in env or env[name] == "":
            return default
        raw, source = env[name], name
    if not isinstance(raw, str):
        return raw  # type: ignore[no-any-return]
    try:
        return convert(raw)
    except (ValueError, SettingError) as exc:
        raise SettingError(f"{source}: {exc}") from None


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise ValueError(f"must be at least 1, got {value}")
    return value


def int_between(low: int, high: int) -> Callable[[str], int]:
    """A parser of whole numbers from `low` to `high`: a value the database or the memory of
    a process cannot hold is refused here, not failed on for ever later."""

    def parse(text: str) -> int:
        value = int(text)
        if not low <= value <= high:
            raise ValueError(f"{value} is out of range ({low} to {high})")
        return value

    return parse


def port(text: str) -> int:
    value = int(text)
    if not 0 <= value <= 65535:
        raise ValueError(f"not a TCP port: {value}")
    return value


def fail(prog: str, message: str, code: int = USAGE_ERROR) -> NoReturn:
    print(f"{prog}: error: {message}", file=sys.stderr)
    raise SystemExit(code)


def add_dsn_and_table(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--dsn", help="PostgreSQL connection string (env OUTBOX_DSN; else the PG* variables)"
    )
    parser.add_argument(
        "--table", help="outbox table, optionally SCHEMA.NAME (env OUTBOX_TABLE; default outbox)"
    )
