"""Settings with a sensible range: one way to refuse a value outside it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol, TypeVar


class _Ordered(Protocol):
    def __le__(self, other: Any, /) -> bool: ...


T = TypeVar("T", bound=_Ordered)


def within(
    parse: Callable[[str], T], low: T, high: T, show: Callable[[T], str]
) -> Callable[[str], T]:
    """`parse`, refusing a value outside `low` to `high` with both bounds as `show` writes
    them."""

    def parse_within(text: str) -> T:
        value = parse(text)
        if not (low <= value and value <= high):
            raise ValueError(f"{text!r} is out of range ({show(low)} to {show(high)})")
        return value

    return parse_within
