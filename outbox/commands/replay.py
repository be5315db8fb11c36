"""`outbox replay` and `outbox reconcile`: send a window of messages again, and find what a
receiver's inbox never recorded (docs/replay.md). Their connection, timeouts and error
handling are `outbox.cli`'s."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import psycopg
from psycopg import sql

from outbox.inbox import DEFAULT_INBOX_TABLE, check_key
from outbox.operations import reconcile, replay
from outbox.operations.repair import default_actor
from outbox.plumbing import dberrors
from outbox.plumbing.cliutil import fail, int_between, resolve
from outbox.plumbing.dsn import check_dsn, with_pg_environment
from outbox.plumbing.durations import parse_duration
from outbox.plumbing.errors import SettingError
from outbox.plumbing.redact import describe_dsn
from outbox.plumbing.text import counted, first_unsafe, printable, printable_name
from outbox.runner import Query, fetch, first_row, perform
from outbox.table import Table, shown, shown_argument

PROG = "outbox"
MAX_LIMIT = 2**31 - 1  # the audit log counts in integer
_TIME_HELP = (
    "an ISO 8601 time with its offset (2026-03-01T14:02:00+01:00), or a duration before now (2h)"
)


def add_commands(command: Callable[[str, str], argparse.ArgumentParser]) -> None:
    """`replay` and `reconcile`, made by `command(name, help)` with the DSN, the table and
    the timeouts every command that connects takes."""
    r = command("replay", "send delivered (or dead) messages of a time window again")
    _add_window(r)
    r.add_argument(
        "--event-type",
        action="extend",
        nargs="+",
        metavar="T",
        help="only this event type (several: any of them)",
    )
    r.add_argument("--aggregate-type", metavar="A", help="only this aggregate type")
    r.add_argument("--aggregate-id", metavar="ID", help="only this aggregate")
    r.add_argument(
        "--status", choices=replay.STATUSES, help="send again done (default) or dead messages"
    )
    r.add_argument("--limit", metavar="N", help="at most N messages, the oldest first")
    r.add_argument("--reason", metavar="TEXT", help="why: kept in the audit log")
    r.add_argument(
        "--dry-run", action="store_true", help="print what would be sent, change nothing"
    )
    r.add_argument(
        "--yes", action="store_true", help="no typed confirmation (required without a terminal)"
    )
    r.add_argument(
        "--resume",
        metavar="N",
        help="go on with replay N where it stopped (its window, filter and batch size are in "
        "the audit log)",
    )
    r.add_argument(
        "--batch",
        metavar="N",
        help=f"messages per batch, 1 to {replay.MAX_BATCH} (default {replay.DEFAULT_BATCH}; "
        "with --resume, the replay's own)",
    )

    c = command(
        "reconcile",
        "compare the messages delivered in a window with a receiver's inbox: what it never "
        "recorded, and what it recorded that was not delivered",
    )
    c.add_argument(
        "--inbox-dsn",
        required=True,
        metavar="DSN",
        help="the receiver's database (a read-only role is enough)",
    )
    c.add_argument(
        "--inbox-table",
        required=True,
        metavar="TABLE",
        help=f"its inbox table, optionally SCHEMA.NAME (e.g. {DEFAULT_INBOX_TABLE})",
    )
    c.add_argument(
        "--consumer",
        metavar="NAME",
        help="the consumer whose keys to read (default: the inbox's only consumer)",
    )
    _add_window(c)
    c.add_argument(
        "--replay", action="store_true", help="send the missing messages again (audited)"
    )
    c.add_argument("--yes", action="store_true", help="with --replay: no typed confirmation")
    c.add_argument(
        "--resume",
        metavar="N",
        help="go on with replay N of a stopped --replay to its window's end (its window and "
        "consumer are in the audit log)",
    )
    c.add_argument("--json", action="store_true", help="one JSON object, for scripts")


def _add_window(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--since", metavar="TIME", help=f"from (inclusive): {_TIME_HELP}")
    parser.add_argument("--until", metavar="TIME", help=f"to (exclusive): {_TIME_HELP}")


# -- reading the flags -------------------------------------------------------------------


@dataclass(frozen=True)
class Moment:
    """A TIME flag: a fixed time, or a duration before the database's now()."""

    at: datetime | None = None
    ago: timedelta | None = None

    def resolve(self, now: datetime) -> datetime:
        if self.at is not None:
            return self.at
        assert self.ago is not None
        return now - self.ago


def parse_time(text: str) -> Moment:
    """`2h` (before now) or an ISO 8601 time with its offset; ValueError otherwise."""
    try:
        return Moment(ago=parse_duration(text))
    except ValueError:
        pass
    try:
        at = datetime.fromisoformat(text.strip())
    except ValueError:
        raise ValueError(
            f"{text!r} is neither an ISO 8601 time nor a duration (e.g. "
            "2026-03-01T14:02:00+01:00, 2h)"
        ) from None
    if at.tzinfo is None:
        raise ValueError(f"{text!r} has no offset (add Z or +01:00: which zone is meant?)")
    return Moment(at=at)


def _text(name: str) -> Callable[[str], str]:
    def check(text: str) -> str:
        if not text:
            raise ValueError("empty")
        if (unsafe := first_unsafe(text)) is not None:
            raise ValueError(f"holds {unsafe}")
        return text

    return check


def _interactive() -> bool:
    return sys.stdin.isatty() and sys.stdout.isatty()


def prepare(args: argparse.Namespace) -> None:
    """Check the flags before connecting: SettingError names the wrong one (exit 2)."""
    if args.resume is not None:
        args.resume = resolve(args, "--resume", int_between(1, MAX_LIMIT), None)
        # Kept in the audit log, as the window: given again, they would be ignored.
        own = ("since", "until", "event_type", "aggregate_type", "aggregate_id", "status", "limit")
        extra = [
            flag
            for flag in (own if args.command == "replay" else own[:2])
            if getattr(args, flag) is not None
        ]
        if extra:
            raise SettingError(
                f"--resume: goes on with the replay's own window, filter and count; drop "
                f"--{extra[0].replace('_', '-')}"
            )
        if args.command == "replay" and args.dry_run:
            # A resume has no preview: it would send, and without the --yes a send needs.
            raise SettingError("--resume: goes on sending, with no dry run; drop --dry-run")
    else:
        for flag in ("--since", "--until"):
            if getattr(args, flag[2:]) is None:
                raise SettingError(f"{flag} is required (e.g. {flag} 2h)")
        args.since = resolve(args, "--since", parse_time, Moment())
        args.until = resolve(args, "--until", parse_time, Moment())
    if args.command == "replay":
        args.limit = resolve(args, "--limit", int_between(1, MAX_LIMIT), None)
        # None when not given: a new replay takes the default, a resumed one its own size.
        # The flag only: OUTBOX_BATCH is the workers' claim batch wherever their settings are
        # set (a worker's pod, where a replay may be run), not a replay's.
        args.batch = resolve(args, "--batch", int_between(1, replay.MAX_BATCH), None, env={})
        args.status = args.status or "done"
        if args.reason is not None:
            args.reason = resolve(args, "--reason", _text("--reason"), None)
        for flag in ("--aggregate-type", "--aggregate-id"):
            resolve(args, flag, _text(flag), None)
        for event_type in args.event_type or ():
            _checked("--event-type", event_type)
        confirming = not args.dry_run
    else:
        args.inbox_dsn = resolve(args, "--inbox-dsn", check_dsn, "")
        args.inbox_table = resolve(args, "--inbox-table", Table.parse, Table.default())
        if args.consumer is not None:
            args.consumer = resolve(args, "--consumer", _consumer, None)
        if args.resume is not None:
            args.replay = True  # going on with a replay is replaying
        if args.yes and not args.replay:
            raise SettingError("--yes confirms --replay; add --replay, or drop --yes")
        confirming = args.replay
    if confirming and not args.yes and not _interactive():
        what = "replay" if args.command == "replay" else "reconcile --replay"
        raise SettingError(
            f"{what} sends messages again and asks to confirm: --yes is required without a terminal"
        )


def _checked(flag: str, value: str) -> None:
    try:
        _text(flag)(value)
    except ValueError as exc:
        raise SettingError(f"{flag}: {exc}") from None


def _consumer(text: str) -> str:
    return check_key("consumer", text)


# -- running -----------------------------------------------------------------------------


def _inbox_connection(dsn: str) -> psycopg.Connection[Any]:
    try:
        return reconcile.connect_inbox(dsn)
    except psycopg.Error as exc:
        where = describe_dsn(with_pg_environment(dsn))
        fail(PROG, f"cannot connect to the inbox at {where}: {dberrors.describe(exc)}", 1)


def _now(conn: psycopg.Connection[Any]) -> datetime:
    statement = sql.SQL("SELECT now()").format()
    now = fetch(conn, Query(statement, None, first_row(lambda r: r and r[0])))
    assert isinstance(now, datetime)
    return now


def _window(args: argparse.Namespace, conn: psycopg.Connection[Any]) -> tuple[datetime, datetime]:
    now = _now(conn)
    since, until = args.since.resolve(now), args.until.resolve(now)
    if until <= since:
        fail(PROG, "--until must be later than --since (the window is empty)")
    return since, until


def confirm(count: int, what: str) -> bool:
    """The typed count, as the TUI's bulk requeue asks for it: True when typed right. Ctrl-D
    (the input's end) is no answer: nothing is confirmed, as for a wrong count."""
    try:
        answer = input(f"{what}: type {count} to confirm: ")
    except EOFError:
        print()  # the line the prompt left open, so that what follows starts a line
        return False
    return answer.strip() == str(count)


def run(args: argparse.Namespace, conn: psycopg.Connection[Any], table: Table) -> None:
    sends = not args.dry_run if args.command == "replay" else args.replay
    if not sends:
        _run(args, conn, table)
        return
    # From before the preview (or the comparison) the user confirms to the last batch, no
    # run of `outbox maintain` retires a partition: its rows would go between two batches,
    # and fewer be sent than were confirmed.
    with replay.holding_off_retirement(conn, table):
        _run(args, conn, table)


def _run(args: argparse.Namespace, conn: psycopg.Connection[Any], table: Table) -> None:
    if args.command == "replay":
        _replay(args, conn, table)
    else:
        _reconcile(args, conn, table)


def _replay(args: argparse.Namespace, conn: psycopg.Connection[Any], table: Table) -> None:
    actor = default_actor()
    if args.resume is not None:
        try:
            progress = perform(conn, replay.resume_point(table, args.resume))
        except replay.NoSuchReplay as exc:
            fail(PROG, str(exc), 1)
        if progress.reconcile is not None:
            # Its filter holds the missing ids of one chunk only: the rest of its window is
            # found missing again by comparing it with the inbox.
            fail(
                PROG,
                f"--resume: replay {args.resume} is a `reconcile --replay`: go on with `outbox "
                f"reconcile --table {shown_argument(table)} --inbox-dsn DSN --inbox-table TABLE "
                f"--resume {args.resume}`",
            )
        if args.batch is not None:
            progress.batch = args.batch  # recorded with each batch: a later resume keeps it
        print(
            f"{shown(table)}: replay {progress.number}: going on from id {progress.next_id} "
            f"in batches of {progress.batch} ({printable(progress.filter.describe())})"
        )
        _send(args, conn, table, progress, actor)
        return
    since, until = _window(args, conn)
    f = replay.ReplayFilter(
        since=since,
        until=until,
        event_types=tuple(args.event_type or ()),
        aggregate_type=args.aggregate_type,
        aggregate_id=args.aggregate_id,
        status=args.status,
    )
    preview = perform(conn, replay.preview(table, f, limit=args.limit))
    lines = preview.lines()
    if args.dry_run or not preview.count:
        verb = "would send again" if preview.count else ""
        print(f"{shown(table)}: {verb + ' ' if verb else ''}{lines[0]}")
        for line in lines[1:]:
            print(line)
        return
    if not args.yes:
        for line in lines:
            print(line)
        if not confirm(preview.count, f"send {counted(preview.count, 'message')} again"):
            fail(PROG, "not confirmed: nothing sent", 1)
    progress = perform(conn, replay.start(table, preview))
    if args.batch is not None:
        progress.batch = args.batch
    _send(args, conn, table, progress, actor)


def _send(
    args: argparse.Namespace,
    conn: psycopg.Connection[Any],
    table: Table,
    progress: replay.Progress,
    actor: str | None,
) -> None:
    try:
        while not progress.finished:
            perform(
                conn,
                replay.send_batch(
                    table,
                    progress,
                    actor=actor,
                    reason=args.reason or progress.reason,
                ),
                transaction=True,  # the rows and their partitions' notes together
            )
    except KeyboardInterrupt:
        print(
            f"{shown(table)}: replay {progress.number}: stopped after "
            f"{counted(progress.sent, 'message')} "
            f"({counted(progress.batches, 'batch', 'batches')}); go on with `outbox replay --table "
            f"{shown_argument(table)} --resume {progress.number}`",
            file=sys.stderr,
        )
        raise SystemExit(130) from None
    by_type = ", ".join(
        f"{name} {n}" for name, n in sorted((printable(t), n) for t, n in progress.by_type.items())
    )
    print(
        f"{shown(table)}: replay {progress.number}: sent {counted(progress.sent, 'message')} again "
        f"in {counted(progress.batches, 'batch', 'batches')}"
        f"{f' ({by_type})' if by_type else ''}{progress.shortfall()}"
    )


def _reconcile(args: argparse.Namespace, conn: psycopg.Connection[Any], table: Table) -> None:
    if args.resume is not None:
        _resume_reconcile(args, conn, table)
        return
    since, until = _window(args, conn)
    progress: replay.Progress | None = None
    with _inbox_connection(args.inbox_dsn) as inbox_conn, _reading_inbox(args):
        found = reconcile.compare(
            conn,
            table,
            inbox_conn,
            args.inbox_table,
            consumer=args.consumer,
            since=since,
            until=until,
        )
        if args.replay and found.missing:
            if not args.yes:
                for line in found.lines(table):
                    print(line)
                if not confirm(found.missing, f"send {counted(found.missing, 'message')} again"):
                    fail(PROG, "not confirmed: nothing sent", 1)
            progress = reconcile.start_replay(conn, table, found, args.inbox_table)
            _send_missing(args, conn, table, inbox_conn, progress)
    sent = None if progress is None else reconcile.Replayed(progress.number, progress.sent)
    if args.json:
        print(json.dumps(found.to_dict(sent)))
        return
    for line in found.lines(table):
        print(line)
    if sent is not None:
        sent_again = counted(sent.count, "missing message")
        print(f"{shown(table)}: replay {sent.number}: sent {sent_again} again")


@contextmanager
def _reading_inbox(args: argparse.Namespace) -> Iterator[None]:
    """What reading the inbox may meet, said in one line."""
    try:
        yield
    except reconcile.AmbiguousConsumer as exc:
        fail(PROG, str(exc))
    except dberrors.MISSING_TABLE:
        fail(PROG, f"inbox table {shown(args.inbox_table)} does not exist at the --inbox-dsn", 1)
    except psycopg.errors.InsufficientPrivilege as exc:
        fail(PROG, f"the --inbox-dsn's role cannot read the inbox: {exc.diag.message_primary}", 1)


def _resume_reconcile(
    args: argparse.Namespace, conn: psycopg.Connection[Any], table: Table
) -> None:
    number = args.resume
    try:
        progress = reconcile.resume_point(conn, table, number)
    except replay.NoSuchReplay as exc:
        fail(PROG, str(exc), 1)
    except reconcile.NotReconciling:
        fail(
            PROG,
            f"--resume: replay {number} is an `outbox replay`: go on with `outbox replay "
            f"--table {shown_argument(table)} --resume {number}`",
        )
    assert progress.reconcile is not None
    recorded = progress.reconcile.get("consumer")
    if recorded is not None and args.consumer not in (None, recorded):
        fail(
            PROG,
            f"--resume: replay {number} compared consumer {printable_name(recorded)}; drop "
            "--consumer",
        )
    compared = reconcile.recorded_inbox(progress)
    if compared is not None and compared != args.inbox_table:
        # Another table holds other keys (or none of this consumer's): compared with it,
        # what was delivered would count missing and be sent again.
        fail(
            PROG,
            f"--resume: replay {number} compared inbox table {shown_argument(compared)}, not "
            f"{shown_argument(args.inbox_table)}; give --inbox-table {shown_argument(compared)}",
        )
    # A record from before the inbox table was kept: the one given, kept from now on.
    reconcile.record_inbox(progress, args.inbox_table)
    with _inbox_connection(args.inbox_dsn) as inbox_conn, _reading_inbox(args):
        # A record from before the consumer was kept: the named one, or the inbox's only one.
        consumer = recorded or reconcile.choose_consumer(
            inbox_conn, args.inbox_table, args.consumer
        )
        progress.reconcile["consumer"] = consumer
        if not args.json:
            print(
                f"{shown(table)}: replay {number}: going on from id {progress.next_id} (missing "
                f"for consumer {printable_name(consumer)}; {printable(progress.filter.describe())})"
            )
        _send_missing(args, conn, table, inbox_conn, progress)
    if args.json:
        print(json.dumps({"replayed": {"replay": number, "count": progress.sent}}))
        return
    sent_again = counted(progress.sent, "missing message")
    print(f"{shown(table)}: replay {number}: sent {sent_again} again")


def _send_missing(
    args: argparse.Namespace,
    conn: psycopg.Connection[Any],
    table: Table,
    inbox_conn: psycopg.Connection[Any],
    progress: replay.Progress,
) -> None:
    try:
        reconcile.replay_missing(
            conn, table, inbox_conn, args.inbox_table, progress, actor=default_actor()
        )
    except KeyboardInterrupt:
        stopped = f"{shown(table)}: replay {progress.number}: stopped"
        if progress.sent == 0 and args.resume is None:
            # No batch sent, none recorded: there is nothing to resume.
            print(f"{stopped} before it sent a message; run the comparison again", file=sys.stderr)
        else:
            print(
                f"{stopped} after {counted(progress.sent, 'missing message')} "
                f"({counted(progress.batches, 'batch', 'batches')}), {progress.left} of the "
                f"{progress.confirmed} confirmed left; go on with `outbox reconcile --table "
                f"{shown_argument(table)} --inbox-table {shown_argument(args.inbox_table)} "
                f"--resume {progress.number}` and the same --inbox-dsn",
                file=sys.stderr,
            )
        raise SystemExit(130) from None
