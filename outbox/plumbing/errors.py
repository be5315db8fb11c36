"""The errors shared by every component and plugin: a setting that cannot be used, a table
that cannot be served."""

from __future__ import annotations


class SettingError(ValueError):
    """A setting has a value that cannot be used; the message names the setting.

    Programs turn it into one line and exit code 2; a message must never quote a value that
    may be secret (outbox.plumbing.redact says what may be shown).
    """


class SchemaError(RuntimeError):
    """The table is missing, has the wrong shape, or is newer than this code. Defined here,
    below outbox.schema (which re-exports it), so that outbox.partitions may raise it too."""


__all__ = ["SchemaError", "SettingError"]
