"""A publisher's one description: its options, which of them are secrets, and how each
reaches the worker (a flag, or its `OUTBOX_*` variable) from an OutboxDispatcher resource.

The worker's flags and `--help`, the operator's rendering of the workers' environment, its
Secret consent and policy checks, and the option tables of docs/publishers/ all read it, so a
publisher is added by describing it once.

A publisher is described by its class: its `name` and its `options`, a tuple of `Option`.
A built-in publisher has a block of its own in the resource (`spec.publisher.http`): each of
its options names the fields of that block that set it (`Field`: how the value is carried).
A plugin's options name none: the generic block `spec.publisher.plugin` sets them, under
`options` by the flag's name without its dashes (`sqs-queue-url: https://...`) or under
`secretRefs` from a Secret key, and a secret option from a Secret only. So a plugin written
against the `Option` API is described already.

This module is shared by the worker and the operator (which never imports the worker): it
holds the description's types and how one is found by name, nothing of either component.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import Enum
from functools import cache
from importlib.metadata import entry_points
from typing import Any

from outbox.plumbing.cliutil import env_name
from outbox.plumbing.errors import SettingError
from outbox.plumbing.redact import masked_option, shown_option

# Publishers are found by name in this entry-point group, the built-in ones too
# (pyproject.toml); a plugin registers its class there.
ENTRY_POINT_GROUP = "outbox.publishers"
# The resource's block for a publisher that has none of its own.
PLUGIN = "plugin"
# The operator's reason (Ready=False) for a publisher block or a Secret's value for one of
# its options that the publisher refuses, unless the option names its own (`refused_as`).
INVALID_PUBLISHER_OPTIONS = "InvalidPublisherOptions"


class Carried(Enum):
    """How a field of the resource reaches its option (the text is the docs' wording)."""

    VALUE = "the value"
    LINES = "a list, one item a line"
    PAIRS = "a map, one KEY=VALUE a line"
    SECRET_KEY = "a Secret key, never copied"
    SECRET_FILE = "a Secret key mounted as a file"
    SECRET_DIR = "a Secret mounted as a directory"

    @property
    def secret(self) -> bool:
        """Does the field name a Secret (whose consent the operator checks)?"""
        return self in (Carried.SECRET_KEY, Carried.SECRET_FILE, Carried.SECRET_DIR)

    @property
    def mounted(self) -> bool:
        return self in (Carried.SECRET_FILE, Carried.SECRET_DIR)


@dataclass(frozen=True)
class Keys:
    """What the keys of a PAIRS field may be: a pattern (and how a message words it), and
    the keys no resource may set, each with why."""

    pattern: re.Pattern[str]
    wording: str
    refused: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Field:
    """A field of the publisher's block in the resource that sets an option: its path in the
    block (dotted) and how its value is carried."""

    path: str
    carried: Carried = Carried.VALUE
    keys: Keys | None = None  # of a PAIRS field

    @property
    def secret_name_path(self) -> str | None:
        """Where the field names its Secret, within the block; None when it names none."""
        if not self.carried.secret:
            return None
        return self.path if self.carried is Carried.SECRET_DIR else f"{self.path}.name"


@dataclass(frozen=True)
class Option:
    """One publisher setting: `--flag`, or the `OUTBOX_FLAG` variable; `fields` are where a
    built-in publisher's block in the resource sets it (a plugin's name none, see the
    module)."""

    flag: str
    help: str
    convert: Callable[[str], Any] = str
    default: Any = None
    required: bool = False
    repeatable: bool = False  # flag given several times; in the variable, one value per line
    secret: bool = False  # masked wherever a value is echoed: errors, --help, start-up line
    fields: tuple[Field, ...] = ()
    # The operator's reason when a Secret key's value for this option is one the worker
    # would refuse at start (`from_secret`).
    refused_as: str = INVALID_PUBLISHER_OPTIONS

    @property
    def dest(self) -> str:
        return self.flag.lstrip("-").replace("-", "_")

    @property
    def variable(self) -> str:
        return env_name(self.flag)

    @property
    def key(self) -> str:
        """The option's name in the generic block: the flag without its dashes."""
        return self.flag.lstrip("-")

    def shown(self, value: Any) -> str:
        """The value as it may appear in a message: masked when secret, else redacted."""
        return shown_option(value, secret=self.secret)

    def masked(self, text: str, raw: str | None) -> str:
        """`text` (a message about the raw value given) safe to show: that value masked if
        secret, and whatever else looks secret (see outbox.plumbing.redact.redact_text) in any
        case."""
        return masked_option(text, raw, secret=self.secret)

    def from_secret(self, text: str) -> list[Any]:
        """The values a Secret key's text gives this option, read as the worker reads its
        variable: one value a line for a repeatable option (blank lines skipped), else the
        whole text, each through `convert`. A ValueError of one line that never quotes the
        value (it came from a Secret, whatever the option says) names the line of a
        repeatable option, and says so when the text gives no value at all: the worker would
        start without the option (unsigned, unauthenticated), which the resource did not ask
        for by naming a Secret."""
        if self.repeatable:
            lines = [(n, line) for n, line in enumerate(text.splitlines(), 1) if line.strip()]
        else:
            lines = [(0, text)] if text else []
        if not lines:
            raise ValueError(f"no value for {self.flag}")
        values = []
        for number, line in lines:
            try:
                values.append(self.convert(line))
            except Exception as exc:  # a plugin's converter may raise anything: one line
                shown = str(exc) if isinstance(exc, ValueError | SettingError) else repr(exc)
                where = f"line {number}: " if self.repeatable else ""
                raise ValueError(masked_option(where + shown, line, secret=True)) from None
        return values


@dataclass(frozen=True)
class Description:
    """A publisher as everything outside it reads it: its name and its options."""

    name: str
    options: tuple[Option, ...]

    def bindings(self, block: str) -> list[tuple[Option, Field]]:
        """Each option with a field of `block` (the publisher's own block, or PLUGIN) that
        sets it, in the options' order."""
        return [(option, f) for option in self.options for f in fields_of(option, block)]

    def option(self, key: str) -> Option | None:
        """The option named `key` in the generic block, if there is one."""
        return next((o for o in self.options if o.key == key), None)


def fields_of(option: Option, block: str) -> tuple[Field, ...]:
    """The fields of `block` that set `option`: its own in a built-in's block; in the
    generic block, `options.<key>` (unless secret) and `secretRefs.<key>`."""
    if block != PLUGIN:
        return option.fields
    plain = () if option.secret else (Field(f"options.{option.key}"),)
    return (*plain, Field(f"secretRefs.{option.key}", Carried.SECRET_KEY))


def describe(publisher: Any) -> Description:
    """The description of a publisher class: its `name` and `options`."""
    options = tuple(publisher.options)
    if not all(isinstance(option, Option) for option in options):
        raise SettingError(f"publisher {publisher.name!r}: its options are not all Options")
    return Description(str(publisher.name), options)


@cache
def installed(name: str) -> Description:
    """The description of the publisher registered as `name` (its entry point loaded): a
    SettingError of one line when there is none or it cannot be loaded."""
    found = [ep for ep in entry_points(group=ENTRY_POINT_GROUP) if ep.name == name]
    if not found:
        raise SettingError(f"no publisher {name!r} is installed")
    try:
        return describe(found[0].load())
    except SettingError:
        raise
    except Exception as exc:  # whatever a plugin's import raises, it is one line
        raise SettingError(f"publisher {name!r} cannot be loaded: {exc}") from None


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def options_table(description: Description, block: str) -> str:
    """The publisher's options as a Markdown table: the flag, its variable, the fields of
    `block` that set it from a resource, and what it is (docs/publishers/ hold one each)."""
    rows = [
        f"| flag (env) | `spec.publisher.{block}` | default | what |",
        "|---|---|---|---|",
    ]
    for option in description.options:
        fields = fields_of(option, block)
        where = ", ".join(f"`{f.path}` ({f.carried.value})" for f in fields) or "—"
        if option.required:
            default = "required"
        elif option.default in (None, (), []):
            default = "—"
        else:
            default = f"`{option.default}`"
        marks = [
            mark
            for mark, on in (("repeatable", option.repeatable), ("secret", option.secret))
            if on
        ]
        what = option.help + (f" ({', '.join(marks)})" if marks else "")
        rows.append(
            f"| `{option.flag}` (`{option.variable}`) | {_cell(where)} | {_cell(default)} "
            f"| {_cell(what)} |"
        )
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    """`python -m outbox.publisher_options NAME`: the installed publisher's options table, as
    a plugin's docs show it (its fields those of the generic block, or a built-in's own)."""
    import sys

    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m outbox.publisher_options NAME", file=sys.stderr)
        return 2
    try:
        description = installed(args[0])
    except SettingError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    own = any(option.fields for option in description.options)
    print(options_table(description, description.name if own else PLUGIN))
    return 0


if __name__ == "__main__":
    # Run as the importable module, not as __main__: plugins' `Option`s are that module's.
    from outbox.publisher_options import main as run

    raise SystemExit(run())
