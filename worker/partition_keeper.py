"""The partition keeper: on a partitioned table, keeps partitions made ahead of the highest
id, so that a deployment without the operator never runs out of them (outbox.partitions).

One replica at a time makes them (the others find the advisory lock taken and only read how
many ids are left ahead, for the metric). A role that may not make partitions (the table's
owner or a member of its role may) is told once, and the partitions are left to `outbox
maintain`. How many partitions ahead is read from the table's layout at each pass: `outbox
migrate --partitions-ahead M` changes it while the workers run.

It also says, once per partition, which of a worker's privileges this worker's role lacks on
a partition and what fixes it (outbox.partition_privileges): a partition made without the
parent's grants refuses every claim that names it with a bare `permission denied`. Each pass
looks, so a partition made ahead that way is named before its rows come, and the claimer
asks at once when a claim is refused (`tell_refused`).

The keeper also notes the partitions finished since its last pass, as `outbox maintain` does
(outbox.operations.partition_maintenance.note_finished_async): `outbox stats`, the TUI and the
operator's backlog read then look only at the partitions that can hold unfinished rows, on a
table no maintenance has run on yet (through every partition, a snapshot on 200 partitions
holding 2M done rows took about 100 times the plain table's).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time

import psycopg

from outbox import partitions
from outbox.operations.partition_maintenance import note_finished_async
from outbox.partition_privileges import refused_partitions
from outbox.runner import fetch_async
from outbox.table import shown
from outbox.worker.service import Service, Shared

log = logging.getLogger("outbox.worker")

# How often partitions ahead are checked: a partition of the default size lasts minutes at
# the fastest producers, and the default keeps 16 of them ahead.
KEEP_INTERVAL = 30.0
# How often, on a plain table, the keeper looks whether the claimer has learnt a layout (a
# conversion): the conversion made partitions ahead, so seconds are soon enough.
LAYOUT_WAIT = 5.0
# The share of the time a top-up spends making partitions while more than a quarter of the
# target is left ahead (outbox.partitions.ALL_AT_ONCE_BELOW): after each partition it waits
# nine times as long as making it took (about 15 ms each), so 150 partitions take 20 s
# rather than 2 s of the database's time at once.
MAKING_SHARE = 0.1


class PartitionKeeper(Service):
    def __init__(self, shared: Shared) -> None:
        super().__init__(shared)
        # The partitions said to be refused, with the privileges lacking: each is said once,
        # again only if what it lacks changes (forgotten once healed).
        self._refused: dict[str, tuple[str, ...]] = {}
        self._telling = asyncio.Lock()  # the claimer and a pass may ask at once

    async def tell_refused(self) -> None:
        """Say which partitions this worker's role may not use, each once, and the fix. Only
        an explanation: a failure to look is left to the refused operation's own report."""
        with contextlib.suppress(psycopg.Error, OSError):
            async with self.connection() as conn:
                await self._tell_refused(conn)

    async def _tell_refused(self, conn: psycopg.AsyncConnection[tuple[object, ...]]) -> None:
        async with self._telling:
            refused = await fetch_async(conn, refused_partitions(self.settings.table))
            told, self._refused = self._refused, {r.partition: r.privileges for r in refused}
            for partition in refused:
                if told.get(partition.partition) != partition.privileges:
                    log.warning("%s", partition.advice(self.settings.table))

    async def run(self) -> None:
        """Keep partitions ahead until cancelled; on a plain table, wait until the claimer
        learns it has been converted to the partitioned layout."""
        layout = self.window.layout
        while layout is None:
            await asyncio.sleep(LAYOUT_WAIT)
            layout = self.window.layout
        may_create = may_note = True
        topping_up, made = False, 0  # a top-up under way, made a partition a pass
        too_far_told = ""  # the last TooFarAhead said, said again only when it changes
        in_the_way_told = ""  # the last table in the way said, again only when it changes
        while True:
            began = time.monotonic()
            full_pass = not topping_up  # a pass of a top-up only makes a partition
            try:
                async with self.connection() as conn:
                    if full_pass:
                        layout = await self._recorded(conn, layout)
                        self.metrics.partition_ids_target.set(
                            layout.partition_size * layout.partitions_ahead
                        )
                    if may_create:
                        kept = await partitions.keep_ahead(
                            conn, self.settings.table, layout, topping_up=topping_up
                        )
                        topping_up, made, left = kept.more, made + kept.made, kept.left
                        if made and not topping_up:
                            log.info(
                                "made %d partitions ahead of %s", made, shown(self.settings.table)
                            )
                            made = 0
                    else:
                        left = await partitions.ids_ahead(conn, self.settings.table, layout)
                    self.metrics.partition_ids_ahead.set(left)
                    if may_note and full_pass:
                        may_note = await self._note_finished(conn)
            except psycopg.Error as exc:
                topping_up = False
                if may_create and isinstance(exc, psycopg.errors.InsufficientPrivilege):
                    may_create = False
                    # Creating the table is not all: a partition is given the table's owner
                    # and attached, which a role with CREATE on the schema alone may not do.
                    log.warning(
                        "this worker's role may not make partitions of %s (%s; that takes the "
                        "table's owner or a member of its role): partitions ahead are left to "
                        "`outbox maintain` (or the operator)",
                        shown(self.settings.table),
                        exc.diag.message_primary or type(exc).__name__,
                    )
                    # At once, this first time only: the ids left ahead, read without making
                    # any. A refusal after it waits for the next pass (it went round at once).
                    continue
                self.metrics.db_errors.labels("keep partitions").inc()
                if isinstance(exc, psycopg.errors.DuplicateTable):
                    # A table of the next partition's name in its way (`make_partition`):
                    # the same refusal every pass until someone renames or drops it. Said
                    # once (again when it changes), in its one line: PL/pgSQL's context
                    # followed it, every 30 seconds.
                    said = exc.diag.message_primary or str(exc)
                    if said != in_the_way_told:
                        log.warning(
                            "could not keep partitions ahead: %s (this worker tries again at "
                            "each pass)",
                            said,
                        )
                    in_the_way_told = said
                else:
                    log.warning("could not keep partitions ahead: %s", exc)
                if not isinstance(exc, psycopg.OperationalError):
                    await self._measure_ahead(layout)
            except partitions.TooFarAhead as exc:
                # The sequence jumped past what is made: no id is left ahead (the alert
                # fires), and the same refusal comes every pass until someone acts.
                topping_up = False
                self.metrics.partition_ids_ahead.set(0)
                if str(exc) != too_far_told:
                    log.warning("%s", exc)
                    too_far_told = str(exc)
            else:
                in_the_way_told = ""  # made, or none to make: a table in the way since is new
            if topping_up:
                # Paced: the database's cores serve the drain, a top-up takes what is left.
                spent = time.monotonic() - began
                await asyncio.sleep(min(spent * (1 / MAKING_SHARE - 1), KEEP_INTERVAL))
                continue
            await self.tell_refused()  # apart: its failure is no failure to keep partitions
            await asyncio.sleep(KEEP_INTERVAL)

    async def _measure_ahead(self, layout: partitions.Layout) -> None:
        """After a pass refused (a table in the way, say): the ids left ahead read on their
        own, so that the metric, and the alert on it, follow the producers while no
        partition is made. It kept the last pass's figure, and the alert stayed silent
        until inserts failed. A failure here is the pass's own, told already."""
        with contextlib.suppress(psycopg.Error, OSError):
            async with self.connection() as conn:
                left = await partitions.ids_ahead(conn, self.settings.table, layout)
                self.metrics.partition_ids_ahead.set(left)

    async def _recorded(
        self, conn: psycopg.AsyncConnection[tuple[object, ...]], layout: partitions.Layout
    ) -> partitions.Layout:
        """The claimer's layout (what the claims last learnt of the partitions' names and
        gaps) with the partitions ahead recorded now: `outbox migrate --partitions-ahead M`
        changes them while the workers run, the fix the producers' OutOfPartitions and the
        alert advise. Read once at the start, a raised number was kept by the migrate's own
        top-up only; the keepers went on keeping the old one, and the alert's target with it."""
        current = self.window.layout or layout
        home = partitions.in_schema(self.settings.table, current.schema)
        recorded = await fetch_async(conn, partitions.read_layout(home))
        if recorded is None or recorded.partitions_ahead == current.partitions_ahead:
            return current
        return dataclasses.replace(current, partitions_ahead=recorded.partitions_ahead)

    async def _note_finished(self, conn: psycopg.AsyncConnection[tuple[object, ...]]) -> bool:
        """Note the partitions finished since the last pass; False once this worker's role
        is found not to own the table (told once: noting is left to `outbox maintain`)."""
        try:
            await note_finished_async(conn, self.settings.table)
        except psycopg.errors.InsufficientPrivilege:
            log.warning(
                "this worker's role does not own %s: finished partitions are noted by `outbox "
                "maintain` (or the operator) only, and outbox stats looks through every "
                "partition until then",
                shown(self.settings.table),
            )
            return False
        return True
