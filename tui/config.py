"""`outbox-tui`'s flags: the same conventions as `outbox` and `outbox-worker` (OUTBOX_*
variables, one-line errors, exit code 2)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta

from outbox.plumbing.cliutil import (
    ArgumentParser,
    add_dsn_and_table,
    fail,
    int_between,
    on_off,
    resolve,
)
from outbox.plumbing.dsn import check_dsn
from outbox.plumbing.durations import duration_between, parse_duration
from outbox.plumbing.errors import SettingError
from outbox.schema import ORDERINGS
from outbox.table import Table

PROG = "outbox-tui"
# What `+` and `-` step through; the flag may set any value, the keys move to a neighbour.
INTERVALS = (0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0)
# Faster than a tenth of a second only polls the database back to back.
REFRESH_RANGE = (timedelta(milliseconds=100), timedelta(hours=1))
_REFRESH = duration_between(*REFRESH_RANGE)
DEFAULT_TABLE = Table.default()
MAX_PAGE_SIZE = 1000  # rows drawn per page; beyond it a query fetches more than a screen shows


@dataclass(frozen=True)
class Config:
    dsn: str = ""
    table: Table = DEFAULT_TABLE
    read_only: bool = False
    interval: float = 2.0  # seconds between the end of one poll and the start of the next
    slo: float = 60.0  # seconds; oldest pending/ready ages over it are coloured
    ordered: bool = False  # workers run --ordering aggregate: show blocked aggregates
    page_size: int = 50
    paused: bool = False  # start without live refresh (snapshots, slow links)


def _refresh(text: str) -> float:
    return _REFRESH(text).total_seconds()


def _seconds(text: str) -> float:
    seconds = parse_duration(text).total_seconds()
    if seconds <= 0:
        raise ValueError("must be more than 0")
    return seconds


def _ordering(text: str) -> bool:
    if text not in ORDERINGS:
        raise ValueError(f"{text!r} is not an ordering (use {' or '.join(ORDERINGS)})")
    return text == "aggregate"


def parse_args(argv: Sequence[str] | None = None) -> Config:
    parser = ArgumentParser(
        prog=PROG,
        description="Watch an outbox table live and repair its dead messages.",
    )
    add_dsn_and_table(parser)
    parser.add_argument(
        "--read-only",
        action="store_true",
        default=None,  # unset: OUTBOX_READ_ONLY decides
        help="hide and refuse every action (env OUTBOX_READ_ONLY=on)",
    )
    parser.add_argument(
        "--refresh",
        help="time between refreshes, 100ms to 1h (default 2s)",
    )
    parser.add_argument("--slo", help="oldest-age target; ages over it are red (default 60s)")
    parser.add_argument(
        "--ordering", help="none or aggregate, as the workers run (aggregate: blocked heads)"
    )
    parser.add_argument("--page-size", help="dead messages per page (default 50)")
    parser.add_argument("--paused", action="store_true", help="start with refresh paused")
    args = parser.parse_args(argv)
    try:
        return Config(
            dsn=resolve(args, "--dsn", check_dsn, ""),
            table=resolve(args, "--table", Table.parse, DEFAULT_TABLE),
            read_only=resolve(args, "--read-only", on_off, False),
            interval=resolve(args, "--refresh", _refresh, 2.0),
            slo=resolve(args, "--slo", _seconds, 60.0),
            ordered=resolve(args, "--ordering", _ordering, False),
            page_size=resolve(args, "--page-size", int_between(1, MAX_PAGE_SIZE), 50),
            paused=args.paused,
        )
    except SettingError as exc:
        fail(PROG, str(exc))


def neighbour_interval(current: float, faster: bool) -> float:
    if faster:
        options = [i for i in INTERVALS if i < current]
        return options[-1] if options else current
    options = [i for i in INTERVALS if i > current]
    return options[0] if options else current
