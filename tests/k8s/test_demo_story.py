"""The operator's story of `make demo` (`demo.py`), at a small size, on the test's own
emulator, kubelet and database: what it printed and what the cluster and the table hold
afterwards tell the same outcome. No timing is asserted."""

from __future__ import annotations

import io
import re
from collections.abc import Callable, Iterator

import psycopg
import pytest

from outbox.demo.sink import Reply, Sink

from .cluster import LocalCluster
from .demo import PUBLISH_SECONDS, Sizing, Step, run_story
from .kubelet import Kubelet
from .test_autoscaling_loop import scale_events
from .test_operator import Operator, get

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


@pytest.fixture
def sink() -> Iterator[Sink]:
    with Sink(lambda body, nth: Reply(delay=PUBLISH_SECONDS)) as server:
        yield server


# `dsn` first: the database outlives the workers at teardown.
def test_the_story_scales_up_for_the_burst_and_back_to_min_replicas_losing_nothing(
    dsn: str,
    cluster: LocalCluster,
    kubelet: Kubelet,
    sink: Sink,
    operators: Callable[..., Operator],
) -> None:
    operators("--worker-publishers", "log,http,null")
    out = io.StringIO()
    sizing = Sizing()
    figures = run_story(
        cluster,
        dsn,
        sink.url,
        step=Step(quiet_seconds=4, burst_seconds=15),
        sizing=sizing,
        every=2,
        out=out,
    )
    text = out.getvalue()

    # What it printed: `kubectl get obd` lines over time, the scale Events, the figures.
    header = next(line for line in text.splitlines() if "OLDEST-READY" in line)
    assert {"READY", "DESIRED", "BACKLOG"} <= set(header.split())
    desired = [int(m[1]) for m in re.finditer(r"^t=\s*\d+s\s+orders\s+\d+\s+(\d+)", text, re.M)]
    assert max(desired) > sizing.min_replicas and desired[-1] == sizing.min_replicas, text
    assert re.search(r"ScaledUp .* 1 -> \d workers: ", text), text
    assert re.search(rf"ScaledDown .* \d -> {sizing.min_replicas} workers: ", text), text
    assert re.search(r"peak oldest ready age\s+[\d.]+ s\s+\(target 10 s\)", text), text
    assert re.search(r"replica-seconds\s+\d+", text), text

    # What the emulator holds: scaled above minReplicas during the burst, back to it after.
    story = scale_events(cluster)
    assert max(to for _, to, _ in story) == figures["largest"] > sizing.min_replicas, story
    assert story[-1][1] == sizing.min_replicas == figures["final"], story
    deployment = get(cluster, "deployments", "orders-worker")
    assert deployment is not None and deployment["spec"]["replicas"] == sizing.min_replicas

    # What the table and the downstream hold: every message sent was delivered, none lost.
    with psycopg.connect(dsn) as conn:
        rows = dict(conn.execute("SELECT status, count(*) FROM outbox GROUP BY 1").fetchall())
        ids = {row[0] for row in conn.execute("SELECT id FROM outbox").fetchall()}
    assert rows == {"done": figures["sent"]}, rows
    assert set(sink.delivered_ids()) == ids
