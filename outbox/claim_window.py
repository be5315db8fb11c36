"""A worker's claim window on a partitioned outbox table: the few partitions its claims look
in, moved on by the claims themselves and read again from the catalog and the partial
indexes now and then (outbox.partitions has the layout it works on)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from functools import lru_cache

import psycopg
from psycopg import sql

from outbox.partitions import (
    FIRST_ID,
    PAST_ID,
    Layout,
    check,
    last_id_given,
    made_top,
    sequence_unreadable,
    written_past,
)
from outbox.plumbing.errors import SchemaError
from outbox.runner import Query, Row, fetch_async, first_row
from outbox.table import Table

# How long a worker trusts the window it read: a row that became ready below it (a retry come
# due, a requeue) or an expired lease waits at most this long for the next reading (or for a
# short claim, which reads it at once). A reading costs a few statements over the partitions
# from the oldest unfinished row: in a 30,000-row drain, readings once a second cost a tenth
# of the drain; a retry's backoff and a lease are seconds to minutes anyway.
WINDOW_TTL = 5.0
# How long readings may start from the oldest unfinished row they last found rather than
# from the lowest partition (see ClaimWindow).
FLOOR_TTL = 30.0
# Partitions a reading statement looks in at a time.
READING_PARTITIONS = 4
# Readings of the oldest unfinished row kept until every transaction that may hold an id
# below theirs has ended (see Settling); past it the newest two are merged into one, which
# settles later, never wrongly.
SIGHTINGS_KEPT = 16
# The statement's snapshot's xmin: no transaction below it is still open (xid8, as a number).
_XMIN = sql.SQL("pg_snapshot_xmin(pg_current_snapshot())::text::bigint")
# Past every transaction id handed out so far: this statement's own, plus one (it takes one,
# which costs a commit record and no flush). Not the snapshot's xmax: that is past the newest
# transaction *ended*, and an open one that began after it is in neither bound nor list.
_PAST_EVERY_XID = sql.SQL("pg_current_xact_id()::text::bigint + 1")
# How often a worker on a plain table looks whether it has been converted meanwhile, should it
# have missed that NOTIFY: its claims through the parent work until then, only slower.
LAYOUT_TTL = 30.0


@dataclass(frozen=True)
class Bounds:
    """Constant id ranges a claim statement is composed with (each a distinct statement,
    prepared once per connection like the plain one)."""

    low: int  # the window: where ready rows are looked for
    high: int
    # Ordered mode: where an unfinished earlier message of an aggregate may be (the oldest
    # partition holding a pending, processing or dead row, up to the window's end).
    unfinished_low: int


def _ids(within: tuple[int, int]) -> sql.Composable:
    return sql.SQL(" AND id >= {low} AND id < {high}").format(
        low=sql.Literal(within[0]), high=sql.Literal(within[1])
    )


def _extent(table: Table, *, lowest: bool) -> Query[tuple[int | None, int | None, int, int]]:
    """The first id of the lowest partition (if asked: it reads every partition's bound in
    the catalog, as `read_partitions` does), the last id the sequence gave (None:
    unreadable, `last_id_given`), the snapshot's xmin, and past every transaction id handed
    out once that last id was read (in this order: left to right); opening no partition."""
    lowest_id = (
        sql.SQL(
            """(SELECT min(substring(pg_get_expr(p.relpartbound, 0) FROM {first})::bigint)
          FROM pg_inherits i JOIN pg_class p ON p.oid = i.inhrelid
         WHERE i.inhparent = {t}::regclass)"""
        )
        if lowest
        else sql.SQL("NULL::bigint")
    )
    statement = sql.SQL("SELECT {lowest_id}, {last}, {xmin}, {past}").format(
        lowest_id=lowest_id.format(t=table.regclass_literal, first=sql.Literal(FIRST_ID)),
        last=last_id_given(table),
        xmin=_XMIN,
        past=_PAST_EVERY_XID,
    )
    return Query(statement, None, first_row(_parse_extent))


def _parse_extent(row: Row | None) -> tuple[int | None, int | None, int, int]:
    assert row is not None
    return tuple(None if value is None else int(value) for value in row)  # type: ignore[return-value]


def _written_past(table: Table, last: int) -> Query[int | None]:
    """Past the last id of the highest partition written past the sequence's `last` id, or
    None. Only its partitions past `last` have their file's size looked at."""
    statement = sql.SQL(
        """SELECT max(w.high) FROM (
  SELECT p.oid,
         substring(pg_get_expr(p.relpartbound, 0) FROM {first})::bigint AS low,
         substring(pg_get_expr(p.relpartbound, 0) FROM {past})::bigint AS high
    FROM pg_inherits AS i JOIN pg_class AS p ON p.oid = i.inhrelid
   WHERE i.inhparent = {t}::regclass) AS w
 WHERE {written}"""
    ).format(
        first=sql.Literal(FIRST_ID),
        past=sql.Literal(PAST_ID),
        t=table.regclass_literal,
        written=written_past(sql.SQL("w.oid"), sql.SQL("w.low"), sql.Placeholder("last")),
    )
    return Query(statement, {"last": last}, first_row(lambda row: None if row is None else row[0]))


@lru_cache(maxsize=64)
def _window_reading(
    table: Table, within: tuple[int, int], leaves: tuple[Table, ...] | None = None
) -> Query[Row]:
    """Where, `within` the live ids, the oldest ready row (or expired lease) and the oldest
    unfinished row are, and the snapshot's xmin. Each a probe of a partial index per
    partition in the range: read after a short claim and once a WINDOW_TTL, never per claim.
    Named by `leaves`, the partitions that make up the range, when given: the same probes
    through the parent planned about 4.7 times as long (ordered mode reads often: dozens of
    times a drain)."""
    statement = sql.SQL("SELECT {ready}, {unfinished}, {xmin}").format(
        ready=_least(table, within, leaves, _READY),
        unfinished=_least(table, within, leaves, _UNFINISHED),
        xmin=_XMIN,
    )
    return Query(statement, None, first_row(_one_row))


@lru_cache(maxsize=64)
def _oldest_unfinished(
    table: Table, within: tuple[int, int], leaves: tuple[Table, ...] | None = None
) -> Query[Row]:
    """The oldest unfinished row `within`, the snapshot's xmin, and past every transaction id
    handed out as it ran (taken after the snapshot)."""
    statement = sql.SQL("SELECT {unfinished}, {xmin}, {past}").format(
        unfinished=_least(table, within, leaves, _UNFINISHED),
        xmin=_XMIN,
        past=_PAST_EVERY_XID,
    )
    return Query(statement, None, first_row(_one_row))


# A row a claim may take: pending and due, or an expired lease (each its own partial index).
_READY = (
    "status = 'pending' AND available_at <= now()",
    "status = 'processing' AND lease_until < now()",
)
# An unfinished row: pending or processing (one partial index), or dead (another).
_UNFINISHED = "status IN ('pending', 'processing')", "status = 'dead'"


def _one_row(row: Row | None) -> Row:
    assert row is not None, "a SELECT without FROM returns its row"
    return row


def _least(
    table: Table, within: tuple[int, int], leaves: tuple[Table, ...] | None, wheres: tuple[str, ...]
) -> sql.Composable:
    """The lowest id `within` whose row matches one of `wheres`: a probe of a partial index
    for each, on each of `leaves` from the lowest up to the first holding such a row
    (`coalesce` evaluates no further: a later partition's ids are all higher), or through
    the parent with the range as constants.

    Looking no further is what makes ordered mode's catch-ups cheap: the partitions a
    catch-up looks in are those the drain has just finished or is finishing, whose indexes
    hold an entry for each row version no vacuum has removed yet, each visited in the heap.
    Probing every partition of the range (`least`) cost the ordered drain of 30 partitions of
    1,000 ids about a tenth of its speed: 0.80x to 0.82x of the plain table against 0.92x to
    0.98x, three sittings of six alternating rounds."""
    sources = [(t.ident, sql.SQL("")) for t in leaves] if leaves else [(table.ident, _ids(within))]
    return sql.SQL("coalesce({})").format(
        sql.SQL(", ").join(
            sql.SQL("least({})").format(
                sql.SQL(", ").join(
                    sql.SQL("(SELECT min(id) FROM {t} WHERE {where}{ids})").format(
                        t=t, where=sql.SQL(where), ids=ids
                    )
                    for where in wheres
                )
            )
            for t, ids in sources
        )
    )


class Settling:
    """Where the oldest unfinished row is, allowing for rows not yet committed: the floor.

    A reading sees committed rows only. A transaction open while it read may hold an id
    below what it found (taken before, committed after: a producer's transaction that lasts
    while the rows after it are delivered), and that row must be found by the readings
    (which start at the floor) and, in ordered mode, stop its aggregate's later messages
    (the head check looks from the floor). So what a reading finds is a sighting, with a
    bound past every transaction id handed out before it looked; the floor moves up to it
    once a later statement's snapshot xmin is at or past that bound (each of those
    transactions has ended) and no higher than what was found from that statement on (it
    sees the rows they committed). What a reading finds is never past the partition of the
    sequence's next id as it began: ids taken later may belong to transactions still open
    that began after the bound.

    Left open: an id whose transaction had no transaction id yet when the bound was taken
    (within the insert that took it, between the sequence's nextval and the row's write),
    and sequences with a CACHE of more than one (a session's cached ids come out of order);
    the reading from the lowest partition every FLOOR_TTL finds such a row.
    """

    def __init__(self) -> None:
        self.floor: int | None = None  # None: none settled, a reading starts at the lowest
        self._sightings: list[tuple[int, int]] = []  # (floor found, its transaction bound)

    def forget(self) -> None:
        self.floor = None
        self._sightings.clear()

    def settle(self, found: int, start: int, xmin: int, bound: int) -> int:
        """The floor after a reading that looked from `start` and found the oldest unfinished
        row's partition at `found`: `bound` is past every transaction id handed out before
        it looked, `xmin` its first look's snapshot's."""
        floor = start if self.floor is None else self.floor
        kept = []
        for seen, past in [*self._sightings, (found, bound)]:
            if past <= xmin:  # every transaction that may hold an id below has ended
                floor = max(floor, min(seen, found))
            else:
                kept.append((seen, past))
        if len(kept) > SIGHTINGS_KEPT:
            # The newest two as one: the lower floor, once the later bound is passed. Never
            # the oldest dropped: those are the first to settle.
            (older, older_past), (newer, newer_past) = kept[-2:]
            kept[-2:] = [(min(older, newer), max(older_past, newer_past))]
        self._sightings = kept
        # A reading that found a row below the floor (one the cases above leave): from there.
        self.floor = min(floor, found)
        return self.floor


class ClaimWindow:
    """A worker's view of where its claims look: the partition of the oldest ready row (or
    as many from there as a batch needs).

    Moved forward by the claims themselves: a full claim's oldest id is where the next one
    starts, a short one sends the next to the following partitions (up to the ids the last
    reading saw, then it reads again), and it is read again at least every WINDOW_TTL. A
    short claim on a window just read at the top may have found nothing claimable while rows
    wait below (ordered mode: heads behind a blocked aggregate's rows), so the next claim
    looks from there up to the highest id, once.

    A reading looks from the oldest unfinished row the last one found (unfinished rows only
    end: a requeued dead row was unfinished already) up to the sequence's last id, and from
    the lowest partition every FLOOR_TTL, for a row committed long after its id was taken;
    that reading, finding nothing ready, also looks past the sequence's partition for a row
    a producer wrote with an id of its own (`written_past`).

    A replay sends done rows of any partition back to pending, below the floor: each of its
    batches notifies the table's channel with `REPLAY_NOTICE`, and a worker hearing it calls
    `forget`, so that its next claim reads again from the lowest partition (where the
    replayed rows now count as unfinished, for the head check).

    A worker makes one before it knows its table; `layout` is set when the table is checked
    (None: a plain table, which claims have no window on).
    """

    def __init__(self, layout: Layout | None = None) -> None:
        self.layout = layout
        self._bounds: Bounds | None = None
        self._width = 0
        self._read_at = 0.0
        self._fresh = False  # no claim since the window was read
        self._widen = False
        self._floor: int | None = None  # where readings start
        self._settling = Settling()  # what `_floor` may move up to
        self._floor_at = 0.0
        self._top = 0  # past the last id given at the last reading, rounded to a partition
        self._made_top = 0  # past the highest partition made, as last looked at
        self.unfinished_behind = False  # the window moved on: the head check's start may too
        # Where the claim that moved the window took rows (leased: unfinished, as far as any
        # look could tell): a catch-up looks no further (see `catch_up`).
        self._claimed_low: int | None = None
        self._forgotten = 0  # how many times `forget` was called: a reading under way is void
        self._layout_at = time.monotonic()  # when a plain table's layout was last looked at
        self._relearn = False  # told to look again (a forget)
        # The last claim came back short only because it took its partition's last id: the
        # window has moved to the next partition, and the next claim should go at once.
        self.ran_out_of_ids = False
        # Whether new rows announce themselves (the worker's listener is up), and whether one
        # has since the last reading began: see `claimed`, ordered mode.
        self.announcing = False
        self._announced = True

    def announced(self) -> None:
        """A NOTIFY of new rows: they may lie past the window's top."""
        self._announced = True

    def forget(self) -> None:
        """Drop the bounds and the floor: the next claim reads from the lowest partition. A
        reading under way when this is called is thrown away, not kept. On a plain table,
        the next claim looks first whether it has been partitioned since."""
        self._bounds, self._floor = None, None
        self._settling.forget()
        self._made_top = 0  # partitions may have been dropped or renamed since
        self._forgotten += 1
        self._relearn = True

    def layout_due(self) -> bool:
        """A plain table's worker looks again whether the table has been converted to the
        partitioned layout: when told (a forget: a NOTIFY `layout`, a reconnection) and
        every LAYOUT_TTL."""
        if self.layout is not None:
            return False
        return self._relearn or time.monotonic() - self._layout_at > LAYOUT_TTL

    async def learn_layout(
        self, conn: psycopg.AsyncConnection[tuple[object, ...]], table: Table
    ) -> Layout | None:
        """Look whether the table is partitioned now; its layout, kept from now on (None: it
        is still plain, or partitioned in a way the claims cannot address, which they then
        go on reaching through the parent)."""
        self._relearn, self._layout_at = False, time.monotonic()
        try:
            layout = await check(conn, table)
        except (ValueError, SchemaError):
            return None
        if layout is not None:
            self.forget()
            self._relearn = False
            self.layout = layout
        return layout

    async def bounds_for_claim(
        self,
        conn: psycopg.AsyncConnection[tuple[object, ...]],
        table: Table,
        batch: int,
        *,
        ordered: bool,
    ) -> Bounds:
        """The bounds the next claim is composed with: read again when stale (or forgotten
        meanwhile), the head check's start caught up in ordered mode."""
        while True:
            forgotten = self._forgotten
            if self.stale():
                await self.read(conn, table, batch)
            elif ordered and self.unfinished_behind:
                await self.catch_up(conn, table)
            if forgotten == self._forgotten and self._bounds is not None:
                return self._bounds

    def stale(self) -> bool:
        return self._bounds is None or time.monotonic() - self._read_at > WINDOW_TTL

    async def read(
        self, conn: psycopg.AsyncConnection[tuple[object, ...]], table: Table, batch: int
    ) -> None:
        assert self.layout is not None, "a plain table has no window"
        size = self.layout.partition_size
        forgotten = self._forgotten
        self._announced = False  # one heard from here on may be past what this reads
        now = time.monotonic()
        refloor = self._floor is None or now - self._floor_at > FLOOR_TTL
        lowest, last_id, xmin, bound = await fetch_async(conn, _extent(table, lowest=refloor))
        if last_id is None:
            raise await sequence_unreadable(conn, table)
        floor = self._floor if not refloor and self._floor is not None else lowest or 0
        top = (last_id // size + 1) * size
        if top > self._made_top:
            # Ids may have been given past every partition (inserts no partition took, their
            # ids spent): no row is there, and a window naming such a partition would fail
            # every claim until one is made. Looked at only when the ids pass what was seen.
            self._made_top = await made_top(conn, table, self.layout)
        top = min(top, self._made_top) if self._made_top else top
        reading_from = min(floor, top)
        ready, unfinished, looked_at = await self._first_ready(conn, table, reading_from, top)
        xmin = looked_at or xmin  # the first look's, when one was made
        if ready is None and refloor:
            # Nothing ready up to the sequence's partition: a row a producer wrote with an
            # id of its own may wait past it (`written_past`, as outbox stats finds it).
            # Looked for with the floor only: over 200 partitions made ahead, each file's
            # size cost ten times the rest of a reading that finds nothing.
            past = await fetch_async(conn, _written_past(table, last_id))
            if past is not None and past > top:
                ready, found, looked_at = await self._first_ready(conn, table, top, int(past))
                xmin = min(xmin, looked_at or xmin)
                unfinished = found if unfinished is None else unfinished
                top = int(past)
        if forgotten != self._forgotten:
            return  # forgotten while it read: read again from the lowest partition
        if refloor:
            self._floor_at = now
        # One partition when a batch fits in one: a statement over a single partition plans
        # and runs as on a plain table (over several, each row's probe goes through an Append
        # that prunes per row).
        self._width = max(1, -(-batch // size)) * size
        self._top = top
        start = ready if ready is not None else min(last_id, top - 1)
        low = int(start) // size * size
        high = max(low + self._width, top) if self._widen else low + self._width
        unfinished_low = int(unfinished) // size * size if unfinished is not None else low
        # Never past the partition of the next id as the reading began (see Settling).
        found = min(unfinished_low, low, (last_id + 1) // size * size)
        # Where this reading looked from, not the ready row it found: with no floor settled
        # yet (a first reading, a forget) the floor must stay there while a transaction open
        # during the reading may still commit a row below what it found.
        self._floor = self._settling.settle(found, reading_from // size * size, xmin, bound)
        self._bounds = Bounds(low, high, self._floor)
        self._read_at = now
        self._fresh, self._widen, self.unfinished_behind = True, False, False
        self._claimed_low = None

    async def _first_ready(
        self,
        conn: psycopg.AsyncConnection[tuple[object, ...]],
        table: Table,
        start: int,
        end: int,
    ) -> tuple[int | None, int | None, int | None]:
        """The first ready row (or expired lease) from `start` up to `end`, the first
        unfinished row of the partitions read until then, and the first look's snapshot's
        xmin (None: nothing to look at).
        Partition by partition, a few at a time, up to the first ready row: a statement over
        them all would plan every partition (a reading over 30 of them cost more than the
        claims of a 30,000-row drain)."""
        assert self.layout is not None
        size = self.layout.partition_size
        ready = unfinished = first_xmin = None
        chunk = READING_PARTITIONS * size
        for low in range(start // size * size, end, chunk):
            within = (low, min(low + chunk, end))
            leaves = self.layout.leaves(table, within)
            ready, found, xmin = await fetch_async(conn, _window_reading(table, within, leaves))
            unfinished = found if unfinished is None else unfinished
            first_xmin = int(xmin) if first_xmin is None else first_xmin
            if ready is not None:
                break
        return ready, unfinished, first_xmin

    async def catch_up(
        self, conn: psycopg.AsyncConnection[tuple[object, ...]], table: Table
    ) -> None:
        """Ordered mode, after the window moved: the head check starts from the oldest
        unfinished row again, so it probes no partition finished meanwhile.

        It looks below the partition where the claim that moved the window took rows, not
        up to the window: that partition holds rows this worker has just leased, so a look
        into it could only find them, after walking its index's entries of the rows done
        before them (in a drain, the partition just left: most of the rows the look
        visited)."""
        b = self._bounds
        assert b is not None and self.layout is not None
        self.unfinished_behind = False
        below = b.low if self._claimed_low is None else min(b.low, self._claimed_low)
        self._claimed_low = None
        if b.unfinished_low >= below:
            return
        forgotten = self._forgotten
        behind = (b.unfinished_low, below)
        leaves = self.layout.leaves(table, behind)
        found, xmin, bound = await fetch_async(conn, _oldest_unfinished(table, behind, leaves))
        if forgotten != self._forgotten:
            return
        size = self.layout.partition_size
        unfinished_low = below if found is None else int(found) // size * size
        # Ids below the window's low were all taken before this look began, by transactions
        # whose ids are below its bound (see Settling).
        self._floor = self._settling.settle(unfinished_low, b.unfinished_low, int(xmin), int(bound))
        self._bounds = Bounds(b.low, b.high, self._floor)

    def bounds(self) -> Bounds:
        assert self._bounds is not None, "read the window first"
        return self._bounds

    def claimed(self, ids: list[int], wanted: int, *, ordered: bool = False) -> None:
        """After a claim: a full one moves the window to its oldest id; a short one means the
        window has run dry (or rows wait outside it): the next claim looks in the next
        partitions, or, past the ids the last reading saw, reads the window again. In
        ordered mode a short claim reads it again: the rows left behind are an aggregate's
        next messages, claimable as soon as their predecessors are done. Unless, in either
        mode, the window reaches the top of the ids already and, listening, no new row was
        announced since it was read: then it stays (a reading every WINDOW_TTL still looks
        below it).

        A claim that took its window's last id, full or short and in either mode, moves the
        window on to the next partition: its ids are all given out (rows it left behind are
        found by the next reading), so the next claim goes there with no reading and no
        empty claim between. Short, it sets `ran_out_of_ids`: its caller claims again at
        once, and from then on each claim of a drain stays within one partition."""
        fresh, self._fresh = self._fresh, False
        self.ran_out_of_ids = False
        b = self._bounds
        if b is None or self.layout is None:
            return
        short = len(ids) < wanted
        took_last = bool(ids) and max(ids) == b.high - 1
        if b.high < self._top and (took_last or (short and not ordered)):
            low = self.layout.present_from(b.high)
            self._bounds = Bounds(low, low + self._width, b.unfinished_low)
            self.unfinished_behind = b.unfinished_low < low
            if ids:
                size = self.layout.partition_size
                self._claimed_low = min(ids) // size * size
            self.ran_out_of_ids = took_last and short
            return
        if short:
            if b.high >= self._top and self.announcing and not self._announced:
                # Wide to the top already, and no row announced since it was read: a reading
                # would find these bounds again. Below them a row becomes ready by a late
                # commit (announced too: a reading follows), a retry coming due or a lease
                # running out (the reading every WINDOW_TTL finds those). In ordered mode
                # the rows left wait behind their aggregates' messages in flight: with a few
                # busy aggregates every ordered claim is short, and reading after each halved
                # the claims a second. At the end of a drain a reading would look from the
                # floor the last one found, over every partition the drain went through, and
                # its first look into each finished partition's indexes walks entries no
                # vacuum has removed yet (70 ms over 30 partitions of 1,000 ids: a tenth of
                # the drain).
                return
            self._widen = fresh
            self._bounds = None
            return
        size = self.layout.partition_size
        low = max(min(ids) // size * size, b.low)
        # The window stays one partition when a batch fits in one, even where this one's last
        # rows may not fill the next claim: that claim comes back short at the partition's
        # end and the next one starts at the next partition (see outbox.lease), statements
        # each planned as on a plain table, where one statement over the two through the
        # parent planned three to four times as long.
        high = low + self._width
        if (low, high) != (b.low, b.high):
            self._bounds = Bounds(low, high, b.unfinished_low)
            self.unfinished_behind = b.unfinished_low < low
