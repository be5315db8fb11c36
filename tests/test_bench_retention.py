"""The retention benchmarks at smoke size: the partitions' retirement beside the DELETE,
`outbox stats` on a partitioned table beside a plain one, and the inbox's purge. Each
produces a complete report of what it did; no timing is asserted (the figures live in
bench/results)."""

from __future__ import annotations

import pytest

from bench import inbox_purge, partitioned, retention, stats_partitioned

pytestmark = pytest.mark.slow


def test_retention_retires_the_same_rows_both_ways_and_breaks_the_time_down():
    report = retention.run(20_000, 2_000)
    assert report["plain"]["rows"] == 20_000
    # Ids 1 to 20,000: all but id 20,000, alone in the newest partition, go (the rows are
    # counted from the partitions' statistics).
    assert abs(report["partitioned"]["rows"] - 19_999) < 200
    kinds = report["partitioned"]["by_statement"]
    assert {"DETACH ... CONCURRENTLY", "DROP TABLE", "ANALYZE"} <= kinds.keys()
    assert report["partitioned_before"]["rows"] == 10  # partitions noted finished
    text = retention.render(report)
    assert "| DROP TABLE |" in text and "Goal, under 1 s" in text


def test_stats_bench_reads_the_same_backlog_from_both_tables():
    report = stats_partitioned.run(5_000, 100, 100, 2)
    assert report["noted"] == 50  # every partition holding done rows only
    assert report["stats"]["plain"]["pending"] == report["stats"]["partitioned"]["pending"]
    assert report["stats"]["partitioned"]["pending"] == "100"
    text = stats_partitioned.render(report)
    assert "| maintained | warm |" in text and "| never maintained | cold |" in text


def test_inbox_purge_bench_purges_one_interval_at_a_time():
    report = inbox_purge.run(100_000, retention.timedelta(hours=48), retention.timedelta(hours=1))
    per_interval = 100_000 / 50
    for step in ("purge_first", "purge_next"):
        assert abs(report[step]["deleted"] - per_interval) <= 2
        assert report[step]["batches"]
    assert report["size_refilled"]["keys"] == 100_000 - report["purge_first"]["deleted"] - (
        report["purge_next"]["deleted"]
    ) + 2 * round(per_interval)
    assert "| purge, oldest interval |" in inbox_purge.render(report)


def test_partitioned_drain_bench_drains_both_tables_and_says_when_the_keeper_tops_up():
    """The drain beside the plain table, at a size whose rows leave fewer than three
    quarters of the partitions ahead: the worker's partition keeper makes more as it
    drains, and the report says so."""
    report = partitioned.run(3_000, 1, 5, aggregates=7)
    for mode in partitioned.MODES:
        (round_,) = report["modes"][mode]["rounds"]
        assert round_["plain"] > 0 and round_["partitioned"] > 0
    text = partitioned.render(report)
    assert "--partitions-ahead 5 --aggregates 7`" in text
    assert "the worker's partition keeper makes 3 more as the drain runs" in text
