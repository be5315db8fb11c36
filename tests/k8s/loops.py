"""Event loops the harness runs in threads of their own (the emulator's, the kubelet's)."""

from __future__ import annotations

import asyncio


def close_unwound(loop: asyncio.AbstractEventLoop) -> list[asyncio.Task[object]]:
    """Cancel what is still pending on a stopped loop, let it run to its end, close the loop;
    returns the tasks that would not end (none, unless one swallows its cancel).

    This is what `asyncio.run` does on the way out. Left pending, a task is closed when its
    loop is collected, later and in another test: a watch closed that way, inside its
    condition's wait, fails releasing a lock it no longer holds, and aiohttp's handler
    reports that as an unraisable exception.
    """
    pending = asyncio.all_tasks(loop)
    for task in pending:
        task.cancel()
    loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
    loop.run_until_complete(loop.shutdown_asyncgens())
    unfinished = [task for task in asyncio.all_tasks(loop) if not task.done()]
    loop.close()
    return unfinished
