"""`outbox reconcile`: the messages the outbox delivered in a window that a receiver's inbox
never recorded, and the keys it recorded that the outbox never delivered there.

The two tables live on two servers (the outbox's and the receiver's), so the comparison is a
walk in id order, `CHUNK` ids at a time, never the whole window in memory:

- **missing**: the window's done rows, by id (`outbox.operations.replay.window` bounds the id
  range), each chunk's ids looked up in the inbox by its primary key (consumer, message_id), where a
  message's key is its id as text;
- **extra**: the inbox's keys that are ids in the window's id range, walked along that same
  primary key (digit strings of one length sort as their numbers), each chunk looked up in
  the outbox: a key whose row is not there or was not delivered in the window;
- **foreign**: keys that are no id at all (another producer's), counted by the database
  among those received since the window began.

Each chunk read from the outbox is read beside `outbox maintain` as a replay's batch is
(`replay.beside_retirement`): in a transaction holding the run's lock shared, so that no run
detaches a partition (which leaves its rows out of the table) while the chunk is read, and
refused with `replay.HalfDetached` when a partition an interrupted run left pending detach
lies in what is left of the window: read through the table, its rows were neither delivered
nor missing, and the inbox's keys of them counted extra.

What is kept across chunks is bounded: counts, counts by type, and the first `MAX_RANGES`
ranges of ids. The inbox is only read: its session is read-only (and a read-only role is
enough, docs/replay.md). `replay_missing` walks the window again and sends the missing
messages of each chunk again as one replay (outbox.operations.replay), audited per batch.
Each batch's record keeps the window, the consumer, the inbox table and the last id reached:
a replay stopped in any chunk goes on from there to the window's end (`resume_point`),
comparing again what it had not reached, with the same consumer's keys in the same table.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any, TypeVar

import psycopg
from psycopg import sql

from outbox.operations import replay
from outbox.plumbing.dsn import connect_options
from outbox.plumbing.text import counted, printable_name
from outbox.runner import Query, Row, Steps, fetch, first_row, perform, step
from outbox.session import session_settings
from outbox.table import Table, shown, shown_argument

T = TypeVar("T")

CHUNK = 10_000  # ids per lookup, on each side: what bounds the memory of a comparison
MAX_RANGES = 1000  # ranges of ids kept for the report; the counts go on past them
_ID_PATTERN = "^[1-9][0-9]{0,18}$"  # an outbox id as text: a bigint, no sign, no zeros ahead


def connect_inbox(dsn: str) -> psycopg.Connection[Any]:
    """A connection to the receiver's database that cannot write."""
    conn = psycopg.connect(dsn, autocommit=True, **connect_options(dsn))
    fetch(conn, session_settings({"default_transaction_read_only": "on"}))
    return conn


class Ranges:
    """Ids seen in increasing order, as inclusive ranges; the first `keep` of them kept."""

    def __init__(self, keep: int = MAX_RANGES) -> None:
        self.kept: list[tuple[int, int]] = []
        self.total = 0  # ranges, kept or not
        self._keep = keep
        self._last: int | None = None

    def add(self, message_id: int) -> None:
        last = self._last
        if last is not None and message_id == last + 1:
            if self.kept and self.kept[-1][1] == last:  # the open range is a kept one
                self.kept[-1] = (self.kept[-1][0], message_id)
        else:
            self.total += 1
            if len(self.kept) < self._keep:
                self.kept.append((message_id, message_id))
        self._last = message_id


def _text(ranges: Sequence[tuple[int, int]]) -> str:
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in ranges)


@dataclass
class Found:
    """A comparison's outcome."""

    since: datetime
    until: datetime
    consumer: str
    delivered: int = 0  # done rows of the window
    missing: int = 0
    missing_by_type: dict[str, int] = field(default_factory=dict)
    missing_ranges: Ranges = field(default_factory=Ranges)
    extra: int = 0
    extra_ranges: Ranges = field(default_factory=Ranges)
    foreign: int = 0

    def lines(self, table: Table) -> list[str]:
        window = f"{self.since.isoformat()} to {self.until.isoformat()}"
        lines = [
            f"{shown(table)}: {self.delivered} delivered from {window}; consumer "
            f"{printable_name(self.consumer)}: "
            f"{self.missing} missing, {self.extra} extra, {counted(self.foreign, 'key')} that "
            f"{'is' if self.foreign == 1 else 'are'} no id"
        ]
        if self.missing:
            # Types and the consumer come from the tables: shown escaped, never as terminal
            # commands.
            by_type = ", ".join(
                f"{t} {n}"
                for t, n in sorted(
                    (printable_name(name), n) for name, n in self.missing_by_type.items()
                )
            )
            lines.append(f"missing by type: {by_type}")
            lines.append(
                f"missing ids: {_text(self.missing_ranges.kept)}{_more(self.missing_ranges)}"
            )
        if self.extra:
            lines.append(
                f"extra keys (in the inbox, not delivered in the window): "
                f"{_text(self.extra_ranges.kept)}{_more(self.extra_ranges)}"
            )
        return lines

    def to_dict(self, replayed: Replayed | None = None) -> dict[str, Any]:
        data: dict[str, Any] = {
            "since": self.since.isoformat(),
            "until": self.until.isoformat(),
            "consumer": self.consumer,
            "delivered": self.delivered,
            "missing": {
                "count": self.missing,
                "by_type": self.missing_by_type,
                "ranges": [list(r) for r in self.missing_ranges.kept],
                "ranges_total": self.missing_ranges.total,
            },
            "extra": {
                "count": self.extra,
                "ranges": [list(r) for r in self.extra_ranges.kept],
                "ranges_total": self.extra_ranges.total,
            },
            "not_ids": self.foreign,
        }
        if replayed is not None:
            data["replayed"] = {"replay": replayed.number, "count": replayed.count}
        return data


def _more(ranges: Ranges) -> str:
    hidden = ranges.total - len(ranges.kept)
    return f" (and {hidden} more ranges)" if hidden > 0 else ""


# -- the statements ----------------------------------------------------------------------


def _delivered_chunk(
    table: Table, ids: replay.IdRange, since: datetime, until: datetime, after: int, chunk: int
) -> Query[list[Row]]:
    """The next `chunk` done rows of the window after id `after`: (id, event_type)."""
    statement = sql.SQL(
        "SELECT id, event_type FROM {t} WHERE id > %(after)s AND id < %(past)s "
        "AND created_at >= %(since)s AND created_at < %(until)s AND status = 'done' "
        "ORDER BY id LIMIT %(chunk)s"
    ).format(t=table.ident)
    params = {"after": after, "past": ids.past, "since": since, "until": until, "chunk": chunk}
    return Query(statement, params, list)


def _recorded(inbox: Table, consumer: str, keys: list[str]) -> Query[set[str]]:
    """Which of `keys` the consumer recorded: one probe of the primary key each."""
    statement = sql.SQL(
        "SELECT message_id FROM {t} WHERE consumer = %(consumer)s "
        "AND message_id = ANY(%(keys)s::text[])"
    ).format(t=inbox.ident)
    return Query(statement, {"consumer": consumer, "keys": keys}, lambda rows: {r[0] for r in rows})


def _keys_chunk(
    inbox: Table, consumer: str, low: str, high: str, after: str, chunk: int
) -> Query[list[str]]:
    """The consumer's next `chunk` keys in [low, high] after `after`, along its primary key."""
    statement = sql.SQL(
        "SELECT message_id FROM {t} WHERE consumer = %(consumer)s AND message_id >= %(low)s "
        "AND message_id <= %(high)s AND message_id > %(after)s ORDER BY message_id "
        "LIMIT %(chunk)s"
    ).format(t=inbox.ident)
    params = {"consumer": consumer, "low": low, "high": high, "after": after, "chunk": chunk}
    return Query(statement, params, lambda rows: [r[0] for r in rows])


def _delivered_among(
    table: Table, ids: list[int], since: datetime, until: datetime
) -> Query[dict[int, bool]]:
    """Of `ids`, those created in the window: whether each is done (ids of rows created
    outside the window are left out)."""
    statement = sql.SQL(
        "SELECT id, status = 'done' FROM {t} WHERE id = ANY(%(ids)s::bigint[]) "
        "AND created_at >= %(since)s AND created_at < %(until)s"
    ).format(t=table.ident)
    return Query(
        statement,
        {"ids": ids, "since": since, "until": until},
        lambda rows: {int(r[0]): bool(r[1]) for r in rows},
    )


def _existing(table: Table, ids: list[int]) -> Query[set[int]]:
    statement = sql.SQL("SELECT id FROM {t} WHERE id = ANY(%(ids)s::bigint[])").format(
        t=table.ident
    )
    return Query(statement, {"ids": ids}, lambda rows: {int(r[0]) for r in rows})


def _not_ids(inbox: Table, consumer: str, since: datetime) -> Query[int]:
    statement = sql.SQL(
        "SELECT count(*) FROM {t} WHERE consumer = %(consumer)s AND received_at >= %(since)s "
        "AND message_id !~ {pattern}"
    ).format(t=inbox.ident, pattern=sql.Literal(_ID_PATTERN))
    return Query(
        statement,
        {"consumer": consumer, "since": since},
        first_row(lambda r: int(r[0]) if r else 0),
    )


def _consumers(inbox: Table) -> Query[list[str]]:
    """The inbox's consumers (at most 3: enough to say there is more than one), by a skip
    scan of the primary key."""
    statement = sql.SQL(
        """WITH RECURSIVE c(consumer) AS (
    (SELECT consumer FROM {t} ORDER BY consumer LIMIT 1)
    UNION ALL
    SELECT (SELECT consumer FROM {t} WHERE consumer > c.consumer ORDER BY consumer LIMIT 1)
      FROM c WHERE c.consumer IS NOT NULL
)
SELECT consumer FROM c WHERE consumer IS NOT NULL LIMIT 3"""
    ).format(t=inbox.ident)
    return Query(statement, None, lambda rows: [r[0] for r in rows])


class AmbiguousConsumer(ValueError):
    """The inbox holds several consumers and none was named."""


def choose_consumer(inbox_conn: psycopg.Connection[Any], inbox: Table, consumer: str | None) -> str:
    if consumer is not None:
        return consumer
    found = fetch(inbox_conn, _consumers(inbox))
    if len(found) == 1:
        return found[0]
    if not found:
        raise AmbiguousConsumer(f"inbox table {shown(inbox)} holds no key: name the --consumer")
    # `found` holds at most three: the third only says there are more than two.
    named = ", ".join(found[:2]) + (", ..." if len(found) > 2 else "")
    raise AmbiguousConsumer(
        f"inbox table {shown(inbox)} holds several consumers ({named}): name one with --consumer"
    )


# -- beside `outbox maintain` ------------------------------------------------------------

AGAIN = "run this comparison again"  # what to do once `outbox maintain` finished a detach


def _window(table: Table, since: datetime, until: datetime, *, after: int) -> Steps[replay.IdRange]:
    """The window's id range from id `after` on, found once a run of `outbox maintain` has
    ended (in the caller's transaction, which keeps the next from beginning), and refused
    (`replay.refuse_half_detached`) when `after` is 0 and a partition pending detach holds a
    part of it."""
    yield from step(replay.shared_run_lock(table))
    window = yield from replay.window(table, since, until)
    ids = replay.IdRange(max(window.first, after), window.past)
    if after == 0:
        whole = replay.ReplayFilter(since=since, until=until)
        yield from replay.refuse_half_detached(table, whole, ids.first, ids.past - 1, AGAIN)
    return ids


def _beside_maintenance(
    table: Table, low: int, past: int, then: Callable[[], str], query: Query[T]
) -> Steps[T]:
    """`query`, read as a replay's batch is sent: in the caller's transaction, once a run of
    `outbox maintain` has ended and keeping the next from beginning until it commits (so no
    partition is being detached, left out of the table, while it reads), and refused
    (HalfDetached, saying to run `outbox maintain`, then `then`) when a partition an
    interrupted run left pending detach holds ids from `low` to before `past`."""
    half_detached = yield from replay.beside_retirement(table, low, past)
    if half_detached:
        raise replay.HalfDetached(replay.half_detached_message(table, half_detached, then()))
    return (yield from step(query))


# -- the walks ---------------------------------------------------------------------------


def _delivered_chunks(
    conn: psycopg.Connection[Any],
    table: Table,
    ids: replay.IdRange,
    since: datetime,
    until: datetime,
    chunk: int,
    then: Callable[[], str],
) -> Iterator[list[Row]]:
    """The window's done rows from `ids.first` on, `chunk` at a time; each chunk read when
    no partition from there to the window's end is pending detach (`_beside_maintenance`)."""
    after = ids.first - 1
    while True:
        rows = perform(
            conn,
            _beside_maintenance(
                table,
                after + 1,
                ids.past,
                then,
                _delivered_chunk(table, ids, since, until, after, chunk),
            ),
            transaction=True,
        )
        if not rows:
            return
        yield rows
        after = int(rows[-1][0])


def _missing_rows(
    conn: psycopg.Connection[Any],
    table: Table,
    inbox_conn: psycopg.Connection[Any],
    inbox: Table,
    consumer: str,
    ids: replay.IdRange,
    since: datetime,
    until: datetime,
    chunk: int,
    then: Callable[[], str],
) -> Iterator[tuple[int, list[Row]]]:
    """(done rows in the chunk, the chunk's rows the inbox never recorded), chunk by chunk."""
    for rows in _delivered_chunks(conn, table, ids, since, until, chunk, then):
        recorded = fetch(inbox_conn, _recorded(inbox, consumer, [str(r[0]) for r in rows]))
        yield len(rows), [r for r in rows if str(r[0]) not in recorded]


def _id_keys(
    inbox_conn: psycopg.Connection[Any],
    inbox: Table,
    consumer: str,
    ids: replay.IdRange,
    chunk: int,
) -> Iterator[list[int]]:
    """The consumer's keys that are ids in [ids.first, ids.past), in increasing order, a
    chunk at a time: one walk of the primary key per number of digits."""
    if ids.empty:
        return
    first, last = max(ids.first, 1), ids.past - 1
    for digits in range(len(str(first)), len(str(last)) + 1):
        low, high = max(first, 10 ** (digits - 1)), min(last, 10**digits - 1)
        low_text, high_text = str(low), str(high)
        after = ""
        while True:
            keys = fetch(
                inbox_conn, _keys_chunk(inbox, consumer, low_text, high_text, after, chunk)
            )
            if not keys:
                break
            after = keys[-1]
            numbers = sorted(
                int(k)
                for k in keys
                if len(k) == digits and k.isascii() and k.isdigit() and low <= int(k) <= high
            )
            if numbers:
                yield numbers
            if len(keys) < chunk:
                break


def compare(
    conn: psycopg.Connection[Any],
    table: Table,
    inbox_conn: psycopg.Connection[Any],
    inbox: Table,
    *,
    consumer: str | None,
    since: datetime,
    until: datetime,
    chunk: int = CHUNK,
) -> Found:
    """Compare the window's delivered messages with the inbox's keys (see the module), `chunk`
    ids at a time on each side."""
    name = choose_consumer(inbox_conn, inbox, consumer)
    found = Found(since, until, name)
    ids = perform(conn, _window(table, since, until, after=0), transaction=True)
    for delivered, missing in _missing_rows(
        conn, table, inbox_conn, inbox, name, ids, since, until, chunk, lambda: AGAIN
    ):
        found.delivered += delivered
        for message_id, event_type in missing:
            found.missing += 1
            found.missing_by_type[event_type] = found.missing_by_type.get(event_type, 0) + 1
            found.missing_ranges.add(int(message_id))
    for numbers in _id_keys(inbox_conn, inbox, name, ids, chunk):
        in_window, present = perform(
            conn, _looked_up(table, numbers, since, until), transaction=True
        )
        for n in numbers:
            # Extra: in the window but not done, or no row at all (purged, or never ours).
            if (n in in_window and not in_window[n]) or (n not in in_window and n not in present):
                found.extra += 1
                found.extra_ranges.add(n)
    found.foreign = fetch(inbox_conn, _not_ids(inbox, name, since))
    return found


def _looked_up(
    table: Table, numbers: list[int], since: datetime, until: datetime
) -> Steps[tuple[dict[int, bool], set[int]]]:
    """Of the keys `numbers` (increasing), those of rows created in the window (whether each
    is done), and those of rows created outside it; read beside `outbox maintain`."""
    in_window = yield from _beside_maintenance(
        table,
        numbers[0],
        numbers[-1] + 1,
        lambda: AGAIN,
        _delivered_among(table, numbers, since, until),
    )
    unknown = [n for n in numbers if n not in in_window]
    present = (yield from step(_existing(table, unknown))) if unknown else set()
    return in_window, present


@dataclass(frozen=True)
class Replayed:
    number: int
    count: int


class NotReconciling(LookupError):
    """`outbox reconcile --resume N` names a replay `outbox replay` made."""


def start_replay(
    conn: psycopg.Connection[Any],
    table: Table,
    found: Found,
    inbox: Table,
    *,
    reason: str | None = None,
) -> replay.Progress:
    """A new replay of what `found` counts missing in `inbox`, its number drawn:
    `replay_missing` sends it. What the person confirmed bounds it: `found.missing`
    messages. Its records keep the consumer and the inbox table compared: a resume compares
    the same keys (`recorded_inbox`)."""
    number = fetch(conn, replay.next_number(table))
    return replay.Progress(
        number,
        replay.ReplayFilter(since=found.since, until=found.until),
        next_id=0,  # from the window's first id
        past_id=0,  # each chunk sets its own
        left=found.missing,
        confirmed=found.missing,
        reason=reason,
        reconcile={"consumer": found.consumer, "inbox_table": _inbox_record(inbox)},
    )


def _inbox_record(inbox: Table) -> dict[str, str | None]:
    # As given: schema-qualified only if it was (unqualified, the search_path finds it).
    return {"schema": inbox.schema, "name": inbox.name}


def recorded_inbox(progress: replay.Progress) -> Table | None:
    """The inbox table replay `progress` compared, as its records keep it; None for a record
    from before it was kept."""
    recorded = (progress.reconcile or {}).get("inbox_table")
    return None if recorded is None else Table(recorded["schema"], recorded["name"])


def record_inbox(progress: replay.Progress, inbox: Table) -> None:
    """Keep `inbox` in the records of the batches `progress` sends from now on."""
    assert progress.reconcile is not None
    progress.reconcile["inbox_table"] = _inbox_record(inbox)


def resume_point(conn: psycopg.Connection[Any], table: Table, number: int) -> replay.Progress:
    """Replay `number` of `outbox reconcile --replay` as its last recorded batch left it: its
    window compared again from the next id on, what is left of the count confirmed
    (replay.NoSuchReplay if it recorded no batch, NotReconciling if `outbox replay` made
    it). Its consumer and inbox table are the recorded ones (none in a record from before
    they were kept)."""
    progress = perform(conn, replay.resume_point(table, number))
    if progress.reconcile is None:
        raise NotReconciling(f"replay {number} was made by `outbox replay`, not by reconcile")
    progress.filter = replace(progress.filter, ids=None)  # the chunk's ids: found again
    return progress


def replay_missing(
    conn: psycopg.Connection[Any],
    table: Table,
    inbox_conn: psycopg.Connection[Any],
    inbox: Table,
    progress: replay.Progress,
    *,
    actor: str | None,
    chunk: int = CHUNK,
) -> None:
    """Send again exactly what the inbox never recorded, as replay `progress` (`start_replay`,
    or `resume_point` to go on with one stopped): its window walked again from
    `progress.next_id`, each chunk's missing ids sent back in batches recorded in the audit
    log (via `outbox reconcile`), at most `progress.left` messages. `progress` counts what
    was sent, so a caller stopped (Ctrl-C) can say how far it went.

    Each batch's record keeps the window, the consumer, the inbox table and the last id
    reached, so a stop
    anywhere resumes for the whole window (`resume_point`), not only for the chunk that was
    being sent. A message sent again before the stop is not missing when the walk comes
    back to it: it is pending (not delivered), or delivered again and recorded by the inbox.

    No run of `outbox maintain` retires a partition meanwhile (`replay.holding_off_retirement`,
    which `outbox reconcile --replay` takes before its comparison already)."""
    with replay.holding_off_retirement(conn, table):
        _replay_missing(conn, table, inbox_conn, inbox, progress, actor=actor, chunk=chunk)


def _replay_missing(
    conn: psycopg.Connection[Any],
    table: Table,
    inbox_conn: psycopg.Connection[Any],
    inbox: Table,
    progress: replay.Progress,
    *,
    actor: str | None,
    chunk: int,
) -> None:
    assert progress.reconcile is not None and "consumer" in progress.reconcile
    consumer = progress.reconcile["consumer"]
    whole = replace(progress.filter, ids=None)
    since, until = whole.since, whole.until
    resumed = progress.next_id > 0  # from its recorded batches' next id

    def then() -> str:
        """What to do once `outbox maintain` has finished a detach: a replay that recorded a
        batch goes on under its number, one that recorded none is compared again."""
        if not (resumed or progress.sent):
            return AGAIN
        resume = (
            f"outbox reconcile --table {shown_argument(table)} --inbox-table "
            f"{shown_argument(inbox)} --resume {progress.number}"
        )
        return f"go on with `{resume}` and the same --inbox-dsn"

    rest = perform(conn, _window(table, since, until, after=progress.next_id), transaction=True)
    for _, missing in _missing_rows(
        conn, table, inbox_conn, inbox, consumer, rest, since, until, chunk, then
    ):
        if progress.left is not None and progress.left <= 0:
            break
        if not missing:
            continue
        ranges = Ranges(keep=len(missing))  # all of them: they are the filter
        for row in missing:
            ranges.add(int(row[0]))
        progress.filter = replay.with_ids(whole, ranges.kept)
        progress.next_id, progress.past_id = int(missing[0][0]), int(missing[-1][0]) + 1
        while not progress.finished:
            perform(
                conn,
                replay.send_batch(
                    table,
                    progress,
                    actor=actor,
                    reason=progress.reason,
                    via="outbox reconcile",
                    then=then,  # its own resume, never `outbox replay`'s (which refuses it)
                ),
                transaction=True,  # the rows and their partitions' notes together
            )
