"""Where the screens get their data and send their actions: a `Source`.

`PgSource` is the real one: the queries of `outbox.stats`, `dead_letters`, `dashboard`,
`repair` and `pausing` over psycopg's async connections, so a query never blocks the UI's
event loop.
Tests and snapshots substitute a `Source` of fixed data.

The app reads every source through `EscapedSource`: what any query returns reaches the
screens with each of its strings escaped (`outbox.plumbing.text.printable`), so no widget can put a
producer's ESC on the operator's terminal. The few strings that go back to the database as
keys (a destination's name, an error group) are turned back into what the database holds.

Each poller has its own connection ("channel"): a slow error-group query never delays the
dashboard, and one poll at a time per channel means a connection is never shared by two
queries. A connection that fails is dropped and the next use reconnects, so the app
recovers by itself from a restarted server or a killed backend.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar, cast

import psycopg

from outbox.operations import pausing, repair, replay
from outbox.operations.repair import Action, ActionRecord, ActionResult, Seen
from outbox.operations.replay import DoneRow, Preview, Progress, ReplayFilter
from outbox.plumbing import dberrors
from outbox.plumbing.redact import address_label, dsn_label
from outbox.plumbing.text import first_line, printable
from outbox.runner import Query, fetch_async, perform_async
from outbox.schema import SchemaError, check_table, serves_ordering
from outbox.session import home_first
from outbox.stats import (
    DestinationState,
    QueueStats,
    Window,
    destination_states,
    queue_stats_async,
    unfinished_window,
)
from outbox.table import Table
from outbox.tui.session import configure_session
from outbox.views import dashboard, dead_letters
from outbox.views.dashboard import Blocked, BlockingHead, LeaseHolder, Session
from outbox.views.dead_letters import DeadPage, ErrorGroup, MessageDetail
from outbox.views.filters import DeadFilter, path_check

T = TypeVar("T")
APPLICATION_NAME = "outbox-tui"
CONNECT_TIMEOUT = 5  # seconds: a dead server shows up in the status line quickly
EXACT_DONE_BELOW = 100_000  # rows: below this, done is counted, not estimated


class ReadOnlyError(RuntimeError):
    """An action was attempted with --read-only."""


@dataclass(frozen=True)
class Overview:
    """One dashboard poll."""

    stats: QueueStats
    holders: list[LeaseHolder]
    blocked: Blocked | None  # only in ordered mode


class Source(Protocol):
    read_only: bool

    @property
    def label(self) -> str:
        """Where the data comes from, for the top bar (never with a password)."""
        ...

    async def check(self, ordered: bool) -> str | None:
        """A problem with the table people should know about (e.g. needs `migrate`, or
        ordered mode's index when `ordered`)."""
        ...

    # Ordered mode's figures (the claimable heads, blocked aggregates, a message's place in
    # its aggregate) probe the ordering index; without it each poll would read every
    # unfinished row, or every row of an aggregate. So each such read first looks the index
    # up in the catalog (one small query) and leaves those figures out without it; the
    # status line says what to run (check).
    async def overview(self, ordered: bool) -> Overview: ...

    async def dead_page(
        self, f: DeadFilter, *, before: int | None, after: int | None, limit: int
    ) -> DeadPage: ...

    async def dead_count(self, f: DeadFilter) -> int: ...

    async def check_filter(self, f: DeadFilter) -> str | None:
        """What the database finds wrong with the filter, None if nothing."""
        ...

    async def error_groups(self, f: DeadFilter) -> list[ErrorGroup]: ...

    async def blocking_heads(self) -> list[BlockingHead] | None:
        """Ordered mode's dead heads; None on a table without ordered mode's index (reading
        them there would scan the table; `check` says what to run)."""
        ...

    async def sessions(self) -> list[Session]: ...

    async def message(self, message_id: int) -> MessageDetail | None: ...

    async def history(self, message_id: int) -> list[ActionRecord]: ...

    async def recent_actions(self) -> list[ActionRecord]: ...

    async def targets(
        self, f: DeadFilter | None = None, ids: Sequence[int] | None = None
    ) -> list[Seen]: ...

    async def apply(
        self, action: Action, seen: Sequence[Seen], recorded: dict[str, Any]
    ) -> ActionResult: ...

    async def destinations(self) -> list[DestinationState]:
        """Every destination with a row (outbox.destinations), by name."""
        ...

    async def change_destination(
        self, verb: pausing.Verb, destination: str, reason: str | None
    ) -> pausing.HandChange:
        """Pause (with `reason`) or resume a destination, recorded in the audit log."""
        ...

    async def done_messages(self, f: ReplayFilter) -> tuple[Preview, list[DoneRow]]:
        """What a replay of `f` would send (outbox.operations.replay), and its first messages."""
        ...

    async def replay(self, shown: Preview) -> Progress:
        """Send again what `shown` previewed, recorded in the audit log."""
        ...

    async def close(self) -> None: ...


class PgSource:
    def __init__(self, dsn: str, table: Table, *, read_only: bool = False) -> None:
        self.dsn = dsn
        self.table = table
        self.read_only = read_only
        self._connections: dict[str, psycopg.AsyncConnection[Any]] = {}
        self._label = dsn_label(dsn)
        self._small_table = False  # known after the first poll's estimate

    @property
    def label(self) -> str:
        return self._label

    async def _connection(self, channel: str) -> psycopg.AsyncConnection[Any]:
        conn = self._connections.get(channel)
        if conn is not None and not conn.closed and not conn.broken:
            return conn
        self._connections.pop(channel, None)
        conn = await psycopg.AsyncConnection.connect(
            self.dsn,
            autocommit=True,
            connect_timeout=CONNECT_TIMEOUT,
            application_name=APPLICATION_NAME,
        )
        await configure_session(conn, read_only=self.read_only)
        # What is named after the table, in the table's schema (see `home_first`).
        await perform_async(conn, home_first(self.table))
        info = conn.info
        self._label = address_label(info.user, info.host, str(info.port), info.dbname)
        self._connections[channel] = conn
        return conn

    async def _run(
        self, channel: str, work: Callable[[psycopg.AsyncConnection[Any]], Awaitable[T]]
    ) -> T:
        conn = await self._connection(channel)
        try:
            return await work(conn)
        except (psycopg.Error, OSError) as exc:
            if dberrors.is_transient(exc):
                # The connection may be gone or unusable: drop it, the next poll reconnects.
                self._connections.pop(channel, None)
                await conn.close()
            raise

    async def _fetch(self, channel: str, query: Query[T]) -> T:
        return await self._run(channel, lambda conn: fetch_async(conn, query))

    async def _windowed(self, channel: str, query: Callable[[Window | None], Query[T]]) -> T:
        """`query` within the window of a partitioned table's unfinished rows
        (outbox.views.window), read from the catalog first: one small statement, where a
        read over the parent would plan every partition, hundreds of them, on each refresh."""

        async def work(conn: psycopg.AsyncConnection[Any]) -> T:
            window = await fetch_async(conn, unfinished_window(self.table))
            return await fetch_async(conn, query(window))

        return await self._run(channel, work)

    async def check(self, ordered: bool) -> str | None:
        async def work(conn: psycopg.AsyncConnection[Any]) -> str | None:
            try:
                await check_table(conn, self.table, ordered=ordered)
            except SchemaError as exc:
                return str(exc)
            return None

        return await self._run("overview", work)

    async def overview(self, ordered: bool) -> Overview:
        async def work(conn: psycopg.AsyncConnection[Any]) -> Overview:
            nonlocal ordered
            ordered = ordered and await serves_ordering(conn, self.table)
            window = await fetch_async(conn, unfinished_window(self.table))
            # A partitioned table's done rows stay the statistics' estimate: counting them
            # exactly would read every partition, hundreds of them, on each poll.
            exact = self._small_table and window is None
            # Ordered: the claimable figures too (rows behind an unfinished head are not claimable).
            try:
                stats = await queue_stats_async(conn, self.table, exact=exact, ordered=ordered)
            except (psycopg.errors.UndefinedTable, psycopg.errors.UndefinedColumn):
                # A table at a schema before v4 has no destinations table yet, one before v5
                # no served_at in it; the status line says what to run, and the figures it
                # has are still shown.
                stats = await queue_stats_async(
                    conn, self.table, exact=exact, ordered=ordered, destinations=False
                )
            # Exact from the next poll on while counting done rows costs next to nothing: a
            # count that stopped at its limit says the table may be far bigger.
            counted = stats.pending + stats.processing + stats.dead + stats.done
            self._small_table = (
                counted < EXACT_DONE_BELOW and stats.counts_exact and not stats.at_least("done")
            )
            holders = await fetch_async(conn, dashboard.lease_holders(self.table, window=window))
            blocked: Blocked | None = None
            if ordered:
                blocked = await fetch_async(
                    conn, dashboard.blocked_aggregates(self.table, window=window)
                )
            return Overview(stats, holders, blocked)

        return await self._run("overview", work)

    async def dead_page(
        self, f: DeadFilter, *, before: int | None, after: int | None, limit: int
    ) -> DeadPage:
        return await self._windowed(
            "dead",
            lambda window: dead_letters.dead_page(
                self.table, f, before=before, after=after, limit=limit, window=window
            ),
        )

    async def dead_count(self, f: DeadFilter) -> int:
        return await self._windowed(
            "dead", lambda window: dead_letters.dead_count(self.table, f, window=window)
        )

    async def check_filter(self, f: DeadFilter) -> str | None:
        if f.payload_path is None:
            return None
        try:
            await self._fetch("action", path_check(f))
        except psycopg.Error as exc:
            if dberrors.is_transient(exc):
                raise
            return first_line(exc)  # the database refused the path the operator typed
        return None

    async def error_groups(self, f: DeadFilter) -> list[ErrorGroup]:
        return await self._windowed(
            "groups", lambda window: dead_letters.error_groups(self.table, f, window=window)
        )

    async def blocking_heads(self) -> list[BlockingHead] | None:
        async def work(conn: psycopg.AsyncConnection[Any]) -> list[BlockingHead] | None:
            if not await serves_ordering(conn, self.table):
                return None  # not read without ordered mode's index (see overview)
            window = await fetch_async(conn, unfinished_window(self.table))
            return await fetch_async(conn, dashboard.blocking_heads(self.table, window=window))

        return await self._run("blocked", work)

    async def sessions(self) -> list[Session]:
        return await self._windowed(
            "sessions", lambda window: dashboard.sessions(self.table, window=window)
        )

    async def message(self, message_id: int) -> MessageDetail | None:
        async def work(conn: psycopg.AsyncConnection[Any]) -> MessageDetail | None:
            ordered = await serves_ordering(conn, self.table)
            window = await fetch_async(conn, unfinished_window(self.table)) if ordered else None
            return await fetch_async(
                conn, dead_letters.message(self.table, message_id, ordered=ordered, window=window)
            )

        return await self._run("detail", work)

    async def history(self, message_id: int) -> list[ActionRecord]:
        return await self._fetch("detail", repair.history(self.table, message_id))

    async def recent_actions(self) -> list[ActionRecord]:
        return await self._fetch("detail", repair.recent_actions(self.table))

    async def targets(
        self, f: DeadFilter | None = None, ids: Sequence[int] | None = None
    ) -> list[Seen]:
        if ids is not None:  # read wherever they are
            return await self._fetch("action", repair.select_targets(self.table, ids=ids))
        return await self._windowed(
            "action", lambda window: repair.select_targets(self.table, f, window=window)
        )

    async def apply(
        self, action: Action, seen: Sequence[Seen], recorded: dict[str, Any]
    ) -> ActionResult:
        if self.read_only:
            raise ReadOnlyError(f"read-only: {action} refused")
        # The window says only whether the table is partitioned: the statement's range is
        # the rows' own ids, wherever the window is now.
        return await self._windowed(
            "action",
            lambda window: repair.repair(
                self.table,
                action,
                seen,
                actor=repair.default_actor(),
                filter={**recorded, "via": APPLICATION_NAME},
                partitioned=window is not None,
            ),
        )

    async def destinations(self) -> list[DestinationState]:
        return await self._fetch("destinations", destination_states(self.table))

    async def done_messages(self, f: ReplayFilter) -> tuple[Preview, list[DoneRow]]:
        async def work(conn: psycopg.AsyncConnection[Any]) -> tuple[Preview, list[DoneRow]]:
            preview = await perform_async(conn, replay.preview(self.table, f))
            return preview, await perform_async(conn, replay.listing(self.table, f))

        return await self._run("done", work)

    async def replay(self, shown: Preview) -> Progress:
        if self.read_only:
            raise ReadOnlyError("read-only: replay refused")
        return await self._run(
            "action",
            lambda conn: replay.replay_confirmed(
                conn, self.table, shown, actor=repair.default_actor(), via=APPLICATION_NAME
            ),
        )

    async def change_destination(
        self, verb: pausing.Verb, destination: str, reason: str | None
    ) -> pausing.HandChange:
        if self.read_only:
            raise ReadOnlyError(f"read-only: {verb} refused")

        async def work(conn: psycopg.AsyncConnection[Any]) -> pausing.HandChange:
            return await pausing.change_by_hand_async(
                conn,
                self.table,
                verb,
                destination,
                reason=reason,
                actor=repair.default_actor(),
                via=APPLICATION_NAME,
            )

        return await self._run("action", work)

    async def close(self) -> None:
        connections, self._connections = list(self._connections.values()), {}
        for conn in connections:
            await conn.close()


# Deeper than anything the TUI decodes (outbox.plumbing.jsontext.MAX_DECODE_DEPTH): past it a value
# is left out rather than walked further.
_SHOWN_DEPTH = 200


def shown(value: T) -> T:
    """`value` with every string in it, dictionary keys included, shown escaped
    (`outbox.plumbing.text.printable`): through dataclasses, lists, tuples and dicts. The one way
    the screens receive what the database holds: a lease owner, an event type, a destination's
    reason may hold ESC and a line break, written by a producer or another tool."""
    return cast(T, _shown(value, 0))


def _shown(value: Any, depth: int) -> Any:
    if isinstance(value, str):
        return printable(value)
    if depth >= _SHOWN_DEPTH:
        return "…"
    if isinstance(value, list):
        return [_shown(v, depth + 1) for v in value]
    if isinstance(value, tuple):
        items = [_shown(v, depth + 1) for v in value]
        return type(value)(*items) if hasattr(value, "_fields") else tuple(items)
    if isinstance(value, dict):
        return {_shown(k, depth + 1): _shown(v, depth + 1) for k, v in value.items()}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        changes = {
            f.name: _shown(getattr(value, f.name), depth + 1)
            for f in dataclasses.fields(value)
            if f.init
        }
        return dataclasses.replace(value, **changes)
    return value


class _Originals:
    """What the database holds behind the escaped strings the screens were given, for those
    that go back to it as keys: a pause names the destination as its row does.

    Two values that are shown alike (`a<ESC>` and a literal `a\\x1b`) cannot be told apart
    on screen; then the literal one is taken, as typed."""

    LIMIT = 10_000  # remembered keys; only those that hold control characters are kept

    def __init__(self) -> None:
        self._raw: dict[str, str] = {}

    def remember(self, values: Iterable[str]) -> None:
        values = list(values)
        plain = set(values)
        for value in values:
            escaped = printable(value)
            if escaped != value and escaped not in plain:
                if len(self._raw) >= self.LIMIT:
                    self._raw.clear()
                self._raw[escaped] = value

    def raw(self, escaped: str) -> str:
        return self._raw.get(escaped, escaped)


class EscapedSource:
    """A `Source` whose every answer is `shown`: the boundary between the database's rows
    and the screens. Keys the screens hand back (a destination's name, an error group in a
    filter) are turned back into the values they were escaped from."""

    def __init__(self, inner: Source) -> None:
        self.inner = inner
        self.read_only = inner.read_only
        self._destinations = _Originals()
        self._groups = _Originals()

    @property
    def label(self) -> str:
        return printable(self.inner.label)

    def _raw_filter(self, f: DeadFilter | None) -> DeadFilter | None:
        if f is None or f.error_group is None:
            return f
        return dataclasses.replace(f, error_group=self._groups.raw(f.error_group))

    def _raw_recorded(self, recorded: dict[str, Any]) -> dict[str, Any]:
        found = recorded.get("filter")
        if not isinstance(found, dict) or not isinstance(found.get("error_group"), str):
            return recorded
        raw = {**found, "error_group": self._groups.raw(found["error_group"])}
        return {**recorded, "filter": raw}

    async def check(self, ordered: bool) -> str | None:
        return shown(await self.inner.check(ordered))

    async def overview(self, ordered: bool) -> Overview:
        return shown(await self.inner.overview(ordered))

    async def dead_page(
        self, f: DeadFilter, *, before: int | None, after: int | None, limit: int
    ) -> DeadPage:
        raw = self._raw_filter(f) or f
        return shown(await self.inner.dead_page(raw, before=before, after=after, limit=limit))

    async def dead_count(self, f: DeadFilter) -> int:
        return await self.inner.dead_count(self._raw_filter(f) or f)

    async def check_filter(self, f: DeadFilter) -> str | None:
        return shown(await self.inner.check_filter(self._raw_filter(f) or f))

    async def error_groups(self, f: DeadFilter) -> list[ErrorGroup]:
        groups = await self.inner.error_groups(self._raw_filter(f) or f)
        self._groups.remember(g.key for g in groups)
        return shown(groups)

    async def blocking_heads(self) -> list[BlockingHead] | None:
        return shown(await self.inner.blocking_heads())

    async def sessions(self) -> list[Session]:
        return shown(await self.inner.sessions())

    async def message(self, message_id: int) -> MessageDetail | None:
        return shown(await self.inner.message(message_id))

    async def history(self, message_id: int) -> list[ActionRecord]:
        return shown(await self.inner.history(message_id))

    async def recent_actions(self) -> list[ActionRecord]:
        return shown(await self.inner.recent_actions())

    async def targets(
        self, f: DeadFilter | None = None, ids: Sequence[int] | None = None
    ) -> list[Seen]:
        return shown(await self.inner.targets(self._raw_filter(f), ids))

    async def apply(
        self, action: Action, seen: Sequence[Seen], recorded: dict[str, Any]
    ) -> ActionResult:
        return shown(await self.inner.apply(action, seen, self._raw_recorded(recorded)))

    async def destinations(self) -> list[DestinationState]:
        found = await self.inner.destinations()
        self._destinations.remember(d.destination for d in found)
        return shown(found)

    async def change_destination(
        self, verb: pausing.Verb, destination: str, reason: str | None
    ) -> pausing.HandChange:
        raw = self._destinations.raw(destination)
        return shown(await self.inner.change_destination(verb, raw, reason))

    async def done_messages(self, f: ReplayFilter) -> tuple[Preview, list[DoneRow]]:
        # The filter is the operator's own text: only what the database returns is escaped.
        preview, rows = await self.inner.done_messages(f)
        return dataclasses.replace(shown(preview), filter=f), shown(rows)

    async def replay(self, shown_preview: Preview) -> Progress:
        return shown(await self.inner.replay(shown_preview))

    async def close(self) -> None:
        await self.inner.close()
