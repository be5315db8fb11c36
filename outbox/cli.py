"""`outbox`: migrate the table, read its state, purge old rows, repair dead messages, replay
and reconcile, pause and resume destinations, run the demo."""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import sys
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any, NoReturn

import psycopg

from outbox import extras
from outbox.commands import inbox as inbox_cli
from outbox.commands import replay as replay_cli
from outbox.destinations import CLOSED, IDLE, OPEN, PAUSED
from outbox.entry import INTERRUPTED, NOTHING_STARTED
from outbox.operations import pausing
from outbox.operations.conversion import migrate_converting, stopped_conversion
from outbox.operations.maintenance import MAX_PURGE_BATCH, PURGE_BATCH, PURGE_BATCH_ENV, purge_done
from outbox.operations.partition_maintenance import (
    AT_LEAST,
    COUNTED,
    DEFAULT_RETENTION,
    ESTIMATE,
    NotPartitioned,
    UpkeepBusy,
    maintain,
    partition_states,
    refuse_no_outbox_table,
)
from outbox.operations.repair import Action, default_actor, repair, select_targets
from outbox.partitions import (
    DEFAULT_PARTITION_SIZE,
    DEFAULT_PARTITIONS_AHEAD,
    PARTITION_SIZE_RANGE,
    PARTITIONS_AHEAD_RANGE,
    Layout,
    read_partitions,
)
from outbox.plumbing import dberrors
from outbox.plumbing.cliutil import (
    ArgumentParser,
    add_dsn_and_table,
    choice,
    fail,
    int_between,
    not_utf8,
    resolve,
    undecodable_at,
)
from outbox.plumbing.dsn import check_dsn, connect_options, with_pg_environment
from outbox.plumbing.durations import duration_between, format_duration, parse_duration
from outbox.plumbing.errors import SettingError
from outbox.plumbing.redact import describe_dsn
from outbox.plumbing.text import age, aligned, counted, first_unsafe, printable, printable_name
from outbox.runner import fetch, perform
from outbox.schema import ORDERINGS, SchemaError, noting_changes, orderings, render_migration
from outbox.session import home_first, session_settings
from outbox.siblings import SIBLINGS
from outbox.stats import (
    DestinationState,
    QueueStats,
    destination_states,
    queue_stats,
    unfinished_window,
)
from outbox.table import Table, shown, shown_argument
from outbox.views.dead_letters import MAX_ID
from outbox.views.filters import DeadFilter

PROG = "outbox"
# How long a command waits for a lock another session holds (a `LOCK TABLE`, a migration, a
# long transaction) and for one statement, before it gives up saying so. Every command's
# statements are short (purge deletes in bounded batches); only a migration that builds
# indexes on a large hand-made table may need more, hence the flags.
DEFAULT_LOCK_TIMEOUT = timedelta(seconds=10)
DEFAULT_STATEMENT_TIMEOUT = timedelta(minutes=5)
# `outbox pause` of a paused destination, `outbox resume` of a closed one: nothing
# changed. Not 1 (something failed) nor 2 (a usage error): a script can tell it apart.
NOTHING_CHANGED = 3
_TIMEOUT = duration_between(timedelta(0), timedelta(days=1))
_MESSAGE_ID = int_between(1, MAX_ID)  # ids are bigint: beyond, none exists
# The demo runs on this machine: more workers than this only thrash it.
DEMO_MAX_EVENTS, DEMO_MAX_WORKERS = 1_000_000, 32
# A command stopped by Ctrl-C (SIGINT) exits as shells report it (outbox.entry.INTERRUPTED);
# a command whose output's reader went away (a closed pipe), likewise: 128 + SIGPIPE.
READER_GONE = 128 + signal.SIGPIPE
# What a command stopped by Ctrl-C leaves, said on its one line. The statement under way is
# cancelled on the server (psycopg cancels it on the interrupt) and its transaction rolled
# back: only what the command had committed stays.
_ROLLED_BACK = "nothing was changed (its one transaction rolled back, unless it had committed)"
_READ_ONLY = "nothing was changed (it only reads)"
_LEFT_BY_AN_INTERRUPT = {
    "migrate": "its transaction was rolled back; a conversion to partitions keeps the steps it "
    "finished and goes on from there when run again",
    "partitions": _READ_ONLY,
    "maintain": "partitions made or retired before the stop stay so, the step under way was "
    "rolled back; run it again to finish (it completes a detach left pending)",
    "stats": _READ_ONLY,
    "purge": "the batches deleted before the stop stay deleted, the one under way was rolled "
    "back; run it again to go on",
    "requeue": _ROLLED_BACK,
    "skip": _ROLLED_BACK,
    "destinations": _READ_ONLY,
    "pause": _ROLLED_BACK,
    "resume": _ROLLED_BACK,
    "replay": "nothing was sent again",  # once sending, `outbox.commands.replay` says how far
    "reconcile": "the comparison only reads; batches a replay of the missing sent before the "
    "stop stay sent (the audit log lists them)",
    "demo": "its workers and database were stopped (unless --keep)",
    "inbox migrate": _ROLLED_BACK,
    "inbox purge": "the batches deleted before the stop stay deleted, the one under way was "
    "rolled back; run it again to go on",
    "inbox check": _READ_ONLY,
}


def _add_timeouts(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--lock-timeout",
        help=f"most time to wait for a lock held by another session, 0 = no limit "
        f"(default {format_duration(DEFAULT_LOCK_TIMEOUT)})",
    )
    parser.add_argument(
        "--statement-timeout",
        help=f"most time one statement may run, 0 = no limit "
        f"(default {format_duration(DEFAULT_STATEMENT_TIMEOUT)})",
    )


def _parser() -> ArgumentParser:
    parser = ArgumentParser(prog=PROG, description="The outbox table: schema, state, retention.")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(name: str, help: str, *, connects: bool = True) -> argparse.ArgumentParser:
        """A command; one that `connects` takes the DSN, the table and the timeouts."""
        sub = commands.add_parser(name, help=help, description=help)
        sub.error = parser.error  # type: ignore[method-assign]
        if connects:
            add_dsn_and_table(sub)
            _add_timeouts(sub)
        return sub

    m = command("migrate", "create or upgrade the outbox table (idempotent)")
    m.add_argument(
        "--ordering",
        help=f"{' or '.join(ORDERINGS)}, as the workers will run: aggregate builds ordered "
        "mode's index (also env OUTBOX_ORDERING=aggregate), none drops it; unset, a new table "
        "gets none and an existing one stays as it is",
    )
    m.add_argument(
        "--partition-size",
        help="ids a partition holds: creates the table partitioned by range of id "
        f"(docs/partitioning.md; default none: a plain table; {DEFAULT_PARTITION_SIZE} is a "
        "good start)",
    )
    m.add_argument(
        "--partitions-ahead",
        help="partitions kept made ahead of the highest id, with --partition-size "
        f"(default {DEFAULT_PARTITIONS_AHEAD})",
    )
    m.add_argument("--print", action="store_true", help="print the SQL instead of running it")

    pt = command("partitions", "a partitioned table's partitions: ids, rows, retirable or why not")
    pt.add_argument("--json", action="store_true", help="one JSON object, for scripts")

    mt = command(
        "maintain",
        "a partitioned table: make partitions ahead, drop those done for the retention, analyze",
    )
    mt.add_argument(
        "--retention",
        help="how long a partition stays after its last row is done, e.g. 7d, 12h, 0s "
        f"(default {format_duration(DEFAULT_RETENTION)})",
    )

    s = command("stats", "counts per status, oldest ages, expired leases, attempts")
    s.add_argument("--json", action="store_true", help="one JSON object, for scripts")
    s.add_argument("--exact", action="store_true", help="count done rows (a full scan)")

    p = command("purge", "delete done rows older than a retention period, in batches")
    p.add_argument("--older-than", required=True, help="e.g. 7d, 12h")
    p.add_argument(
        "--batch", help=f"rows per DELETE (env {PURGE_BATCH_ENV}; default {PURGE_BATCH})"
    )
    p.add_argument("--dry-run", action="store_true", help="count what would be deleted")

    r = command("requeue", "put dead messages back to pending: available now, attempts reset")
    which = r.add_mutually_exclusive_group(required=True)
    which.add_argument(
        "--id", action="append", metavar="ID", help="a dead message (repeat, or comma-separate)"
    )
    which.add_argument(
        "--error",
        metavar="TEXT",
        type=_error_text,
        help="every dead message whose last_error contains TEXT",
    )
    which.add_argument("--all-dead", action="store_true", help="every dead message")
    r.add_argument("--dry-run", action="store_true", help="count what would be requeued")

    k = command("skip", "mark dead messages done on purpose (unblocks an ordered aggregate)")
    k.add_argument(
        "--id",
        action="append",
        metavar="ID",
        required=True,
        help="a dead message (repeat, or comma-separate)",
    )
    k.add_argument("--dry-run", action="store_true", help="count what would be skipped")

    ds = command(
        "destinations",
        "each destination's health: closed, open (the breaker), paused; idle when no worker "
        "serves it any more",
    )
    ds.add_argument("--json", action="store_true", help="one JSON object, for scripts")

    for name, help in (
        ("pause", "send nothing to a destination until `outbox resume` (recorded, with why)"),
        ("resume", "send to a paused destination again, or close an open breaker (recorded)"),
    ):
        h = command(name, help)
        h.add_argument(
            "destination",
            metavar="DESTINATION",
            help="its name, as workers record it; `outbox destinations` lists it escaped, each "
            "backslash doubled: a name listed as billing\\\\eu is typed 'billing\\eu', one "
            "listed as a\\xa0b as $'a\\xa0b'",
        )
        if name == "pause":
            h.add_argument(
                "--reason", required=True, metavar="TEXT", help="why: kept with who paused it"
            )
        else:
            h.add_argument(
                "--reason", metavar="TEXT", help="why (e.g. the API is back): kept in the audit log"
            )
        h.add_argument(
            "--actor",
            help="who, for the record (env OUTBOX_ACTOR; default the OS user, else the "
            "database user)",
        )

    replay_cli.add_commands(command)

    d = command("demo", "run the whole system on an embedded PostgreSQL and report", connects=False)
    d.add_argument("--events", help=f"events to enqueue, 1 to {DEMO_MAX_EVENTS} (default 3000)")
    d.add_argument("--workers", help=f"worker processes, 1 to {DEMO_MAX_WORKERS} (default 4)")
    d.add_argument("--keep", action="store_true", help="leave the database running afterwards")

    i = command(
        "inbox",
        "the receiving end's inbox table: migrate, purge, check (docs/receiving.md)",
        connects=False,  # its own commands do, each
    )
    inbox_cli.add_commands(i, _add_timeouts, parser.error)
    return parser


def _dsn(args: argparse.Namespace) -> str:
    return resolve(args, "--dsn", check_dsn, "")


def _table(args: argparse.Namespace) -> Table:
    return resolve(args, "--table", Table.parse, Table.default())


def _error_text(text: str) -> str:
    # Empty, it would match every dead message: an unset variable in `--error "$X"` must not
    # requeue them all (that is --all-dead, said on purpose).
    if not text:
        raise argparse.ArgumentTypeError("empty (every dead message is --all-dead)")
    # An argument's undecodable bytes arrive as lone surrogates: no stored error holds one
    # (rows take UTF-8), and the query could not even be sent with it.
    if undecodable_at(text) is not None:
        raise argparse.ArgumentTypeError(f"{not_utf8(text)}; no error text holds one")
    return text


def message_ids(values: list[str]) -> list[int]:
    """`--id 3 --id 4,5` -> [3, 4, 5]."""
    ids: list[int] = []
    for value in values:
        for part in value.split(","):
            try:
                ids.append(_MESSAGE_ID(part.strip()))
            except ValueError:
                raise SettingError(f"--id: {part.strip()!r} is not a message id") from None
    return ids


def _connect(dsn: str) -> psycopg.Connection[Any]:
    try:
        return psycopg.connect(dsn, autocommit=True, **connect_options(dsn))
    except (psycopg.OperationalError, psycopg.ProgrammingError) as exc:
        # A setting libpq or psycopg refuses before trying any server (sslmode=bogus,
        # PGCONNECT_TIMEOUT=abc) can never work: a usage error, named by its parameter.
        refused = dberrors.invalid_setting(exc)
        if refused is not None:
            fail(PROG, f"{refused} (set by the DSN or a PG* variable)")
        where = describe_dsn(with_pg_environment(dsn))
        fail(PROG, f"cannot connect to {where}: {dberrors.describe(exc)}", 1)


def print_stats(stats: QueueStats) -> None:
    # The planner's estimate (~), or counted: exactly, or at least (≥) where the count stopped.
    done = f"~{stats.done}" if stats.done_is_estimate else stats.count_text("done")
    rows = [
        ("table", shown(stats.table)),
        ("pending", f"{stats.count_text('pending')} ({stats.count_text('ready')} ready)"),
        (
            "processing",
            f"{stats.count_text('processing')} "
            f"({stats.count_text('expired_leases')} with expired lease)",
        ),
        ("done", done),
        ("dead", stats.count_text("dead")),
        ("retrying", f"{stats.count_text('retrying')} (waiting out a backoff)"),
        # The unfinished age grows through backoff; the ready age does not (docs/monitoring.md).
        ("oldest unfinished age", age(stats.oldest_unfinished_age)),
        ("oldest ready age", age(stats.oldest_ready_age)),
        ("highest id", str(stats.max_id)),
        ("attempts", _attempts_text(stats)),
        ("destinations", _destinations_summary(stats.destinations)),
    ]
    width = max(len(name) for name, _ in rows)
    for name, value in rows:
        print(f"{name:<{width}}  {value}")


def _attempts_text(stats: QueueStats) -> str:
    """Messages by attempts so far; over the oldest `count_limit` waiting ones only when
    there are more (said, or a bounded distribution reads as the whole backlog's)."""
    text = ", ".join(f"{k}: {v}" for k, v in stats.attempts.items()) or "-"
    limit = stats.count_limit
    if limit is not None and sum(stats.attempts.values()) >= limit:
        text += f" (the oldest {limit:,} pending and processing only)"
    return text


def _destinations_summary(states: Sequence[DestinationState]) -> str:
    if not states:
        return "none recorded (all closed)"
    held = [d for d in states if not d.sending and not d.idle]
    idle = sum(d.idle for d in states)
    idle_note = f", {idle} idle" if idle else ""
    if not held:
        return f"{len(states)}, none held{idle_note}" if idle else f"{len(states)}, all closed"
    named = ", ".join(f"{printable_name(d.destination)} {d.state}" for d in held)
    return f"{len(states)}: {named}{idle_note} (see outbox destinations)"


def print_destinations(table: Table, states: Sequence[DestinationState]) -> None:
    """A table of destinations; under each, why it is held (who paused it and why, or the
    last error), so the line that matters is next to its destination. Reasons and errors
    are shown `printable`, names `printable_name` (one name never shows as another): rows
    hold what downstreams answered and what older versions or other tools wrote, ESC and
    line breaks included."""
    if not states:
        print(
            f"{shown(table)}: no destination recorded: every destination is closed (a row "
            "appears when a worker serves one, or one fails, is paused or rate limited)"
        )
        return
    counts = ", ".join(
        f"{sum(d.shown_state == s for d in states)} {s}"
        for s in (OPEN, PAUSED, IDLE)
        if any(d.shown_state == s for d in states)
    )
    print(f"{shown(table)}: {counted(len(states), 'destination')}"
          + (f", {counts}" if counts else ", all closed"))  # fmt: skip
    header = ("DESTINATION", "STATE", "SINCE", "FOR", "FAILURES", "NEXT PROBE")
    rows = [
        (
            printable_name(d.destination),
            d.shown_state,
            d.since.isoformat(sep=" ", timespec="seconds") if d.since else "-",
            age(d.for_seconds),
            str(d.failures),
            _next_probe(d),
        )
        for d in states
    ]
    # FAILURES is a number: right-aligned; the rest read left to right.
    head, *lines = aligned([header, *rows], right={4})
    print(head)
    for d, line in zip(states, lines, strict=True):
        print(line)
        if d.idle:
            print(f"    {idle_text(d)}")
        if d.state == PAUSED:
            who, why = printable_name(d.changed_by or "?"), printable(d.reason or "(no reason)")
            print(f"    paused by {who}: {why}")
        elif d.reason:
            print(f"    reason: {printable(d.reason)}")
        elif d.sending and d.changed_by:
            print(f"    resumed by {printable_name(d.changed_by)}")
        if d.last_error:
            print(f"    last error: {printable(d.last_error)}")


def idle_text(d: DestinationState) -> str:
    """Why an idle destination holds nothing back, and what its row still says."""
    if d.served_ago is None:
        served = "no running worker serves it"
    else:
        served = f"no worker has served it for {age(d.served_ago)}"
        if d.served_by:
            served += f" (last {printable_name(d.served_by)})"
    was = "" if d.state == CLOSED else f"; its row still says {d.state} (`outbox resume` closes it)"
    return f"idle: {served}{was}"


def _next_probe(d: DestinationState) -> str:
    if d.state != OPEN or d.idle:
        return "-"
    if d.probing:
        return f"running ({printable_name(d.probing)})"
    if d.next_probe_in is None or d.next_probe_in <= 0:
        return "due"
    return f"in {age(d.next_probe_in)}"


def main(argv: Sequence[str] | None = None) -> None:
    args: argparse.Namespace | None = None
    try:
        args = _parser().parse_args(argv)
        _main(args)
        # Output to a pipe is buffered: a reader gone (`| head`) shows here, not as a traceback
        # from the interpreter's exit.
        sys.stdout.flush()
    except KeyboardInterrupt:
        _interrupted(args)
    except BrokenPipeError:
        _reader_gone()


def _reader_gone() -> NoReturn:
    """What reads the output went away (`outbox stats | head -3`): stop without a traceback,
    with the exit code of a command a SIGPIPE ended, as shells report it. What the command
    did is done; only the rest of its output is lost."""
    # The output's buffer still holds what could not be written: empty it into nowhere, or
    # the interpreter's exit tries again and fails on it.
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    raise SystemExit(READER_GONE)


def _interrupted(args: argparse.Namespace | None) -> NoReturn:
    """Ctrl-C: one line saying what is left, exit INTERRUPTED. A second Ctrl-C while it is
    said is ignored: the first one's line is the whole answer, never a traceback."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if args is None:
        print(NOTHING_STARTED, file=sys.stderr)
    else:
        name = args.command if args.command != "inbox" else f"inbox {args.inbox_command}"
        left = _LEFT_BY_AN_INTERRUPT.get(name, "what it had committed stays, nothing more")
        print(f"{PROG} {name}: interrupted; {left}", file=sys.stderr)
    raise SystemExit(INTERRUPTED)


def _main(args: argparse.Namespace) -> None:
    try:
        if args.command == "demo":
            try:  # the demo's parts load only when asked for
                demo = extras.load("outbox.demo.run", "demo")
            except extras.MissingExtra as exc:
                fail(PROG, str(exc))
            sys.exit(
                demo.run_demo(  # type: ignore[attr-defined]
                    events=resolve(args, "--events", int_between(1, DEMO_MAX_EVENTS), 3000),
                    workers=resolve(args, "--workers", int_between(1, DEMO_MAX_WORKERS), 4),
                    keep=args.keep,
                )
            )
        if args.command == "inbox" and inbox_cli.prepare(args):
            return
        table = _table(args)
        if args.command == "migrate":
            ordering = resolve(args, "--ordering", choice(*ORDERINGS), None)
            # From the environment it only builds: a variable meant for other workers must
            # not drop an ordered table's index. Dropping takes the flag.
            args.ordering = None if args.ordering is None and ordering == "none" else ordering
            args.layout = _layout(args)
            if args.print:
                print(render_migration(table, args.ordering, args.layout), end="")
                return
        if args.command == "maintain":
            args.retention = resolve(args, "--retention", parse_duration, DEFAULT_RETENTION)
        dsn = _dsn(args)
        purge_options = (
            {
                "older_than": resolve(args, "--older-than", parse_duration, timedelta(days=7)),
                "batch": resolve(
                    args,
                    "--batch",
                    int_between(1, MAX_PURGE_BATCH),
                    PURGE_BATCH,
                    variable=PURGE_BATCH_ENV,
                ),
                "dry_run": args.dry_run,
            }
            if args.command == "purge"
            else {}
        )
        if args.command in ("requeue", "skip") and args.id is not None:
            args.id = message_ids(args.id)
        if args.command in ("pause", "resume"):
            args.destination = _checked("DESTINATION", pausing.check_destination, args.destination)
            if args.reason is not None:
                args.reason = _checked("--reason", pausing.check_reason, args.reason)
            args.actor = resolve(args, "--actor", _actor, default_actor())
        if args.command in ("replay", "reconcile"):
            replay_cli.prepare(args)
        timeouts = {
            "lock_timeout": resolve(args, "--lock-timeout", _TIMEOUT, DEFAULT_LOCK_TIMEOUT),
            "statement_timeout": resolve(
                args, "--statement-timeout", _TIMEOUT, DEFAULT_STATEMENT_TIMEOUT
            ),
        }
    except SettingError as exc:
        fail(PROG, str(exc))
    with _connect(dsn) as conn:
        try:
            settings = {name: _milliseconds(value) for name, value in timeouts.items()}
            fetch(conn, session_settings(settings))
            # What is named after the table, in the table's schema (see `home_first`).
            perform(conn, home_first(table))
            _run(args, conn, table, purge_options)
        except SchemaError as exc:
            # A conversion stopped by Ctrl-C says itself what it left (its CHECK, dropped or not).
            fail(PROG, str(exc), INTERRUPTED if isinstance(exc.__cause__, KeyboardInterrupt) else 1)
        except dberrors.MISSING_TABLE as exc:
            _refuse_no_outbox_table(conn, table)  # a sibling missing, of no outbox table
            migrate_it = f"outbox migrate --table {shown_argument(table)}"
            fail(PROG, f"{_missing(table, exc)}; run `{migrate_it}`", 1)
        except psycopg.errors.UndefinedColumn as exc:
            _refuse_no_outbox_table(conn, table)
            # A column a later schema adds (the destinations' served_at: v5).
            primary = exc.diag.message_primary or "a column is missing"
            fail(
                PROG,
                f"table {shown(table)} is at an older schema ({primary}); run `outbox migrate "
                f"--table {shown_argument(table)}`",
                1,
            )
        except UpkeepBusy:
            fail(
                PROG,
                f"gave up after waiting {format_duration(timeouts['lock_timeout'])} for the "
                f"partition upkeep lock of table {shown(table)}, held by a worker making "
                "partitions ahead, another outbox maintain or a replay's batch (an advisory lock: "
                "see pg_locks); nothing was changed (raise --lock-timeout, or 0 to wait for it)",
                1,
            )
        except psycopg.errors.LockNotAvailable:
            fail(
                PROG,
                f"gave up after waiting {format_duration(timeouts['lock_timeout'])} for a lock "
                f"on {shown(table)} (or its audit log) held by another session, e.g. a LOCK TABLE, "
                f"a migration or a long transaction; {_left_as_it_was(args)} (see pg_locks, or "
                "raise --lock-timeout)",
                1,
            )
        except psycopg.errors.QueryCanceled:
            fail(
                PROG,
                f"gave up after a statement on {shown(table)} ran for "
                f"{format_duration(timeouts['statement_timeout'])}; "
                f"{_left_as_it_was(args, 'by it')} (raise --statement-timeout)",
                1,
            )
        except psycopg.errors.DuplicateTable as exc:
            # A table in the way of a partition (outbox.partitions.make_partition) says itself
            # which table and what to do; PostgreSQL's own (a race on a name) is as clear.
            fail(PROG, exc.diag.message_primary or dberrors.describe(exc), 1)
        except psycopg.Error as exc:
            fail(PROG, _database_error(conn, exc), 1)


def _database_error(conn: psycopg.Connection[Any], exc: psycopg.Error) -> str:
    """A database error as one line naming what is wrong: the server's words, or ours for a
    refusal raised as one of its errors (a sequence the role may not read, a table it does
    not own), with no driver class name before them (`InsufficientPrivilege: permission
    denied for table outbox_layout`), which says nothing they do not. A refusal of the
    server's names the role refused; an error of the driver alone (no SQLSTATE: the
    connection broke) says it is the connection's."""
    said = dberrors.describe(exc)
    if exc.sqlstate is None and isinstance(exc, psycopg.OperationalError | psycopg.InterfaceError):
        return f"the connection to the database failed: {said}"
    if isinstance(exc, psycopg.errors.InsufficientPrivilege) and exc.diag.message_primary:
        return f"{said} (role {conn.info.user})"
    return said


def _left_as_it_was(args: argparse.Namespace, by: str = "") -> str:
    """What a command stopped by a timeout left: nothing, its statements being one
    transaction; `outbox maintain` commits each step on its own (DETACH ... CONCURRENTLY
    cannot run in a transaction), so what it did before stays, and a partition it was
    detaching is left pending detach, which its next run finishes."""
    if args.command == "maintain":
        return (
            "the run stopped there: what it did before stays, and a partition it was "
            "detaching is finished by the next run"
        )
    return f"nothing was changed {by}".rstrip()


def _layout(args: argparse.Namespace) -> Layout | None:
    """The partitioned layout `migrate` was asked for, or None."""
    size = resolve(args, "--partition-size", int_between(*PARTITION_SIZE_RANGE), None)
    ahead = resolve(
        args, "--partitions-ahead", int_between(*PARTITIONS_AHEAD_RANGE), DEFAULT_PARTITIONS_AHEAD
    )
    if size is None:
        if args.partitions_ahead is not None:
            fail(PROG, "--partitions-ahead: needs --partition-size (the partitions' size)")
        return None
    return Layout(size, ahead)


def _checked(name: str, check: Callable[[str], str], value: str) -> str:
    try:
        return check(value)
    except ValueError as exc:
        raise SettingError(f"{name}: {exc}") from None


def _actor(text: str) -> str:
    if not text.strip():
        raise ValueError("an empty name records nobody")
    if (unsafe := first_unsafe(text)) is not None:
        raise ValueError(f"holds {unsafe}")
    return text


def _missing(table: Table, exc: psycopg.Error) -> str:
    """The table is missing, or (a table of an older schema) one of its siblings is."""
    primary = exc.diag.message_primary or ""
    for sibling, _ in SIBLINGS:
        if f'{table.derived_name(sibling)}"' in primary:
            return f"table {shown(table)} is at an older schema ({primary})"
    return f"table {shown(table)} does not exist"


def _refuse_no_outbox_table(conn: psycopg.Connection[Any], table: Table) -> None:
    """Before a missing column or sibling is said to be a table at an older schema, to be
    migrated: fail, as `outbox migrate` refuses it, on a table that is no outbox table at all
    (`CREATE TABLE orders (id int)`), which that migration would not take."""
    try:
        perform(conn, refuse_no_outbox_table(table))
    except SchemaError as exc:
        fail(PROG, str(exc), 1)
    except psycopg.Error:
        pass  # the catalog could not be read: the older schema's line it is


def _milliseconds(value: timedelta) -> str:
    # Rounded up: PostgreSQL takes whole milliseconds, and 0 would mean no limit at all.
    return f"{math.ceil(value / timedelta(milliseconds=1))}ms"


def _run(
    args: argparse.Namespace,
    conn: psycopg.Connection[Any],
    table: Table,
    purge_options: dict[str, Any],
) -> None:
    if args.command == "migrate":
        with noting_changes() as changes:
            before, after, converted = migrate_converting(conn, table, args.ordering, args.layout)
        if converted is not None:
            print("\n".join(converted.describe()))
        versions = [f"migrated from v{before} to v{after}"] if before != after else []
        done = "; ".join(versions + changes) or f"already at schema v{after}"
        if changes and not versions:
            done = f"at schema v{after}; {done}"
        # Which worker setting the table serves: a worker with another one refuses to start.
        print(f"{shown(table)}: {done}, for --ordering {' or '.join(orderings(conn, table))}")
        if converted is None and (left := stopped_conversion(conn, table)) is not None:
            print(f"{PROG}: warning: {left}", file=sys.stderr)
    elif args.command == "stats":
        stats = queue_stats(conn, table, exact=args.exact)
        if args.json:
            print(json.dumps(stats.to_dict()))
        else:
            print_stats(stats)
    elif args.command == "purge":
        count = purge_done(conn, table, **purge_options)
        verb = "would delete" if args.dry_run else "deleted"
        print(f"{shown(table)}: {verb} {counted(count, 'done row')}")
        if fetch(conn, read_partitions(table)) is not None:
            # Deleting works on a partitioned table, but leaves what partitioning spares.
            print(
                f"{shown(table)}: is partitioned: `outbox maintain --table {shown_argument(table)} "
                f"--retention {format_duration(purge_options['older_than'])}` retires its "
                "finished partitions whole (DETACH and DROP), where DELETE leaves dead rows "
                "for vacuum and a bloated table"
            )
    elif args.command in ("requeue", "skip"):
        _repair(args, conn, table)
    elif args.command in ("partitions", "maintain"):
        _partitions(args, conn, table)
    elif args.command == "destinations":
        states = fetch(conn, destination_states(table))
        if args.json:
            print(json.dumps({"table": str(table), "destinations": [d.to_dict() for d in states]}))
        else:
            print_destinations(table, states)
    elif args.command == "inbox":
        inbox_cli.run(args, conn)
    elif args.command in ("replay", "reconcile"):
        replay_cli.run(args, conn, table)
    elif args.command in ("pause", "resume"):
        result = pausing.change_by_hand(
            conn,
            table,
            args.command,
            args.destination,
            reason=getattr(args, "reason", None),
            actor=args.actor,
            via=f"outbox {args.command}",
        )
        if not result.changed:
            fail(PROG, result.summary(), NOTHING_CHANGED)
        print(f"{shown(table)}: {result.summary()}")


def _partitions(args: argparse.Namespace, conn: psycopg.Connection[Any], table: Table) -> None:
    """`outbox partitions` and `outbox maintain`."""
    try:
        if args.command == "maintain":

            def waiting() -> None:
                print(
                    f"{PROG}: waiting for the partition upkeep lock of table {shown(table)} "
                    "(held by a worker making partitions ahead, another outbox maintain, or a "
                    "replay's batch)",
                    file=sys.stderr,
                    flush=True,
                )

            # Each statement bounded as the command's --statement-timeout says (the session's
            # setting): the error it ends in tells the user to raise that.
            done = maintain(
                conn, table, retention=args.retention, waiting=waiting, sessions_timeout=True
            )
            moved = f"moved {', '.join(done.moved)} into the table's schema; " if done.moved else ""
            print(
                f"{shown(table)}: {moved}made {counted(done.made, 'partition')} ahead, retired "
                f"{len(done.retired)} ({'~' if done.rows_estimated else ''}"
                f"{counted(done.rows_retired, 'row')}), {len(done.kept)} "
                f"finished but within the retention of {format_duration(args.retention)}; analyzed"
            )
            if done.attached_back:
                names = ", ".join(map(shown, done.attached_back))
                print(
                    f"{shown(table)}: attached back {names}, found detached or pending detach "
                    "by no run of outbox maintain (by hand) or holding an unfinished row; "
                    "retired like any other once finished for the retention"
                )
            if done.held_off:
                print(f"{shown(table)}: {done.held_off}")
            return
        states = partition_states(conn, table)
    except NotPartitioned as exc:
        left = stopped_conversion(conn, table)
        fail(PROG, f"{exc}; {left + '; ' if left else ''}see docs/partitioning.md", 1)
    if args.json:
        print(json.dumps({"table": str(table), "partitions": [p.to_dict() for p in states]}))
        return
    if not states:
        print(
            f"{shown(table)}: no partitions: none is attached (detached or dropped by hand, "
            "`outbox maintain` never retires the newest); `outbox maintain --table "
            f"{shown_argument(table)}` makes them ahead of the highest id"
        )
        return
    rows: list[Sequence[str]] = [
        ("partition", "ids", "pending", "processing", "dead", "done", "oldest created_at",
         "retirable"),
    ]  # fmt: skip
    for p in states:
        oldest = p.oldest_created_at.strftime("%Y-%m-%d %H:%M:%S") if p.oldest_created_at else "-"
        retirable = (
            f"yes, nothing unfinished since {p.done_since:%Y-%m-%d %H:%M:%S}"
            if p.retirable and p.done_since
            else "yes"
            if p.retirable
            else f"no: {p.why_not}"
        )
        rows.append((
            shown(p.name),
            f"{p.low}-{p.high - 1}",
            *map(str, (p.pending, p.processing, p.dead)),
            f"{_DONE_MARK[p.done_figure]}{p.done_estimate}",
            oldest,
            retirable,
        ))  # fmt: skip
    print("\n".join(aligned(rows, right={2, 3, 4, 5})))
    written = [i for i, p in enumerate(states) if p.written_past]
    if written:
        # Where the producers' next ids go is no longer the sequence's last id alone: the
        # partitions ahead count from this one, as `outbox stats` and `outbox maintain` count.
        ahead = sum(1 for p in states[written[-1] + 1 :] if p.why_not == "made ahead")
        print(
            f"{shown(table)}: {shown(states[written[-1]].name)} holds a row written with an id "
            f"past the sequence's last; {counted(ahead, 'partition')} made ahead of it"
        )


# A partition's done rows: the planner's estimate, counted, or counted up to a limit.
_DONE_MARK = {ESTIMATE: "~", COUNTED: "", AT_LEAST: "≥"}


def _repair(args: argparse.Namespace, conn: psycopg.Connection[Any], table: Table) -> None:
    """`outbox requeue` / `outbox skip`: the TUI's actions, fenced and recorded the same way."""
    action: Action = args.command
    ids: list[int] | None = args.id
    # A partitioned table's dead rows are all within the window of its unfinished rows (the
    # snapshot's and the TUI's): the dead rows are read within it, and changed within the
    # range of their own ids, as constants, so that only the partitions the rows can be in
    # are planned and locked, not the hundreds made ahead. Rows named by id are read wherever
    # they are (the ids, given as values, prune the partitions they are not in). A table
    # partitioned in a way the workers refuse (a DEFAULT partition) has no window: its dead
    # rows are still put right, through the parent, as before.
    try:
        window = fetch(conn, unfinished_window(table))
    except SchemaError:
        window = None
    if ids is not None:
        query = select_targets(table, ids=ids)
        recorded: dict[str, Any] = {"ids": ids}
    elif args.error is not None:
        query = select_targets(table, DeadFilter(error=args.error), window=window)
        recorded = {"error": args.error}
    else:
        query = select_targets(table, window=window)
        recorded = {"all_dead": True}
    seen = fetch(conn, query)
    dead = [s for s in seen if s.status == "dead"]
    left_alone = ""
    if ids is not None:
        found = {s.id for s in seen}
        not_dead = [f"{s.id} ({s.status})" for s in seen if s.status != "dead"]
        missing = [str(i) for i in ids if i not in found]
        notes = ([f"not dead: {', '.join(not_dead)}"] if not_dead else []) + (
            [f"not found: {', '.join(missing)}"] if missing else []
        )
        left_alone = f" (left alone, {'; '.join(notes)})" if notes else ""
    verb = "requeue" if action == "requeue" else "skip"
    if args.dry_run:
        print(f"{shown(table)}: would {verb} {_messages(len(dead))}{left_alone}")
        return
    result = fetch(
        conn,
        repair(
            table,
            action,
            dead,
            actor=default_actor(),
            filter={**recorded, "via": f"outbox {action}"},
            partitioned=window is not None,
        ),
    )
    done = "requeued" if action == "requeue" else "skipped"
    changed = (
        f"{result.count} of {_messages(len(dead))} ({len(result.changed_meanwhile)} changed "
        "meanwhile, left alone)"
        if result.changed_meanwhile
        else _messages(result.count)
    )
    print(f"{shown(table)}: {done} {changed}{left_alone}")


def _messages(n: int) -> str:
    return counted(n, "dead message")
