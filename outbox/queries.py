"""Every statement of the lease protocol, composed once per table with a quoted identifier.

Parameters are named; times always come from the database's now(). The statements are
written so that a generic (prepared) plan is as good as a custom one: the claim walks the
partial indexes in order and the batched statements join `unnest` arrays to the primary key.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cache, cached_property, lru_cache

import psycopg
from psycopg import sql

from outbox.limits import MAX_HEADER_COUNT, MAX_HEADERS_BYTES, MAX_NAME_BYTES, format_bytes
from outbox.stencils import Stencil, stand_in_names
from outbox.table import Table, channel_identifier

REAPED_ERROR = "lease expired on the last attempt (worker crashed, or publish outlived the lease)"
ERROR_HISTORY = 10  # failed attempts kept per message in `errors` (schema v3), newest last


def with_error(error: sql.Composable) -> sql.Composed:
    """`errors` with one more entry (now, this attempt, `error`), cut to the newest ones.
    Only failures write it, so a message that is delivered first time pays nothing."""
    return sql.SQL(
        "jsonb_path_query_array(coalesce(o.errors, '[]') || jsonb_build_array(jsonb_build_object("
        "'at', now(), 'attempt', o.attempts, 'error', {error})), {window})"
    ).format(error=error, window=sql.Literal(f"$[last - {ERROR_HISTORY - 1} to last]"))


# What a claim returns of each row taken (a small payload as the text measured: see `sized`).
# Headers come as the text measured (a row taken has them within the limit, or none), parsed
# row by row (outbox.lease): one row's headers can never fail the decoding of the others, and
# by then they are known to be a small object of strings. The last column is the row's age
# at the claim on the database's clock, for the worker's age-at-publish histogram.
_CLAIMED_COLUMNS = sql.SQL(
    "o.id, o.lease_version, o.attempts, o.aggregate_type, o.aggregate_id, o.event_type, "
    "coalesce(sized.small_body, o.payload::text), o.created_at, sized.headers_text, o.replay, "
    "extract(epoch FROM now() - o.created_at)::float8"
)

# What each claim statement's `picked` holds of a locked row: what `sized` measures.
_PICKED = ("id", "payload", "headers", "event_type", "aggregate_type", "aggregate_id")
_PICKED_COLUMNS = sql.SQL(", ").join(map(sql.Identifier, _PICKED))
_PICKED_OF_C = sql.SQL(", ").join(sql.Identifier("c", name) for name in _PICKED)

# Ordered mode: a row is claimable only if no earlier row of its aggregate is unfinished
# (pending, processing or dead). One probe of the `aggregate` partial index. A replayed row
# (outbox.operations.replay) also waits until no later row of its aggregate is in flight: it is
# earlier than what was sent while it was done, so it must not overtake a later message already
# leased, while that lease lasts (a worker that died holding it would stop the aggregate for
# good: that message is no longer its aggregate's head, so it is never taken over). Once it is
# pending, the aggregate's later rows wait behind it as they would behind any earlier row. On a
# partitioned table a claim checks this within its window; the rest of the table is checked
# after a claim that took replayed rows (`replays_waiting`).
_HEAD_OF_AGGREGATE = sql.SQL(
    " AND NOT EXISTS (SELECT 1 FROM {t} AS prev WHERE prev.aggregate_id = c.aggregate_id"
    " AND prev.id < c.id AND prev.status <> 'done'{within})"
)
_REPLAY_WAITS = sql.SQL(
    " AND (c.replay IS NULL OR NOT EXISTS (SELECT 1 FROM {t} AS later"
    " WHERE later.aggregate_id = c.aggregate_id AND later.id > c.id"
    " AND later.status = 'processing' AND later.lease_until >= now(){within}))"
)


# On a partitioned table (outbox.partitions) each statement names the id range its rows can
# be in, as constants: PostgreSQL then plans, locks and opens those partitions only.
Within = tuple[int, int] | None  # [low, high), or None: the whole table
# A partition's own statements, with ordered mode's checks for an aggregate's other
# messages made within an id range (they may be in earlier partitions): through its parent,
# and in the partitions that make up the range when they are named (none: the parent alone).
Checked = tuple[Table, tuple[int, int], tuple[Table, ...]] | None
# Where ordered mode's checks look: each table with the id range to look in (None: all of it).
Looks = tuple[tuple[sql.Composable, Within], ...]


def _within(within: Within, alias: str | None = None) -> sql.Composable:
    if within is None:
        return sql.SQL("")
    column = sql.Identifier(alias, "id") if alias else sql.Identifier("id")
    return sql.SQL(" AND {c} >= {low} AND {c} < {high}").format(
        c=column, low=sql.Literal(within[0]), high=sql.Literal(within[1])
    )


# What a batch of successes returns: the applied (id, lease_version) pairs only when some
# were not applied (lost leases), so the common case sends back one small row.
# The finalize commits durably, as the claim does: a worker's log of a finalize written is
# the database's record of it, through a crash of the server too (the chaos suite checks
# one against the other across immediate shutdowns).
_APPLIED = sql.SQL(
    "SELECT count(*), CASE WHEN count(*) < %(n)s::int THEN array_agg(id) END, "
    "CASE WHEN count(*) < %(n)s::int THEN array_agg(lease_version) END FROM applied"
)


# Every claim first sends rows whose lease expired on their last attempt to dead: a message
# that kills its worker each time never reaches a finalize, so the claim must end it.
_REAP_CTE = sql.SQL(
    """reaped AS (
    UPDATE {t} AS o SET status = 'dead', last_error = {reaped_error}, errors = {errors},
                   lease_owner = NULL, lease_until = NULL
     WHERE id IN (SELECT id FROM {t}
                   WHERE status = 'processing' AND lease_until < now()
                     AND attempts >= %(max_attempts)s::int{within}
                     FOR UPDATE SKIP LOCKED){within_o}
)"""
)


def _reap(t: sql.Composable, within: Within) -> sql.Composed:
    reaped_error = sql.Literal(REAPED_ERROR)
    return _REAP_CTE.format(
        t=t,
        reaped_error=reaped_error,
        errors=with_error(reaped_error),
        within=_within(within),
        within_o=_within(within, "o"),
    )


# How every claim statement begins, and nothing else does: how `outbox.views.dashboard` tells a
# worker's last claim in pg_stat_activity (which keeps only a statement's first kilobyte).
CLAIM_MARKER = "/* outbox claim */"
_CLAIM = sql.SQL(CLAIM_MARKER)

# Bounded rows (outbox.limits): a row can never crash a worker, and can never cost another row
# anything. The picked rows are measured once they are locked (a row another claim holds is
# never measured), every column a worker loads: the payload as the text a worker receives
# (`payload::text`, what it holds in memory: the stored size may be compressed many times
# over), the names in bytes (octet_length reads a stored value's length without loading it),
# and the headers, which must be a JSON object of at most MAX_HEADER_COUNT string values and
# MAX_HEADERS_BYTES of text: flat by construction, so no depth can reach the worker's JSON
# decoder. A row past a limit goes dead in the same statement with the reason (the column and
# the limit, never the content), and is never sent. The others are taken in the order the
# claim found them while the running total of their payloads fits the byte budget; the first
# of them always, so that a claim never comes back empty while rows are ready (a replica
# holds at most its budget plus one payload, and each row's other columns are bounded). A
# row past the budget stays as it was, for the next claim: the worker asks for fewer rows
# when rows are large, so few are measured in vain.
# `picked` has the locked rows (_PICKED), in the order the claim found them; each payload and
# headers becomes text once (OFFSET 0 keeps the planner from writing the casts out again),
# and a small payload's text is what the claim returns. A large one is not kept between the
# steps of the statement (where it would spill to disk): a row taken makes it again. The
# checks run in the order written (CASE), the cheap ones first; a row without headers (the
# common case) stops after the names. The second OFFSET 0 has them run once a row: flattened,
# `reason` would be written out, and its checks run, at each of its four uses.
_SIZED_CTE = sql.SQL(
    """sized AS (
    SELECT id, small_body, size, reason, headers_text, CASE
           WHEN reason IS NOT NULL THEN 'dead'
           WHEN count(*) FILTER (WHERE reason IS NULL) OVER w = 1
             OR sum(size) FILTER (WHERE reason IS NULL) OVER w
                <= %(claim_bytes)s::bigint THEN 'take'
           ELSE 'cut' END AS verdict
      FROM (SELECT id, size, CASE WHEN size <= 8192 THEN body END AS small_body,
                   CASE WHEN headers_size <= {max_headers} THEN headers_text END AS headers_text,
                   CASE
                   WHEN size > %(max_payload_bytes)s::bigint
                   THEN 'payload of ' || {size_shown} || ' exceeds --max-payload-bytes '
                        || {limit}
                   WHEN octet_length(event_type) > {max_name}
                   THEN 'event_type of ' || {event_type_shown} || ' exceeds ' || {max_name_shown}
                   WHEN octet_length(aggregate_type) > {max_name}
                   THEN 'aggregate_type of ' || {aggregate_type_shown} || ' exceeds '
                        || {max_name_shown}
                   WHEN octet_length(aggregate_id) > {max_name}
                   THEN 'aggregate_id of ' || {aggregate_id_shown} || ' exceeds '
                        || {max_name_shown}
                   WHEN headers IS NULL THEN NULL
                   WHEN headers_size > {max_headers}
                   THEN 'headers of ' || {headers_shown} || ' exceed ' || {max_headers_shown}
                   WHEN jsonb_typeof(headers) <> 'object'
                   THEN 'headers is a JSON ' || jsonb_typeof(headers)
                        || ', not an object of string values'
                   WHEN jsonb_path_exists(headers, {not_a_string})
                   THEN 'headers is not a JSON object of string values (a value is a JSON '
                        || (jsonb_path_query_first(headers, {not_a_string_type}) #>> '{{}}')
                        || ')'
                   -- Fewer bytes than the shortest text of that many entries (`"": ""` each)
                   -- cannot hold too many: the usual headers are never counted.
                   WHEN headers_size >= {count_from}
                    AND jsonb_array_length(jsonb_path_query_array(headers, '$.*'))
                        > {max_header_count}
                   THEN 'headers hold '
                        || jsonb_array_length(jsonb_path_query_array(headers, '$.*'))
                        || ' entries, more than ' || {max_header_count}
                   END AS reason
              FROM (SELECT id, body, octet_length(body)::bigint AS size, headers,
                           headers_text, octet_length(headers_text)::bigint AS headers_size,
                           event_type, aggregate_type, aggregate_id
                      FROM (SELECT id, payload::text AS body, headers,
                                   headers::text AS headers_text,
                                   event_type, aggregate_type, aggregate_id
                              FROM picked OFFSET 0) AS p) AS m OFFSET 0) AS r
    WINDOW w AS (ROWS UNBOUNDED PRECEDING)
), oversized AS (
    UPDATE {t} AS o SET status = 'dead', last_error = sized.reason, errors = {errors},
                   lease_owner = NULL, lease_until = NULL
      FROM sized
     WHERE o.id = sized.id AND sized.verdict = 'dead'{within_o}
)"""
)

# Every claim ends the same way: the rows taken become a new lease, one generation later.
_TAKE_LEASE = sql.SQL(
    """UPDATE {t} AS o
   SET status = 'processing', lease_owner = %(owner)s, lease_until = now() + %(lease)s::interval,
       lease_version = o.lease_version + 1, attempts = o.attempts + 1
  FROM sized
 WHERE o.id = sized.id AND sized.verdict = 'take'{within_o}
RETURNING {columns}"""
)


# The limit as the worker's flag takes it (outbox.limits.format_bytes): 8MiB, 1500 bytes.
_LIMIT_SHOWN = sql.SQL(
    """CASE WHEN mod(%(max_payload_bytes)s::bigint, 1073741824) = 0
                            THEN %(max_payload_bytes)s::bigint / 1073741824 || 'GiB'
                            WHEN mod(%(max_payload_bytes)s::bigint, 1048576) = 0
                            THEN %(max_payload_bytes)s::bigint / 1048576 || 'MiB'
                            WHEN mod(%(max_payload_bytes)s::bigint, 1024) = 0
                            THEN %(max_payload_bytes)s::bigint / 1024 || 'KiB'
                            ELSE %(max_payload_bytes)s::bigint || ' bytes' END"""
)

# A header value that is not a string (`strict`: an object's values, not the object itself).
_NOT_A_STRING = 'strict $.* ? (@.type() != "string")'


def _size_shown(size: str) -> sql.Composed:
    """A size in a reason, for people and in bytes: `3072 kB (3145740 bytes)`, or `1025
    bytes` (pg_size_pretty's own words below 10 kB)."""
    return sql.SQL(
        "CASE WHEN {size} < 10240 THEN {size} || ' bytes' "
        "ELSE pg_size_pretty({size}::bigint) || ' (' || {size} || ' bytes)' END"
    ).format(size=sql.SQL(size))


def _take_lease(t: sql.Composable, within: Within) -> sql.Composed:
    """The measure of `picked` (_PICKED), the death of rows past a limit, and the lease of
    the others (all of them `within`)."""
    # The shortest text of MAX_HEADER_COUNT + 1 entries: `{"": "", ...}`.
    count_from = 2 + (MAX_HEADER_COUNT + 1) * len('"": ""') + MAX_HEADER_COUNT * len(", ")
    within_o = _within(within, "o")
    sized = _SIZED_CTE.format(
        t=t,
        within_o=within_o,
        errors=with_error(sql.SQL("sized.reason")),
        limit=_LIMIT_SHOWN,
        size_shown=_size_shown("size"),
        max_name=sql.Literal(MAX_NAME_BYTES),
        max_name_shown=sql.Literal(format_bytes(MAX_NAME_BYTES)),
        event_type_shown=_size_shown("octet_length(event_type)"),
        aggregate_type_shown=_size_shown("octet_length(aggregate_type)"),
        aggregate_id_shown=_size_shown("octet_length(aggregate_id)"),
        max_headers=sql.Literal(MAX_HEADERS_BYTES),
        max_headers_shown=sql.Literal(format_bytes(MAX_HEADERS_BYTES)),
        headers_shown=_size_shown("headers_size"),
        not_a_string=sql.Literal(_NOT_A_STRING),
        not_a_string_type=sql.Literal(_NOT_A_STRING + ".type()"),
        count_from=sql.Literal(count_from),
        max_header_count=sql.Literal(MAX_HEADER_COUNT),
    )
    return sql.SQL("{sized}\n{take}").format(
        sized=sized, take=_TAKE_LEASE.format(t=t, columns=_CLAIMED_COLUMNS, within_o=within_o)
    )


def _checks(looks: Looks, later: Looks) -> sql.Composed:
    """Ordered mode's checks for an aggregate's earlier messages, in each of `looks`, and
    for a replayed row's later messages in flight, in each of `later`."""
    head = sql.SQL("").join(
        _HEAD_OF_AGGREGATE.format(t=t, within=_within(w, "prev")) for t, w in looks
    )
    replay = sql.SQL("").join(
        _REPLAY_WAITS.format(t=t, within=_within(w, "later")) for t, w in later
    )
    return head + replay


def _claim(
    t: sql.Composable,
    ordered: bool,
    within: Within,
    unfinished: Within,
    looks: Looks = (),
    later: Looks = (),
) -> sql.Composed:
    """Ordered mode's checks look for other unfinished messages `unfinished` (from the
    oldest partition holding one): they may sit in an earlier partition than the window the
    claim takes rows from, so a claim from a partition itself (`t`) looks for them in
    `looks`: its partitioned parent, or the partitions that make up that range; and for a
    replayed row's later messages in `later` (none can be in a partition below it)."""
    itself = ((t, unfinished),)
    head = _checks(looks or itself, later or looks or itself) if ordered else sql.SQL("")
    return sql.SQL(
        """{marker}
WITH {reap}, expired AS (
    SELECT {columns} FROM {t} AS c
     WHERE c.status = 'processing' AND c.lease_until < now()
       AND c.attempts < %(max_attempts)s::int{c_within}{head}
     ORDER BY c.lease_until
     LIMIT %(batch)s::int
       FOR UPDATE OF c SKIP LOCKED
), ready AS (
    SELECT {columns} FROM {t} AS c
     WHERE c.status = 'pending' AND c.available_at <= now(){c_within}{head}
     ORDER BY c.available_at, c.id
     LIMIT %(batch)s::int
       FOR UPDATE OF c SKIP LOCKED
), picked AS (
    SELECT {picked} FROM expired UNION ALL SELECT {picked} FROM ready LIMIT %(batch)s::int
), {take}"""
    ).format(
        t=t,
        head=head,
        c_within=_within(within, "c"),
        reap=_reap(t, within),
        take=_take_lease(t, within),
        marker=_CLAIM,
        columns=_PICKED_OF_C,
        picked=_PICKED_COLUMNS,
    )


def _claim_heads(t: sql.Composable, unfinished: Within) -> sql.Composed:
    """Ordered claim that visits each aggregate once instead of each waiting row.

    A skip scan of the `aggregate` index lists the first unfinished row of every aggregate
    (its head); only heads that are ready, or whose lease expired, are claimed. Its cost grows
    with the number of aggregates that have work, not with the backlog: the better plan when
    a few aggregates hold a deep backlog (see `OrderedClaims` in outbox/lease.py).
    """
    return sql.SQL(
        """{marker}
WITH RECURSIVE {reap}, heads(aggregate_id, id) AS (
    (SELECT aggregate_id, id FROM {t} WHERE status <> 'done'{within}
      ORDER BY aggregate_id, id LIMIT 1)
    UNION ALL
    SELECT n.aggregate_id, n.id FROM heads AS h CROSS JOIN LATERAL (
        SELECT aggregate_id, id FROM {t}
         WHERE status <> 'done' AND aggregate_id > h.aggregate_id{within}
         ORDER BY aggregate_id, id LIMIT 1) AS n
), picked AS (
    SELECT {columns} FROM {t} AS c JOIN heads AS h ON c.id = h.id{c_within}
     WHERE ((c.status = 'pending' AND c.available_at <= now())
        OR (c.status = 'processing' AND c.lease_until < now()
            AND c.attempts < %(max_attempts)s::int)){replay}
     ORDER BY c.available_at, c.id
     LIMIT %(batch)s::int
       FOR UPDATE OF c SKIP LOCKED
), {take}"""
    ).format(
        t=t,
        within=_within(unfinished),
        c_within=_within(unfinished, "c"),
        reap=_reap(t, unfinished),
        take=_take_lease(t, unfinished),
        marker=_CLAIM,
        columns=_PICKED_OF_C,
        replay=_REPLAY_WAITS.format(t=t, within=_within(unfinished, "later")),
    )


def _statement(compose: Callable[[Queries], sql.Composed]) -> cached_property[sql.Composed]:
    """One of the lease protocol's statements, made when first asked for: filled in from its
    stencil when it names tables only (`Queries._names`), else composed."""

    def statement(self: Queries) -> sql.Composed:
        if self._names is None:
            return compose(self)
        return _stencil(len(self._names), compose.__name__).fill(self._names)

    statement.__name__ = compose.__name__
    statement.__doc__ = compose.__doc__
    return cached_property(statement)


class Queries:
    """The lease protocol's statements for a table, or for its rows `within` an id range,
    each composed when first asked for: a partitioned table's claim window composes new ones
    every partition or two, and asks for one or two of them (composing all seven cost more
    Python time than the claim that used one)."""

    def __init__(
        self,
        table: Table,
        within: Within,
        unfinished_low: int | None,
        checked: Checked,
        *,
        stencilled: bool = True,
    ) -> None:
        self._table, self._t, self._within = table, table.ident, within
        # The tables the statements name, when they name no id range: each statement is then
        # its shape's stencil filled with them (outbox.stencils), not composed anew.
        self._names: tuple[sql.Composable, ...] | None = None
        if stencilled and within is None and (checked is None or checked[2]):
            leaves = checked[2] if checked is not None else ()
            self._names = (table.ident, *(leaf.ident for leaf in leaves))
        self._unfinished = within
        if within is not None and unfinished_low is not None:
            self._unfinished = (min(unfinished_low, within[0]), within[1])
        self._checked = None if checked is None else checked[0].ident
        self._looks: Looks = ()
        self._later: Looks = ()
        if checked is not None:
            parent, self._unfinished, leaves = checked
            # Named, a range's few partitions each plan as a plain table's check: an ordered
            # claim on 230 partitions planned in 2.0 ms so, 4.8 ms with its checks through the
            # parent, 1.8 ms on the plain table (medians of EXPLAIN's planning time).
            self._looks = tuple((leaf.ident, None) for leaf in leaves) or (
                (parent.ident, self._unfinished),
            )
            # A replayed row's later messages are never in a partition below its own: with
            # the partitions named, that check looks in this one only (and the claim plans
            # one subquery fewer per partition below).
            if leaves:
                self._later = ((self._t, None),)
        self._fence = sql.SQL(
            "o.id = f.id AND o.status = 'processing' AND o.lease_version = f.version{within}"
        ).format(within=_within(within, "o"))

    @_statement
    def claim(self) -> sql.Composed:
        return _claim(self._t, False, self._within, self._unfinished)

    @_statement
    def claim_ordered(self) -> sql.Composed:
        return _claim(self._t, True, self._within, self._unfinished, self._looks, self._later)

    @cached_property
    def claim_heads(self) -> sql.Composed:
        # Visiting aggregates walks every unfinished row in the range: through the parent.
        if self._checked is not None:
            return _claim_heads(self._checked, self._unfinished)
        return _claim_heads(self._t, self._unfinished)

    @_statement
    def finalize_done(self) -> sql.Composed:
        """The common case, kept lean: a batch of successes."""
        return sql.SQL(
            """WITH applied AS (
UPDATE {t} AS o
   SET status = 'done', done_at = now(), last_error = NULL,
       lease_owner = NULL, lease_until = NULL
  FROM unnest(%(ids)s::bigint[], %(versions)s::bigint[]) AS f(id, version)
 WHERE {fence}
RETURNING o.id, o.lease_version)
{applied}"""
        ).format(t=self._t, fence=self._fence, applied=_APPLIED)

    @_statement
    def finalize(self) -> sql.Composed:
        """Any mix of outcomes, each row fenced on its own lease_version; it returns the
        status each row ended in (a defer past the maximum defer age ends dead)."""
        return sql.SQL(
            """UPDATE {t} AS o
   SET status = CASE WHEN f.deferred AND o.created_at < now() - %(max_defer_age)s::interval
                     THEN 'dead' ELSE f.status END,
       available_at = CASE WHEN f.status = 'pending'
                           THEN now() + make_interval(secs => f.delay) ELSE o.available_at END,
       attempts = o.attempts - f.refund::int,
       last_error = CASE WHEN f.status = 'done' THEN NULL
                         WHEN f.deferred AND o.created_at < now() - %(max_defer_age)s::interval
                         THEN 'maximum defer age exceeded; last ' || f.error
                         ELSE coalesce(f.error, o.last_error) END,
       errors = CASE WHEN f.status = 'done' OR f.error IS NULL THEN o.errors
                     WHEN f.deferred AND o.created_at < now() - %(max_defer_age)s::interval
                     THEN {defer_expired}
                     WHEN f.deferred THEN o.errors
                     ELSE {failed} END,
       done_at = CASE WHEN f.status = 'done' THEN now() END,
       lease_owner = NULL, lease_until = NULL
  FROM unnest(%(ids)s::bigint[], %(versions)s::bigint[], %(statuses)s::text[],
              %(delays)s::float8[], %(errors)s::text[], %(refunds)s::bool[],
              %(deferreds)s::bool[])
       AS f(id, version, status, delay, error, refund, deferred)
 WHERE {fence}
RETURNING o.id, o.lease_version, o.status"""
        ).format(
            t=self._t,
            fence=self._fence,
            # A defer is not a failure, unless it runs past the maximum defer age.
            defer_expired=with_error(sql.SQL("'maximum defer age exceeded; last ' || f.error")),
            failed=with_error(sql.SQL("f.error")),
        )

    @_statement
    def extend(self) -> sql.Composed:
        """The lease keeper's extend: push the expiry of leases still held; a lost one is
        left."""
        return sql.SQL(
            """UPDATE {t} AS o
   SET lease_until = now() + %(lease)s::interval
  FROM unnest(%(ids)s::bigint[], %(versions)s::bigint[]) AS f(id, version)
 WHERE {fence}
RETURNING o.id"""
        ).format(t=self._t, fence=self._fence)


async def listen(conn: psycopg.AsyncConnection[tuple[object, ...]], table: Table) -> sql.Composed:
    """LISTEN on the table's channel as the catalog names it (`Table.channel_sql`), the one
    the trigger notifies however `outbox migrate` and the worker were each given the
    table's name (`outbox`, `public.outbox`). Read at each (re)connection."""
    found = await (await conn.execute(sql.SQL("SELECT {c}").format(c=table.channel_sql))).fetchone()
    channel = str(found[0]) if found and found[0] is not None else table.channel
    return sql.SQL("LISTEN {}").format(channel_identifier(channel))


@cache  # a few shapes: a table, and a partition with its checks' partitions
def _stencil(count: int, name: str) -> Stencil:
    """Statement `name` of a table (and, in ordered mode, the `count - 1` partitions its
    checks look in) composed once with stand-ins for them."""
    first, *others = (Table(None, stand_in) for stand_in in stand_in_names(count))
    checked = (first, (0, 1), tuple(others)) if others else None
    shape = Queries(first, None, None, checked, stencilled=False)
    return Stencil.of(getattr(shape, name), count)


@lru_cache(maxsize=256)
def queries(
    table: Table, within: Within = None, unfinished_low: int | None = None, checked: Checked = None
) -> Queries:
    """The statements for `table`, or for its rows `within` an id range (a partitioned
    table's: outbox.partitions); ordered mode's checks then look from `unfinished_low`, or,
    for a partition's own statements, as `checked` says (the parent, an id range, and the
    partitions that make it up when they can be named)."""
    return Queries(table, within, unfinished_low, checked)


# -- an operator's repairs (outbox.operations.repair) ----------------------------------------------

_REPAIRS = {
    # Back to the queue as if new: claimable now, every attempt available again. The last
    # error stays until the next attempt overwrites it, so people can still see it.
    "requeue": sql.SQL(
        "status = 'pending', available_at = now(), attempts = 0, "
        "lease_owner = NULL, lease_until = NULL"
    ),
    # Done on purpose: unblocks an ordered aggregate; the audit log says it was skipped.
    "skip": sql.SQL("status = 'done', done_at = now(), lease_owner = NULL, lease_until = NULL"),
}


@cache
def repair(table: Table, action: str) -> sql.Composed:
    """Requeue or skip dead rows, each fenced on the lease_version the operator saw, and
    record it in the audit log (`<table>_actions`) in the same statement.

    Returns one row: the ids changed, and the audit record's id."""
    return _repair(table, action, sql.SQL(""))


def repair_between(table: Table, action: str, low: int, high: int) -> sql.Composed:
    """`repair` on a partitioned table, its rows' ids within [low, high) as constants: the
    planner prunes the partitions outside (a join on the ids given prunes none, and plans
    and locks every partition, hundreds of them made ahead). The range is the ids' own, so
    it leaves none of them out."""
    bounds = sql.SQL(" AND o.id >= {low} AND o.id < {high}").format(
        low=sql.Literal(low), high=sql.Literal(high)
    )
    return _repair(table, action, bounds)


def _repair(table: Table, action: str, bounds: sql.Composable) -> sql.Composed:
    return sql.SQL(
        """WITH changed AS (
    UPDATE {t} AS o SET {set}
      FROM unnest(%(ids)s::bigint[], %(versions)s::bigint[]) AS f(id, version)
     WHERE o.id = f.id AND o.status = 'dead' AND o.lease_version = f.version{bounds}
    RETURNING o.id
), recorded AS (
    INSERT INTO {a} (actor, action, message_ids, filter, requested, count)
    SELECT coalesce(%(actor)s::text, current_user), %(action)s::text,
           coalesce(array_agg(id ORDER BY id), '{{}}'), %(filter)s::jsonb,
           %(requested)s::int, count(*)
      FROM changed
    RETURNING id
)
SELECT (SELECT coalesce(array_agg(id ORDER BY id), '{{}}') FROM changed),
       (SELECT id FROM recorded)"""
    ).format(t=table.ident, set=_REPAIRS[action], a=table.sibling("actions"), bounds=bounds)


@lru_cache(maxsize=64)
def replays_waiting(table: Table, low: int) -> sql.Composed:
    """Of replayed rows just claimed (`ids`, `aggregates`), those a later message of whose
    aggregate is in flight: they must wait (`_REPLAY_WAITS`). A partitioned table's claim
    checks that only within its window, where a claim statement must stay cheap to plan; the
    later message may be in any partition above, so this looks through the parent from `low`
    with no upper bound. It runs only after a claim took replayed rows."""
    return sql.SQL(
        """SELECT r.id FROM unnest(%(ids)s::bigint[], %(aggregates)s::text[]) AS r(id, aggregate_id)
 WHERE EXISTS (SELECT 1 FROM {t} AS later
                WHERE later.aggregate_id = r.aggregate_id AND later.id > r.id
                  AND later.status = 'processing' AND later.lease_until >= now()
                  AND later.id >= {low})"""
    ).format(t=table.ident, low=sql.Literal(low))
