"""How the operator's flag and OUTBOX_* values become settings: each converter takes the text
and returns the value, or raises ValueError saying what is wrong with it (load_settings names
the flag)."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from datetime import timedelta
from importlib.metadata import entry_points
from typing import Any

from outbox.controller.defaults import NAME
from outbox.plumbing.durations import parse_duration
from outbox.publisher_options import ENTRY_POINT_GROUP


def installed_publishers() -> tuple[str, ...]:
    """Publishers registered beside the operator: the worker image is the operator's image."""
    return tuple(sorted(ep.name for ep in entry_points(group=ENTRY_POINT_GROUP)))


def names(text: str) -> tuple[str, ...]:
    found = tuple(part.strip() for part in text.split(",") if part.strip())
    if not found:
        raise ValueError("expected one or more names separated by commas")
    return found


def dns_label(text: str) -> str:
    # Namespaces and Lease names: a typo fails here with its name, not later at the API.
    if not NAME.match(text):
        raise ValueError(f"{text!r} is not a valid Kubernetes name (lower-case RFC 1123)")
    return text


def entries(check: Callable[[str], str]) -> Callable[[str], tuple[str, ...]]:
    """A list separated by commas, each entry checked; empty allows nothing."""

    def convert(text: str) -> tuple[str, ...]:
        return tuple(check(part.strip()) for part in text.split(",") if part.strip())

    return convert


_LABEL_KEY = re.compile(
    r"^([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"
)
_LABEL_VALUE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?$")
_KEY_PREFIX = re.compile(r"^[-A-Za-z0-9_./]*\*$")


def key_pattern(text: str) -> str:
    # A label or annotation key, or a prefix of one ending in *.
    if text == "*" or _LABEL_KEY.match(text) or _KEY_PREFIX.match(text):
        return text
    raise ValueError(f"{text!r} is not a key, a prefix ending in *, or *")


def pair(text: str) -> str:
    key, _, value = text.partition("=")
    if text == "*" or (_LABEL_KEY.match(key) and _LABEL_VALUE.match(value)):
        return text
    raise ValueError(f"{text!r} is not key, key=value or *")


def name_or_any(text: str) -> str:
    return text if text == "*" else dns_label(text)


_PEER_KEYS = frozenset({"namespaceSelector", "podSelector", "ipBlock"})


def peers(text: str) -> tuple[Mapping[str, Any], ...]:
    """NetworkPolicy peers as JSON: a list of objects with namespaceSelector, podSelector
    or ipBlock (the API server checks the rest, when the policy is written)."""
    try:
        peers = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"not JSON ({exc.msg})") from None
    except RecursionError:  # the parser recurses once per level: `[[[[...` thousands deep
        raise ValueError("not JSON this program reads (nested too deeply)") from None
    if not isinstance(peers, list) or not all(
        isinstance(p, dict) and p and set(p) <= _PEER_KEYS for p in peers
    ):
        raise ValueError(
            "expected a list of NetworkPolicy peers, each with namespaceSelector, "
            "podSelector or ipBlock"
        )
    return tuple(peers)


def publisher_names(text: str) -> tuple[str, ...]:
    # Built-in publishers and plugins alike, each installed here too: the operator renders a
    # publisher's workers from its description, which it loads.
    chosen = names(text)
    known = installed_publishers()
    for name in chosen:
        if name not in known:
            raise ValueError(
                f"{name!r} is no publisher installed beside the operator "
                f"(installed: {', '.join(known)})"
            )
    return chosen


def log_format(text: str) -> str:
    if text not in ("auto", "json", "text"):
        raise ValueError(f"{text!r} is not one of auto, json, text")
    return text


def log_level(text: str) -> str:
    level = text.upper()
    if level not in ("DEBUG", "INFO", "WARNING", "ERROR"):
        raise ValueError(f"{text!r} is not DEBUG, INFO, WARNING or ERROR")
    return level


def positive_duration(text: str) -> timedelta:
    value = parse_duration(text)
    if value <= timedelta(0):
        raise ValueError("must be greater than zero")
    return value
