"""The per-scenario numbers `make chaos` prints at the end of the run."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from chaos.checker import Verdict
from chaos.history import Fault


@dataclass(frozen=True)
class ScenarioReport:
    name: str
    verdict: Verdict
    faults: list[Fault] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def faults_summary(self) -> str:
        counts = Counter(f.kind for f in self.faults)
        return ", ".join(f"{n} {kind}" for kind, n in counts.most_common()) or "none"


COLUMNS = ("scenario", "messages", "faults", "delivered", "dup expl/unexpl", "dead", "lost",
           "fenced", "effects", "absorbed", "double", "violations", "secs")  # fmt: skip


def table(reports: list[ScenarioReport]) -> list[str]:
    rows = [COLUMNS] + [
        (
            r.name,
            str(r.verdict.messages),
            r.faults_summary,
            str(r.verdict.delivered),
            f"{r.verdict.explained}/{r.verdict.unexplained}",
            str(r.verdict.dead),
            str(r.verdict.lost),
            str(r.verdict.lost_leases),
            str(r.verdict.effects),
            str(r.verdict.absorbed),
            str(r.verdict.double_effects),
            str(len(r.verdict.violations)),
            f"{r.seconds:.1f}",
        )
        for r in reports
    ]
    widths = [max(len(row[i]) for row in rows) for i in range(len(COLUMNS))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)) for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    reasons: Counter[str] = Counter()
    for r in reports:
        reasons.update(r.verdict.reasons)
    if reasons:
        lines.append("")
        lines.append("duplicates, by cause:")
        lines.extend(f"  {n:>5} x {why}" for why, n in reasons.most_common())
    return lines
