"""The benchmark report's arithmetic: ratios are taken within a round."""

from __future__ import annotations

from bench.report import _paired


def test_a_ratio_is_the_median_of_the_rounds_ratios_not_a_ratio_of_medians() -> None:
    # Round by round the machine got faster and slower; within each round the worker was
    # twice, once and half the plain loop's speed.
    worker = {"runs": [10.0, 30.0, 20.0]}
    plain = {"runs": [5.0, 30.0, 40.0]}
    assert _paired(worker, plain) == "1.00x [0.50-2.00]"  # median / median would be 0.67x


def test_one_round_gives_its_ratio_alone_and_no_rounds_no_ratio() -> None:
    assert _paired({"runs": [3.0]}, {"runs": [2.0]}) == "1.50x"
    assert _paired({"runs": [3.0]}, {"runs": [0.0]}) == "-"
