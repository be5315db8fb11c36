"""The reconcile benchmark's harness at tiny sizes: both measured processes run, the peer's
and the reconcile's answers agree (37 missing), and the report renders every size."""

from __future__ import annotations

from bench.reconcile import render, run


def test_the_reconcile_bench_measures_both_and_renders():
    results = run([2000, 4000])
    sizes = results["sizes"]
    assert list(sizes) == ["2000", "4000"]
    for entry in sizes.values():
        assert entry["reconcile"]["peak_kib"] > 0 and entry["peer"]["peak_kib"] > 0
    assert sizes["2000"]["reconcile_vs_smallest"] == 1.0
    text = render(results, "a note")
    assert "| 4,000 |" in text and text.rstrip().endswith("a note")
