"""The Secrets the passes read, kept between passes without watching Secrets.

A watch (or list) of Secrets would let the operator read every Secret of every namespace it
serves, those no resource names included; it reads only the Secrets a resource names, each
by name with `get`, and with their consent (controller/consent.py). So instead of a watch,
the last read of each Secret, by (namespace, name), is reused by every pass that names it:

- for at most `--secret-recheck` (60 s by default, as the kubelet's own Secret cache lives
  about a minute), after which the next pass that needs it reads it again;
- never by a resource whose last pass found a problem with its inputs (a Secret missing,
  not shared, with a bad value, a DSN the database refused: `forget`): its next pass reads
  anew, so that the fix shows at its next poll;
- never by the first pass of a resource's new generation (`forget` too).

A read that fails is not kept. Passes that need the same Secret at once share one read.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Generic, TypeVar

T = TypeVar("T")
Key = tuple[str, str]  # (namespace, name)


@dataclass(frozen=True)
class _Kept(Generic[T]):
    value: T
    at: float  # monotonic


class SecretCache(Generic[T]):
    """The last read of each Secret, reused for `recheck_seconds` (see the module)."""

    def __init__(self, recheck_seconds: float) -> None:
        self._recheck = recheck_seconds
        self._kept: dict[Key, _Kept[T]] = {}
        self._reading: dict[Key, asyncio.Task[T]] = {}
        self.reads = 0  # reads made, for the metrics and tests

    async def get(self, key: Key, read: Callable[[str, str], Awaitable[T]]) -> T:
        kept = self._kept.get(key)
        if kept is not None and time.monotonic() - kept.at < self._recheck:
            return kept.value
        task = self._reading.get(key)
        if task is None:
            task = asyncio.create_task(self._read(key, read), name=f"reading Secret {key}")
            self._reading[key] = task
            task.add_done_callback(lambda _: self._reading.pop(key, None))
        # One waiter cancelled (its pass stopped) never cancels the others' read.
        return await asyncio.shield(task)

    async def _read(self, key: Key, read: Callable[[str, str], Awaitable[T]]) -> T:
        self.reads += 1
        value = await read(*key)
        self._kept[key] = _Kept(value, time.monotonic())
        return value

    def forget(self, namespace: str, names: Iterable[str]) -> None:
        """The next pass that needs these Secrets reads them again."""
        for name in names:
            self._kept.pop((namespace, name), None)
