"""`python -m bench` (`make bench`): run every benchmark, print a table, write JSON and a plot.

python -m bench                   # the full run (about 15 minutes on 2 cores)
python -m bench --smoke           # tiny sizes, one repeat: checks the harness only
python -m bench --only throughput # the no-op throughput section and the SQL ceiling alone
python -m bench --only latency    # the light-load latency section alone
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

from bench import scenarios
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


LATENCY_RATE = 100  # messages/s: light load


def run_latency(bench: Bench, count: int, repeat: int) -> dict[str, Any]:
    """Enqueue-to-publish percentiles at light load, in rounds (every other one in reverse
    order); each contender's figures are the medians of its rounds' percentiles."""
    contenders: dict[str, Any] = {
        "outbox_dispatcher": lambda: scenarios.latency_ours(
            bench, count, LATENCY_RATE, via_http=False
        ),
        "pgqueuer": lambda: scenarios.latency_pgqueuer(bench, count, LATENCY_RATE),
        "outbox_dispatcher_via_http": lambda: scenarios.latency_ours(
            bench, count, LATENCY_RATE, via_http=True
        ),
    }
    rounds: dict[str, list[dict[str, Any]]] = {name: [] for name in contenders}
    for n in range(repeat):
        names = list(contenders) if n % 2 == 0 else list(reversed(contenders))
        for name in names:
            _log(f"latency: {name}, {count} messages at {LATENCY_RATE}/s ({n + 1}/{repeat})")
            rounds[name].append(contenders[name]())
    latency: dict[str, Any] = {"rate_per_second": LATENCY_RATE}
    for name, measured in rounds.items():
        latency[name] = _medians(measured)
    # The producer's INSERT alone, as timed beside our worker: the floor under every figure.
    latency["insert"] = _medians([r["insert"] for r in rounds["outbox_dispatcher"]])
    return latency


def _medians(measured: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        **{
            key: statistics.median(r[key] for r in measured)
            for key in ("p50_ms", "p99_ms", "max_ms")
        },
        "samples": measured[0]["samples"],
        "rounds": measured,
    }


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

        report["latency"] = run_latency(bench, 200 if smoke else 1000, repeat)
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
    args = parser.parse_args()
    report = run(args)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.only:
        (out / f"{args.only}.json").write_text(json.dumps(report, indent=2))
        section = render_throughput if args.only == "throughput" else render_latency
        text = render_section(report, section(report))
        (out / f"{args.only}.md").write_text(text)
        print(text)
        return
    (out / "report.json").write_text(json.dumps(report, indent=2))
    text = render(report)
    (out / "report.md").write_text(text)
    plot(report, out / "report.png")
    print(text)
    print(f"\nwritten: {out / 'report.json'}, {out / 'report.md'}, {out / 'report.png'}")


if __name__ == "__main__":
    main()
