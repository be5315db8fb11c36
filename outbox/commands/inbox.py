"""`outbox inbox migrate`, `outbox inbox purge` and `outbox inbox check`: the receiving end's
table, from the same `outbox` command (its connection, timeouts and error handling are
`outbox.cli`'s)."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

import psycopg

from outbox import inbox
from outbox.operations.maintenance import MAX_PURGE_BATCH, PURGE_BATCH_ENV
from outbox.plumbing import dberrors
from outbox.plumbing.cliutil import add_dsn_and_table, int_between, resolve
from outbox.plumbing.durations import format_duration, parse_duration
from outbox.plumbing.text import counted
from outbox.schema import SchemaError
from outbox.table import Table, shown, shown_argument

# Not OUTBOX_TABLE: that names the outbox table wherever the workers' settings are set.
TABLE_ENV = "OUTBOX_INBOX_TABLE"
_TABLE_HELP = (
    f"inbox table, optionally SCHEMA.NAME (env {TABLE_ENV}; default {inbox.DEFAULT_INBOX_TABLE})"
)


def add_commands(
    parser: argparse.ArgumentParser,
    add_timeouts: Callable[[argparse.ArgumentParser], None],
    error: Callable[[str], Any],
) -> None:
    """`inbox migrate`, `inbox purge` and `inbox check` under `parser` (the `inbox` command)."""
    commands = parser.add_subparsers(dest="inbox_command", required=True, metavar="COMMAND")

    def command(name: str, help: str) -> argparse.ArgumentParser:
        sub = commands.add_parser(name, help=help, description=help)
        sub.error = error  # type: ignore[method-assign,assignment]
        add_dsn_and_table(sub)
        # Same flag and variable as every command; another default, another meaning.
        for action in sub._actions:
            if action.dest == "table":
                action.help = _TABLE_HELP
        add_timeouts(sub)
        return sub

    m = command("migrate", "create the inbox table a receiver records message ids in (idempotent)")
    m.add_argument("--print", action="store_true", help="print the SQL instead of running it")

    p = command(
        "purge",
        "delete message ids received long ago, oldest first, in bounded batches, one purger "
        "at a time",
    )
    p.add_argument(
        "--older-than",
        help="keep ids received more recently than this; at least the time a message can still "
        "be delivered again, see docs/receiving.md "
        f"(default {format_duration(inbox.DEFAULT_RETENTION)})",
    )
    p.add_argument(
        "--batch",
        help=f"rows per DELETE (env {PURGE_BATCH_ENV}; default {inbox.DEFAULT_PURGE_BATCH})",
    )
    p.add_argument("--dry-run", action="store_true", help="count what would be deleted")

    command(
        "check",
        "check the inbox table as a receiver needs it (its version, the purge's index on "
        "received_at): one line, exit 1 naming what is wrong and what to run",
    )


def table(args: argparse.Namespace) -> Table:
    default = Table.parse(inbox.DEFAULT_INBOX_TABLE)
    # The flag, else its own variable (resolve names either in an error, and refuses what
    # is no text: an undecodable byte), else the default.
    return resolve(args, "--table", Table.parse, default, variable=TABLE_ENV)


def prepare(args: argparse.Namespace) -> bool:
    """Read the command's settings (SettingError names a bad one); True when the command is
    done without a database (`migrate --print`)."""
    args.inbox_table = table(args)
    # `outbox`'s own messages (a lock waited for too long, ...) then name the inbox table.
    args.table = args.inbox_table
    if args.inbox_command == "migrate" and args.print:
        print(inbox.render_migration(args.inbox_table), end="")
        return True
    if args.inbox_command == "purge":
        args.older_than = resolve(args, "--older-than", parse_duration, inbox.DEFAULT_RETENTION)
        args.batch = resolve(
            args, "--batch", int_between(1, MAX_PURGE_BATCH), inbox.DEFAULT_PURGE_BATCH,
            variable=PURGE_BATCH_ENV,
        )  # fmt: skip
    return False


def run(args: argparse.Namespace, conn: psycopg.Connection[Any]) -> None:
    t: Table = args.inbox_table
    try:
        if args.inbox_command == "migrate":
            done = inbox.migrated(conn, t)
            state = ", ".join(done) if done else "already there"
            print(f"{shown(t)}: {state} (inbox v{inbox.INBOX_VERSION})")
            return
        inbox.check(conn, t)
        if args.inbox_command == "check":
            print(f"{shown(t)}: ready (inbox v{inbox.INBOX_VERSION}, purge index on received_at)")
            return
        result = inbox.purge(
            conn, t, older_than=args.older_than, batch=args.batch, dry_run=args.dry_run
        )
    except dberrors.MISSING_TABLE:
        raise SchemaError(
            f"inbox table {shown(t)} does not exist; run "
            f"`outbox inbox migrate --table {shown_argument(t)}`"
        ) from None
    before = result.cutoff.isoformat(sep=" ", timespec="seconds")
    verb = "would delete" if args.dry_run else "deleted"
    print(f"{shown(t)}: {verb} {counted(result.deleted, 'message id')} received before {before}")
    if result.busy:
        print(
            f"{shown(t)}: another purge of this table is running; stopped and left the rest to it"
        )


__all__ = ["add_commands", "prepare", "run", "table"]
