"""Command-line plumbing shared by every entry point: flags backed by OUTBOX_* variables,
one-line errors, exit code 2 for usage errors."""

from __future__ import annotations

import argparse
import ast
import dataclasses
import inspect
import ipaddress
import itertools
import os
import re
import sys
import textwrap
from collections.abc import Callable, Mapping
from datetime import timedelta
from functools import cache
from typing import Any, NoReturn, TypeVar

from outbox.plumbing.durations import format_duration
from outbox.plumbing.errors import SettingError
from outbox.plumbing.text import printable
from outbox.table import DEFAULT_TABLE_NAME

T = TypeVar("T")
USAGE_ERROR = 2


class ArgumentParser(argparse.ArgumentParser):
    """argparse with a one-line error (no usage dump) and exit code 2.

    A value that starts with a minus and a digit (`--retention -1s`, `--batch -5`) is the
    flag's value, to be refused by its conversion with the reason, not taken for an unknown
    flag (argparse's own rule admits plain negative numbers only: `-1s` got "expected one
    argument"). No flag of these commands starts with a digit."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._negative_number_matcher = re.compile(r"^-\.?\d")

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
    variable: str | None = None,
) -> T:
    """A setting from its flag, else its variable (OUTBOX_* after the flag's name, unless
    named), else the default.

    Conversion errors name where the bad value came from.
    """
    env = os.environ if env is None else env
    raw = getattr(args, flag.lstrip("-").replace("-", "_"))
    source = flag
    if raw is None:
        name = variable or env_name(flag)
        if name not in env or env[name] == "":
            return default
        raw, source = env[name], name
    if not isinstance(raw, str):
        return raw  # type: ignore[no-any-return]
    try:
        return convert(raw)
    except UnicodeError:
        # An argument's or a variable's undecodable bytes arrive as lone surrogates, which
        # Python's codec then names in its own words; said here without quoting the value
        # (it may be a DSN, with its password).
        raise SettingError(f"{source}: {not_utf8(raw)}") from None
    except (ValueError, SettingError) as exc:
        raise SettingError(f"{source}: {exc}") from None


def undecodable_at(text: str) -> int | None:
    """Where the first undecodable byte of an argument or a variable is (Python hands them
    over as lone surrogates, which no query, DSN or connection can carry), or None."""
    return next((i for i, c in enumerate(text) if "\ud800" <= c <= "\udfff"), None)


def not_utf8(text: str) -> str:
    """What is wrong with text holding an undecodable byte, where, quoting none of it."""
    at = undecodable_at(text)
    where = f" at character {at + 1}" if at is not None else ""
    return f"not UTF-8 text (an undecodable byte{where})"


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise ValueError(f"must be at least 1, got {value}")
    return value


def on_off(text: str) -> bool:
    """The one spelling of a boolean setting, in flags and OUTBOX_* variables alike."""
    if text not in ("on", "off"):
        raise ValueError(f"{text!r} is not on or off")
    return text == "on"


def choice(*allowed: str) -> Callable[[str], str]:
    """A converter that accepts exactly one of `allowed`."""

    def convert(text: str) -> str:
        if text not in allowed:
            raise ValueError(f"{text!r} is not one of {', '.join(allowed)}")
        return text

    return convert


@cache
def field_docs(model: type) -> dict[str, str]:
    """The docstring under each field of a settings dataclass, by field name.

    The docstrings are the one source of each setting's meaning: `--help` is generated from
    them, and the docs are checked against them.
    """
    tree = ast.parse(textwrap.dedent(inspect.getsource(model)))
    body = tree.body[0].body  # type: ignore[attr-defined]
    docs: dict[str, str] = {}
    for node, following in itertools.pairwise(body):
        if (
            isinstance(node, ast.AnnAssign)
            and isinstance(node.target, ast.Name)
            and isinstance(following, ast.Expr)
            and isinstance(following.value, ast.Constant)
            and isinstance(following.value.value, str)
        ):
            docs[node.target.id] = " ".join(following.value.value.split())
    return docs


def show_default(value: Any) -> str:
    """A default as a user would type it: 60s, on, outbox."""
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, timedelta):
        return format_duration(value)
    if value is None:
        return "off"
    return str(value)


def field_help(model: type, name: str, default: Any = dataclasses.MISSING) -> str:
    """`--help` text of a settings field: its docstring and its default."""
    if default is dataclasses.MISSING:
        default = _field_default(model, name)
    doc = field_docs(model).get(name, "")
    return f"{doc} (default {show_default(default)})".strip().replace("%", "%%")


def _field_default(model: type, name: str) -> Any:
    spec = {f.name: f for f in dataclasses.fields(model)}[name]
    if spec.default_factory is not dataclasses.MISSING:
        return spec.default_factory()
    return spec.default


def int_between(low: int, high: int) -> Callable[[str], int]:
    """A parser of whole numbers from `low` to `high`: a value the database or the memory of
    a process cannot hold is refused here, not failed on for ever later."""

    def parse(text: str) -> int:
        value = whole_number(text)
        if not low <= value <= high:
            raise ValueError(f"{value} is out of range ({low} to {high})")
        return value

    return parse


def whole_number(text: str) -> int:
    """`text` as an integer; ValueError saying so in words (Python's own names int())."""
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"{text!r} is not a whole number") from None


def port(text: str) -> int:
    value = whole_number(text)
    if not 0 <= value <= 65535:
        raise ValueError(f"not a TCP port: {value}")
    return value


def listen_address(text: str) -> str:
    """An IP address to listen on (`0.0.0.0`, `::`, `127.0.0.1`): a typo fails at start-up
    with the setting's name, not as a bind error."""
    try:
        return str(ipaddress.ip_address(text.strip()))
    except ValueError:
        raise ValueError(f"{text!r} is not an IP address (e.g. 0.0.0.0, ::, 127.0.0.1)") from None


def fail(prog: str, message: str, code: int = USAGE_ERROR) -> NoReturn:
    # One line of text: a database error quotes what it was given (a row's value, a
    # trigger's message), ESC and line breaks included.
    print(f"{prog}: error: {printable(message)}", file=sys.stderr)
    raise SystemExit(code)


def add_dsn_and_table(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--dsn", help="PostgreSQL connection string (env OUTBOX_DSN; else the PG* variables)"
    )
    parser.add_argument(
        "--table",
        help=f"outbox table, optionally SCHEMA.NAME (env OUTBOX_TABLE; default "
        f"{DEFAULT_TABLE_NAME})",
    )
