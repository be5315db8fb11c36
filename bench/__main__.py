"""`python -m bench` (`make bench`): run every benchmark, print a table, write JSON and a plot.

python -m bench                   # the full run (about 15 minutes on 2 cores)
python -m bench --smoke           # tiny sizes, one repeat: checks the harness only
python -m bench --only throughput # the no-op throughput section and the SQL ceiling alone
python -m bench --only latency    # commit to receiver, worker beside a floor and pgqueuer
python -m bench --only latency --latency-rates 1000 --latency-processes 2 --latency-seconds 5
python -m bench --repeat 4 --messages 20000 --out bench/results
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from bench import latency, scenarios
from bench.ceiling import run_ceiling
from bench.costs import statement_costs
from bench.env import Bench
from bench.http import run_http
from bench.profile import profile_worker
from bench.report import plot, render, render_latency, render_section, render_throughput
from bench.throughput import BATCH, CONTENDERS, SEEDS, Contender, run_contender


def _summary(values: list[float]) -> dict[str, Any]:
    return {
        "median": statistics.median(values),
        "min": min(values),
        "max": max(values),
        "runs": values,
    }


def _log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def run_throughput(bench: Bench, messages: int, repeat: int) -> dict[str, Any]:
    """Every contender and the SQL ceiling on both seeds, in rounds: each round runs every
    one once, so that a machine whose load drifts weighs on all of them alike. The ratios are
    taken within a round: the SQL ceiling of n clients runs right after the worker and the
    plain loop of n processes, and every other round runs in reverse order, so that neither
    side of a ratio always runs first. The ceiling runs twice: on the table as shipped, then
    on one migrated with `--ordering aggregate`, which shows what ordered mode's index costs."""
    ceilings = {
        (seed, clients, ordering): f"SQL ceiling (pgbench), {clients} client(s){suffix}{table}"
        for seed, suffix in zip(SEEDS, ("", ", one aggregate per row"), strict=True)
        for clients in (1, 2)
        for ordering, table in ((None, ""), ("aggregate", ", ordered table"))
    }
    jobs: list[Contender | tuple[str, int, str, str | None]] = []
    for contender in CONTENDERS:
        jobs.append(contender)
        if contender.peer == "plain-loop":
            for ordering in (None, "aggregate"):
                key = (contender.seed, contender.processes, ordering)
                jobs.append((ceilings[key], contender.processes, contender.seed, ordering))
    runs: dict[str, list[float]] = {}
    cpu: dict[str, list[float]] = {}
    for n in range(repeat):
        for job in jobs if n % 2 == 0 else reversed(jobs):
            if isinstance(job, Contender):
                _log(f"throughput: {job.name} ({n + 1}/{repeat})")
                drained = run_contender(bench, job, messages)
                runs.setdefault(job.name, []).append(drained.messages_per_second)
                if drained.cpu_us_per_message is not None:
                    cpu.setdefault(job.name, []).append(drained.cpu_us_per_message)
            else:
                name, clients, seed, ordering = job
                _log(f"ceiling: {name} ({n + 1}/{repeat})")
                aggregates = SEEDS[seed] or messages
                runs.setdefault(name, []).append(
                    run_ceiling(bench, messages, clients, BATCH, aggregates, ordering)
                )
    throughput: dict[str, Any] = {}
    for contender in CONTENDERS:
        throughput[contender.name] = {
            "peer": contender.peer, "processes": contender.processes,
            "detail": contender.detail, "seed": contender.seed, **_summary(runs[contender.name]),
        }  # fmt: skip
        if contender.name in cpu:
            throughput[contender.name]["cpu_us_per_message"] = _summary(cpu[contender.name])
    for (seed, clients, ordering), name in ceilings.items():
        throughput[name] = {
            "peer": "ceiling-ordered" if ordering else "ceiling", "processes": clients,
            "seed": seed,
            "detail": "our claim + batched finalize, no Python"
            + (", table migrated with --ordering aggregate" if ordering else ""),
            **_summary(runs[name]),
        }  # fmt: skip
    return throughput


def _latency_plan(args: argparse.Namespace) -> latency.Plan:
    """The grid from the flags; --smoke's is one quick cell (100/s, one process, both
    modes, every contender, 2 s each)."""
    base = latency.SMOKE if args.smoke else latency.Plan()

    def listed(text: str | None, convert: Any, default: tuple[Any, ...]) -> tuple[Any, ...]:
        return tuple(convert(v) for v in text.split(",")) if text else default

    return latency.Plan(
        rates=listed(args.latency_rates, int, base.rates),
        processes=listed(args.latency_processes, int, base.processes),
        modes=listed(args.latency_modes, str, base.modes),
        contenders=listed(args.latency_contenders, str, base.contenders),
        seconds=args.latency_seconds if args.latency_seconds is not None else base.seconds,
        repeat=args.latency_repeat if args.latency_repeat is not None else base.repeat,
        # "all": every cell every round.
        repeat_processes=(
            None
            if args.latency_repeat_processes == "all"
            else listed(args.latency_repeat_processes, int, base.repeat_processes or ()) or None
        ),
    )


def run(args: argparse.Namespace) -> dict[str, Any]:
    smoke = args.smoke
    messages = args.messages or (2000 if smoke else 20_000)
    repeat = 1 if smoke else args.repeat
    report: dict[str, Any] = {"smoke": smoke, "messages": messages, "repeat": repeat}
    with Bench() as bench:
        report["environment"] = bench.environment()

        if args.only in (None, "throughput"):
            report["throughput"] = run_throughput(bench, messages, repeat)
            _log("costs: claim and finalize under EXPLAIN ANALYZE, both seeds")
            report["costs"] = statement_costs(bench, messages, SEEDS, repeat)
            if args.only == "throughput":
                return report
            report["http"] = run_http(bench, messages, repeat, _log, profile=args.profile)

        report["latency"] = latency.run_latency(bench, _latency_plan(args), _log)
        if args.only == "latency":
            return report

        done_rows = (1_000, 10_000) if smoke else (10_000, 100_000, 1_000_000, 5_000_000)
        report["scale_done_rows"] = []
        for count in done_rows:
            _log(f"scale: claim + finalize with {count:,} done rows kept")
            report["scale_done_rows"].append(scenarios.scale_done_rows(bench, count, messages))
        report["ordered"] = []
        for aggregates in (10, 100) if smoke else (10, 1_000, 100_000):
            _log(f"ordered mode: {aggregates:,} aggregates")
            report["ordered"].append(scenarios.ordered_aggregates(bench, aggregates, messages))

        memory_messages = 20_000 if smoke else 1_000_000
        _log(f"memory: RSS over a {memory_messages:,}-message drain")
        report["memory"] = scenarios.memory_drain(bench, memory_messages)

        report["publisher_bound"] = []
        for concurrency in (1, 8) if smoke else (1, 8, 32, 128, 512):
            _log(f"publisher-bound: 50 ms publishes, concurrency {concurrency}")
            report["publisher_bound"].append(scenarios.publisher_bound(bench, concurrency))

        if args.profile:
            _log("profile: py-spy on one worker process draining")
            report["profile"] = profile_worker(bench, messages * (1 if smoke else 5))
    return report


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, one repeat")
    parser.add_argument("--messages", type=int, help="messages per throughput run (20000)")
    parser.add_argument("--repeat", type=int, default=3, help="runs per figure (3)")
    parser.add_argument("--out", default="bench/results", help="where report.json/.md/.png go")
    parser.add_argument(
        "--no-profile", dest="profile", action="store_false", help="skip the py-spy profile"
    )
    parser.add_argument(
        "--only",
        choices=["throughput", "latency"],
        help="run one section: throughput (no-op, with the SQL ceiling and the statements' "
        "costs) or latency; writes SECTION.json/.md",
    )
    group = parser.add_argument_group("latency (bench/latency.py)")
    for flag, what in (
        ("--latency-rates", "messages/s, comma-separated (10,100,1000)"),
        ("--latency-processes", "contender processes, comma-separated (1,2)"),
        ("--latency-modes", "unordered and/or ordered (both)"),
        ("--latency-contenders", "worker, floor and/or pgqueuer (all)"),
    ):
        group.add_argument(flag, metavar="LIST", help=what)
    by_rate = ", ".join(f"{s:g} at {r}/s" for r, s in latency.SECONDS.items())
    group.add_argument(
        "--latency-seconds", type=float, help=f"seconds of traffic per run (by rate: {by_rate})"
    )
    default = latency.Plan()
    group.add_argument(
        "--latency-repeat", type=int, help=f"rounds, samples pooled ({default.repeat})"
    )
    group.add_argument(
        "--latency-repeat-processes",
        metavar="LIST",
        help="process counts whose cells run every round, the others once, or 'all' "
        f"({','.join(map(str, default.repeat_processes or ())) or 'all'})",
    )
    args = parser.parse_args()
    report = run(args)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.only:
        (out / f"{args.only}.json").write_text(json.dumps(report, indent=2))
        section = render_throughput if args.only == "throughput" else render_latency
        text = render_section(report, section(report))
        written = out / f"{args.only}.md"
        if args.only == "latency":
            # The findings below the figures are written by hand: a new run keeps them.
            kept = written.read_text().partition(latency.FINDINGS)[2] if written.exists() else ""
            text += latency.FINDINGS + kept if kept else ""
            latency.plot(report["latency"], out / "latency.png")
        written.write_text(text)
        print(text)
        return
    (out / "report.json").write_text(json.dumps(report, indent=2))
    text = render(report)
    (out / "report.md").write_text(text)
    plot(report, out / "report.png")
    latency.plot(report["latency"], out / "latency.png")
    print(text)
    print(f"\nwritten: {out / 'report.json'}, {out / 'report.md'}, {out / 'report.png'}")


if __name__ == "__main__":
    main()
