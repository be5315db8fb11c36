"""Waiting for the first of several things: one helper for every component."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Any


async def first_of(*waits: Awaitable[Any]) -> list[asyncio.Future[Any]]:
    """Wait until any of `waits` finishes, then cancel the others and wait for them to end
    (none is left running behind the caller). Returns them as futures, in the order given:
    the caller reads which finished, and how, from them."""
    futures: list[asyncio.Future[Any]] = [asyncio.ensure_future(wait) for wait in waits]
    try:
        await asyncio.wait(futures, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for future in futures:
            future.cancel()
        await asyncio.gather(*futures, return_exceptions=True)
    return futures
