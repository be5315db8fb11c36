"""The lease protocol as typed async functions: claim, finalize, extend, release.

Each call is one statement in its own short transaction (autocommit connections), so no
lock or transaction is held while a message is published. Each runs as a `Query`
(outbox.runner) of a statement from `outbox.queries`.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import replace
from datetime import timedelta
from functools import partial
from itertools import pairwise, repeat
from operator import attrgetter, itemgetter
from typing import NamedTuple, TypeVar

import psycopg

from outbox.claim_window import Bounds, ClaimWindow
from outbox.limits import CLAIM_BYTES, WORKER_MAX_PAYLOAD_BYTES
from outbox.models import Message, Outcome, OutcomeKind
from outbox.partitions import Layout, check
from outbox.plumbing.errors import SchemaError
from outbox.plumbing.text import storable
from outbox.queries import Queries, queries, replays_waiting
from outbox.runner import Query, Row, fetch_async
from outbox.table import Table

MAX_ERROR_LENGTH = 2000
# Claims a window's statement must serve for preparing it to pay. Preparing a new statement
# is a round trip of its own, and PostgreSQL plans its first five runs afresh all the same: at
# 1,000-id partitions and batches of 500, a window's statement serves one or two claims, and
# preparing each one cost a claim a round trip more than the plain table's (at the default
# million ids, a partition's statements serve thousands of claims and are prepared).
PREPARED_WINDOW_CLAIMS = 20

# The most partitions an ordered claim's checks name one by one (each a probe of its own
# index per row checked); past these, one check through the parent prunes them per row.
CHECKED_PARTITIONS = 4

AsyncConn = psycopg.AsyncConnection[tuple[object, ...]]
T = TypeVar("T")


async def claim(
    conn: AsyncConn,
    table: Table,
    *,
    owner: str,
    batch: int,
    lease: timedelta,
    max_attempts: int,
    ordered: bool = False,
    by_aggregate: bool = False,
    prepare: bool | None = None,
    max_payload_bytes: int = WORKER_MAX_PAYLOAD_BYTES,
    claim_bytes: int = CLAIM_BYTES,
    window: ClaimWindow | None = None,
) -> list[Message]:
    """Lease up to `batch` messages, oldest first; reaps expired last attempts to dead.

    `ordered` claims only the head of each aggregate; `by_aggregate` finds the heads by
    visiting aggregates rather than waiting rows (see OrderedClaims for when that is better).
    `prepare` is psycopg's: True sends the claim as a prepared statement (its plan is as good
    generic as custom, and planning it is most of an idle claim's time), None leaves it to
    the connection's `prepare_threshold`.

    Rows are bounded (outbox.limits): a row whose payload, as text, is longer than
    `max_payload_bytes`, or whose names or headers are past their limits, goes dead with the
    reason instead of being taken, and the messages taken hold at most `claim_bytes` of
    payload between them, or one message when the first alone is more; the rest stay ready
    for the next claim. A row that cannot be read all the same fails alone: it goes dead with
    the reason and the others are returned.

    On a partitioned table, `window` (outbox.partitions) says which few partitions to look
    in; each claim moves it on.
    """

    def statement(q: Queries, rows: int, budget: int, prepared: bool | None) -> Query[_Claimed]:
        chosen = (q.claim_heads if by_aggregate else q.claim_ordered) if ordered else q.claim
        params = {
            "batch": rows,
            "owner": owner,
            "lease": lease,
            "max_attempts": max_attempts,
            "max_payload_bytes": max_payload_bytes,
            "claim_bytes": budget,
        }
        return Query(chosen, params, _claimed, prepared, binary=True)

    if window is None or window.layout is None:
        claimed = await fetch_async(conn, statement(queries(table), batch, claim_bytes, prepare))
        layout = None
    else:
        # A window's statements name its partitions, so each serves only the claims of a
        # partition or two: prepared only when those are many.
        reused = window.layout.partition_size >= PREPARED_WINDOW_CLAIMS * batch
        claimed = await _claim_in_window(
            conn, table, window, ordered=ordered, batch=batch, budget=claim_bytes,
            statement=partial(statement, prepared=prepare if reused else False),
        )  # fmt: skip
        layout = window.layout
    if claimed.unreadable:
        # Leased already: ended by a finalize fenced on the lease just taken, like any other.
        await finalize(conn, table, claimed.unreadable, layout=layout)
    return claimed.messages


def _queries_within(
    table: Table,
    layout: Layout | None,
    within: tuple[int, int],
    unfinished_low: int | None = None,
) -> Queries:
    """A partitioned table's statements for rows `within` an id range: on the partition
    itself when the range is one partition, else on the parent with the range as constants.
    A partition's ordered claim makes its checks for unfinished messages below the window
    in the partitions from the oldest unfinished one, each named, when they are a few
    (CHECKED_PARTITIONS), else through the parent: a statement that names the parent for
    all it does planned about seven times as long as the plain table's (8.7 ms against
    1.2); the partition's own claim planned in 2.0 ms with its checks naming two partitions,
    4.8 ms with them through the parent, 1.8 ms on the plain table."""
    assert layout is not None
    leaf = layout.leaf_of(table, within)
    if leaf is None:
        return queries(table, within, unfinished_low)
    if unfinished_low is None or unfinished_low >= within[0]:
        return queries(leaf)
    checked = (unfinished_low, within[1])
    leaves = layout.leaves(table, checked) or ()
    if len(leaves) > CHECKED_PARTITIONS:
        leaves = ()
    return queries(leaf, checked=(table, checked, leaves))


async def _claim_in_window(
    conn: AsyncConn,
    table: Table,
    window: ClaimWindow,
    *,
    ordered: bool,
    batch: int,
    budget: int,
    statement: Callable[[Queries, int, int], Query[_Claimed]],
) -> _Claimed:
    """A claim in the window's partitions; if it comes back short, the window has run dry
    (or ready rows wait outside it): read it again and claim the rest at once, so that a
    short claim still means "all there was", as on a plain table (a claimer waits for a
    NOTIFY after one), but for rows below a window that reaches the top of the ids, which
    a reading every WINDOW_TTL finds (`ClaimWindow.claimed`). Unless it came back short for
    having taken its partition's last id
    (`window.ran_out_of_ids`: the caller claims again at once): the rest of the batch, a row
    or so when ids start at 1, cost a statement of its own each time, and left every other
    claim of a drain across two partitions, its finalize through the parent."""
    messages: list[Message] = []
    unreadable: list[Outcome] = []
    looked: Bounds | None = None
    attempt, rechecked = 0, False
    while True:
        wanted = batch - len(messages) - len(unreadable)
        left = budget - sum(len(m.payload_json) for m in messages)
        try:
            bounds = await window.bounds_for_claim(conn, table, batch, ordered=ordered)
            if bounds == looked:
                # Read again, the window is where the claim just looked: the same claim
                # would find what it found (rows committed since announce themselves with
                # a NOTIFY). In ordered mode most short claims end here: their rows wait
                # behind messages in flight.
                break
            looked = bounds
            within = (bounds.low, bounds.high)
            q = _queries_within(table, window.layout, within, bounds.unfinished_low)
            got = await fetch_async(conn, statement(q, wanted, left))
        except psycopg.Error as exc:
            if messages or unreadable:
                # A look after the first failed: what the first leased is returned, not left
                # to its lease's end; the failure comes again at the next claim, its own.
                break
            # A partition the window named is gone: at once again, as the table is now.
            if not isinstance(exc, psycopg.errors.UndefinedTable) or rechecked:
                raise
            if not await _recheck(conn, table, window):
                raise
            rechecked, looked = True, None
            continue
        ids = [*map(_row_id, got.messages), *map(_message_id, got.unreadable)]
        window.claimed(ids, wanted, ordered=ordered)
        messages.extend(got.messages)
        unreadable.extend(got.unreadable)
        taken = sum(len(m.payload_json) for m in got.messages)
        cut_by_budget = bool(got.messages) and taken + taken / len(got.messages) > left
        if attempt or len(ids) >= wanted or cut_by_budget or window.ran_out_of_ids:
            break
        attempt += 1
    messages.sort(key=_row_id)
    if ordered:
        messages = await _hold_back_replays(conn, table, window.layout, messages)
    return _Claimed(messages, unreadable)


async def _recheck(conn: AsyncConn, table: Table, window: ClaimWindow) -> bool:
    """A claim named a partition that is not there: retired under the window (`outbox
    maintain` dropped it, every row done), or attached under another name. The table is
    checked again and the window forgotten, so the next reading starts at its lowest
    partition; its statements go on naming partitions unless the check finds one named
    otherwise (then every one goes through the parent, for good). Whether the claim may go
    again at once: not when the table cannot be checked (it goes through the parent)."""
    try:
        layout = await check(conn, table)
    except (ValueError, SchemaError):
        layout = None
    if layout is None:
        if window.layout is not None and window.layout.named_leaves:
            window.layout = replace(window.layout, named_leaves=False)
        return False
    window.layout = layout
    window.forget()
    return True


async def _hold_back_replays(
    conn: AsyncConn, table: Table, layout: Layout | None, messages: list[Message]
) -> list[Message]:
    """Ordered mode on a partitioned table: the claim checked within its window that no later
    message of a replayed row's aggregate is in flight; this checks the rest of the table
    (`replays_waiting`) and gives back, pending again with the attempt refunded, the replayed
    rows that must wait. Nothing runs unless the claim took replayed rows."""
    replayed = [m for m in messages if m.replay is not None]
    if not replayed or layout is None:
        return messages
    low = layout.span(m.id for m in replayed)[0]
    params = {"ids": [m.id for m in replayed], "aggregates": [m.aggregate_id for m in replayed]}
    waiting = await fetch_async(conn, Query(replays_waiting(table, low), params, _renewed))
    if not waiting:
        return messages
    back = [m for m in replayed if m.id in waiting]
    await finalize(conn, table, [Outcome.release(m) for m in back], layout=layout)
    return [m for m in messages if m.id not in waiting]


_new_tuple = tuple.__new__
_FIELDS = len(Message._fields)
_HEADERS = Message._fields.index("headers")
_row_id, _headers_text = itemgetter(0), itemgetter(_HEADERS)


class _Claimed(NamedTuple):
    messages: list[Message]
    unreadable: list[Outcome]  # dead, each with its reason


def _claimed(rows: list[Row]) -> _Claimed:
    # Sorted as rows (RETURNING order is unspecified), then each row made a Message by
    # tuple.__new__ through map: no Python call per message, where Message._make and a key
    # lambda cost about twice as much (a claim makes one per message). _make's length check,
    # once for all: every row of one statement has the same columns.
    if rows and len(rows[0]) != _FIELDS:
        raise TypeError(f"a claimed row has {len(rows[0])} columns, Message {_FIELDS} fields")
    rows.sort(key=_row_id)
    if not any(map(_headers_text, rows)):  # no headers: the rows are the messages
        return _Claimed(list(map(_new_tuple, repeat(Message), rows)), [])
    messages: list[Message] = []
    unreadable: list[Outcome] = []
    for row in rows:
        text = row[_HEADERS]
        if text is None:
            messages.append(_new_tuple(Message, row))
            continue
        try:
            headers = _parsed_headers(text)
        except (ValueError, RecursionError) as exc:
            message = Message._make((*row[:_HEADERS], None, *row[_HEADERS + 1 :]))
            unreadable.append(Outcome.dead(message, f"headers cannot be read: {exc}"))
            continue
        messages.append(_new_tuple(Message, (*row[:_HEADERS], headers, *row[_HEADERS + 1 :])))
    return _Claimed(messages, unreadable)


def _parsed_headers(text: str) -> dict[str, str]:
    """A row's headers from their text, as the claim checked them: a JSON object of string
    values (ValueError otherwise: the claim's checks and this must never disagree, but if they
    do, the row fails alone)."""
    headers = json.loads(text)
    if not isinstance(headers, dict) or not all(isinstance(v, str) for v in headers.values()):
        raise ValueError("not a JSON object of string values")
    return headers


class OrderedClaims:
    """Chooses, claim by claim, how ordered mode finds the heads of aggregates.

    Walking ready rows in order stops once a batch of heads is found: cheap while heads are
    plentiful, but when a few aggregates hold a deep backlog (and their heads are in flight)
    it walks the whole backlog to find little. Visiting aggregates costs one index probe per
    aggregate with work, whatever the backlog. So: walk rows while that fills batches; after a
    short batch, visit aggregates; when visiting fills a batch (many aggregates), walk again.
    """

    def __init__(self) -> None:
        self.by_aggregate = False

    def observe(self, claimed: int, batch: int) -> None:
        # A short batch from either plan means few claimable heads: visit aggregates next.
        self.by_aggregate = claimed < batch


Applied = Mapping[tuple[int, int], str]  # (id, lease_version) -> the status the row ended in

_message_id, _lease_version, _kind = (attrgetter(f) for f in Outcome._fields[:3])
DONE = OutcomeKind.DONE


def all_done(outcomes: Sequence[Outcome]) -> bool:
    """Every outcome a delivery (the finalize of a batch's deliveries, once per message: a
    count in C instead of a generator)."""
    return list(map(_kind, outcomes)).count(DONE) == len(outcomes)


class AllApplied(Mapping[tuple[int, int], str]):
    """Every outcome of a finalize applied, each row ending `status`: the common case,
    answered without building the map it stands for until something looks an entry up
    (the finalizer only counts it; building it was a tuple and an entry per message)."""

    __slots__ = ("_map", "_outcomes", "_status")

    def __init__(self, outcomes: Sequence[Outcome], status: str) -> None:
        self._outcomes, self._status = outcomes, status
        self._map: dict[tuple[int, int], str] | None = None

    def _built(self) -> dict[tuple[int, int], str]:
        if self._map is None:
            outcomes = self._outcomes
            pairs = zip(map(_message_id, outcomes), map(_lease_version, outcomes), strict=True)
            self._map = dict.fromkeys(pairs, self._status)
        return self._map

    def __len__(self) -> int:
        return len(self._outcomes)

    def __getitem__(self, key: tuple[int, int]) -> str:
        return self._built()[key]

    def __iter__(self) -> Iterator[tuple[int, int]]:
        return iter(self._built())


async def finalize_applied(
    conn: AsyncConn,
    table: Table,
    outcomes: Sequence[Outcome],
    *,
    max_defer_age: timedelta = timedelta(days=1),
    layout: Layout | None = None,
) -> Applied:
    """Apply outcomes, each fenced on its own lease_version.

    Returns the (id, lease_version) of every outcome applied, with the status its row ended
    in. One missing lost its lease: another claim took the row (or reaped it) meanwhile.
    `layout`, a partitioned table's, has the statement address only the partitions that
    hold the outcomes' rows.
    """
    if not outcomes:
        return {}
    outcomes = _in_id_order(outcomes, _message_id)
    held = list(map(_message_id, outcomes))
    ids = _bigint_array(held)
    versions = _bigint_array(map(_lease_version, outcomes))
    if all_done(outcomes):
        params: dict[str, object] = {"ids": ids, "versions": versions, "n": len(outcomes)}

        def done(rows: list[Row]) -> Applied:
            count, applied_ids, applied_versions = rows[0]
            if count == len(outcomes):  # every row applied: the common case sends no ids back
                return AllApplied(outcomes, "done")
            pairs = zip(applied_ids or (), applied_versions or (), strict=True)
            return {(int(i), int(v)): "done" for i, v in pairs}

        return await _held_rows(
            conn, table, layout, held, lambda q: Query(q.finalize_done, params, done)
        )
    params = {
        "ids": ids,
        "versions": versions,
        "statuses": [o.status.value for o in outcomes],
        "delays": [o.delay for o in outcomes],
        "errors": [_storable(o.error) for o in outcomes],
        "refunds": [o.refund_attempt for o in outcomes],
        "deferreds": [o.deferred for o in outcomes],
        "max_defer_age": max_defer_age,
    }
    return await _held_rows(
        conn, table, layout, held, lambda q: Query(q.finalize, params, _applied)
    )


async def _held_rows(
    conn: AsyncConn,
    table: Table,
    layout: Layout | None,
    ids: list[int],
    statement: Callable[[Queries], Query[T]],
) -> T:
    """A statement on rows held (finalize, extend): on a partitioned table, on the
    partitions holding `ids`. When it names a partition that is not there (attached under
    another name since the start), once more through the parent with the range as constants:
    the statement failed before touching a row, and these rows must not be left to their
    lease's end (the claim, when it meets the same partition, checks the table again and
    stops naming partitions if one is named otherwise: `_recheck`)."""
    if layout is None:
        return await fetch_async(conn, statement(queries(table)))
    within = layout.span(ids)
    try:
        return await fetch_async(conn, statement(_queries_within(table, layout, within)))
    except psycopg.errors.UndefinedTable:
        if layout.leaf_of(table, within) is None:
            raise
        return await fetch_async(conn, statement(queries(table, within)))


def _applied(rows: list[Row]) -> Applied:
    return {(int(i), int(v)): str(status) for i, v, status in rows}


async def finalize(
    conn: AsyncConn,
    table: Table,
    outcomes: Sequence[Outcome],
    *,
    max_defer_age: timedelta = timedelta(days=1),
    layout: Layout | None = None,
) -> set[int]:
    """`finalize_applied`, answering only which ids were applied."""
    applied = await finalize_applied(
        conn, table, outcomes, max_defer_age=max_defer_age, layout=layout
    )
    return {message_id for message_id, _ in applied}


def _in_id_order(items: Sequence[T], key: Callable[[T], int]) -> Sequence[T]:
    """`items` by id: a statement on rows held (finalize, extend) probes, and so locks, its
    rows in its arrays' order (a Nested Loop over them: tests/test_query_plans.py). The
    lease keeper's extend (its ids as claimed) and a finalize of the same rows (as their
    deliveries ended) run at once on two connections; in two orders, each held a row the
    other waited for, and PostgreSQL failed one (`deadlock detected`): an extension lost
    (a second delivery, once the lease ran out) or a finalize retried. Sorted here, on the
    worker, rather than locked in order by the statement (a SELECT ... ORDER BY id FOR NO
    KEY UPDATE before the UPDATE): that cost each row a lock record of its own, 56 bytes of
    WAL and 15% of the finalize's time."""
    if all(key(a) < key(b) for a, b in pairwise(items)):
        return items  # already: a claim's messages come in id order
    return sorted(items, key=key)


def _storable(error: str | None) -> str | None:
    return None if error is None else storable(error, MAX_ERROR_LENGTH)


def _bigint_array(values: Iterable[int]) -> str:
    """An array literal for `::bigint[]` (`{1, 2, 3}`): much cheaper than adapting a list
    element by element, and a list's own repr, in C, beats joining each int's str."""
    return f"{{{str(list(values))[1:-1]}}}"


async def extend(
    conn: AsyncConn,
    table: Table,
    messages: Sequence[Message],
    *,
    lease: timedelta,
    layout: Layout | None = None,
) -> set[int]:
    """The lease keeper's extend: renew the leases still held; the ids renewed."""
    if not messages:
        return set()
    messages = _in_id_order(messages, _row_id)
    held = [m.id for m in messages]
    params = {"ids": held, "versions": [m.lease_version for m in messages], "lease": lease}
    return await _held_rows(conn, table, layout, held, lambda q: Query(q.extend, params, _renewed))


def _renewed(rows: list[Row]) -> set[int]:
    return {int(row[0]) for row in rows}


async def release(
    conn: AsyncConn, table: Table, messages: Sequence[Message], *, layout: Layout | None = None
) -> set[int]:
    """Give messages back (shutdown): pending, available now, the attempt refunded."""
    return await finalize(conn, table, [Outcome.release(m) for m in messages], layout=layout)
