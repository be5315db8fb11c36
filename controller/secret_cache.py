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

A read that fails is not kept. Passes that need the same Secret at once share one read; a
read under way when its Secret is forgotten may have fetched it before the change, so it is
neither joined by a later pass nor kept (the read in flight is the key's generation). A read
is dated from its start, when the value it returns may already have been fetched. Entries
past their recheck are dropped (swept by the first `get` once a recheck interval went by,
and whenever a dispatcher is released): a Secret no resource names any more (its spec
changed) leaves memory within two recheck intervals while any pass reads Secrets, and the
Secrets of a deleted dispatcher are forgotten with it (`forget`, then `sweep`), however
few dispatchers are left to read.
"""

from __future__ import annotations

import asyncio
import functools
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
        # The read under way of each key: the only one whose value may be joined or kept.
        self._reading: dict[Key, asyncio.Task[T]] = {}
        self._tasks: set[asyncio.Task[T]] = set()  # every read under way, forgotten ones too
        self._swept = time.monotonic()
        self.reads = 0  # reads made, for the metrics and tests

    def __len__(self) -> int:
        """Secrets kept (fresh or not swept yet)."""
        return len(self._kept)

    async def get(self, key: Key, read: Callable[[str, str], Awaitable[T]]) -> T:
        now = time.monotonic()
        if now - self._swept >= self._recheck:
            self.sweep()
        kept = self._kept.get(key)
        if kept is not None and now - kept.at < self._recheck:
            return kept.value
        task = self._reading.get(key)
        if task is None:
            task = asyncio.create_task(self._read(key, read), name=f"reading Secret {key}")
            self._reading[key] = task
            self._tasks.add(task)
            task.add_done_callback(functools.partial(self._done, key))
        # One waiter cancelled (its pass stopped) never cancels the others' read.
        return await asyncio.shield(task)

    async def _read(self, key: Key, read: Callable[[str, str], Awaitable[T]]) -> T:
        self.reads += 1
        began = time.monotonic()
        value = await read(*key)
        if self._reading.get(key) is asyncio.current_task():  # not forgotten meanwhile
            self._kept[key] = _Kept(value, began)
        return value

    def _done(self, key: Key, task: asyncio.Task[T]) -> None:
        self._tasks.discard(task)
        if self._reading.get(key) is task:
            del self._reading[key]

    def sweep(self) -> None:
        """Drop what no pass can be served any more: the reads older than the recheck."""
        now = self._swept = time.monotonic()
        for key in [k for k, kept in self._kept.items() if now - kept.at >= self._recheck]:
            del self._kept[key]

    def forget(self, namespace: str, names: Iterable[str]) -> None:
        """The next pass that needs these Secrets reads them again; a read of them under way
        is neither joined nor kept."""
        for name in names:
            self._kept.pop((namespace, name), None)
            self._reading.pop((namespace, name), None)
