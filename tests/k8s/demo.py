"""The operator's story, as `make demo` tells it after `outbox demo`.

`python -m k8s.demo` (from `tests/`, or with `PYTHONPATH=tests`) starts an embedded
PostgreSQL, the API server emulator, the local kubelet and the real `outbox-controller`,
applies an OutboxDispatcher with `kubectl`, and runs a compressed day: a quiet start, a burst
of arrivals that one worker cannot keep up with (each message takes the downstream a fixed
time), then quiet again. It prints `kubectl get obd` as the loop scales up, drains and
scales back down to minReplicas, then the scale Events and the figures: the peak oldest ready
age against the target, the time to drain, and the replica-seconds spent.

The emulator and the kubelet are test infrastructure (see README.md here); this script is the
closed loop shown to a person, and `test_demo_story.py` runs it at a small size.
"""

from __future__ import annotations

import argparse
import itertools
import os
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import psycopg

from outbox.demo.embedded import EmbeddedPostgres
from outbox.demo.sink import Reply, Sink
from outbox.schema import migrate
from outbox.stats import queue_stats
from outbox.table import Table

from .cluster import ADMIN_TOKEN, KUBECTL, LocalCluster
from .kubelet import Kubelet
from .test_autoscaling_loop import (
    CONCURRENCY,
    PUBLISH_SECONDS,
    Arrivals,
    scale_events,
    sink_dispatcher,
    unfinished,
)
from .test_operator import (
    CRD,
    Operator,
    apply,
    get,
    secret_manifest,
    wait_for,
)


@dataclass(frozen=True)
class Step:
    """The compressed day: a quiet rate, a burst at a known rate, then quiet again."""

    quiet_rate: float = 5.0  # msg/s before and after the burst
    quiet_seconds: float = 10.0  # before the burst
    burst_rate: float = 120.0  # msg/s: three workers' worth
    burst_seconds: float = 30.0


@dataclass(frozen=True)
class Sizing:
    """spec.scaling of the demo's resource, compressed to fit in a minute or two."""

    min_replicas: int = 1
    max_replicas: int = 4
    target_seconds: int = 10
    window_seconds: int = 10

    def spec(self) -> dict[str, Any]:
        return {
            "minReplicas": self.min_replicas,
            "maxReplicas": self.max_replicas,
            "pollIntervalSeconds": 1,
            "targetOldestReadyAgeSeconds": self.target_seconds,
            "scaleDownStabilizationSeconds": self.window_seconds,
        }


@dataclass(frozen=True)
class Sample:
    at: float  # seconds since the recording started
    oldest_ready_age: float
    backlog: int
    replicas: int  # the Deployment's spec.replicas: what is paid for, starting pods included


@dataclass
class Recorder:
    """Samples the database's backlog and the Deployment's size every `every` seconds."""

    dsn: str
    cluster: LocalCluster
    deployment: str = "orders-worker"
    every: float = 0.5
    samples: list[Sample] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    _started: float = 0.0

    def __enter__(self) -> Recorder:
        self._started = time.monotonic()
        self._thread = threading.Thread(target=self._run, name="recorder", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)

    def now(self) -> float:
        return time.monotonic() - self._started

    def _run(self) -> None:
        table = Table.parse("outbox")
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            while not self._stop.is_set():
                stats = queue_stats(conn, table)
                deployment = get(self.cluster, "deployments", self.deployment) or {}
                replicas = int((deployment.get("spec") or {}).get("replicas") or 0)
                self.samples.append(
                    Sample(self.now(), stats.oldest_ready_age or 0.0, stats.backlog, replicas)
                )
                self._stop.wait(self.every)

    def peak_age(self) -> float:
        return max((s.oldest_ready_age for s in self.samples), default=0.0)

    def violation_seconds(self, target: float) -> float:
        """How long the oldest ready message was older than `target` (sample to sample)."""
        pairs = itertools.pairwise(self.samples)
        return sum(b.at - a.at for a, b in pairs if a.oldest_ready_age > target)

    def replica_seconds(self) -> float:
        """The Deployment's size integrated over time (each sample holds until the next)."""
        return sum(a.replicas * (b.at - a.at) for a, b in itertools.pairwise(self.samples))

    def drained_at(self, after: float) -> float | None:
        """When the backlog was first empty after `after`."""
        return next((s.at for s in self.samples if s.at >= after and s.backlog == 0), None)


class Screen:
    """What a person would see: `kubectl get obd` every few seconds, with the elapsed time."""

    def __init__(self, cluster: LocalCluster, recorder: Recorder, out: TextIO) -> None:
        self.cluster, self.recorder, self.out = cluster, recorder, out
        self._widths: list[int] = []

    def say(self, text: str) -> None:
        print(text, file=self.out, flush=True)

    def get_obd(self) -> None:
        """One `kubectl get obd` line, aligned under the first call's header (as `-w` shows)."""
        header, *rows = self.cluster.kubectl("get", "obd", "orders").stdout.splitlines()
        if not self._widths:
            names = header.split()
            starts = [header.index(name) for name in names]
            self._widths = [b - a for a, b in itertools.pairwise(starts)] + [0]
            self.say(f"{'':8}{header}")
        for row in rows:
            cells = [
                cell.ljust(width) for cell, width in zip(row.split(), self._widths, strict=False)
            ]
            self.say(f"t={self.recorder.now():3.0f}s  {''.join(cells)}")

    def watch(self, seconds: float, every: float, until: Callable[[], bool] | None = None) -> None:
        """Print a line every `every` s for `seconds` s (or until `until()`, with a deadline)."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            # Asked before the line is printed, so that the last line shows the state that
            # ended the story (asked after, the state could change in between).
            ended = until is not None and until()
            self.get_obd()
            if ended:
                return
            time.sleep(every)  # the display's cadence, not a wait for a state
        if until is not None:
            raise AssertionError(f"the story did not end within {seconds:.0f} s")


def run_story(
    cluster: LocalCluster,
    dsn: str,
    sink_url: str,
    *,
    step: Step = Step(),
    sizing: Sizing = Sizing(),
    every: float = 3.0,
    out: TextIO = sys.stdout,
) -> dict[str, Any]:
    """Tell the story against a running operator (the CRD installed); return its figures."""
    apply(
        cluster,
        secret_manifest("orders-db", dsn=dsn),
        sink_dispatcher(sink_url, sizing.spec()),
    )
    one_worker = CONCURRENCY / PUBLISH_SECONDS
    with Recorder(dsn, cluster) as recorder, Arrivals(dsn) as arrivals:
        screen = Screen(cluster, recorder, out)
        screen.say(
            "$ kubectl apply -f orders.yaml   # an OutboxDispatcher: target oldest ready age "
            f"{sizing.target_seconds}s, {sizing.min_replicas}..{sizing.max_replicas} workers"
        )
        wait_for(
            "a ready worker at minReplicas",
            lambda: (
                (get(cluster, "outboxdispatchers", "orders") or {})
                .get("status", {})
                .get("readyReplicas", 0)
                >= max(sizing.min_replicas, 1)
            ),
            timeout=60,
        )
        screen.say(
            f"\nquiet: {step.quiet_rate:g} msg/s; each message takes the downstream "
            f"{PUBLISH_SECONDS * 1000:.0f} ms, so one worker delivers {one_worker:g} msg/s"
        )
        arrivals.rate = step.quiet_rate
        screen.watch(step.quiet_seconds, every)

        screen.say(
            f"\nburst: {step.burst_rate:g} msg/s for {step.burst_seconds:g} s "
            f"({step.burst_rate / one_worker:.1f} workers' worth)"
        )
        arrivals.rate = step.burst_rate
        screen.watch(step.burst_seconds, every)
        burst_end = recorder.now()

        screen.say(
            f"\nquiet again: {step.quiet_rate:g} msg/s; the backlog drains, then it scales down"
        )
        arrivals.rate = step.quiet_rate

        def settled() -> bool:
            # Back to the minimum as `kubectl get obd` shows it (the resource's status, which
            # follows the Deployment's resize) and the burst drained.
            deployment = get(cluster, "deployments", "orders-worker") or {}
            status = (get(cluster, "outboxdispatchers", "orders") or {}).get("status", {})
            back = (
                deployment.get("spec", {}).get("replicas") == sizing.min_replicas
                and status.get("desiredReplicas") == sizing.min_replicas
            )
            return back and recorder.drained_at(burst_end) is not None

        screen.watch(120 + sizing.window_seconds, every, until=settled)
    sent = arrivals.sent
    wait_for("the last messages delivered", lambda: unfinished(dsn) == 0, timeout=60)

    screen.say("\n$ kubectl get events   # the scale decisions and why")
    listing = cluster.kubectl("get", "events", "--sort-by=.metadata.resourceVersion").stdout
    header, *lines = listing.splitlines()
    screen.say(header)
    for line in lines:
        if "Scaled" in line:
            screen.say(line)

    drained = recorder.drained_at(burst_end)
    story = scale_events(cluster)
    deployment = get(cluster, "deployments", "orders-worker") or {}
    figures = {
        "target_seconds": sizing.target_seconds,
        "peak_oldest_ready_age_seconds": round(recorder.peak_age(), 1),
        "drain_seconds_after_burst": round(drained - burst_end, 1) if drained else None,
        "replica_seconds": round(recorder.replica_seconds()),
        "largest": max((to for _, to, _ in story), default=sizing.min_replicas),
        "final": int(deployment.get("spec", {}).get("replicas", -1)),
        "sent": sent,
    }
    screen.say("\nFigures")
    screen.say(
        f"  peak oldest ready age     {figures['peak_oldest_ready_age_seconds']:>6} s"
        f"   (target {sizing.target_seconds} s)"
    )
    screen.say(
        f"  time to drain             {figures['drain_seconds_after_burst']:>6} s"
        "   (from the end of the burst to an empty backlog)"
    )
    screen.say(f"  replica-seconds           {figures['replica_seconds']:>6}")
    screen.say(
        f"  workers                   {sizing.min_replicas} -> {figures['largest']} -> "
        f"{figures['final']}   (minReplicas {sizing.min_replicas}, maxReplicas "
        f"{sizing.max_replicas})"
    )
    screen.say(f"  messages sent             {sent:>6}")
    return figures


@contextmanager
def local_stack(workdir: Path) -> Iterator[tuple[str, LocalCluster, Sink]]:
    """PostgreSQL, the emulator (CRD installed), the kubelet, the operator and the sink."""
    with (
        EmbeddedPostgres(settings={"max_connections": "100"}) as server,
        Sink(lambda body, nth: Reply(delay=PUBLISH_SECONDS)) as sink,
    ):
        dsn = server.dsn()
        with psycopg.connect(dsn, autocommit=True) as conn:
            migrate(conn, Table.parse("outbox"))
        (workdir / "k8s").mkdir()
        cluster = LocalCluster(workdir / "k8s").start()
        try:
            cluster.install_crd(CRD)
            node = Kubelet(cluster.url, ADMIN_TOKEN, workdir / "kubelet").start()
            cluster.emulator.pod_logs = node.log
            operator = Operator(cluster, workdir, "--worker-publishers", "log,http,null")
            try:
                operator.start()
                yield dsn, cluster, sink
            finally:
                operator.stop()
                node.stop()
        finally:
            cluster.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m k8s.demo", description=__doc__.split("\n")[0])
    parser.add_argument("--burst-seconds", type=float, default=Step.burst_seconds)
    parser.add_argument("--burst-rate", type=float, default=Step.burst_rate)
    args = parser.parse_args(argv)
    if not os.access(KUBECTL, os.X_OK):
        print(f"the operator demo needs kubectl at {KUBECTL} (Debian package kubectl): skipped")
        return 0
    step = Step(burst_rate=args.burst_rate, burst_seconds=args.burst_seconds)
    print("\nThe operator: an OutboxDispatcher sized by its backlog's age")
    print("(the real outbox-controller against a local API server emulator; real workers)\n")
    with (
        tempfile.TemporaryDirectory(prefix="outbox-operator-demo-") as tmp,
        local_stack(Path(tmp)) as (dsn, cluster, sink),
    ):
        figures = run_story(cluster, dsn, sink.url, step=step)
        delivered = len(set(sink.delivered_ids()))
    lost = figures["sent"] - delivered
    print(f"  delivered (unique ids)    {delivered:>6}")
    print(f"  lost                      {lost:>6}")
    minimum = Sizing().min_replicas
    ok = lost == 0 and figures["largest"] > minimum and figures["final"] == minimum
    print(f"Result: {'OK' if ok else 'FAILED'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
