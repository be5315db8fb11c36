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
        other = ", ".join(
            f"{rate} msg/s world: {row['violations_vs_keda_on_pending']:.4f}x"
            for rate, row in goal["other_worlds"].items()
        )
        lines += [
            "",
            "## Goal",
            "",
            f"- violation-seconds: {goal['violations_vs_keda_on_age']:.4f}x KEDA on age's "
            f"(goal <= 0.005x), {goal['violations_vs_keda_on_pending']:.4f}x KEDA on "
            "pending's (goal <= 0.01x)",
            f"- replica-seconds: {goal['replica_seconds_vs_keda_on_pending']:.3f}x KEDA on "
            "pending's (goal <= 1.2x)",
            f"- reversals: {goal['reversals']:.0f} against KEDA on pending's "
            f"{goal['reversals_keda_on_pending']:.0f} (goal: no more)",
            f"- worlds with another drain rate, violation-seconds against KEDA on pending "
            f"(goal <= 0.05x): {other}",
            f"- **{'met' if goal['met'] else 'NOT met'}**",
        ]
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
    for rate, world in report["worlds"].items():
        rate_text, _, unsteady = rate.partition("-")
        title = f"## Drain rate {rate_text} msg/s per worker" + (
            ", an unsteady downstream (±25% over 30 min, ±10% per second; not in the goal)"
            if unsteady
            else ""
        )
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
