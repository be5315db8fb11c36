"""Statements composed once per shape, with stand-ins for the tables they name.

A partitioned table's claim window moves to a new partition every claim or two, and each
partition's statements name it (and, in ordered mode, the partitions its checks look in).
Composing the claim's 6.8 kB statement anew for each took about 0.5 ms of a worker's time,
and rendering it on each pooled connection 0.4 ms more: as much again as the claim's own
work on the worker's side, paid every partition. A stencil is the statement composed once
with stand-in names, kept as its text between them; a statement for given tables is that
text with their quoted names in between, a handful of parts to render.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from psycopg import sql

# No statement of the project names a table so: a stand-in's quoted name is found in the text
# only where the stand-in was put.
_STAND_IN = "outbox stand-in {}"


def stand_in_names(count: int) -> tuple[str, ...]:
    """The table names a stencil's statement is composed with, one per table it names."""
    return tuple(_STAND_IN.format(i) for i in range(count))


@dataclass(frozen=True)
class Stencil:
    """A statement's text around the places its tables are named: `chunks[i]`, then table
    `slots[i]`, ..., then the last chunk."""

    chunks: tuple[str, ...]
    slots: tuple[int, ...]

    @classmethod
    def of(cls, statement: sql.Composed, count: int) -> Stencil:
        """The stencil of `statement`, composed with tables named `stand_in_names(count)`.
        Everything else in it is the project's own text and constants, rendered here once
        (no connection: its literals are the project's ASCII)."""
        text = statement.as_string(None)
        names = [sql.Identifier(name).as_string(None) for name in stand_in_names(count)]
        pattern = re.compile("|".join(map(re.escape, names)))
        chunks, slots, start = [], [], 0
        for found in pattern.finditer(text):
            chunks.append(text[start : found.start()])
            slots.append(names.index(found[0]))
            start = found.end()
        chunks.append(text[start:])
        return cls(tuple(chunks), tuple(slots))

    def fill(self, tables: Sequence[sql.Composable]) -> sql.Composed:
        """The statement naming `tables` (each a quoted identifier, rendered by psycopg for
        the connection as any other)."""
        parts: list[sql.Composable] = [sql.SQL(self.chunks[0])]
        for slot, chunk in zip(self.slots, self.chunks[1:], strict=True):
            parts += (tables[slot], sql.SQL(chunk))
        return sql.Composed(parts)
