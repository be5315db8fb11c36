"""`outbox`: migrate the table, read its state, purge old rows, repair dead messages, run the
demo."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

import psycopg

from outbox import admin
from outbox.cliutil import ArgumentParser, add_dsn_and_table, fail, positive_int, resolve
from outbox.maintenance import purge_done
from outbox.schema import SchemaError, migrate, render_migration
from outbox.settings import SettingError, check_dsn, parse_duration, redact_dsn
from outbox.stats import QueueStats, queue_stats
from outbox.table import Table

PROG = "outbox"


def _parser() -> ArgumentParser:
    parser = ArgumentParser(prog=PROG, description="The outbox table: schema, state, retention.")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(name: str, help: str) -> argparse.ArgumentParser:
        sub = commands.add_parser(name, help=help, description=help)
        sub.error = parser.error  # type: ignore[method-assign]
        return sub

    m = command("migrate", "create or upgrade the outbox table (idempotent)")
    add_dsn_and_table(m)
    m.add_argument("--print", action="store_true", help="print the SQL instead of running it")

    s = command("stats", "counts per status, oldest ages, expired leases, attempts")
    add_dsn_and_table(s)
    s.add_argument("--json", action="store_true", help="one JSON object, for scripts")
    s.add_argument("--exact", action="store_true", help="count done rows (a full scan)")

    p = command("purge", "delete done rows older than a retention period, in batches")
    add_dsn_and_table(p)
    p.add_argument("--older-than", required=True, help="e.g. 7d, 12h")
    p.add_argument("--batch", help="rows per DELETE (default 5000)")
    p.add_argument("--dry-run", action="store_true", help="count what would be deleted")

    r = command("requeue", "put dead messages back to pending: available now, attempts reset")
    add_dsn_and_table(r)
    which = r.add_mutually_exclusive_group(required=True)
    which.add_argument(
        "--id", action="append", metavar="ID", help="a dead message (repeat, or comma-separate)"
    )
    which.add_argument(
        "--error", metavar="TEXT", help="every dead message whose last_error contains TEXT"
    )
    which.add_argument("--all-dead", action="store_true", help="every dead message")
    r.add_argument("--dry-run", action="store_true", help="count what would be requeued")

    k = command("skip", "mark dead messages done on purpose (unblocks an ordered aggregate)")
    add_dsn_and_table(k)
    k.add_argument(
        "--id",
        action="append",
        metavar="ID",
        required=True,
        help="a dead message (repeat, or comma-separate)",
    )
    k.add_argument("--dry-run", action="store_true", help="count what would be skipped")

    d = command("demo", "run the whole system on an embedded PostgreSQL and report")
    d.add_argument("--events", help="events to enqueue (default 3000)")
    d.add_argument("--workers", help="worker processes (default 4)")
    d.add_argument("--keep", action="store_true", help="leave the database running afterwards")
    return parser


def _dsn(args: argparse.Namespace) -> str:
    return resolve(args, "--dsn", check_dsn, "")


def _table(args: argparse.Namespace) -> Table:
    return resolve(args, "--table", Table.parse, Table.parse("outbox"))


def message_ids(values: list[str]) -> list[int]:
    """`--id 3 --id 4,5` -> [3, 4, 5]."""
    ids: list[int] = []
    for value in values:
        for part in value.split(","):
            try:
                ids.append(positive_int(part.strip()))
            except ValueError:
                raise SettingError(f"--id: {part.strip()!r} is not a message id") from None
    return ids


def _connect(dsn: str) -> psycopg.Connection[Any]:
    try:
        return psycopg.connect(dsn, autocommit=True, connect_timeout=10)
    except psycopg.OperationalError as exc:
        first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else "connection failed"
        fail(PROG, f"cannot connect to {redact_dsn(dsn) or 'PostgreSQL'}: {first_line}", 1)


def _format_age(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 120:
        return f"{seconds:.1f}s"
    if seconds < 7200:
        return f"{seconds / 60:.1f}m"
    return f"{seconds / 3600:.1f}h"


def print_stats(stats: QueueStats) -> None:
    done = f"~{stats.done}" if stats.done_is_estimate else str(stats.done)
    rows = [
        ("table", stats.table),
        ("pending", f"{stats.count_text('pending')} ({stats.count_text('ready')} ready)"),
        (
            "processing",
            f"{stats.count_text('processing')} "
            f"({stats.count_text('expired_leases')} with expired lease)",
        ),
        ("done", done),
        ("dead", stats.count_text("dead")),
        ("oldest pending age", _format_age(stats.oldest_pending_age)),
        ("oldest ready age", _format_age(stats.oldest_ready_age)),
        ("highest id", str(stats.max_id)),
        ("attempts", ", ".join(f"{k}: {v}" for k, v in stats.attempts.items()) or "-"),
    ]
    width = max(len(name) for name, _ in rows)
    for name, value in rows:
        print(f"{name:<{width}}  {value}")


def main(argv: Sequence[str] | None = None) -> None:
    args = _parser().parse_args(argv)
    try:
        if args.command == "demo":
            from outbox.demo.run import run_demo  # the demo's parts load only when asked for

            sys.exit(
                run_demo(
                    events=resolve(args, "--events", positive_int, 3000),
                    workers=resolve(args, "--workers", positive_int, 4),
                    keep=args.keep,
                )
            )
        table = _table(args)
        if args.command == "migrate" and args.print:
            print(render_migration(table), end="")
            return
        dsn = _dsn(args)
        purge_options = (
            {
                "older_than": resolve(args, "--older-than", parse_duration, timedelta(days=7)),
                "batch": resolve(args, "--batch", positive_int, 5000),
                "dry_run": args.dry_run,
            }
            if args.command == "purge"
            else {}
        )
        if args.command in ("requeue", "skip") and args.id is not None:
            args.id = message_ids(args.id)
    except SettingError as exc:
        fail(PROG, str(exc))
    with _connect(dsn) as conn:
        try:
            _run(args, conn, table, purge_options)
        except SchemaError as exc:
            fail(PROG, str(exc), 1)
        except psycopg.errors.UndefinedTable:
            fail(PROG, f"table {table} does not exist; run `outbox migrate --table {table}`", 1)
        except psycopg.Error as exc:
            fail(PROG, f"{type(exc).__name__}: {str(exc).strip().splitlines()[0]}", 1)


def _run(
    args: argparse.Namespace,
    conn: psycopg.Connection[Any],
    table: Table,
    purge_options: dict[str, Any],
) -> None:
    if args.command == "migrate":
        before, after = migrate(conn, table)
        if before == after:
            print(f"{table}: already at schema v{after}")
        else:
            print(f"{table}: migrated from v{before} to v{after}")
    elif args.command == "stats":
        stats = queue_stats(conn, table, exact=args.exact)
        if args.json:
            print(json.dumps(stats.to_dict()))
        else:
            print_stats(stats)
    elif args.command == "purge":
        count = purge_done(conn, table, **purge_options)
        verb = "would delete" if args.dry_run else "deleted"
        print(f"{table}: {verb} {count} done rows")
    elif args.command in ("requeue", "skip"):
        _repair(args, conn, table)


def _repair(args: argparse.Namespace, conn: psycopg.Connection[Any], table: Table) -> None:
    """`outbox requeue` / `outbox skip`: the TUI's actions, fenced and recorded the same way."""
    action: admin.Action = args.command
    ids: list[int] | None = args.id
    if ids is not None:
        query = admin.select_targets(table, ids=ids)
        recorded: dict[str, Any] = {"ids": ids}
    elif args.error is not None:
        query = admin.select_targets(table, admin.DeadFilter(error=args.error))
        recorded = {"error": args.error}
    else:
        query = admin.select_targets(table)
        recorded = {"all_dead": True}
    seen = admin.fetch(conn, query)
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
        print(f"{table}: would {verb} {_messages(len(dead))}{left_alone}")
        return
    result = admin.apply(
        conn,
        table,
        action,
        dead,
        actor=admin.default_actor(),
        filter={**recorded, "via": f"outbox {action}"},
    )
    done = "requeued" if action == "requeue" else "skipped"
    changed = (
        f"{result.count} of {_messages(len(dead))} ({len(result.changed_meanwhile)} changed "
        "meanwhile, left alone)"
        if result.changed_meanwhile
        else _messages(result.count)
    )
    print(f"{table}: {done} {changed}{left_alone}")


def _messages(n: int) -> str:
    return f"{n} dead message{'' if n == 1 else 's'}"
