"""The latency floor: the lease protocol over HTTP without the worker's machinery.

python -m bench.latency_floor DSN URL BATCH CONCURRENCY [ordered] [trace=FILE]

One asyncio loop (uvloop, as the worker runs by default) on one connection: LISTEN on the
table's channel; claim up to BATCH with the project's own claim (outbox.lease.claim, the
statement outbox.queries holds, prepared as the worker prepares it; ordered mode's heads
when `ordered`, found as OrderedClaims says, as the worker finds them); POST every claimed
message at once over at most CONCURRENCY connections (the worker's default connection limit
is its concurrency), the same body (the worker's envelope) and headers as the http
publisher; then finalize the whole batch in one fenced statement (outbox.lease.finalize);
and claim again at once after a full batch (in ordered mode after any); otherwise wait for a
NOTIFY, or one second.

No services, no ledger, no timers, no hand-offs between tasks: what the protocol costs on
this machine, to set the worker's figures beside. Runs until SIGTERM; what it holds then is
left to its leases (the benchmark has every message by then).

`trace=FILE` notes when each claim and each finalize returned, with their ids, and writes
them to FILE as JSON lines at the end, as the worker's debug log has them ("claimed",
"finalized"): bench.latency_trace follows the messages' path through both.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import sys
import time
from datetime import timedelta

import aiohttp
import psycopg

from bench.env import uvloop_run
from outbox.lease import OrderedClaims, claim, finalize
from outbox.models import Message, Outcome
from outbox.queries import listen
from outbox.table import Table
from outbox.worker.publishers.envelope import envelope

TABLE = Table.parse("outbox")
LEASE = timedelta(seconds=60)
MAX_ATTEMPTS = 12
POLL = 1.0  # seconds an empty claim waits for a NOTIFY, as the worker's poll interval
# psycopg prepares only what is asked for (the claim), never the batched finalize: the
# worker's connection setting (outbox.worker.replica.EXPLICIT_PREPARE_ONLY).
EXPLICIT_PREPARE_ONLY = 2**31 - 1


async def _post(session: aiohttp.ClientSession, url: str, message: Message) -> Outcome:
    headers = {
        "Idempotency-Key": str(message.id),
        "Outbox-Event-Type": message.event_type,
        "Outbox-Attempt": str(message.attempts),
    }
    try:
        async with session.post(url, data=envelope(message).encode(), headers=headers) as reply:
            await reply.read()
            if 200 <= reply.status < 300:
                return Outcome.done(message)
            error = f"HTTP {reply.status}"
    except aiohttp.ClientError as exc:
        error = f"{type(exc).__name__}: {exc}"
    return Outcome.retry(message, timedelta(0), error)


# A note: (event, time.time_ns() when the statement returned, the messages' ids).
Note = tuple[str, int, list[int]]


async def dispatch(
    dsn: str, url: str, batch: int, concurrency: int, ordered: bool, notes: list[Note] | None = None
) -> None:
    owner = "latency-floor"
    async with (
        await psycopg.AsyncConnection.connect(
            dsn, autocommit=True, prepare_threshold=EXPLICIT_PREPARE_ONLY, application_name=owner
        ) as conn,
        aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=concurrency),
            timeout=aiohttp.ClientTimeout(),
            headers={
                "Content-Type": "application/json",
                "User-Agent": owner,
                "Outbox-Worker": owner,
            },
        ) as session,
    ):
        # UTC by name, as the worker's pool sets it: timestamps decode without a zone lookup.
        await conn.execute("SET TimeZone = 'UTC'")
        await conn.execute(await listen(conn, TABLE))
        plan = OrderedClaims()
        while True:
            messages = await claim(
                conn, TABLE, owner=owner, batch=batch, lease=LEASE, max_attempts=MAX_ATTEMPTS,
                ordered=ordered, by_aggregate=plan.by_aggregate, prepare=True,
            )  # fmt: skip
            if notes is not None and messages:
                notes.append(("claimed", time.time_ns(), [m.id for m in messages]))
            if ordered:
                plan.observe(len(messages), batch)
            if messages:
                outcomes = await asyncio.gather(*(_post(session, url, m) for m in messages))
                await finalize(conn, TABLE, outcomes)
                if notes is not None:
                    notes.append(("finalized", time.time_ns(), [m.id for m in messages]))
            # Claim again at once after a full batch (more may be waiting), and in ordered
            # mode after any (the finalize made the next message of each aggregate its head,
            # which no NOTIFY announces). Otherwise every row committed since the claim's
            # snapshot has a NOTIFY coming: those that came in during the claim, the POSTs
            # or the finalize are kept by psycopg and yielded first, the others are awaited.
            if len(messages) == batch or (ordered and messages):
                continue
            async for _ in conn.notifies(timeout=POLL, stop_after=1):
                pass


async def main(argv: list[str]) -> None:
    dsn, url, batch, concurrency = argv[0], argv[1], int(argv[2]), int(argv[3])
    ordered = "ordered" in argv[4:]
    trace = next((a.removeprefix("trace=") for a in argv[4:] if a.startswith("trace=")), None)
    notes: list[Note] | None = [] if trace else None
    task = asyncio.ensure_future(dispatch(dsn, url, batch, concurrency, ordered, notes))
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, task.cancel)
    with contextlib.suppress(asyncio.CancelledError):
        await task
    if trace and notes is not None:
        _write_notes(trace, notes)


def _write_notes(path: str, notes: list[Note]) -> None:
    with open(path, "w") as out:
        for event, at_ns, ids in notes:
            out.write(json.dumps({"event": event, "time_ns": at_ns, "ids": ids}) + "\n")


if __name__ == "__main__":
    uvloop_run(main(sys.argv[1:]))
