"""`python -m bench.fleet`: one operator and a fleet of OutboxDispatchers (issue 34).

python -m bench.fleet                                  # 200, 500 and 1,000; 1 and 20 databases
python -m bench.fleet --sizes 200 --databases 1        # one size
python -m bench.fleet --baseline ec25ba5 --current HEAD
python -m bench.fleet --smoke                          # 5 dispatchers, a short window

What a platform team runs: one operator install, an `OutboxDispatcher` per service, each on
its own outbox table, every field at the CRD's defaults (poll every 5 s, minReplicas 0, the
log publisher). Each run starts afresh:

- the project's API emulator (`tests/k8s/`) in a process of its own (`bench.fleet_emulator`),
  so that its CPU is measured apart from the operator's, and it counts the requests it serves;
- the operator as a real `outbox-controller` process with its default leader election, of
  the working tree or of another revision (`git archive`, mapped into the `outbox` namespace
  as pyproject.toml maps the folders, run with this environment's libraries);
- one embedded PostgreSQL (`bench.env.Bench`); the N tables in one database, or spread over
  20 databases of that same server (a Secret for each). Each revision gets tables migrated by
  its own `outbox.schema`.

Once the operator leads, the N resources are created in one `kubectl create`; the run waits
until every resource has a `status.backlog`, then measures a steady window of --duration
seconds: new database sessions (`pg_stat_database.sessions`), the operator's and the
emulator's CPU (/proc/PID/stat) and resident memory, API requests by verb, the emulator's
handling time and loop lag, and the status freshness: a row is inserted into one of ~10
sample tables at a random moment, and the time until that resource's `status.backlog.pending`
shows it is taken (then the row is deleted and the status seen at 0 before the next). Whether
the operator lost its Lease is read from its exit and its log.

No kubelet runs: a Deployment the operator scales up has no pods, and nothing consumes.
Writes fleet.json and fleet.md into --out.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
import tomllib
import urllib.request
from collections import Counter
from collections.abc import Sequence
from contextlib import ExitStack, suppress
from dataclasses import dataclass, field
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any

import psycopg
import yaml
from psycopg import sql

from bench.env import Bench, with_dbname

ROOT = Path(__file__).resolve().parent.parent
NS = "default"
POLL_SECONDS = 5.0  # the CRD's default pollIntervalSeconds
SAMPLE_TABLES = 10
DRAIN_SECONDS = 3 * POLL_SECONDS + 10  # after the window, for rows inserted in it
LOST_LEASE = "no longer the leader"
DEFAULT_BASELINE = "ec25ba5"
TICKS = os.sysconf("SC_CLK_TCK")
APPLICATION = "bench-fleet"

# The issue's goals, at 200 dispatchers with the defaults.
GOALS = {
    "first_status_seconds": 60.0,
    "freshness_p99_seconds": 2 * POLL_SECONDS + 2,
    "sessions_per_second": 1.0,
    "operator_cpu_cores": 0.25,
    "operator_rss_mb": 400.0,
}


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


# ---- the code under test ----------------------------------------------------------------


@dataclass(frozen=True)
class Code:
    """One operator to measure: the working tree, or a revision unpacked into a tree."""

    label: str  # "baseline" or "current"
    revision: str | None  # None: the working tree
    described: str
    tree: Path  # where its outbox/ and component folders are
    pythonpath: Path | None  # the namespace tree to put first on PYTHONPATH

    @property
    def schema(self) -> int:
        text = (self.tree / "outbox" / "schema.py").read_text()
        found = re.search(r"^SCHEMA_VERSION = (\d+)", text, re.M)
        assert found, "no SCHEMA_VERSION in outbox/schema.py"
        return int(found.group(1))

    def env(self) -> dict[str, str]:
        env = {**os.environ}
        env.pop("PYTHONPATH", None)
        if self.pythonpath is not None:
            env["PYTHONPATH"] = str(self.pythonpath)
        return env


def _git(*args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(ROOT), *args], capture_output=True, text=True, check=True
    ).stdout.strip()


def working_tree(label: str) -> Code:
    head = _git("rev-parse", "--short", "HEAD")
    dirty = _git("status", "--porcelain", "--untracked-files=no", "--", "outbox", "controller")
    described = f"working tree at {head}" + (
        " (with uncommitted changes to outbox/ and controller/)" if dirty else ""
    )
    return Code(label, None, described, ROOT, None)


def revision_tree(label: str, revision: str, into: Path) -> Code:
    """`revision`'s files (git archive), its top-level folders mapped into the `outbox`
    namespace as its own pyproject.toml maps them, as symlinks."""
    commit = _git("rev-parse", "--verify", f"{revision}^{{commit}}")
    subject = _git("log", "-1", "--format=%s", commit)
    source = into / f"{label}-src"
    source.mkdir(parents=True)
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", "--format=tar", commit], capture_output=True, check=True
    ).stdout
    with tarfile.open(fileobj=__import__("io").BytesIO(archive)) as tar:
        tar.extractall(source, filter="data")
    package_dir = tomllib.loads((source / "pyproject.toml").read_text())["tool"]["setuptools"][
        "package-dir"
    ]
    namespace = into / f"{label}-path"
    root = namespace / "outbox"
    root.mkdir(parents=True)
    for name, folder in package_dir.items():
        if name == "outbox":
            for item in (source / folder).iterdir():
                (root / item.name).symlink_to(item, target_is_directory=item.is_dir())
        else:
            (namespace / name.replace(".", "/")).symlink_to(
                source / folder, target_is_directory=True
            )
    short = commit[:7]
    code = Code(label, short, f"{short} ({subject[:70]})", namespace, namespace)
    imported = subprocess.run(
        [sys.executable, "-c", "import outbox.controller.cli as m; print(m.__file__)"],
        env=code.env(), cwd=namespace, capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    if not imported.startswith(str(namespace)):
        raise RuntimeError(f"{label}: outbox.controller resolves to {imported}, not {namespace}")
    return code


def prepare(label: str, revision: str | None, into: Path) -> Code:
    if revision is None:
        return working_tree(label)
    return revision_tree(label, revision, into)


# ---- the databases --------------------------------------------------------------------------


@dataclass
class Databases:
    """The fleet's tables: `count` databases of one server, table i in database i % count."""

    admin_dsn: str
    schema: int
    count: int
    tables: int = 0  # migrated so far, per revision's schema

    def name(self, k: int) -> str:
        return f"fleet_v{self.schema}_of{self.count}_{k}"

    def dsn(self, k: int) -> str:
        return with_dbname(self.admin_dsn, self.name(k))

    @property
    def names(self) -> list[str]:
        return [self.name(k) for k in range(self.count)]

    def of(self, i: int) -> int:
        return i % self.count

    def ensure(self, code: Code, tables: int) -> None:
        """Create the databases and migrate tables up to `tables` with `code`'s schema."""
        if self.tables >= tables:
            return
        with psycopg.connect(self.admin_dsn, autocommit=True) as conn:
            if self.tables == 0:
                for name in self.names:
                    conn.execute(sql.SQL("DROP DATABASE IF EXISTS {}").format(sql.Identifier(name)))
                    conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        for k in range(self.count):
            wanted = [table(i) for i in range(self.tables, tables) if self.of(i) == k]
            if wanted:
                subprocess.run(
                    [sys.executable, "-P", str(ROOT / "bench" / "fleet_tables.py"),
                     self.dsn(k), *wanted],
                    env=code.env(), cwd=code.tree, check=True,
                )  # fmt: skip
        self.tables = tables

    def drop(self) -> None:
        with psycopg.connect(self.admin_dsn, autocommit=True) as conn:
            for name in self.names:
                conn.execute(
                    sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
                )


def table(i: int) -> str:
    return f"outbox_{i:04d}"


def resource(i: int) -> str:
    return f"svc-{i:04d}"


# ---- processes and what /proc says of them -----------------------------------------------------


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS  # utime, stime


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def stop_process(process: subprocess.Popen[bytes], timeout: float = 30) -> int:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)
    return process.returncode


def wait_until(what: str, probe: Any, timeout: float, every: float = 0.1) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = probe()
        if found:
            return found
        time.sleep(every)
    raise TimeoutError(f"timed out waiting for {what}")


class EmulatorProcess:
    """`bench.fleet_emulator` in its own process, and its bench-only endpoints."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        with (workdir.parent / "emulator.log").open("ab") as out:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "bench.fleet_emulator", str(workdir)],
                cwd=ROOT, stdout=out, stderr=subprocess.STDOUT,
            )  # fmt: skip
        info = wait_until("the emulator", self._info, timeout=60, every=0.2)
        self.url: str = info["url"]
        self.kubeconfig = Path(info["kubeconfig"])

    def _info(self) -> dict[str, Any] | None:
        if self.process.poll() is not None:
            raise RuntimeError(f"the emulator exited with {self.process.returncode}")
        path = self.workdir / "cluster.json"
        return json.loads(path.read_text()) if path.exists() else None

    def get(self, path: str) -> Any:
        with urllib.request.urlopen(self.url + path, timeout=30) as response:
            return json.loads(response.read())

    def kubectl(self, *args: str, input: str | None = None) -> str:
        env = {**os.environ, "KUBECONFIG": str(self.kubeconfig), "HOME": str(self.workdir)}
        result = subprocess.run(
            ["kubectl", *args], input=input, capture_output=True, text=True, env=env, timeout=900
        )
        if result.returncode != 0:
            raise RuntimeError(f"kubectl {args[0]} failed: {result.stderr[-2000:]}")
        return result.stdout

    def stop(self) -> None:
        stop_process(self.process)


class OperatorProcess:
    """`python -m outbox.controller` of one Code, with the operator's default election."""

    def __init__(self, code: Code, emulator: EmulatorProcess, workdir: Path) -> None:
        self.log_path = workdir / "operator.log"
        env = {**code.env(), "KUBECONFIG": str(emulator.kubeconfig), "POD_NAMESPACE": NS}
        env.pop("KUBERNETES_SERVICE_HOST", None)
        with self.log_path.open("ab") as out:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "outbox.controller", "--health-port", "0",
                 "--log-format", "text", "--leader-identity", "fleet-bench"],
                stdout=out, stderr=out, env=env, cwd=workdir,
            )  # fmt: skip
        self.pid = self.process.pid
        port = wait_until(
            "the operator's health port",
            lambda: self._alive() and re.search(r"health and metrics on port (\d+)", self.log()),
            timeout=60,
        )
        self.port = int(port.group(1))

    def _alive(self) -> bool:
        if self.process.poll() is not None:
            raise RuntimeError(f"the operator exited: {self.log()[-2000:]}")
        return True

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def leading(self) -> bool:
        self._alive()
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=10) as r:
            text = r.read().decode()
        return bool(re.search(r"^outbox_controller_leader 1(\.0)?$", text, re.M))

    @property
    def running(self) -> bool:
        return self.process.poll() is None


# ---- the resources -------------------------------------------------------------------------


def secrets(databases: Databases) -> list[dict[str, Any]]:
    return [
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {
                "name": f"fleet-db-{k}",
                "namespace": NS,
                "annotations": {"outbox.dev/dispatchers": "*"},
            },
            "stringData": {"dsn": databases.dsn(k)},
        }
        for k in range(databases.count)
    ]


def dispatchers(databases: Databases, count: int) -> list[dict[str, Any]]:
    """Every field the CRD defaults left to it: only the table and the publisher are given."""
    return [
        {
            "apiVersion": "outbox.dev/v1alpha1",
            "kind": "OutboxDispatcher",
            "metadata": {"name": resource(i), "namespace": NS},
            "spec": {
                "database": {
                    "dsnSecretRef": {"name": f"fleet-db-{databases.of(i)}", "key": "dsn"},
                    "table": table(i),
                },
                "publisher": {"type": "log"},
            },
        }
        for i in range(count)
    ]


def sample(count: int) -> list[int]:
    """~10 resources spread over the fleet."""
    n = min(SAMPLE_TABLES, count)
    return sorted({round(k * count / n) for k in range(n)})


# ---- freshness -------------------------------------------------------------------------------


@dataclass
class Probe:
    """One sample table's cycle: wait for a status of 0, insert a row at a random moment,
    time until the status shows it, delete it, again."""

    index: int
    conn: psycopg.Connection[Any]
    state: str = "clearing"  # clearing -> idle -> inserted -> clearing
    due: float = 0.0
    inserted_at: float = 0.0

    @property
    def name(self) -> str:
        return resource(self.index)

    def _table(self) -> sql.Identifier:
        return sql.Identifier(table(self.index))

    def insert(self) -> None:
        self.conn.execute(
            sql.SQL(
                "INSERT INTO {} (aggregate_type, aggregate_id, event_type, payload, "
                "available_at) VALUES ('fleet', 'probe', 'Probed', '{{}}', "
                "now() + interval '1 hour')"
            ).format(self._table())
        )
        self.inserted_at = time.monotonic()  # autocommit: visible from here on

    def clear(self) -> None:
        self.conn.execute(sql.SQL("DELETE FROM {}").format(self._table()))


@dataclass
class Freshness:
    delays: list[float] = field(default_factory=list)
    missed: int = 0  # rows not shown within the window


def step_probes(
    probes: list[Probe], shown: dict[str, Any], now: float, fresh: Freshness, inserting: bool
) -> None:
    for probe in probes:
        pending = shown.get(probe.name)
        if probe.state == "clearing" and pending == 0:
            probe.state, probe.due = "idle", now + random.uniform(0, POLL_SECONDS)
        elif probe.state == "idle" and inserting and now >= probe.due:
            probe.insert()
            probe.state = "inserted"
        elif probe.state == "inserted" and pending is not None and pending >= 1:
            fresh.delays.append(time.monotonic() - probe.inserted_at)
            probe.clear()
            probe.state = "clearing"


# ---- one run ---------------------------------------------------------------------------------


def percentile(values: Sequence[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def hist_percentile(counts: list[int], buckets: list[float], q: float) -> float | None:
    total = sum(counts)
    if total == 0:
        return None
    seen = 0
    for i, n in enumerate(counts):
        seen += n
        if seen >= q * total:
            return buckets[i] if i < len(buckets) else float("inf")
    return None


def hist_max(counts: list[int], buckets: list[float]) -> float | None:
    top = [i for i, n in enumerate(counts) if n]
    if not top:
        return None
    return buckets[top[-1]] if top[-1] < len(buckets) else float("inf")


@dataclass
class Snapshot:
    at: float
    operator_cpu: float
    emulator_cpu: float
    sessions: int
    stats: dict[str, Any]
    machine_busy: float  # CPU seconds every process of the machine used so far


def machine_busy() -> float:
    """CPU seconds the whole machine spent busy since boot (/proc/stat: all but idle and
    iowait): what else runs on the shared cores shows as busy the operator did not use."""
    fields = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    return (sum(fields[:8]) - fields[3] - fields[4]) / TICKS


def sessions(admin: psycopg.Connection[Any], names: list[str]) -> int:
    row = admin.execute(
        "SELECT coalesce(sum(sessions), 0) FROM pg_stat_database WHERE datname = ANY(%s)",
        (names,),
    ).fetchone()
    return int(row[0]) if row else 0


def operator_connections(admin: psycopg.Connection[Any], names: list[str]) -> int:
    row = admin.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = ANY(%s) AND application_name <> %s",
        (names, APPLICATION),
    ).fetchone()
    return int(row[0]) if row else 0


def snapshot(
    admin: psycopg.Connection[Any],
    databases: Databases,
    operator: OperatorProcess,
    emulator: EmulatorProcess,
) -> Snapshot:
    return Snapshot(
        time.monotonic(),
        cpu_seconds(operator.pid) if operator.running else float("nan"),
        cpu_seconds(emulator.process.pid),
        sessions(admin, databases.names),
        emulator.get("/_bench/stats"),
        machine_busy(),
    )


def summarize_log(text: str) -> dict[str, Any]:
    """Warnings and errors by message shape (resource names and numbers folded)."""
    shapes: Counter[str] = Counter()
    levels: Counter[str] = Counter()
    for line in text.splitlines():
        found = re.match(r"^\S+ \S+ (WARNING|ERROR|CRITICAL)\s+(\S+): (.*)$", line)
        if not found:
            continue
        levels[found.group(1)] += 1
        message = re.sub(r"svc-\d+", "svc-N", found.group(3))
        message = re.sub(r"outbox_\d+", "outbox_N", message)
        message = re.sub(r"\d+(\.\d+)?", "N", message)
        shapes[f"{found.group(1)} {message[:160]}"] += 1
    return {
        "warnings": levels["WARNING"],
        "errors": levels["ERROR"] + levels["CRITICAL"],
        "too_many_clients": text.count("too many clients")
        + text.count("remaining connection slots"),
        "top": [{"count": n, "message": m} for m, n in shapes.most_common(6)],
    }


def measure(
    bench: Bench,
    databases: Databases,
    count: int,
    code: Code,
    *,
    duration: float,
    first_status_timeout: float,
    workdir: Path,
    profile: Path | None = None,
) -> dict[str, Any]:
    """One run: a fresh emulator and operator, `count` resources, a steady window."""
    workdir.mkdir(parents=True)
    result: dict[str, Any] = {
        "code": code.label,
        "revision": code.revision or "working tree",
        "described": code.described,
        "dispatchers": count,
        "databases": databases.count,
    }
    samples = sample(count)
    with ExitStack() as stack:
        admin = stack.enter_context(
            psycopg.connect(bench.admin_dsn, autocommit=True, application_name=APPLICATION)
        )
        conns = {
            k: stack.enter_context(
                psycopg.connect(databases.dsn(k), autocommit=True, application_name=APPLICATION)
            )
            for k in sorted({databases.of(i) for i in samples})
        }
        probes = [Probe(i, conns[databases.of(i)]) for i in samples]
        for probe in probes:
            probe.clear()
        emulator = EmulatorProcess(workdir / "k8s")
        stack.callback(emulator.stop)
        emulator.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(secrets(databases)))
        operator = OperatorProcess(code, emulator, workdir)
        stack.callback(stop_process, operator.process)
        wait_until("the operator to lead", operator.leading, timeout=60, every=0.25)
        items = yaml.safe_dump_all(dispatchers(databases, count))
        start = snapshot(admin, databases, operator, emulator)
        applying = time.monotonic()
        applying_wall = time.time()
        result["load_average_at_start"] = [round(x, 2) for x in os.getloadavg()]
        emulator.kubectl("create", "-f", "-", input=items)
        applied = time.monotonic()
        result["apply_seconds"] = round(applied - applying, 1)
        log(f"  created {count} resources in {applied - applying:.1f} s")
        with_status = 0
        first_status: float | None = None
        while time.monotonic() - applying < first_status_timeout and operator.running:
            with_status = emulator.get("/_bench/status")["with_backlog"]
            if with_status == count:
                first_status = time.monotonic() - applying
                break
            time.sleep(0.25)
        result["first_status_seconds"] = None if first_status is None else round(first_status, 1)
        result["resources_with_status"] = with_status
        ramped = snapshot(admin, databases, operator, emulator)
        result["deployments_at_ramp_end"] = emulator.get("/_bench/status")["deployments"]
        ramp = figures(start, ramped, ramped.at - start.at, Freshness(), [], [], [], [])
        result["ramp"] = {
            "seconds": round(ramped.at - start.at, 1),
            **{key: ramp[key] for key in RAMP_FIGURES},
        }
        log(f"  first status for all: {result['first_status_seconds']} s ({with_status}/{count})")

        # The steady window.
        fresh = Freshness()
        rss: list[float] = []
        emulator_rss: list[float] = []
        connections: list[int] = []
        ages: list[float] = []
        spy = start_profile(operator.pid, profile, duration) if profile else None
        before = snapshot(admin, databases, operator, emulator)
        # An operator that exited during the ramp has no steady state to measure.
        window = duration if operator.running else 0.0
        names = ",".join(probe.name for probe in probes)
        next_second = before.at
        exited_at: float | None = None
        while time.monotonic() - before.at < window:
            now = time.monotonic()
            shown = emulator.get(f"/_bench/status?names={names}")
            step_probes(probes, shown, now, fresh, inserting=True)
            if not operator.running:
                exited_at = now - applying
                break
            if now >= next_second:
                next_second += 1.0
                rss.append(rss_mb(operator.pid))
                emulator_rss.append(rss_mb(emulator.process.pid))
                connections.append(operator_connections(admin, databases.names))
                oldest = emulator.get("/_bench/status")["oldest_sampled_at"]
                if oldest:
                    stamp = datetime.fromisoformat(oldest.replace("Z", "+00:00"))
                    ages.append((datetime.now(UTC) - stamp).total_seconds())
            time.sleep(0.1)
        after = snapshot(admin, databases, operator, emulator)
        # Rows inserted in the window are waited for (no new ones): a miss is one the status
        # never showed, not one the window's end cut short.
        drained = time.monotonic() + DRAIN_SECONDS
        while operator.running and time.monotonic() < drained:
            if all(probe.state != "inserted" for probe in probes):
                break
            shown = emulator.get(f"/_bench/status?names={names}")
            step_probes(probes, shown, time.monotonic(), fresh, inserting=False)
            time.sleep(0.1)
        fresh.missed = sum(1 for probe in probes if probe.state == "inserted")
        for probe in probes:
            probe.clear()
        if spy is not None:
            result["profile"] = finish_profile(spy, profile)  # type: ignore[arg-type]
        if exited_at is None and not operator.running:
            exited_at = time.monotonic() - applying
        code_at_stop = operator.process.poll()
        exit_code = stop_process(operator.process)
        text = operator.log()
        final = emulator.get("/_bench/stats")
        lost_at = logged_at(text, LOST_LEASE)
        result["lease"] = {
            "lost": lost_at is not None,
            "exited_by_itself_after_seconds": None if exited_at is None else round(exited_at, 1),
            "lost_after_seconds": None if lost_at is None else round(lost_at - applying_wall, 1),
            "exit_code": exit_code if code_at_stop is not None else None,
            **renewals(final, applying_wall, lost_at),
        }
        result["log"] = summarize_log(text)
        span = after.at - before.at
        result["window_seconds"] = round(span, 1) if window else None
        steady = figures(before, after, span, fresh, rss, emulator_rss, connections, ages)
        if not window:
            steady = {key: _nothing(value) for key, value in steady.items()}
        result.update(steady)
    return result


def figures(
    before: Snapshot,
    after: Snapshot,
    span: float,
    fresh: Freshness,
    rss: list[float],
    emulator_rss: list[float],
    connections: list[int],
    ages: list[float],
) -> dict[str, Any]:
    buckets = before.stats["buckets"]
    requests = {
        kind: round((n - before.stats["requests"].get(kind, 0)) / span, 2)
        for kind, n in sorted(after.stats["requests"].items())
        if n - before.stats["requests"].get(kind, 0) > 0
    }
    handling = [
        a - b for a, b in zip(after.stats["handling"], before.stats["handling"], strict=True)
    ]
    lag = [a - b for a, b in zip(after.stats["lag"], before.stats["lag"], strict=True)]
    counts = {
        kind: n - before.stats["requests"].get(kind, 0)
        for kind, n in after.stats["requests"].items()
    }
    busy = {
        kind: seconds - before.stats["seconds"].get(kind, 0.0)
        for kind, seconds in after.stats["seconds"].items()
    }
    by_verb = {
        kind: {
            "mean_ms": round(1000 * seconds / counts[kind], 1),
            "seconds_per_second": round(seconds / span, 3),
        }
        for kind, seconds in sorted(busy.items(), key=lambda item: -item[1])
        if counts.get(kind)
    }

    def r(value: float | None, digits: int = 3) -> float | None:
        return None if value is None else round(value, digits)

    operator_cpu = after.operator_cpu - before.operator_cpu
    return {
        "machine_busy_cores": r((after.machine_busy - before.machine_busy) / span, 2),
        "freshness": {
            "samples": len(fresh.delays),
            "missed": fresh.missed,
            "p50_seconds": r(percentile(fresh.delays, 0.5), 2),
            "p99_seconds": r(percentile(fresh.delays, 0.99), 2),
            "max_seconds": r(max(fresh.delays, default=None), 2),
        },
        "oldest_status_age_seconds": r(max(ages, default=None), 1),
        "sessions_per_second": r((after.sessions - before.sessions) / span, 2),
        "operator_db_connections_max": max(connections, default=0),
        "operator_cpu_cores": None if operator_cpu != operator_cpu else r(operator_cpu / span),
        "operator_rss_mb": r(sum(rss) / len(rss), 1) if rss else None,
        "operator_rss_max_mb": r(max(rss), 1) if rss else None,
        "api_requests_per_second": requests,
        "api_requests_per_second_total": round(sum(requests.values()), 1),
        "emulator": {
            "cpu_cores": r((after.emulator_cpu - before.emulator_cpu) / span),
            "rss_mb": r(max(emulator_rss), 1) if emulator_rss else None,
            "handling_p50_ms": r(_ms(hist_percentile(handling, buckets, 0.5)), 1),
            "handling_p99_ms": r(_ms(hist_percentile(handling, buckets, 0.99)), 1),
            "loop_lag_p50_ms": r(_ms(hist_percentile(lag, buckets, 0.5)), 1),
            "loop_lag_p99_ms": r(_ms(hist_percentile(lag, buckets, 0.99)), 1),
            "loop_lag_max_ms": r(_ms(hist_max(lag, buckets)), 1),
            "handler_seconds_per_second": r(sum(busy.values()) / span),
            "by_verb": by_verb,
        },
    }


def logged_at(text: str, needle: str) -> float | None:
    """When the operator's text log first says `needle` (seconds since the epoch)."""
    for line in text.splitlines():
        if needle in line:  # 2026-01-01 10:00:00,123 ERROR   outbox.controller: ...
            return datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp()
    return None


def renewals(stats: dict[str, Any], since: float, lost: float | None) -> dict[str, Any]:
    """The Lease as the API server saw it: the longest time between two successful renewals
    from `since` on (a leader gives up after its renew deadline, 10 s), and the slowest Lease
    request the emulator handled; with `lost` (when the operator logged the loss), how long
    before it the last renewal was, and the last gaps before it."""
    times = [t for t in stats["renewals"] if t >= since - 5 and (lost is None or t <= lost)]
    gaps = [b - a for a, b in itertools.pairwise(times)]
    slowest = [stats["slowest"].get(k, 0.0) for k in ("get leases", "update leases")]
    return {
        "renewals_seen": len(times),
        "longest_renewal_gap_seconds": round(max(gaps), 1) if gaps else None,
        "last_renewal_before_loss_seconds": (
            round(lost - times[-1], 1) if lost is not None and times else None
        ),
        "last_gaps_seconds": [round(g, 1) for g in gaps[-6:]] if lost is not None else None,
        "slowest_lease_request_ms": round(1000 * max(slowest), 1),
    }


RAMP_FIGURES = (
    "machine_busy_cores",
    "sessions_per_second",
    "operator_cpu_cores",
    "api_requests_per_second",
    "api_requests_per_second_total",
    "emulator",
)


def _nothing(value: Any) -> Any:
    """The shape of a figure with no value (no steady window to measure)."""
    if isinstance(value, dict):
        return {key: _nothing(item) for key, item in value.items()} if value else {}
    return None


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1000


# ---- where the operator's time goes ---------------------------------------------------------


def py_spy() -> str | None:
    found = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    return found if Path(found).exists() else None


def start_profile(pid: int, output: Path, duration: float) -> subprocess.Popen[bytes] | None:
    binary = py_spy()
    if binary is None:
        return None
    return subprocess.Popen(
        [binary, "record", "--format", "raw", "--rate", "100", "--nonblocking",
         "--duration", str(int(duration)), "--output", str(output), "--pid", str(pid)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip


# Who a busy sample is working for: the innermost frame of a known library or of the
# operator's own code (py-spy names frames `function (package/module.py:line)`), so that
# the standard library's work (copy, json, asyncio's transports) is counted for its caller.
AREAS = (
    ("kopf (watching)", "(kopf/"),
    ("kubernetes client (pydantic models)", "(pydantic/"),
    ("kubernetes client (pydantic models)", "(pydantic_core/"),
    ("kubernetes client", "(kubernetes/"),
    ("aiohttp (HTTP to the API)", "(aiohttp/"),
    ("aiohttp (HTTP to the API)", "(netrc.py"),
    ("psycopg (database)", "(psycopg/"),
    ("psycopg (database)", "(psycopg_pool/"),
    ("yaml", "(yaml/"),
    ("operator: database reads", "(outbox/controller/database.py"),
    ("operator: leader election", "(outbox/controller/leader.py"),
    ("operator: reconcile, render, status", "(outbox/controller/"),
    ("outbox (shared)", "(outbox/"),
    ("prometheus_client", "(prometheus_client/"),
    ("logging", "(logging/"),
)
# Innermost frames of a thread that waits in C (epoll, a lock): py-spy may count them busy.
WAITING = (".select (selectors.py", "_worker (concurrent/futures/thread.py", "wait (threading.py")


def normalized(frame: str) -> str:
    """The operator's frames named alike whichever tree it runs from."""
    return re.sub(r"\((?:[^()]*/)?(?:outbox/)?controller/", "(outbox/controller/", frame)


def area(frames: Sequence[str]) -> str:
    for frame in reversed(frames):
        for name, marker in AREAS:
            if marker in frame:
                return name
    return "event loop and standard library"


def finish_profile(spy: subprocess.Popen[bytes], output: Path) -> dict[str, Any]:
    try:
        spy.wait(120)
    except subprocess.TimeoutExpired:
        spy.send_signal(signal.SIGINT)
        spy.wait(30)
    if not output.exists():
        return {"skipped": "py-spy could not sample the operator (ptrace not permitted?)"}
    own: Counter[str] = Counter()
    by_area: Counter[str] = Counter()
    operator: Counter[str] = Counter()
    total = waiting = 0
    for line in output.read_text().splitlines():
        stack, _, n = line.rpartition(" ")
        if not n.isdigit():
            continue
        count = int(n)
        frames = [normalized(f.strip()) for f in stack.split(";")]
        if any(f in frames[-1] for f in WAITING):
            waiting += count
            continue
        total += count
        own[frames[-1]] += count
        by_area[area(frames)] += count
        # The operator's functions on the stack (inclusive), by name without the line.
        for name in {re.sub(r":\d+\)$", ")", f) for f in frames if "(outbox/" in f}:
            operator[name] += count

    def share(n: int) -> float:
        return round(n / max(total, 1), 3)

    return {
        "samples": total,
        "waiting_samples": waiting,
        "rate_per_second": 100,
        "by_area": {k: share(v) for k, v in by_area.most_common()},
        "operator_inclusive": {k: share(v) for k, v in operator.most_common(25)},
        "top_frames": [{"frame": f, "share": share(v)} for f, v in own.most_common(15)],
    }


# ---- the whole benchmark ------------------------------------------------------------------


def environment(bench: Bench) -> dict[str, Any]:
    env = bench.environment()
    env["load_average_at_start"] = [round(x, 2) for x in os.getloadavg()]
    with open("/proc/meminfo") as meminfo:
        env["memory_gb"] = round(int(meminfo.readline().split()[1]) / 1024**2, 1)
    for package in ("kopf", "kubernetes", "kubernetes_asyncio", "kmock", "psycopg", "aiohttp"):
        with suppress(metadata.PackageNotFoundError):
            env[package] = metadata.version(package)
    return env


def codes(baseline: str | None, current: str | None, into: Path) -> list[Code]:
    found = [] if baseline is None else [prepare("baseline", baseline, into)]
    found.append(prepare("current", current, into))
    return found


def run(args: argparse.Namespace) -> dict[str, Any]:
    sizes = [5] if args.smoke else args.sizes
    variants = [1] if args.smoke else args.databases
    duration = 15.0 if args.smoke else args.duration
    report: dict[str, Any] = {
        "smoke": args.smoke,
        "sizes": sizes,
        "databases": variants,
        "duration_seconds": duration,
        "poll_interval_seconds": POLL_SECONDS,
        "goals_at_200": GOALS,
        "runs": [],
    }
    baseline = None if args.baseline in ("", "none") else args.baseline
    with (
        tempfile.TemporaryDirectory(prefix="bench-fleet-") as tmp,
        Bench() as bench,
    ):
        found = codes(baseline, args.current, Path(tmp))
        report["environment"] = environment(bench)
        report["codes"] = {code.label: code.described for code in found}
        work = Path(args.keep) if args.keep else Path(tmp) / "runs"
        for variant in variants:
            sets = {
                schema: Databases(bench.admin_dsn, schema, variant)
                for schema in {code.schema for code in found}
            }
            for size in sizes:
                # Which code goes first alternates from one size to the next.
                flip = (variants.index(variant) * len(sizes) + sizes.index(size)) % 2
                order = list(reversed(found)) if flip else found
                for code in order:
                    databases = sets[code.schema]
                    log(
                        f"{size} dispatchers, {variant} database(s): "
                        f"{code.label} ({code.described})"
                    )
                    databases.ensure(code, max(sizes))
                    row = measure(
                        bench, databases, size, code,
                        duration=duration,
                        first_status_timeout=args.first_status_timeout,
                        workdir=work / f"{code.label}-{size}x{variant}",
                    )  # fmt: skip
                    log(f"  {headline(row)}")
                    report["runs"].append(row)
            for databases in sets.values():
                databases.drop()
        if args.profile and not args.smoke:
            code = found[-1]
            databases = Databases(bench.admin_dsn, code.schema, 1)
            databases.ensure(code, args.profile)
            log(f"profile: py-spy on the {code.label} operator at {args.profile} dispatchers")
            row = measure(
                bench, databases, args.profile, code,
                duration=min(duration, 60.0),
                first_status_timeout=args.first_status_timeout,
                workdir=work / f"profile-{args.profile}",
                profile=work / f"profile-{args.profile}.txt",
            )  # fmt: skip
            report["profile"] = row
            databases.drop()
    return report


def headline(row: dict[str, Any]) -> str:
    fresh = row["freshness"]
    return (
        f"first status {row['first_status_seconds']} s, freshness p50 {fresh['p50_seconds']} "
        f"p99 {fresh['p99_seconds']} s, {row['sessions_per_second']} sessions/s, "
        f"CPU {row['operator_cpu_cores']}, RSS {row['operator_rss_mb']} MB, "
        f"{row['api_requests_per_second_total']} API req/s, lease lost: {row['lease']['lost']}"
    )


# ---- the report -----------------------------------------------------------------------------


def _v(value: Any, suffix: str = "") -> str:
    if value is None:
        return "—"
    if isinstance(value, float):
        return f"{value:g}{suffix}"
    return f"{value}{suffix}"


def _rows(run: dict[str, Any]) -> dict[str, str]:
    fresh = run["freshness"]
    emulator = run["emulator"]
    lease = run["lease"]
    ramp = run.get("ramp") or {}
    ramp_emulator = ramp.get("emulator") or {}
    first = (
        _v(run["first_status_seconds"])
        if run["first_status_seconds"] is not None
        else f"not within the wait ({run['resources_with_status']} of {run['dispatchers']})"
    )
    lost = "no"
    if lease["lost"]:
        at = lease.get("lost_after_seconds", lease["exited_by_itself_after_seconds"])
        lost = f"**yes**, {at} s after the create began" if at is not None else "**yes**"
    return {
        "first status for all (s)": first,
        "status freshness p50 / p99 / max (s)": (
            f"{_v(fresh['p50_seconds'])} / {_v(fresh['p99_seconds'])} / "
            f"{_v(fresh['max_seconds'])} ({fresh['samples']} samples"
            + (f", {fresh['missed']} never shown" if fresh["missed"] else "")
            + ")"
            if run["window_seconds"]
            else "no steady window: the operator had exited"
        ),
        "oldest status.backlog in the fleet, worst (s)": _v(run["oldest_status_age_seconds"]),
        "new DB sessions/s": _v(run["sessions_per_second"]),
        "operator's DB connections open, most": _v(run["operator_db_connections_max"]),
        "operator CPU (cores)": _v(run["operator_cpu_cores"]),
        "operator resident, mean / max (MB)": (
            f"{_v(run['operator_rss_mb'])} / {_v(run['operator_rss_max_mb'])}"
        ),
        "API requests/s": _v(run["api_requests_per_second_total"]),
        "emulator CPU (cores)": _v(emulator["cpu_cores"]),
        "emulator handling p50 / p99 (ms)": (
            f"{_v(emulator['handling_p50_ms'])} / {_v(emulator['handling_p99_ms'])}"
        ),
        "emulator loop lag p99 / max (ms)": (
            f"{_v(emulator['loop_lag_p99_ms'])} / {_v(emulator['loop_lag_max_ms'])}"
        ),
        "lost its Lease": lost,
        "Lease: longest gap between renewals the server took (s)": _v(
            lease.get("longest_renewal_gap_seconds")
        )
        + (
            f"; the last {lease['last_renewal_before_loss_seconds']} s before the loss "
            f"(gaps before it: {', '.join(f'{g:g}' for g in lease.get('last_gaps_seconds') or [])})"
            if lease.get("last_renewal_before_loss_seconds") is not None
            else ""
        ),
        "Lease: slowest Lease request in the emulator (ms)": _v(
            lease.get("slowest_lease_request_ms")
        ),
        "machine: busy cores (of 2), steady / starting; load average at the start": (
            f"{_v(run.get('machine_busy_cores'))} / {_v(ramp.get('machine_busy_cores'))}; "
            f"{_v(run.get('load_average_at_start', [None])[0])}"
        ),
        "Deployments stored when the wait for first status ended": _v(
            run.get("deployments_at_ramp_end")
        ),
        "while starting: seconds measured": _v(ramp.get("seconds")),
        "while starting: operator CPU (cores)": _v(ramp.get("operator_cpu_cores")),
        "while starting: new DB sessions/s": _v(ramp.get("sessions_per_second")),
        "while starting: API requests/s": _v(ramp.get("api_requests_per_second_total")),
        "while starting: emulator CPU (cores)": _v(ramp_emulator.get("cpu_cores")),
        "while starting: emulator loop lag p99 / max (ms)": (
            f"{_v(ramp_emulator.get('loop_lag_p99_ms'))} / "
            f"{_v(ramp_emulator.get('loop_lag_max_ms'))}"
        ),
        "log: warnings / errors (too many clients)": (
            f"{run['log']['warnings']} / {run['log']['errors']} ({run['log']['too_many_clients']})"
        ),
    }


GOAL_TEXT = {
    "first status for all (s)": "≤ 60",
    "status freshness p50 / p99 / max (s)": f"p99 ≤ {GOALS['freshness_p99_seconds']:g}",
    "new DB sessions/s": "≤ 1",
    "operator CPU (cores)": "≤ 0.25",
    "operator resident, mean / max (MB)": "≤ 400",
    "lost its Lease": "never",
    "Lease: longest gap between renewals the server took (s)": "< 10 (renew deadline)",
}


def render(report: dict[str, Any]) -> str:
    env = report["environment"]
    codes_text = "; ".join(f"{label}: {text}" for label, text in report["codes"].items())
    lines = [
        "# One operator, a fleet of OutboxDispatchers",
        "",
        "`python -m bench.fleet` (issue 34)"
        + (" — smoke size, checks the harness only." if report["smoke"] else "."),
        "",
        "## Machine and method",
        "",
        f"- {env['cores']} cores ({env['machine']}), {env.get('memory_gb')} GB, shared with "
        f"other work (load average {env['load_average_at_start']} at the start); "
        f"PostgreSQL {env['postgresql']} embedded, stock settings but max_connections "
        f"{env['postgresql_settings'].get('max_connections')}; Python {env['python']}, "
        f"kopf {env.get('kopf')}, kubernetes client "
        f"{env.get('kubernetes_asyncio') or env.get('kubernetes')}, "
        f"kmock {env.get('kmock')}; repository at {env['commit']}.",
        f"- Code measured: {codes_text}. Each revision's operator runs from its own tree "
        "(`git archive`, mapped into `outbox` as its pyproject.toml maps the folders) with this "
        "environment's libraries, on tables migrated by its own schema.",
        "- Each run: a fresh API emulator (the project's, `tests/k8s/`) in a process of its "
        "own, on the same cores; the operator as an `outbox-controller` process with its "
        "default leader election (Lease 15 s, renew deadline 10 s, retry 2 s); one "
        "`kubectl create` of N resources with the CRD's defaults (poll 5 s, minReplicas 0, "
        "log publisher), each on its own table; with 20 databases, the tables are spread "
        "over 20 databases of the same server, one Secret each. No kubelet: Deployments the "
        "operator scales up have no pods.",
        f"- First status: seconds from the start of the `kubectl create` until every resource "
        f"has a `status.backlog` (the create itself is part of it). Then a steady window of "
        f"{report['duration_seconds']:g} s: rows are inserted one at a time into "
        f"{SAMPLE_TABLES} sample tables at random moments, and the freshness is the time "
        "until the emulator stores that resource's `status.backlog.pending` showing it "
        "(polled every 0.1 s; the row is deleted and the status seen at 0 before the next); "
        "the oldest `status.backlog.sampledAt` of the whole fleet is read every second. "
        "Sessions: `pg_stat_database.sessions` of the fleet's databases over the window "
        "(the benchmark's own connections are opened before it). CPU: utime + stime from "
        "/proc over the window; resident: VmRSS each second. API requests: counted by the "
        "emulator by verb and resource; its handling time excludes watches; its loop lag is "
        "how late a 50 ms timer fires in its event loop.",
        "- Lease: the emulator records when each Lease write succeeds; the longest gap between "
        "two is what the leader's renew deadline (10 s) is measured against, and the "
        "emulator's slowest Lease request shows whether the server or the leader was late. "
        "Machine busy: all of the machine's CPU time from /proc/stat, so that the other work "
        "on the shared cores shows beside the operator's and the emulator's.",
        *_invocations(report),
        *(f"- {note}" for note in report.get("notes", [])),
        *(
            f"- Replaced by a later run of the same cell (kept in fleet.json): {run['code']} at "
            f"{run['dispatchers']} dispatchers, {run['databases']} database(s): {headline(run)}."
            for run in report.get("replaced_runs", [])
        ),
        "- One run per cell, baseline and current alternating which goes first; the figures "
        "are a shared machine's: compare within a table, not across runs of other days.",
        "",
        f"Goals (issue 34, at 200 dispatchers with the defaults): first status for all "
        f"≤ 60 s, freshness p99 ≤ two poll intervals + 2 s = "
        f"{GOALS['freshness_p99_seconds']:g} s, ≤ 1 new DB session/s in the steady state, "
        "≤ 0.25 core, ≤ 400 MB resident, never a lost Lease.",
        "",
    ]
    if report.get("findings"):
        lines += ["## What the figures say", ""]
        lines += [f"- {finding}" for finding in report["findings"]]
        lines.append("")
    cells: dict[tuple[int, int], list[dict[str, Any]]] = {}
    for run in report["runs"]:
        cells.setdefault((run["databases"], run["dispatchers"]), []).append(run)
    for (variant, size), runs in sorted(cells.items()):
        runs = sorted(runs, key=lambda r: r["code"])  # baseline, current
        plural = "database" if variant == 1 else "databases"
        lines += [f"## {size} dispatchers, {variant} {plural}", ""]
        header = (
            "| figure | goal | " + " | ".join(f"{r['code']} ({r['revision']})" for r in runs) + " |"
        )
        lines += [header, "|---|---|" + "---:|" * len(runs)]
        table_rows = [_rows(r) for r in runs]
        for name in table_rows[0]:
            goal = GOAL_TEXT.get(name, "")
            lines.append(f"| {name} | {goal} | " + " | ".join(t[name] for t in table_rows) + " |")
        lines += [
            "",
            "API requests/s by verb in the steady window, and in brackets the emulator's "
            "mean time in its handler for one (ms); then the same while starting:",
            "",
        ]
        parts = [(r["code"], r) for r in runs]
        parts += [(f"{r['code']} starting", r.get("ramp") or {}) for r in runs]
        lines += ["| verb resource | " + " | ".join(name for name, _ in parts) + " |"]
        lines += ["|---|" + "---:|" * len(parts)]
        kinds = sorted({k for _, part in parts for k in part.get("api_requests_per_second") or {}})
        for kind in kinds:
            lines.append(
                f"| {kind} | " + " | ".join(_per_verb(part, kind) for _, part in parts) + " |"
            )
        tops = [(r["code"], r["log"]["top"]) for r in runs if r["log"]["top"]]
        if tops:
            lines += ["", "Most frequent warnings and errors in the operator's log:", ""]
            for label, top in tops:
                for item in top[:4]:
                    lines.append(f"- {label}: {item['count']} times: `{item['message']}`")
        lines.append("")
    profile = report.get("profile")
    if profile and "profile" in profile:
        lines += render_profile(profile)
    return "\n".join(lines) + "\n"


def _per_verb(part: dict[str, Any], kind: str) -> str:
    """Requests/s of one verb, with the emulator's mean handling time in brackets."""
    rate = (part.get("api_requests_per_second") or {}).get(kind)
    each = ((part.get("emulator") or {}).get("by_verb") or {}).get(kind)
    if rate is None:
        return "—"
    return f"{rate:g}" + (f" ({each['mean_ms']:g})" if each else "")


def _invocations(report: dict[str, Any]) -> list[str]:
    """One line per invocation when the report merges several."""
    lines = []
    for n, one in enumerate(report.get("invocations", []), 1):
        codes = "; ".join(f"{label}: {text}" for label, text in one["codes"].items())
        lines.append(
            f"- Invocation {n}: sizes {one['sizes']}, databases {one['databases']}, "
            f"{one['duration_seconds']:g} s windows, load average "
            f"{one['environment']['load_average_at_start']} at its start; {codes}."
        )
    return lines


def render_profile(run: dict[str, Any]) -> list[str]:
    found = run["profile"]
    if "skipped" in found:
        return ["## Where the operator's time goes", "", found["skipped"], ""]
    lines = [
        "## Where the operator's time goes",
        "",
        f"py-spy ({found['rate_per_second']} samples/s, non-blocking, busy samples only) on the "
        f"{run['code']} operator ({run['revision']}) over its steady window at "
        f"{run['dispatchers']} dispatchers, 1 database ({found['samples']} busy samples, and "
        f"{found.get('waiting_samples', 0)} more of threads waiting in epoll or on a lock, left "
        f"out; {_v(run['operator_cpu_cores'])} core while profiled).",
        "",
        "Each busy sample counted for the innermost frame of a library or of the operator's",
        "own code on its stack (the standard library's work goes to its caller):",
        "",
        "| working for | share of busy samples |",
        "|---|---:|",
    ]
    for name, share in found["by_area"].items():
        lines.append(f"| {name} | {share:.1%} |")
    lines += ["", "| the operator's functions on the stack (inclusive) | share |", "|---|---:|"]
    for name, share in found["operator_inclusive"].items():
        lines.append(f"| `{name}` | {share:.1%} |")
    lines += ["", "| innermost frame | share |", "|---|---:|"]
    for item in found["top_frames"]:
        lines.append(f"| `{item['frame']}` | {item['share']:.1%} |")
    lines.append("")
    return lines


def merge(earlier: dict[str, Any], later: dict[str, Any]) -> dict[str, Any]:
    """`later`'s runs added to `earlier`'s report (one report from several invocations, e.g.
    the 20-database variant at fewer sizes); the environment and codes of each invocation
    are kept."""

    def cell(run: dict[str, Any]) -> tuple[int, int, str]:
        return run["databases"], run["dispatchers"], run["code"]

    replaced = {cell(run) for run in later["runs"]}
    runs = [run for run in earlier["runs"] if cell(run) not in replaced] + later["runs"]
    merged = {**earlier, "runs": runs}
    # A cell measured again keeps its earlier run on record: a rerun must not hide a result.
    merged["replaced_runs"] = [
        *earlier.get("replaced_runs", []),
        *(run for run in earlier["runs"] if cell(run) in replaced),
    ]
    merged["invocations"] = [
        *earlier.get("invocations", [_invocation(earlier)]),
        _invocation(later),
    ]
    for key in ("sizes", "databases"):
        merged[key] = sorted({*earlier[key], *later[key]})
    if "profile" in later:
        merged["profile"] = later["profile"]
    return merged


def _invocation(report: dict[str, Any]) -> dict[str, Any]:
    return {
        "sizes": report["sizes"],
        "databases": report["databases"],
        "duration_seconds": report["duration_seconds"],
        "codes": report["codes"],
        "environment": report["environment"],
    }


def _sizes(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench.fleet",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--sizes", type=_sizes, default=[200, 500, 1000], help="dispatchers per run (200,500,1000)"
    )
    parser.add_argument(
        "--databases",
        type=_sizes,
        default=[1, 20],
        help="databases the tables are spread over, one variant each (1,20)",
    )
    parser.add_argument(
        "--baseline",
        default=DEFAULT_BASELINE,
        help=f"revision measured beside the current code ({DEFAULT_BASELINE}); "
        "'none' for the current code alone",
    )
    parser.add_argument(
        "--current", default=None, help="revision of the current code (default: the working tree)"
    )
    parser.add_argument(
        "--duration", type=float, default=60.0, help="seconds of the steady window (60)"
    )
    parser.add_argument(
        "--first-status-timeout",
        type=float,
        default=240.0,
        help="most seconds to wait for every resource's first status (240)",
    )
    parser.add_argument(
        "--profile",
        type=int,
        default=200,
        help="after the runs, py-spy on the current operator at this size (200; 0: none)",
    )
    parser.add_argument("--smoke", action="store_true", help="5 dispatchers, a short window")
    parser.add_argument(
        "--merge",
        action="store_true",
        help="add these runs to --out's fleet.json (replacing runs of the same size, "
        "databases and code) instead of starting a new report",
    )
    parser.add_argument("--keep", help="keep each run's logs in this folder")
    parser.add_argument("--out", type=Path, default=Path("bench/results"))
    args = parser.parse_args(argv)
    report = run(args)
    args.out.mkdir(parents=True, exist_ok=True)
    if args.merge and (args.out / "fleet.json").exists():
        report = merge(json.loads((args.out / "fleet.json").read_text()), report)
    (args.out / "fleet.json").write_text(json.dumps(report, indent=2) + "\n")
    text = render(report)
    (args.out / "fleet.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
