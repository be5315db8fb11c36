"""The error for a setting that cannot be used, shared by every component and plugin."""

from __future__ import annotations


class SettingError(ValueError):
    """A setting has a value that cannot be used; the message names the setting.

    Programs turn it into one line and exit code 2; a message must never quote a value that
    may be secret (outbox.plumbing.redact says what may be shown).
    """


__all__ = ["SettingError"]
