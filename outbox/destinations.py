"""Destination health, shared by every replica of a table: the breaker, pauses, rate tokens,
and which destinations the running workers serve.

A failure that many different messages meet at one destination is the destination's, not
the messages'. Each outbox table has a small table beside it, `<table>_destinations` (schema
v4), with one row per destination that a worker serves or served, or that has failed, been
paused or been rate limited. The database is the one place every replica already shares, so
a breaker opened by one replica holds for all of them, and for replicas started while it is
open.

States (docs/protocol.md draws them):

- `closed`: messages flow. Retryable failures (timeouts, refused or reset connections, 5xx,
  429) of *different* messages are collected within a window; a success seen by the
  reporting replica starts the window again. At `threshold` distinct messages it opens. One
  poison message failing again and again is one message: it never opens the breaker.
- `open`: nothing is sent but one probe at a time. A replica takes the probe (a lease on the
  row: `probe_owner`, `probe_until`) once `next_probe_at` has passed; a probe that succeeds
  closes the breaker for everyone, one that fails doubles the delay (with jitter) up to the
  cap. A `Retry-After` opens it at once until then.
- `paused`: opened by a person (`outbox pause`), with who and why; only `outbox resume` ends it.

A person may also close an open breaker (`outbox resume`, the TUI; `resumed`): one who knows
the destination is back need not wait for the next probe. Like a pause it is recorded with
who and why (outbox.operations.pausing); if the destination still fails, the breaker opens again.

A row outlives the workers that wrote it: after a URL changes, the old origin's row stays as
it was, open perhaps, and no worker will ever probe it again. So each worker stamps the
destinations it is configured for (`served_at`, schema v5; `served`) when it starts and every
SERVED_INTERVAL. A destination no worker stamped within IDLE_AFTER is idle: shown as such,
and nothing (the operator's scaling hold, its DestinationReachable condition, its alert
series) treats an idle destination's state as a live outage. Sends cannot tell this: an open
destination gets none, and is still served.

Changes are read-modify-write under the row's lock in one short transaction, with the
rules in `transition` (pure, unit-tested); every time is the database's `now()`. Failures
are rare events, so this costs nothing on the path of a healthy message.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any

import psycopg
from psycopg import sql

from outbox.plumbing.text import storable
from outbox.runner import Query, Row, Steps, first_row, no_rows, perform, perform_async, step
from outbox.table import Table

CLOSED, OPEN, PAUSED = "closed", "open", "paused"
STATES = (CLOSED, OPEN, PAUSED)
# Not a state of the row: how a destination no worker serves any more is shown, whatever its
# row says (`is_idle`).
IDLE = "idle"
SHOWN_STATES = (*STATES, IDLE)
# Failed message ids kept per window: enough to count up to any sensible threshold.
MAX_FAILING_IDS = 100
MAX_ERROR_LENGTH = 500
# How often each worker stamps the destinations it serves. A stamp younger than half of it
# is left as it is: with many replicas most stamps then write nothing.
SERVED_INTERVAL = timedelta(seconds=10)
# A destination no worker stamped for this long is idle: several stamps missed in a row,
# more than a slow or briefly unreachable database explains, and well under the 5 minutes
# after which an open destination pages (docs/monitoring.md).
IDLE_AFTER = 6 * SERVED_INTERVAL


def table_of(table: Table) -> sql.Composable:
    return table.sibling("destinations")


def create_statements(table: Table) -> list[sql.Composed]:
    """The destinations table (a migration step of schema v4)."""
    return [
        sql.SQL(
            """CREATE TABLE IF NOT EXISTS {d} (
    destination   text        PRIMARY KEY,
    state         text        NOT NULL DEFAULT 'closed'
                  CHECK (state IN ('closed', 'open', 'paused')),
    since         timestamptz NOT NULL DEFAULT now(),
    failures      integer     NOT NULL DEFAULT 0,
    failing_ids   bigint[]    NOT NULL DEFAULT '{{}}',
    failing_at    timestamptz[] NOT NULL DEFAULT '{{}}',
    window_start  timestamptz,
    last_error    text,
    last_failure  timestamptz,
    next_probe_at timestamptz,
    probe_delay   double precision NOT NULL DEFAULT 0,
    probe_owner   text,
    probe_until   timestamptz,
    reason        text,
    changed_by    text,
    tokens        double precision,
    tokens_at     timestamptz,
    granted       integer
)"""
        ).format(d=table_of(table))
    ]


def serving_statements(table: Table) -> list[sql.Composed]:
    """Who serves each destination (a migration step of schema v5): the last stamp of a
    worker configured for it, and that worker. Columns without a default: a catalog change
    only, no rewrite."""
    return [
        sql.SQL(
            "ALTER TABLE {d} ADD COLUMN IF NOT EXISTS served_at timestamptz, "
            "ADD COLUMN IF NOT EXISTS served_by text"
        ).format(d=table_of(table))
    ]


@dataclass(frozen=True)
class Policy:
    """When a breaker opens and how it probes. The worker's settings take these defaults."""

    threshold: int = 5  # distinct failing messages within the window
    window: timedelta = timedelta(seconds=60)
    probe_start: timedelta = timedelta(seconds=2)
    probe_cap: timedelta = timedelta(seconds=30)
    # A Retry-After pauses the destination for that long, but never longer than this.
    max_retry_after: timedelta = timedelta(hours=1)


@dataclass(frozen=True)
class Destination:
    """One row: a destination's state as every replica sees it."""

    destination: str
    state: str = CLOSED
    since: datetime | None = None
    failures: int = 0  # failures in the window (closed) or since it opened
    failing_ids: tuple[int, ...] = ()  # the messages failing in the window, oldest first
    failing_at: tuple[datetime, ...] = ()  # when each of them last failed
    window_start: datetime | None = None
    last_error: str | None = None
    last_failure: datetime | None = None
    next_probe_at: datetime | None = None
    probe_delay: float = 0.0  # seconds: the delay before the last probe
    probe_owner: str | None = None
    probe_until: datetime | None = None
    reason: str | None = None  # why it is paused (or opened by a Retry-After)
    changed_by: str | None = None
    # The last stamp of a worker configured for it, and that worker (None: never stamped,
    # or not read: the rules neither read nor write them).
    served_at: datetime | None = None
    served_by: str | None = None

    @property
    def sending(self) -> bool:
        return self.state == CLOSED


# What the rules read and write, under the row's lock.
_COLUMNS = (
    "destination", "state", "since", "failures", "failing_ids", "failing_at", "window_start",
    "last_error",
    "last_failure", "next_probe_at", "probe_delay", "probe_owner", "probe_until", "reason",
    "changed_by",
)  # fmt: skip
# What a listing reads besides: the workers' stamps, which only `served` writes.
_LISTED = (*_COLUMNS, "served_at", "served_by")


def is_idle(row: Destination, now: datetime) -> bool:
    """Whether no worker has stamped the destination within IDLE_AFTER of `now` (the
    database's): nothing running serves it, whatever its row says."""
    return row.served_at is None or now - row.served_at > IDLE_AFTER


def _parse(row: Row, columns: tuple[str, ...] = _COLUMNS) -> Destination:
    values = dict(zip(columns, row, strict=True))
    values["failing_ids"] = tuple(values["failing_ids"] or ())
    values["failing_at"] = tuple(values["failing_at"] or ())
    return Destination(**values)


# -- the rules -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Failure:
    message_id: int
    error: str
    retry_after: timedelta | None = None
    # Seconds since the reporter last saw this destination succeed (None: not lately).
    # Failures before that success are the past: they no longer count, whoever saw them.
    succeeded_ago: float | None = None


def _jittered(seconds: float, rng: random.Random | None) -> timedelta:
    """Between half and all of `seconds`: replicas that wait together do not probe together."""
    return timedelta(seconds=(rng or random).uniform(seconds / 2, seconds))


def failed(
    row: Destination,
    failure: Failure,
    *,
    owner: str,
    now: datetime,
    policy: Policy,
    rng: random.Random | None = None,
) -> Destination:
    """The destination after a retryable failure reported by `owner`."""
    error = storable(failure.error, MAX_ERROR_LENGTH)
    row = replace(row, last_error=error, last_failure=now)
    retry_after = min(failure.retry_after, policy.max_retry_after) if failure.retry_after else None
    if row.state == PAUSED:
        return row
    if row.state == OPEN:
        if row.probe_owner != owner:
            # A message sent before it opened; or a Retry-After that extends the pause.
            if retry_after is not None and (
                row.next_probe_at is None or row.next_probe_at < now + retry_after
            ):
                return replace(row, next_probe_at=now + retry_after)
            return row
        # Our probe failed: wait longer before the next one.
        delay = min(row.probe_delay * 2, policy.probe_cap.total_seconds())
        wait = retry_after if retry_after is not None else _jittered(delay, rng)
        return replace(
            row, failures=row.failures + 1, probe_delay=delay, next_probe_at=now + wait,
            probe_owner=None, probe_until=None,
        )  # fmt: skip
    # The failures that still count: within the window, and after the reporter's last
    # success (another replica's failures since then count, its earlier ones do not).
    since = now - policy.window
    if failure.succeeded_ago is not None:
        since = max(since, now - timedelta(seconds=failure.succeeded_ago))
    kept = [
        (i, at)
        for i, at in zip(row.failing_ids, row.failing_at, strict=False)
        if at > since and i != failure.message_id
    ]
    kept = [*kept, (failure.message_id, now)][-MAX_FAILING_IDS:]
    ids = tuple(i for i, _ in kept)
    row = replace(
        row,
        failures=len(kept),
        failing_ids=ids,
        failing_at=tuple(at for _, at in kept),
        window_start=min(at for _, at in kept),
    )
    if retry_after is not None:
        return _opened(row, now, now + retry_after, policy, reason="Retry-After")
    if len(ids) >= policy.threshold:
        return _opened(row, now, now + _jittered(policy.probe_start.total_seconds(), rng), policy)
    return row


def _opened(
    row: Destination, now: datetime, probe_at: datetime, policy: Policy, reason: str | None = None
) -> Destination:
    return replace(
        row, state=OPEN, since=now, next_probe_at=probe_at,
        probe_delay=policy.probe_start.total_seconds(), probe_owner=None, probe_until=None,
        reason=reason, changed_by=None,
    )  # fmt: skip


def succeeded(row: Destination, *, owner: str, now: datetime) -> Destination:
    """The destination after `owner`'s probe succeeded: closed for everyone."""
    if row.state != OPEN or row.probe_owner != owner:
        return row
    return closed(row, now)


def resumed(row: Destination, *, by: str, now: datetime) -> Destination | None:
    """A person's resume: a paused destination, or an open breaker (without waiting for a
    probe: they know the destination is back), closed and marked with who did it; None for a
    closed one (nothing to do)."""
    return closed(row, now, by=by) if row.state in (PAUSED, OPEN) else None


def closed(row: Destination, now: datetime, by: str | None = None) -> Destination:
    return replace(
        row, state=CLOSED, since=now, failures=0, failing_ids=(), failing_at=(), window_start=None,
        next_probe_at=None, probe_delay=0.0, probe_owner=None, probe_until=None,
        reason=None, changed_by=by,
    )  # fmt: skip


def probe_taken(
    row: Destination, *, owner: str, now: datetime, hold: timedelta
) -> Destination | None:
    """The destination with `owner` holding its probe, or None when no probe is due (not
    open, not yet time, or another replica's probe is still running)."""
    if row.state != OPEN or row.next_probe_at is None or row.next_probe_at > now:
        return None
    if row.probe_until is not None and row.probe_until > now and row.probe_owner != owner:
        return None
    return replace(row, probe_owner=owner, probe_until=now + hold)


def paused(row: Destination, *, by: str, reason: str, now: datetime) -> Destination:
    return replace(
        row, state=PAUSED, since=now, reason=reason, changed_by=by, next_probe_at=None,
        probe_owner=None, probe_until=None,
    )  # fmt: skip


# -- statements ------------------------------------------------------------------------------

AsyncConn = psycopg.AsyncConnection[Any]
SyncConn = psycopg.Connection[Any]


def _lock(table: Table) -> sql.Composed:
    """The row, created closed if missing, locked for the transition; and now()."""
    return sql.SQL(
        """WITH made AS (
    INSERT INTO {d} (destination) VALUES (%(destination)s) ON CONFLICT DO NOTHING
)
SELECT {columns}, now() FROM {d} WHERE destination = %(destination)s FOR UPDATE"""
    ).format(d=table_of(table), columns=sql.SQL(", ").join(map(sql.Identifier, _COLUMNS)))


def _write(table: Table) -> sql.Composed:
    return sql.SQL("UPDATE {d} SET {assignments} WHERE destination = %(destination)s").format(
        d=table_of(table),
        assignments=sql.SQL(", ").join(
            sql.SQL("{c} = {p}").format(c=sql.Identifier(c), p=sql.Placeholder(c))
            for c in _COLUMNS[1:]
        ),
    )


def _params(row: Destination) -> dict[str, Any]:
    values = {c: getattr(row, c) for c in _COLUMNS}
    values["failing_ids"] = list(row.failing_ids)
    values["failing_at"] = list(row.failing_at)
    return values


@dataclass(frozen=True)
class Change:
    before: Destination
    after: Destination | None  # None: the rule declined, nothing was written
    now: datetime  # the database's


Rule = Callable[[Destination, datetime], "Destination | None"]


def _decide(found: Row, rule: Rule) -> Change:
    before, now = _parse(found[:-1]), found[-1]
    return Change(before, rule(before, now), now)


def _changed(change: Change) -> dict[str, Any] | None:
    """The row to write, if the rule changed anything."""
    after = change.after
    return _params(after) if after is not None and after != change.before else None


def changing(table: Table, destination: str, rule: Rule) -> Steps[Change]:
    """`change`'s statements, to run inside a larger operation's transaction (the row's lock
    is held until that commits)."""
    lock = Query(_lock(table), {"destination": destination}, first_row(lambda row: row))
    found = yield from step(lock)
    if found is None:  # inserted by that statement, so not visible to it: read again
        found = yield from step(lock)
    assert found is not None  # the row exists now, made or not by us
    result = _decide(found, rule)
    if (write := _changed(result)) is not None:
        yield from step(Query(_write(table), write, no_rows))
    return result


async def change(conn: AsyncConn, table: Table, destination: str, rule: Rule) -> Change:
    """Apply `rule(row, now) -> row | None` to the destination's row (made closed if it is
    missing) under the row's lock, in one short transaction."""
    return await perform_async(conn, changing(table, destination, rule), transaction=True)


def change_sync(conn: SyncConn, table: Table, destination: str, rule: Rule) -> Change:
    """`change` on a sync connection (the CLI's pause and resume)."""
    return perform(conn, changing(table, destination, rule), transaction=True)


def listing(table: Table) -> Query[list[tuple[Destination, datetime]]]:
    """Every destination with a row, and the database's now() (for ages, due probes and
    whether a worker serves it)."""
    statement = sql.SQL("SELECT {columns}, now() FROM {d} ORDER BY destination").format(
        d=table_of(table), columns=sql.SQL(", ").join(map(sql.Identifier, _LISTED))
    )
    return Query(statement, None, lambda rows: [(_parse(r[:-1], _LISTED), r[-1]) for r in rows])


def served(table: Table, destinations: list[str], *, owner: str) -> Query[int]:
    """Stamp `destinations` as served by `owner` now (a row is made, closed, for one that has
    none), in one statement; how many stamps were written. A stamp younger than half of
    SERVED_INTERVAL is left as it is: another replica stamped it, and rewriting the row
    would only add dead tuples. Rows are taken in name order, so that replicas stamping the
    same set never deadlock."""
    statement = sql.SQL(
        """INSERT INTO {d} AS d (destination, served_at, served_by)
SELECT name, now(), %(owner)s FROM unnest(%(names)s::text[]) AS name ORDER BY name
ON CONFLICT (destination) DO UPDATE
   SET served_at = excluded.served_at, served_by = excluded.served_by
 WHERE d.served_at IS NULL OR d.served_at < now() - %(fresh)s::interval
RETURNING destination"""
    ).format(d=table_of(table))
    params = {"names": sorted(set(destinations)), "owner": owner, "fresh": SERVED_INTERVAL / 2}
    return Query(statement, params, len)


def take_tokens(table: Table, destination: str, *, rate: float, want: int) -> Query[int]:
    """Up to `want` send tokens of the destination's bucket, shared by every replica: it
    fills at `rate` per second up to half a second's worth (so no 10 s window sees more than
    the rate and 5 %), and what is taken is gone. One statement: concurrent takers are
    serialized on the row, each computing from the row as the last one left it."""
    filled = sql.SQL(
        "least(%(burst)s, coalesce(d.tokens, %(burst)s)"
        " + %(rate)s * extract(epoch FROM now() - coalesce(d.tokens_at, now()))::float8)"
    )
    grant = sql.SQL("least(%(want)s, floor({filled})::int)").format(filled=filled)
    statement = sql.SQL(
        """INSERT INTO {d} AS d (destination, tokens, tokens_at, granted)
VALUES (%(destination)s, %(burst)s - least(%(want)s, floor(%(burst)s)::int), now(),
        least(%(want)s, floor(%(burst)s)::int))
ON CONFLICT (destination) DO UPDATE
   SET tokens = {filled} - {grant}, tokens_at = now(), granted = {grant}
RETURNING granted"""
    ).format(d=table_of(table), filled=filled, grant=grant)
    params = {"destination": destination, "rate": rate, "burst": max(1.0, rate / 2), "want": want}
    return Query(statement, params, first_row(lambda row: int(row[0]) if row else 0))
