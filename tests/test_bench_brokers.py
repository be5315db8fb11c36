"""The broker benchmark at smoke size: both brokers, both sides, a complete report.

No timing is asserted: these machines are shared and noisy. The figures live in bench/.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench.cpu import THREAD_GROUPS

ROOT = Path(__file__).resolve().parent.parent


def test_broker_bench_smoke_run_writes_a_complete_report(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "bench.brokers", "--smoke", "--out", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=100,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads((tmp_path / "brokers.json").read_text())
    assert report["environment"]["postgresql"].startswith("18.")
    assert report["messages"] > 0 and report["repeat"] == 1
    [mode] = report["modes"]
    assert set(report["modes"][mode]) == {"nats", "kafka"}
    for row in report["modes"][mode].values():
        for side in ("plain", "worker"):
            assert row[side]["messages_per_second"]["median"] > 0
            assert row[side]["cpu_us_per_message"]["median"] >= 0
        assert row["throughput_ratio"]["median"] > 0
    assert report["null_publisher"][mode]["messages_per_second"]["median"] > 0
    # The goal's denominator: the plain claim/finalize loop, in the same run.
    sql = report["sql_loop"][mode]
    assert sql["cpu_us_per_message"]["median"] > 0
    assert sql["cpu_us_per_message_main"]["median"] == sql["cpu_us_per_message"]["median"]
    for row in report["modes"][mode].values():
        [ratio] = row["cpu_goal_ratio"]["runs"]
        plain, worker = row["plain"]["cpu_us_per_message"], row["worker"]["cpu_us_per_message"]
        expected = worker["runs"][0] / (plain["runs"][0] + sql["cpu_us_per_message"]["runs"][0])
        assert ratio == pytest.approx(expected)
    # CPU by thread: librdkafka's threads work for Kafka's two sides alone. The worker's Kafka
    # publisher polls librdkafka from the event loop (no poll thread, by design: a thread cost
    # more CPU per message), so its delivery reports count in the main thread.
    for name, row in report["modes"][mode].items():
        for side in ("plain", "worker"):
            figures = {key: value["runs"][0] for key, value in row[side].items()}  # one round
            librdkafka = figures["cpu_us_per_message_librdkafka"]
            assert (librdkafka > 0) == (name == "kafka"), (name, side, figures)
            parts = sum(figures[f"cpu_us_per_message_{g}"] for g in THREAD_GROUPS)
            assert parts == pytest.approx(figures["cpu_us_per_message"])
        assert row["worker"]["cpu_us_per_message_main"]["median"] > 0
    kafka_worker = report["modes"][mode]["kafka"]["worker"]
    assert (
        kafka_worker["cpu_us_per_message_other"]["median"]
        < kafka_worker["cpu_us_per_message_main"]["median"]
    )
    text = (tmp_path / "brokers.md").read_text()
    for heading in (
        "NATS JetStream",
        "Kafka",
        "null publisher",
        "plain claim/finalize loop",
        "Goal, worker CPU ≤ 1.5 x (plain client + plain claim/finalize loop)",
        "How it is measured",
        "by thread",
    ):
        assert heading in text
