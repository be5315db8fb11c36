"""`python -m bench.fleet_emulator WORKDIR`: the API emulator in a process of its own.

The fleet benchmark measures the operator's CPU apart from the API server's, so the project's
emulator (`tests/k8s/`, `LocalCluster`) runs here, alone in its process, with the
OutboxDispatcher CRD installed. It writes WORKDIR/cluster.json (its URL and kubeconfig) once
it serves, and runs until SIGTERM.

Beside the Kubernetes API it answers three paths of its own, which are neither counted nor
recorded, so that the benchmark can watch without adding API traffic:

- `GET /_bench/stats`: requests served so far by verb and resource (`get secrets`,
  `patch outboxdispatchers/status`, `watch leases`), the handling time of each finished
  request (from its arrival in the handler to its answer, waits on the store's lock
  included), the slowest of each kind, when each Lease write succeeded (the renewals as
  the server saw them), and this loop's lag (how late a 50 ms timer fires: the queueing
  every request meets before it is handled);
- `GET /_bench/status?names=a,b`: `status.backlog.pending` of those OutboxDispatchers
  (null without a backlog yet); without `names`, how many have a backlog at all, the
  oldest `status.backlog.sampledAt` among them, and how many Deployments are stored;
- `GET /_bench/status?since=T`: how many have a `sampledAt` later than T (ISO time).

kmock keeps every request it parsed for a test's assertions; a benchmark sends hundreds of
thousands, so only the last few thousand are kept.
"""

from __future__ import annotations

import asyncio
import json
import signal
import sys
import threading
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp.web

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))  # the emulator is test infrastructure

import k8s.cluster  # noqa: E402
from k8s.emulator import Emulator  # noqa: E402

CRD = ROOT / "crds" / "outboxdispatchers.yaml"
KEEP_REQUESTS = 2000  # of kmock's record of parsed requests
LAG_PERIOD = 0.05  # seconds between two ticks of the lag probe
BUCKETS = tuple(round(0.0005 * 1.25**i, 6) for i in range(60))  # 0.5 ms .. ~340 s


@dataclass
class Histogram:
    """Counts of durations in geometric buckets: percentiles without keeping samples."""

    counts: list[int] = field(default_factory=lambda: [0] * (len(BUCKETS) + 1))

    def add(self, seconds: float) -> None:
        for i, bound in enumerate(BUCKETS):
            if seconds <= bound:
                self.counts[i] += 1
                return
        self.counts[-1] += 1


@dataclass
class Counters:
    requests: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    handling: Histogram = field(default_factory=Histogram)  # non-watch requests
    seconds: dict[str, float] = field(default_factory=lambda: defaultdict(float))  # by kind
    slowest: dict[str, float] = field(default_factory=lambda: defaultdict(float))  # by kind
    renewals: list[float] = field(default_factory=list)  # wall times of Lease writes done
    lag: Histogram = field(default_factory=Histogram)
    max_lag: float = 0.0


COUNTERS = Counters()


def classify(method: str, path: str, query: dict[str, str]) -> str:
    """`verb resource[/subresource]`, as the API server's audit log would name a request."""
    parts = [p for p in path.split("/") if p]
    if parts[:1] == ["api"]:
        rest = parts[2:]
    elif parts[:1] == ["apis"]:
        rest = parts[3:]
    else:
        return f"{method.lower()} {'/'.join(parts[:1]) or '/'}"  # discovery, openapi, version
    if len(rest) >= 2 and rest[0] == "namespaces" and len(rest) > 2:
        rest = rest[2:]
    resource = rest[0] if rest else "discovery"
    name = rest[1] if len(rest) > 1 else None
    sub = f"/{rest[2]}" if len(rest) > 2 else ""
    if method == "GET":
        watching = query.get("watch") in ("true", "1")
        verb = "watch" if watching else ("get" if name else "list")
    else:
        verb = {
            "POST": "create",
            "PUT": "update",
            "PATCH": "patch",
            "DELETE": "delete" if name else "deletecollection",
        }.get(method, method.lower())
    return f"{verb} {resource}{sub}"


class CountingEmulator(Emulator):
    """The project's emulator, counting and timing what it serves."""

    async def __call__(self, raw_request: aiohttp.web.BaseRequest) -> aiohttp.web.StreamResponse:
        if raw_request.path.startswith("/_bench/"):
            return self._bench(raw_request)
        kind = classify(raw_request.method, raw_request.path, dict(raw_request.query))
        COUNTERS.requests[kind] += 1
        started = time.perf_counter()
        try:
            response = await super().__call__(raw_request)
            if kind in ("update leases", "create leases") and response.status < 300:
                COUNTERS.renewals.append(time.time())
                del COUNTERS.renewals[:-KEEP_REQUESTS]
            return response
        finally:
            if not kind.startswith("watch "):
                took = time.perf_counter() - started
                COUNTERS.handling.add(took)
                COUNTERS.seconds[kind] += took
                COUNTERS.slowest[kind] = max(COUNTERS.slowest[kind], took)
            if len(self._requests) > 2 * KEEP_REQUESTS:
                del self._requests[:-KEEP_REQUESTS]

    def _bench(self, request: aiohttp.web.BaseRequest) -> aiohttp.web.StreamResponse:
        if request.path == "/_bench/stats":
            return aiohttp.web.json_response(
                {
                    "requests": dict(COUNTERS.requests),
                    "handling": COUNTERS.handling.counts,
                    "seconds": dict(COUNTERS.seconds),
                    "slowest": dict(COUNTERS.slowest),
                    "renewals": COUNTERS.renewals,
                    "lag": COUNTERS.lag.counts,
                    "max_lag": COUNTERS.max_lag,
                    "buckets": BUCKETS,
                }
            )
        if request.path == "/_bench/status":
            return aiohttp.web.json_response(self._backlogs(request.query))
        return aiohttp.web.json_response({"error": "unknown"}, status=404)

    def _dispatchers(self) -> list[tuple[str, dict[str, Any]]]:
        # Read in place, between two awaits of this loop: consistent, and no copies.
        return [
            (name, obj)
            for (rtype, _, name), obj in self._store.items()
            if rtype.plural == "outboxdispatchers"
        ]

    def _backlogs(self, query: Any) -> dict[str, Any]:
        found = self._dispatchers()
        deployments = sum(1 for rtype, _, _ in self._store if rtype.plural == "deployments")
        if "names" in query:
            wanted = set(query["names"].split(","))
            return {
                name: ((obj.get("status") or {}).get("backlog") or {}).get("pending")
                for name, obj in found
                if name in wanted
            }
        stamps = [
            backlog["sampledAt"]
            for _, obj in found
            if (backlog := (obj.get("status") or {}).get("backlog"))
        ]
        since = query.get("since")
        return {
            "resources": len(found),
            "deployments": deployments,
            "with_backlog": len(stamps),
            "oldest_sampled_at": min(stamps, default=None),
            "sampled_since": sum(1 for s in stamps if since is not None and s > since),
        }


async def probe_lag(stop: threading.Event) -> None:
    """How late this loop wakes for a timer: the wait every request meets before it is
    handled, once the loop is busy."""
    while not stop.is_set():
        asked = time.perf_counter()
        await asyncio.sleep(LAG_PERIOD)
        late = max(0.0, time.perf_counter() - asked - LAG_PERIOD)
        COUNTERS.lag.add(late)
        COUNTERS.max_lag = max(COUNTERS.max_lag, late)


def main() -> None:
    workdir = Path(sys.argv[1])
    workdir.mkdir(parents=True, exist_ok=True)
    k8s.cluster.Emulator = CountingEmulator  # type: ignore[misc]
    cluster = k8s.cluster.LocalCluster(workdir).start()
    cluster.install_crd(CRD)
    stop = threading.Event()
    lag = asyncio.run_coroutine_threadsafe(probe_lag(stop), cluster._loop)
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    info = {"url": cluster.url, "kubeconfig": str(cluster.kubeconfig)}
    (workdir / "cluster.json.tmp").write_text(json.dumps(info))
    (workdir / "cluster.json.tmp").rename(workdir / "cluster.json")
    while not stop.wait(1):
        pass
    lag.cancel()
    cluster.stop()


if __name__ == "__main__":
    main()
