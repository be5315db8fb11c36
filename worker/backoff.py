"""Retry delays: "full jitter" (AWS Architecture Blog), so a recovering downstream is not hit by
every backed-up message at once."""

from __future__ import annotations

import random
from datetime import timedelta


def full_jitter(
    attempt: int, *, base: timedelta, cap: timedelta, rng: random.Random | None = None
) -> timedelta:
    """uniform(0, min(cap, base * 2**attempt))."""
    ceiling = min(cap.total_seconds(), base.total_seconds() * 2.0 ** min(attempt, 62))
    return timedelta(seconds=(rng or random).uniform(0, ceiling))


def retry_delay(
    attempt: int,
    *,
    retry_after: timedelta | None,
    base: timedelta,
    cap: timedelta,
) -> timedelta:
    """The downstream's Retry-After when it gave one (bounded by cap), else full jitter."""
    if retry_after is not None:
        return min(retry_after, cap)
    return full_jitter(attempt, base=base, cap=cap)
