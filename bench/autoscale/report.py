"""The simulation's report: Markdown tables per world and trace, and a plot."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bench.autoscale.world import Run

COLUMNS = (
    ("violation_seconds", "s over SLO", "{:,.0f}"),
    ("max_age_seconds", "max age (s)", "{:,.1f}"),
    ("replica_seconds", "replica-s", "{:,.0f}"),
    ("scale_changes", "scale changes", "{:,.0f}"),
    ("reversals", "reversals", "{:,.0f}"),
)


def _table(rows: dict[str, dict[str, float]]) -> list[str]:
    lines = [
        "| autoscaler | " + " | ".join(title for _, title, _ in COLUMNS) + " |",
        "|---|" + "---:|" * len(COLUMNS),
    ]
    for name, summary in rows.items():
        cells = " | ".join(fmt.format(summary[key]) for key, _, fmt in COLUMNS)
        lines.append(f"| {name} | {cells} |")
    return lines


def render(report: dict[str, Any]) -> str:
    hours = report["seconds"] / 3600
    lines = [
        "# Autoscaling: the scaling policy against KEDA + HPA"
        + (" (smoke run)" if report["smoke"] else ""),
        "",
        f"Simulated in 1-second steps by `python -m bench.autoscale`: {hours:g} h per trace, "
        f"SLO (targetOldestReadyAgeSeconds) {report['slo_seconds']:g} s, a new pod productive "
        f"{report['startup_delay_seconds']:g} s after it is asked for, at most "
        f"{report['max_replicas']} replicas, minimum 0. The policy is told no drain rate; "
        "KEDA on pending is configured with the true one (target = drain rate x SLO per "
        "replica). KEDA on age has targetQueryValue = the SLO.",
        "",
        "Traces: " + "; ".join(f"**{k}**: {v}" for k, v in report["traces"].items()) + ".",
    ]
    goal = report.get("goal")
    if goal:
        lines += [
            "",
            "## Goal",
            "",
            "Two worlds: in the *settled* one a snapshot sees only what the workers left "
            "behind; in the *in-flight* one every snapshot also sees the last second's "
            "arrivals claimable although every worker has room (rows arriving faster than a "
            "claim's round trip). In both, at every drain rate (the main one, halved and "
            "doubled; the policy is told none): violation-seconds <= 0.005x KEDA on age's "
            "and <= 0.01x KEDA on pending's, replica-seconds <= 1.1x KEDA on pending's (1.5x "
            "in the in-flight world), reversals no more than KEDA on pending's.",
        ]
        for world in ("settled", "in-flight"):
            row = goal[world]
            lines += [
                "",
                f"### {world.capitalize()} world",
                "",
                "| drain rate (msg/s) | s over SLO vs KEDA on age | vs KEDA on pending "
                "| replica-s vs KEDA on pending | reversals (KEDA on pending) |",
                "|---:|---:|---:|---:|---:|",
            ]
            for rate, r in row["drain_rates"].items():
                lines.append(
                    f"| {rate} | {r['violations_vs_keda_on_age']:.4f}x "
                    f"| {r['violations_vs_keda_on_pending']:.4f}x "
                    f"| {r['replica_seconds_vs_keda_on_pending']:.3f}x "
                    f"| {r['reversals']:.0f} ({r['reversals_keda_on_pending']:.0f}) |"
                )
            missed = [rate for rate, r in row["drain_rates"].items() if not r["met"]]
            if missed:
                lines += [
                    "",
                    "Missed at "
                    + ", ".join(f"{rate} msg/s" for rate in missed)
                    + " (the per-trace tables below show where).",
                ]
            lines += ["", f"**{'met' if row['met'] else 'NOT met'}**"]
        lines += ["", f"Both worlds: **{'met' if goal['met'] else 'NOT met'}**"]
    polls = report.get("poll_intervals")
    if polls:
        lines += [
            "",
            "## The poll interval (the policy alone, main world, all traces summed)",
            "",
            "| pollIntervalSeconds | " + " | ".join(title for _, title, _ in COLUMNS) + " |",
            "|---:|" + "---:|" * len(COLUMNS),
        ]
        for poll, summary in polls.items():
            cells = " | ".join(fmt.format(summary[key]) for key, _, fmt in COLUMNS)
            lines.append(f"| {poll} | {cells} |")
    kinds = {
        "": "",
        "in-flight": ", in-flight world (snapshots see the last second's arrivals claimable)",
        "unsteady": ", an unsteady downstream (±25% over 30 min, ±10% per second; not in the goal)",
    }
    for rate, world in report["worlds"].items():
        rate_text, _, kind = rate.partition("-")
        title = f"## Drain rate {rate_text} msg/s per worker" + kinds[kind]
        lines += ["", title, "", "### All traces summed", ""]
        lines += _table(world["total"])
        for trace, rows in world["traces"].items():
            lines += ["", f"### {trace}", ""]
            lines += _table(rows)
    lines += ["", "![replicas and age over time](autoscaling.png)", ""]
    return "\n".join(lines)


def plot(runs: dict[str, dict[str, Run]], slo: float, path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return  # the plot needs the bench extra; the tables are written regardless
    shown = [name for name in ("step", "spikes") if name in runs]
    figure, axes = plt.subplots(2, len(shown), figsize=(8 * len(shown), 8), squeeze=False)
    for column, trace in enumerate(shown):
        top, bottom = axes[0][column], axes[1][column]
        for name, run in runs[trace].items():
            minutes = [t / 60 for t in range(1, len(run.ages) + 1)]
            top.plot(minutes, run.replicas, label=name, linewidth=1)
            bottom.plot(minutes, run.ages, label=name, linewidth=1)
        bottom.axhline(slo, color="red", linestyle="--", linewidth=0.8, label="SLO")
        top.set_title(f"{trace}: replicas")
        bottom.set_title(f"{trace}: oldest ready age (s)")
        bottom.set_yscale("symlog", linthresh=slo)
        bottom.set_xlabel("minutes")
        top.legend(loc="upper right", fontsize="small")
        bottom.legend(loc="upper right", fontsize="small")
    figure.tight_layout()
    figure.savefig(path, dpi=90)
    plt.close(figure)
