"""`python -m bench.autoscale`: the scaling policy against KEDA + HPA, simulated.

python -m bench.autoscale                   # five 2-hour traces, worlds of 100/200/400 msg/s
python -m bench.autoscale --smoke           # 20-minute traces, 200 msg/s only: checks the harness
python -m bench.autoscale --out bench/results

Each drain rate runs in two worlds (bench/autoscale/world.py): the *settled* one, whose
snapshots see only what the workers left behind, and the *in-flight* one, whose snapshots
see the last second's arrivals claimable although the workers have room (rows arriving
faster than a claim's round trip). World keys: "200", "200-in-flight", ...

Writes autoscaling.md, autoscaling.json and autoscaling.png into --out. Every contender
sees the same arrivals (seeded) in the same world; nothing is timed, so the figures are the
same on every machine.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from bench.autoscale.contenders import Ours, keda_on_age, keda_on_pending
from bench.autoscale.report import plot, render
from bench.autoscale.traces import TRACES
from bench.autoscale.world import Autoscaler, Run, simulate

SLO = 30.0
STARTUP_DELAY = 20.0
MAX_REPLICAS = 100
DRAIN_RATES = (200.0, 100.0, 400.0)  # the first is the main world; the others test learning
SEED = 11
UNSTEADY = f"{DRAIN_RATES[0]:g}-unsteady"
IN_FLIGHT = "in-flight"
# The goal (issue: the policy's saturation test), in each world and at each drain rate.
VIOLATIONS_VS_KEDA_ON_AGE = 0.005
VIOLATIONS_VS_KEDA_ON_PENDING = 0.01
REPLICA_SECONDS_VS_KEDA_ON_PENDING = {"settled": 1.1, IN_FLIGHT: 1.5}


def world_key(rate: float, world: str) -> str:
    return f"{rate:g}" if world == "settled" else f"{rate:g}-{world}"


def scaling() -> dict[str, Any]:
    """The resource's spec.scaling: the CRD's defaults but for a ceiling the spikes need."""
    return {"maxReplicas": MAX_REPLICAS, "targetOldestReadyAgeSeconds": SLO}


def contenders(drain_rate: float) -> list[Autoscaler]:
    return [
        Ours(scaling()),
        keda_on_age(SLO, MAX_REPLICAS),
        keda_on_pending(drain_rate, SLO, MAX_REPLICAS),
    ]


def unsteady_speed(seconds: int) -> list[float]:
    """A downstream whose speed drifts ±25% over half an hour, with ±10% noise per second."""
    rng = np.random.default_rng(SEED)
    return [
        (1 + 0.25 * math.sin(2 * math.pi * t / 1800)) * float(rng.uniform(0.9, 1.1))
        for t in range(seconds)
    ]


def run_world(
    drain_rate: float, seconds: int, speed: list[float] | None = None, claim_lag: bool = False
) -> tuple[dict[str, Any], dict[str, dict[str, Run]]]:
    rows: dict[str, Any] = {}
    runs: dict[str, dict[str, Run]] = {}
    for i, trace in enumerate(TRACES):
        arrivals = trace.arrivals(seconds, SEED + i)
        runs[trace.name] = {}
        rows[trace.name] = {}
        for autoscaler in contenders(drain_rate):
            run = simulate(
                autoscaler,
                arrivals,
                drain_rate=drain_rate,
                startup_delay=STARTUP_DELAY,
                speed=speed or (),
                claim_lag=claim_lag,
            )
            runs[trace.name][autoscaler.name] = run
            rows[trace.name][autoscaler.name] = run.summary(SLO)
    total: dict[str, dict[str, float]] = {}
    for per_trace in rows.values():
        for name, summary in per_trace.items():
            into = total.setdefault(name, dict.fromkeys(summary, 0.0))
            for key, value in summary.items():
                into[key] = max(into[key], value) if key == "max_age_seconds" else into[key] + value
    return {"traces": rows, "total": total}, runs


POLL_INTERVALS = (5, 10, 15, 30)


def poll_sensitivity(seconds: int) -> dict[str, dict[str, float]]:
    """The policy alone in the main world, polled less often: summed over the traces."""
    result: dict[str, dict[str, float]] = {}
    for poll in POLL_INTERVALS:
        total: dict[str, float] = {}
        for i, trace in enumerate(TRACES):
            run = simulate(
                Ours({**scaling(), "pollIntervalSeconds": poll}),
                trace.arrivals(seconds, SEED + i),
                drain_rate=DRAIN_RATES[0],
                startup_delay=STARTUP_DELAY,
            )
            for key, value in run.summary(SLO).items():
                total[key] = (
                    max(total.get(key, 0.0), value)
                    if key == "max_age_seconds"
                    else (total.get(key, 0.0) + value)
                )
        result[f"{poll}"] = total
    return result


def compare(total: dict[str, dict[str, float]], world: str) -> dict[str, Any]:
    """The policy against the KEDA models in one world's summed figures, goal by goal."""
    ours, age, pend = total["outbox-dispatcher"], total["KEDA on age"], total["KEDA on pending"]
    row: dict[str, Any] = {
        "violations_vs_keda_on_age": ours["violation_seconds"] / max(age["violation_seconds"], 1),
        "violations_vs_keda_on_pending": ours["violation_seconds"]
        / max(pend["violation_seconds"], 1),
        "replica_seconds_vs_keda_on_pending": ours["replica_seconds"] / pend["replica_seconds"],
        "replica_seconds_goal": REPLICA_SECONDS_VS_KEDA_ON_PENDING[world],
        "reversals": ours["reversals"],
        "reversals_keda_on_pending": pend["reversals"],
    }
    row["violations_met"] = (
        row["violations_vs_keda_on_age"] <= VIOLATIONS_VS_KEDA_ON_AGE
        and row["violations_vs_keda_on_pending"] <= VIOLATIONS_VS_KEDA_ON_PENDING
    )
    row["replica_seconds_met"] = (
        row["replica_seconds_vs_keda_on_pending"] <= row["replica_seconds_goal"]
    )
    row["reversals_met"] = ours["reversals"] <= pend["reversals"]
    return row


def goal(worlds: dict[str, Any]) -> dict[str, Any]:
    """The issue's goal, from the summed figures of each world: in both worlds every goal
    at every drain rate (the policy is told none, so it must hold with the true one halved
    and doubled as well as at the main one)."""
    result: dict[str, Any] = {}
    met = True
    for world in ("settled", IN_FLIGHT):
        per_rate = {
            f"{rate:g}": compare(worlds[world_key(rate, world)]["total"], world)
            for rate in DRAIN_RATES
        }
        for row in per_rate.values():
            row["met"] = (
                row["violations_met"] and row["replica_seconds_met"] and row["reversals_met"]
            )
        world_met = all(row["met"] for row in per_rate.values())
        main = per_rate[f"{DRAIN_RATES[0]:g}"]
        result[world] = {**main, "drain_rates": per_rate, "met": world_met}
        met = met and world_met
    result["met"] = met
    return result


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.autoscale", description=__doc__)
    parser.add_argument("--smoke", action="store_true", help="20-minute traces, one world")
    parser.add_argument("--out", type=Path, default=Path("bench/results"))
    args = parser.parse_args(argv)
    seconds = 20 * 60 if args.smoke else 2 * 3600
    rates = DRAIN_RATES[:1] if args.smoke else DRAIN_RATES
    worlds: dict[str, Any] = {}
    main_runs: dict[str, dict[str, Run]] = {}
    for world in ("settled", IN_FLIGHT):
        for rate in rates:
            key = world_key(rate, world)
            worlds[key], runs = run_world(rate, seconds, claim_lag=world == IN_FLIGHT)
            if key == world_key(DRAIN_RATES[0], "settled"):
                main_runs = runs
    report: dict[str, Any] = {
        "smoke": args.smoke,
        "seconds": seconds,
        "slo_seconds": SLO,
        "startup_delay_seconds": STARTUP_DELAY,
        "max_replicas": MAX_REPLICAS,
        "scaling": scaling(),
        "traces": {t.name: t.description for t in TRACES},
        "worlds": worlds,
    }
    if not args.smoke:
        report["goal"] = goal(worlds)
        # Not part of the goal: the main world with a downstream whose speed drifts and jitters
        # (KEDA on pending configured with the mean rate).
        worlds[UNSTEADY], _ = run_world(DRAIN_RATES[0], seconds, unsteady_speed(seconds))
        report["poll_intervals"] = poll_sensitivity(seconds)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "autoscaling.json").write_text(json.dumps(report, indent=2) + "\n")
    text = render(report)
    (args.out / "autoscaling.md").write_text(text)
    plot(main_runs, SLO, args.out / "autoscaling.png")
    print(text)


if __name__ == "__main__":
    main()
