"""The ordered pair's path (bench/latency_trace.py): the notes read from the worker's debug
log and the floor's notes alike, and a pair's hops from them. No timing is asserted: the
figures live in bench/results/latency_trace.md."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from bench import latency_trace
from bench.latency_trace import Notes, hops, read_notes

MS = 1_000_000  # ns
ROOT = Path(__file__).resolve().parent.parent


def test_the_workers_log_and_the_floors_notes_read_alike():
    worker = [
        "not json: a line of some library",
        json.dumps(
            {
                "time": "2026-12-06T19:00:00.001000+00:00",
                "level": "debug",
                "event": "claimed",
                "ids": [1, 3],
                "versions": [1, 1],
            }
        ),
        json.dumps(
            {
                "time": "2026-12-06T19:00:00.004500+00:00",
                "event": "finalized",
                "ids": [1],
                "outcomes": ["done"],
            }
        ),
        json.dumps({"time": "2026-12-06T19:00:00.005000+00:00", "message": "other"}),
    ]
    base = 1_796_583_600_000 * MS  # 2026-12-06T19:00:00Z
    floor = [json.dumps({"event": "claimed", "time_ns": base + 7 * MS, "ids": [2]})]
    notes = read_notes([worker, floor])
    assert notes.claimed == {1: (0, base + 1 * MS), 3: (0, base + 1 * MS), 2: (1, base + 7 * MS)}
    assert notes.finalized == {1: base + 4_500_000}


def test_a_pairs_hops_add_up_to_its_second_events_latency():
    notes = Notes(
        claimed={1: (0, 10 * MS), 2: (1, 40 * MS), 3: (0, 60 * MS)},
        finalized={1: 30 * MS},
    )
    committed = {1: 5 * MS, 2: 5 * MS, 3: 50 * MS, 4: 50 * MS}
    received = {1: 12 * MS, 2: 45 * MS, 3: 62 * MS}
    found, same = hops([(1, 2), (3, 4)], committed, received, notes)
    # The second pair has no note of its B: left out whole.
    assert found["commit_to_a_claimed"] == [5.0]
    assert found["a_claimed_to_a_received"] == [2.0]
    assert found["a_received_to_a_finalized"] == [18.0]
    assert found["a_finalized_to_b_claimed"] == [10.0]
    assert found["b_claimed_to_b_received"] == [5.0]
    assert found["b_latency"] == [40.0] == [sum(found[k][0] for k, _ in latency_trace.PATH)]
    assert found["a_latency"] == [7.0]
    assert same == 0  # B was claimed by the other process


def test_the_report_sets_each_rounds_worker_beside_its_floor():
    run = {"pairs": 2, "same_process": 1, "cpu_s": 1.0, "waiting_s": 2.0, "slices": 100,
           "messages": 1000, "hops": {k: [1.0, 3.0] for k, _ in latency_trace.HOPS}}  # fmt: skip
    runs = [{**run, "contender": c, "round": n} for n in (1, 2) for c in ("worker", "floor")]
    text = latency_trace.render(runs, 1000, 2, [0.5, 1.5])
    assert "| hop | worker (1) | floor (1) | worker (2) | floor (2) |" in text
    assert "--rounds 2" in text and "0.5 to 1.5" in text
    assert "| waiting for a core, ms per message | 2.00 | 2.00 | 2.00 | 2.00 |" in text
    assert "| B claimed by A's process | 50% | 50% | 50% | 50% |" in text


def test_one_quick_round_follows_every_pair_through_both_contenders(tmp_path):
    """One process of each at 100/s for one second: the worker's debug log and the floor's
    notes both name every measured pair's claims and finalize (a missing note would leave
    a hop without figures); the findings written by hand below the figures are kept."""
    out = tmp_path / "latency_trace.md"
    findings = "A finding written by hand.\n"
    out.write_text("old figures\n" + latency_trace.FINDINGS + findings)
    result = subprocess.run(
        [sys.executable, "-m", "bench.latency_trace", "--rate", "100", "--processes", "1",
         "--seconds", "1", "--rounds", "1", "--out", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=280,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    text = out.read_text()
    assert "| hop | worker (1) | floor (1) |" in text
    assert "nan" not in text, text
    assert "| B claimed by A's process | 100% | 100% |" in text  # one process each
    assert "old figures" not in text and text.endswith(latency_trace.FINDINGS + findings)


def test_bad_arguments_are_one_line_and_exit_2():
    result = subprocess.run(
        [sys.executable, "-m", "bench.latency_trace", "--rate", "1"],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 2
    assert "--rate must be 2 or more" in result.stderr.splitlines()[-1]
