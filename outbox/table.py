"""The outbox table's name, parsed once and always rendered as quoted identifiers."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from psycopg import sql

from outbox.settings import SettingError

_MAX_IDENTIFIER_BYTES = 63  # PostgreSQL's NAMEDATALEN - 1
DEFAULT_TABLE_NAME = "outbox"  # every command's and the producer API's default table


def _split_name(name: str) -> list[str]:
    """Split `schema.table` on unquoted dots; double quotes protect dots, `""` is a quote."""
    parts: list[str] = []
    current: list[str] = []
    quoted = False
    i = 0
    while i < len(name):
        char = name[i]
        if char == '"':
            if quoted and name[i + 1 : i + 2] == '"':
                current.append('"')
                i += 1
            else:
                quoted = not quoted
        elif char == "." and not quoted:
            parts.append("".join(current))
            current = []
        else:
            current.append(char)
        i += 1
    if quoted:
        raise SettingError(f"invalid table name {name!r}: unbalanced double quote")
    parts.append("".join(current))
    return parts


@dataclass(frozen=True)
class Table:
    """An outbox table, optionally schema-qualified (`app.outbox`)."""

    schema: str | None
    name: str

    @classmethod
    def parse(cls, text: str) -> Table:
        parts = _split_name(text)
        if len(parts) > 2 or any(not part for part in parts):
            raise SettingError(f"invalid table name {text!r}: expected NAME or SCHEMA.NAME")
        for part in parts:
            if "\x00" in part or len(part.encode()) > _MAX_IDENTIFIER_BYTES:
                raise SettingError(
                    f"invalid table name {text!r}: each part must be 1-63 bytes without NUL"
                )
        return cls(None, parts[0]) if len(parts) == 1 else cls(parts[0], parts[1])

    @classmethod
    def default(cls) -> Table:
        return cls(None, DEFAULT_TABLE_NAME)

    def __str__(self) -> str:
        return f"{self.schema}.{self.name}" if self.schema else self.name

    @property
    def ident(self) -> sql.Identifier:
        return sql.Identifier(self.schema, self.name) if self.schema else sql.Identifier(self.name)

    def sibling(self, suffix: str) -> sql.Identifier:
        """A related object (function) in the same schema, named after the table."""
        name = _bounded(f"{self.name}_{suffix}")
        return sql.Identifier(self.schema, name) if self.schema else sql.Identifier(name)

    def index_name(self, suffix: str) -> sql.Identifier:
        """Index names take the table's schema implicitly and must not be qualified."""
        return sql.Identifier(_bounded(f"{self.name}_{suffix}"))

    @property
    def regclass_literal(self) -> sql.Composable:
        """The table as a string literal for `::regclass` and catalog lookups."""
        return sql.Literal(self.ident.as_string(None))

    @property
    def channel(self) -> str:
        """The LISTEN/NOTIFY channel; bounded to an identifier's length, stable for a table."""
        channel = f"outbox:{self}"
        if len(channel.encode()) <= _MAX_IDENTIFIER_BYTES:
            return channel
        return "outbox:" + hashlib.sha256(str(self).encode()).hexdigest()[:32]


def _bounded(name: str) -> str:
    """Keep derived names within PostgreSQL's limit, unique per table."""
    if len(name.encode()) <= _MAX_IDENTIFIER_BYTES:
        return name
    digest = hashlib.sha256(name.encode()).hexdigest()[:8]
    return name.encode()[: _MAX_IDENTIFIER_BYTES - 9].decode(errors="ignore") + "_" + digest
