"""`python -m bench.operator_loop`: the scaling policy against KEDA + HPA, in the closed loop.

python -m bench.operator_loop                   # the compressed step trace (about 8 minutes)
python -m bench.operator_loop --smoke           # a short trace: checks the harness only
python -m bench.operator_loop --out bench/results

`bench.autoscale` simulates the world; this runs it: the operator's reconcile loop
(`outbox.controller.reconcile.DispatcherLoop`, in this process) against the API server emulator,
with the local kubelet running the Deployment's pods as real `outbox-worker` processes, a
producer sending at a known rate, and a downstream that takes a fixed time per message. The
emulator and the kubelet are the test harness (`tests/k8s/`, see its README).

Each contender gets a fresh database, emulator and kubelet and sees the same trace. The
operator's own policy runs through the unmodified `DispatcherLoop`; the KEDA models (the
`KedaHpa` of `bench.autoscale.contenders`, fed the figures KEDA's PostgreSQL scaler would
query) replace the policy in a subclass that overrides only the sizing decision, so the
operator ships no switch for them. Every duration of the KEDA and HPA defaults and of the
CRD's defaults is divided by the same factor, so that a trace fits in minutes.

Writes operator_loop.md and operator_loop.json into --out. Violation-seconds: seconds the
oldest ready message (read from the database every half second) was older than the target;
replica-seconds: the Deployment's spec.replicas integrated over the trace.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubernetes.aio.client import ApiClient, Configuration

from bench.autoscale.contenders import KedaHpa
from bench.env import Bench
from outbox.controller.decision import Decision
from outbox.controller.kube import Kube
from outbox.controller.metrics import Metrics
from outbox.controller.reconcile import Context, DispatcherLoop
from outbox.controller.settings import ControllerSettings
from outbox.controller.spec import ScalingSettings
from outbox.demo.sink import Reply, Sink
from outbox.stats import QueueStats

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))  # the emulator and the kubelet are test infrastructure

from k8s.cluster import ADMIN_TOKEN, LocalCluster  # noqa: E402
from k8s.demo import Recorder  # noqa: E402
from k8s.kubelet import Kubelet  # noqa: E402
from k8s.test_autoscaling_loop import (  # noqa: E402
    CONCURRENCY,
    PUBLISH_SECONDS,
    Arrivals,
    scale_events,
    sink_dispatcher,
    unfinished,
)
from k8s.test_operator import (  # noqa: E402
    CRD,
    apply,
    get,
    secret_manifest,
    wait_for,
)

COMPRESSION = 5  # every default duration divided by this
SLO = 30 // COMPRESSION  # targetOldestReadyAgeSeconds: the CRD's default, 30 s
MIN_REPLICAS = 1
MAX_REPLICAS = 6
DRAIN_RATE = CONCURRENCY / PUBLISH_SECONDS  # one worker's, msg/s


@dataclass(frozen=True)
class Trace:
    """Arrivals in msg/s: quiet, a step, quiet again long enough for every scale-down."""

    quiet_rate: float
    step_rate: float
    before: int  # seconds
    step: int
    after: int

    def rate(self, second: int) -> float:
        in_step = self.before <= second < self.before + self.step
        return self.step_rate if in_step else self.quiet_rate

    @property
    def seconds(self) -> int:
        return self.before + self.step + self.after


# The quiet tail outlasts every scale-down window, the policy's 60 s arrival window included
# (a constant of the policy, not compressed).
FULL = Trace(quiet_rate=5, step_rate=3 * DRAIN_RATE, before=10, step=40, after=150)
SMOKE = Trace(quiet_rate=5, step_rate=3 * DRAIN_RATE, before=3, step=10, after=15)


def scaling() -> dict[str, Any]:
    """spec.scaling: the CRD's defaults, compressed (its 5 s poll becomes 1 s)."""
    return {
        "minReplicas": MIN_REPLICAS,
        "maxReplicas": MAX_REPLICAS,
        "pollIntervalSeconds": 1,
        "targetOldestReadyAgeSeconds": SLO,
        "scaleDownStabilizationSeconds": 300 // COMPRESSION,
    }


# ---- KEDA in the operator's loop ------------------------------------------------------------


@dataclass(frozen=True)
class Observed:
    """What KEDA's PostgreSQL scaler and the HPA read at one pass."""

    replicas: int
    oldest_age: float  # SELECT now() - min(created_at) WHERE status IN ('pending', 'processing')
    pending: float  # SELECT count(*) WHERE status IN ('pending', 'processing')


class KedaPolicy:
    """`KedaHpa` driven from the operator's passes, one model second per second of the
    database's clock; seconds between two passes see the newer reading."""

    def __init__(self, model: KedaHpa) -> None:
        self.model = model
        self.name = model.name
        self._start: float | None = None
        self._t = -1

    def reconfigure(self, scaling: ScalingSettings) -> None:
        """The trace never edits spec.scaling."""

    def decided(self, decision: Decision, *, replicas: int, ready_replicas: int) -> None:
        """KEDA and the HPA learn nothing from what the operator settled on."""

    def wish(
        self, stats: QueueStats, *, replicas: int, ready_replicas: int, paused: bool = False
    ) -> Decision:
        now = stats.sampled_at.timestamp()
        self._start = now if self._start is None else self._start
        observed = Observed(replicas, stats.oldest_pending_age or 0.0, float(stats.backlog))
        wanted = replicas
        while self._t < int(now - self._start):
            self._t += 1
            asked = self.model.step(self._t, observed)  # type: ignore[arg-type]
            if asked is not None and asked != wanted:
                wanted = asked
                observed = Observed(wanted, observed.oldest_age, observed.pending)
        value = self.model.metric(observed)  # type: ignore[arg-type]
        message = f"{self.name}: metric {value:.1f}, target {self.model.target:g} per replica"
        return Decision(wanted, "KedaHpa", message)


def keda(name: str, metric: Callable[[Observed], float], target: float) -> KedaPolicy:
    """KEDA 2 and the HPA with their defaults (30 s polling, 300 s cooldown, 15 s sync, 300 s
    stabilization), compressed."""
    model = KedaHpa(
        name,
        metric,  # type: ignore[arg-type]
        target=target,
        max_replicas=MAX_REPLICAS,
        polling_interval=30 // COMPRESSION,
        cooldown=300 // COMPRESSION,
        hpa_sync=15 // COMPRESSION,
        downscale_window=300 // COMPRESSION,
    )
    return KedaPolicy(model)


CONTENDERS: dict[str, Callable[[], KedaPolicy | None]] = {
    "outbox-dispatcher": lambda: None,
    "KEDA on age": lambda: keda("KEDA on age", lambda o: o.oldest_age, SLO),
    "KEDA on pending": lambda: keda("KEDA on pending", lambda o: o.pending, DRAIN_RATE * SLO),
}


# ---- one run ----------------------------------------------------------------------------------


@dataclass
class Result:
    violation_seconds: float
    max_age_seconds: float
    replica_seconds: float
    largest: int
    back_to_min_seconds: float | None  # after the step ended; None: not within the trace
    scale_changes: int
    sent: int
    lost: int
    decisions: list[tuple[int, int, str]] = field(default_factory=list)

    def row(self) -> dict[str, Any]:
        return {
            "violation_seconds": round(self.violation_seconds, 1),
            "max_age_seconds": round(self.max_age_seconds, 1),
            "replica_seconds": round(self.replica_seconds),
            "largest": self.largest,
            "back_to_min_seconds": self.back_to_min_seconds,
            "scale_changes": self.scale_changes,
            "sent": self.sent,
            "lost": self.lost,
            "decisions": [f"{a} -> {b}: {why}" for a, b, why in self.decisions],
        }


def api_client(cluster: LocalCluster) -> ApiClient:
    configuration = Configuration(host=cluster.url)
    configuration.api_key = {"authorization": ADMIN_TOKEN}
    configuration.api_key_prefix = {"authorization": "Bearer"}
    return ApiClient(configuration)


async def drive(
    cluster: LocalCluster, dsn: str, trace: Trace, policy: KedaPolicy | None
) -> tuple[Recorder, Arrivals]:
    """The operator's loop for one resource while the trace plays; then until it drains."""
    api = api_client(cluster)
    settings = ControllerSettings(worker_publishers=("log", "http", "null"), health_port=0)
    context = Context(settings, Kube(api, lambda: None, "bench"), Metrics())
    body = wait_for("the stored resource", lambda: get(cluster, "outboxdispatchers", "orders"))
    dispatcher = DispatcherLoop(context, body)
    if policy is not None:
        dispatcher.new_policy = lambda scaling: policy
    task = asyncio.create_task(dispatcher.run(), name="dispatcher")
    try:
        await asyncio.to_thread(
            wait_for,
            "a ready worker at minReplicas",
            lambda: (
                (get(cluster, "deployments", "orders-worker") or {})
                .get("status", {})
                .get("readyReplicas")
            ),
        )
        with Recorder(dsn, cluster) as recorder, Arrivals(dsn) as arrivals:
            started = time.monotonic()
            for second in range(trace.seconds):
                arrivals.rate = trace.rate(second)
                # The trace's clock: each second's rate holds until the next second.
                await asyncio.sleep(max(0.0, started + second + 1 - time.monotonic()))
        await asyncio.to_thread(wait_for, "the drain", lambda: unfinished(dsn) == 0, 120)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await api.close()  # type: ignore[no-untyped-call]
    return recorder, arrivals


def run_contender(bench: Bench, trace: Trace, policy: KedaPolicy | None) -> Result:
    with (
        bench.database() as dsn,
        tempfile.TemporaryDirectory(prefix="operator-loop-") as tmp,
        Sink(lambda body, nth: Reply(delay=PUBLISH_SECONDS)) as sink,
    ):
        workdir = Path(tmp)
        (workdir / "k8s").mkdir()
        cluster = LocalCluster(workdir / "k8s").start()
        try:
            cluster.install_crd(CRD)
            node = Kubelet(cluster.url, ADMIN_TOKEN, workdir / "kubelet").start()
            try:
                apply(
                    cluster,
                    secret_manifest("orders-db", dsn=dsn),
                    sink_dispatcher(sink.url, scaling()),
                )
                recorder, arrivals = asyncio.run(drive(cluster, dsn, trace, policy))
                decisions = scale_events(cluster)
            finally:
                node.stop()
        finally:
            cluster.stop()
        delivered = set(sink.delivered_ids())
    return Result(
        violation_seconds=recorder.violation_seconds(SLO),
        max_age_seconds=recorder.peak_age(),
        replica_seconds=recorder.replica_seconds(),
        largest=max((to for _, to, _ in decisions), default=MIN_REPLICAS),
        back_to_min_seconds=back_to_min(recorder, trace.before + trace.step),
        scale_changes=len(decisions),
        sent=arrivals.sent,
        lost=arrivals.sent - len(delivered),
        decisions=decisions,
    )


def back_to_min(recorder: Recorder, step_end: float) -> float | None:
    """Seconds from the end of the step until the Deployment was at minReplicas for good."""
    above = [s.at for s in recorder.samples if s.replicas != MIN_REPLICAS]
    if not above or above[-1] < step_end:
        return 0.0
    after = [s.at for s in recorder.samples if s.at > above[-1]]
    return round(after[0] - step_end, 1) if after else None


def render(report: dict[str, Any]) -> str:
    trace = report["trace"]
    lines = [
        "# The scaling policy against KEDA + HPA in the closed loop",
        "",
        f"The operator's loop against the API emulator, real workers (one delivers "
        f"{DRAIN_RATE:g} msg/s), target oldest ready age {SLO:g} s, {MIN_REPLICAS}..{MAX_REPLICAS} "
        f"workers; every default duration divided by {COMPRESSION}.",
        f"Trace: {trace['quiet_rate']:g} msg/s for {trace['before']} s, {trace['step_rate']:g} "
        f"msg/s for {trace['step']} s, {trace['quiet_rate']:g} msg/s for {trace['after']} s"
        + (" (smoke size)." if report["smoke"] else "."),
        "",
        "| autoscaler | violation-seconds | max age (s) | replica-seconds | largest "
        "| back to min after the step (s) | scale changes | sent | lost |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, row in report["contenders"].items():
        back = (
            "not within the trace"
            if row["back_to_min_seconds"] is None
            else row["back_to_min_seconds"]
        )
        lines.append(
            f"| {name} | {row['violation_seconds']:g} | {row['max_age_seconds']:g} | "
            f"{row['replica_seconds']} | {row['largest']} | {back} | {row['scale_changes']} | "
            f"{row['sent']} | {row['lost']} |"
        )
    lines += [
        "",
        "Measured on a shared machine, one run per contender, one after the other. The",
        "compression applies to the configurable durations only: the policy's own constants",
        "(its 60 s arrival-rate window, its 20 s start-up prior) and a real pod's start-up",
        "(about a second) are not compressed. KEDA on pending is given the drain rate, which",
        "the operator's policy learns.",
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.operator_loop", description=__doc__)
    parser.add_argument("--smoke", action="store_true", help="a short trace: checks the harness")
    parser.add_argument("--out", type=Path, default=Path("bench/results"))
    args = parser.parse_args(argv)
    trace = SMOKE if args.smoke else FULL
    rows: dict[str, Any] = {}
    with Bench() as bench:
        for name, make in CONTENDERS.items():
            print(f"{name}: {trace.seconds} s trace", flush=True)
            rows[name] = run_contender(bench, trace, make()).row()
        environment = bench.environment()
    report = {
        "smoke": args.smoke,
        "compression": COMPRESSION,
        "slo_seconds": SLO,
        "drain_rate_per_worker": DRAIN_RATE,
        "scaling": scaling(),
        "trace": {
            "quiet_rate": trace.quiet_rate,
            "step_rate": trace.step_rate,
            "before": trace.before,
            "step": trace.step,
            "after": trace.after,
        },
        "contenders": rows,
        "environment": environment,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "operator_loop.json").write_text(json.dumps(report, indent=2) + "\n")
    text = render(report)
    (args.out / "operator_loop.md").write_text(text)
    print(text)
    if any(row["lost"] for row in rows.values()):
        sys.exit("messages were lost: see operator_loop.json")


if __name__ == "__main__":
    main()
