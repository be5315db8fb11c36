"""The outbox table's name, parsed once and always rendered as quoted identifiers."""

from __future__ import annotations

import hashlib
import shlex
from dataclasses import dataclass

from psycopg import sql

from outbox.plumbing.errors import SettingError
from outbox.plumbing.text import printable, printable_name

_MAX_IDENTIFIER_BYTES = 63  # PostgreSQL's NAMEDATALEN - 1
DEFAULT_TABLE_NAME = "outbox"  # every command's and the producer API's default table

# Characters that something between us and the server may read as a placeholder: psycopg
# takes `%` inside any statement sent with parameters (quotes do not protect it, so `"a%%b"`
# reaches the server as `"a%b"`, another table), and `{}` are the placeholders of
# `sql.SQL.format` and `str.format` should a rendered name ever be formatted again. A name
# holding any of them is written as a Unicode-escaped identifier, `U&"a\0025b"`, which holds
# none of them and names the same table whether or not the statement has parameters.
_PLACEHOLDER_CHARS = frozenset("%{}")


def _identifier(*parts: str) -> sql.Composable:
    """A (possibly qualified) identifier free of placeholder characters, as rendered SQL."""
    if not any(_PLACEHOLDER_CHARS & set(part) for part in parts):
        return sql.Identifier(*parts)
    return sql.SQL(".").join(_escaped(part) for part in parts)


def _escaped(part: str) -> sql.Composable:
    if not _PLACEHOLDER_CHARS & set(part):
        return sql.Identifier(part)
    body = "".join(
        f"\\{ord(c):04x}" if c in _PLACEHOLDER_CHARS else {"\\": "\\\\", '"': '""'}.get(c, c)
        for c in part
    )
    return sql.SQL(f'U&"{body}"')


def text_constant(value: str) -> sql.Composable:
    """A string constant free of placeholder characters: a plain literal when it has none,
    else the same text spelled in hex (valid whatever `standard_conforming_strings` says)."""
    if not _PLACEHOLDER_CHARS & set(value):
        return sql.Literal(value)
    return sql.SQL("convert_from(decode({}, 'hex'), 'UTF8')").format(
        sql.Literal(value.encode().hex())
    )


def _quoted_part(part: str, *, force: bool = False) -> str:
    """One part as `_split_name` reads it back: double-quoted if it holds a dot or a quote
    (or if `force`)."""
    if not force and "." not in part and '"' not in part:
        return part
    return '"' + part.replace('"', '""') + '"'


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
    def argument(self) -> str:
        """The table as a `--table` value for a shell command line: `parse` reads it back as
        this table. `str()` does not: a name holding a dot (`"a.b"`) prints as `a.b`, which
        is table b of schema a."""
        first, *rest = self._parts(self.name)
        # A leading `-` would read as an option, whatever the shell quoting: quote that part.
        parts = [_quoted_part(first, force=first.startswith("-")), *map(_quoted_part, rest)]
        return shlex.quote(".".join(parts))

    def create_schema(self) -> list[sql.Composed]:
        """The statement that creates the table's schema if it is missing: none for a table
        without one (it goes to the first schema of the search_path). Only if missing:
        `CREATE SCHEMA IF NOT EXISTS` asks for the right to create schemas in the database
        before it looks, which refused a role that owns the schema and may not create
        others (the least a table's owner needs)."""
        if not self.schema:
            return []
        create = sql.SQL("CREATE SCHEMA IF NOT EXISTS {s}").format(s=sql.Identifier(self.schema))
        body = sql.SQL(
            "BEGIN IF to_regnamespace({name}) IS NULL THEN {create}; END IF; END"
        ).format(name=text_constant(sql.Identifier(self.schema).as_string(None)), create=create)
        return [sql.SQL("DO {body}").format(body=sql.Literal(body.as_string(None)))]

    @property
    def ident(self) -> sql.Composable:
        """The table as a quoted identifier, safe in statements with or without parameters."""
        return _identifier(*self._parts(self.name))

    def sibling(self, suffix: str) -> sql.Composable:
        """A related object (function) in the same schema, named after the table."""
        return _identifier(*self._parts(self.derived_name(suffix)))

    def index_name(self, suffix: str) -> sql.Composable:
        """Index names take the table's schema implicitly and must not be qualified."""
        return _identifier(self.derived_name(suffix))

    def derived_name(self, suffix: str) -> str:
        """The bare name of a related object (`outbox_ready`), as the catalog holds it."""
        return _bounded(f"{self.name}_{suffix}")

    @property
    def regclass_literal(self) -> sql.Composable:
        """The table as a string constant for `::regclass` and catalog lookups."""
        return text_constant(sql.Identifier(*self._parts(self.name)).as_string(None))

    @property
    def channel_ident(self) -> sql.Composable:
        """The channel as an identifier, for LISTEN."""
        return channel_identifier(self.channel)

    def _parts(self, name: str) -> tuple[str, ...]:
        return (self.schema, name) if self.schema else (name,)

    @property
    def channel(self) -> str:
        """The LISTEN/NOTIFY channel of the table named as here; bounded to an identifier's
        length. The table's own channel is `channel_sql`'s, the same however it is named:
        this is it for a table named as the catalog holds it (`catalog_named`)."""
        channel = f"outbox:{self}"
        if len(channel.encode()) <= _MAX_IDENTIFIER_BYTES:
            return channel
        return "outbox:" + hashlib.sha256(str(self).encode()).hexdigest()[:32]

    @classmethod
    def catalog_named(cls, schema: str, name: str) -> Table:
        """The table in `schema` named as its channel names it: without its schema when that
        is `public`, the channel every table named so had before it was made the same for
        every spelling (a deployment on the default schema keeps its channel)."""
        return cls(None if schema == "public" else schema, name)

    @property
    def catalog_name_sql(self) -> sql.Composable:
        """SQL: `str()` of the table as the catalog names it (`catalog_named`), the same
        however it is spelled, or of the table as named while there is none: for what every
        session on the table must derive alike from its name (its channel, the producers'
        aggregate locks)."""
        return sql.SQL(
            "coalesce((SELECT CASE WHEN n.nspname = 'public' THEN '' ELSE n.nspname || '.' END"
            " || c.relname FROM pg_class AS c JOIN pg_namespace AS n ON n.oid = c.relnamespace"
            " WHERE c.oid = to_regclass({t})), {given})"
        ).format(t=self.regclass_literal, given=text_constant(str(self)))

    @property
    def channel_sql(self) -> sql.Composable:
        """SQL: the table's LISTEN/NOTIFY channel, one for the table however it is named.
        As named, `outbox` and `public.outbox` were two channels: a worker given one spelling
        never heard the trigger `outbox migrate` made with the other, and waited for its
        polls. It is `channel` of the table as the catalog names it (`catalog_named`: its
        schema and name, the schema left out when it is `public`), or of the table as named
        while there is no such table."""
        name = self.catalog_name_sql
        return sql.SQL(
            "(SELECT CASE WHEN octet_length('outbox:' || name) <= {limit} THEN 'outbox:' || name"
            " ELSE 'outbox:' || left(encode(sha256(convert_to(name, 'UTF8')), 'hex'), 32) END"
            " FROM (SELECT {name} AS name) AS table_name)"
        ).format(limit=sql.Literal(_MAX_IDENTIFIER_BYTES), name=name)


def channel_identifier(channel: str) -> sql.Composable:
    """A channel as an identifier, for LISTEN (free of placeholder characters)."""
    return _identifier(channel)


def _bounded(name: str) -> str:
    """Keep derived names within PostgreSQL's limit, unique per table."""
    if len(name.encode()) <= _MAX_IDENTIFIER_BYTES:
        return name
    digest = hashlib.sha256(name.encode()).hexdigest()[:8]
    return clipped(name, _MAX_IDENTIFIER_BYTES - 9) + "_" + digest


def clipped(name: str, limit: int = _MAX_IDENTIFIER_BYTES) -> str:
    """`name` cut as PostgreSQL cuts an identifier: to its limit in bytes (UTF-8), never
    inside a character. Cut at 63 characters, a name of multi-byte letters is longer than
    the one the server keeps, and a lookup by it finds nothing."""
    return name.encode()[:limit].decode(errors="ignore")


def shown(name: Table | str) -> str:
    """A table's or a partition's name as a line for people shows it: a quoted identifier
    may hold any character but NUL, and a newline or an escape sequence must not print raw,
    nor a name holding the four characters `\\x1b` show as one holding ESC
    (`printable_name`). (Statements, lock keys and JSON output take the name itself.)"""
    return printable_name(str(name))


def shown_argument(table: Table) -> str:
    """`table.argument` as a line for people shows it: a name holding a control character
    is written in the shell's ANSI-C quotes (`$'out\\nbox'`, read back by bash and zsh as
    the name), where quoted as is it would print raw and an escape of it name another table."""
    argument = table.argument
    if printable(argument) == argument:
        return argument
    text = shlex.split(argument)[0]
    body = "".join(
        "\\\\" if c == "\\" else "\\'" if c == "'" else _ansi_c(c) if printable(c) != c else c
        for c in text
    )
    return f"$'{body}'"


def shown_sql_name(quoted: str, name: str) -> str:
    """A name as SQL to paste, on one line: `quoted`, PostgreSQL's quote_ident of `name`, or,
    when it holds a character a line must not show raw (`printable`), `name` as a
    Unicode-escaped identifier (`U&"out\\000abox"`), which names the same object. (`shown`
    suits a name told to people; a statement offered to run needs it as SQL reads it.)"""
    if printable(quoted) == quoted:
        return quoted
    body = "".join(
        "\\\\"
        if c == "\\"
        else '""'
        if c == '"'
        else _unicode_escape(c)
        if printable(c) != c
        else c
        for c in name
    )
    return f'U&"{body}"'


def _unicode_escape(char: str) -> str:
    code = ord(char)
    return f"\\{code:04x}" if code <= 0xFFFF else f"\\+{code:06x}"


def _ansi_c(char: str) -> str:
    # C1 controls as \u: bash reads \xHH as one byte, which is not the character in UTF-8.
    # Past U+FFFF (a tag character) as \U: \u reads four digits only.
    code = ord(char)
    return {10: "\\n", 9: "\\t", 13: "\\r"}.get(code) or (
        f"\\x{code:02x}"
        if code < 0x80
        else f"\\u{code:04x}"
        if code <= 0xFFFF
        else f"\\U{code:08x}"
    )
