"""The answer's pair trial: the pick against its nearest rival from paired windows (pure analysis, exact numbers),
and the confidence line that reports it."""

import math
import statistics

import pytest

from pipeprof.analysis.confidence import pair_decision, pair_words, rival_of
from pipeprof.stats import t95


def test_the_rival_is_the_other_count_whose_rate_is_nearest_the_picks():
    assert rival_of({0: 65.0, 1: 48.8, 2: 48.4}, 0) == 1
    assert rival_of({0: 40.0, 1: 50.0, 2: 60.0}, 1) == 0  # equally near: the smaller count
    assert rival_of({2: 50.0}, 2) is None  # one count measured: no rival, nothing added


def test_a_faster_smaller_count_is_separated_and_named_with_the_pairs_ratio():
    small, large = [52.0, 55.0, 54.0, 53.0], [40.0, 42.0, 41.0, 40.0]  # 0 workers against 2
    p = pair_decision(2, 0, large, small)
    logs = [math.log(s / b) for s, b in zip(small, large)]
    mid, half = statistics.fmean(logs), t95(4) * statistics.stdev(logs) / 2
    mean, lo, hi = math.exp(mid), math.exp(mid - half), math.exp(mid + half)
    assert p["separated"] and p["workers"] == 0 and p["why"] == "faster"
    assert p["first_over_second"] == pytest.approx(mean)
    assert p["first_over_second_ci95_low"] == pytest.approx(lo)
    assert p["first_over_second_ci95_high"] == pytest.approx(hi)
    assert pair_words(p) == f"0 against 2 workers in alternation: {mean:.2f}x ({lo:.2f}-{hi:.2f})"


def test_a_faster_larger_count_is_the_answer_named_first_with_its_ratio_over_the_smaller():
    p = pair_decision(1, 4, [30.0, 31.0, 29.0, 30.0], [60.0, 61.0, 59.0, 62.0])
    assert p["separated"] and p["workers"] == 4 and (p["first"], p["second"]) == (4, 1)
    ratios = [s / b for s, b in zip([30.0, 31.0, 29.0, 30.0], [60.0, 61.0, 59.0, 62.0])]
    assert p["first_over_second"] == pytest.approx(1 / math.exp(statistics.fmean(math.log(r) for r in ratios)))
    assert p["first_over_second_ci95_low"] < p["first_over_second"] < p["first_over_second_ci95_high"]


def test_a_larger_count_faster_by_under_5_percent_leaves_the_smaller_one():
    p = pair_decision(2, 1, [50.0, 50.5, 50.2, 50.1], [48.5, 48.9, 48.6, 48.4])
    assert p["separated"] and p["workers"] == 1 and p["why"] == "within 5%"


def test_equal_costs_are_within_the_machines_drift_and_the_smaller_count_answered():
    p = pair_decision(2, 0, [50.0, 52.0, 49.0, 51.0], [51.0, 50.0, 50.0, 52.0])
    assert not p["separated"] and p["why"] == "drift" and p["workers"] == 0
    assert p["first_over_second_ci95_low"] < 1 < p["first_over_second_ci95_high"]


def test_one_pair_has_no_interval_and_cannot_separate():
    p = pair_decision(0, 2, [80.0], [40.0])
    assert not p["separated"] and p["first_over_second_ci95_low"] is None
    assert pair_words(p).endswith("(no interval: 1 pair)")


def _answer(pair):
    from pipeprof.answer import Answer, Confidence

    sure = Confidence(draws=60, workers_low=0, workers_high=0, workers_share=1.0, side="step", resource="step")
    sure.answer_share, sure.holds = 1.0, True
    return Answer(
        key={}, workers=0, samples_per_s=50.0, best_workers=0, best_samples_per_s=50.0, confidence=sure, pair=pair
    )


def test_the_confidence_line_reports_the_pair_or_the_drift():
    from pipeprof.report.summary import confidence_line

    apart = pair_decision(0, 2, [52.0, 55.0, 54.0, 53.0], [40.0, 42.0, 41.0, 40.0])
    apart["words"] = pair_words(apart)
    assert confidence_line(_answer(apart)).startswith(apart["words"] + "; step side")
    tied = pair_decision(0, 2, [50.0, 52.0, 49.0, 51.0], [51.0, 50.0, 50.0, 52.0])
    tied["words"] = pair_words(tied)
    assert confidence_line(_answer(tied)).startswith(
        f"num_workers 0 or 2: within the machine's drift ({tied['words']})"
    )
    assert "re-draws of the windows" in confidence_line(_answer(None))  # one count measured: as before
