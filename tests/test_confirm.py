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


def test_the_pair_rows_ratio_is_the_picks_over_the_rivals_from_the_decision():
    """The pick 2 workers (40-42 samples/s) against 0 (52-55): the decision's smaller over larger is 0's over 2's;
    the row names the pick first, so its pair_ratio is the inverse, its interval the decision's ends flipped."""
    from pipeprof.analysis.confidence import pair_columns

    pick, rival = [40.0, 42.0, 41.0, 40.0], [52.0, 55.0, 54.0, 53.0]
    p = pair_decision(2, 0, pick, rival)
    logs = [math.log(a / b) for a, b in zip(pick, rival)]
    mid, half = statistics.fmean(logs), t95(4) * statistics.stdev(logs) / 2
    cols = pair_columns(p)
    assert cols["pair_ratio"] == pytest.approx(math.exp(mid))
    assert cols["pair_ratio_ci95_low"] == pytest.approx(math.exp(mid - half))
    assert cols["pair_ratio_ci95_high"] == pytest.approx(math.exp(mid + half))
    assert cols["pair_separated"] and cols["pair_workers"] == 0 and cols["pair_why"] == "faster"
    same = pair_columns(pair_decision(0, 2, rival, pick))  # the pick the smaller count: the decision's own ratio
    assert same["pair_ratio"] == pytest.approx(math.exp(-mid)) and same["pair_ratio_ci95_low"] == pytest.approx(
        math.exp(-mid - half)
    )
    assert pair_columns(pair_decision(0, 2, [80.0], [40.0]))["pair_ratio_ci95_low"] is None  # one pair


def test_the_pair_row_names_the_pick_first_and_carries_no_action_gain():
    """action_trial names the rival (its variant) A and the pick B; the stored row has the pick's median, interval
    and stage clocks unprefixed, the rival's as baseline_*, and none of the action-gain columns."""
    from pipeprof.measure.windows import Paired, Window, summarize_rates
    from pipeprof.orchestrate.action_trials import pair_row
    from pipeprof.stats import rate_ci95
    from pipeprof.trials.action_trial import paired_columns

    rival, pick = [52.0, 55.0, 54.0, 53.0], [40.0, 42.0, 41.0, 40.0]
    wins = [Window(float(i), float(i + 1), int(r), 1) for i, r in enumerate(rival + pick)]
    paired = Paired(a=wins[:4], b=wins[4:], planned_pairs=4)
    got = paired_columns(paired, 60.0, ci_target=0.01) | {"worker_us_per_sample": 900.0}
    got |= {"baseline_worker_us_per_sample": 700.0, "stage_us_per_sample.decode": 500.0}
    assert got["action_gain_frac"] is not None  # the rival's "gain" over the pick, as action_trial reads it
    row = pair_row(got)
    assert not {"action_gain_frac", "action_gain_ci95_low", "action_gain_ci95_high"} & set(row)
    assert row["window_rates"] == pick and row["baseline_window_rates"] == rival
    assert row["samples_per_s"] == statistics.median(pick) == summarize_rates(pick)["samples_per_s"]
    assert (row["samples_per_s_ci95_low"], row["samples_per_s_ci95_high"]) == pytest.approx(rate_ci95(pick))
    assert row["samples_per_s_mean"] == pytest.approx(statistics.fmean(pick))
    assert row["baseline_samples_per_s"] == statistics.median(rival)
    assert (row["baseline_ci95_low"], row["baseline_ci95_high"]) == pytest.approx(rate_ci95(rival))
    assert row["worker_us_per_sample"] == 700.0 and row["baseline_worker_us_per_sample"] == 900.0
    assert row["baseline_stage_us_per_sample.decode"] == 500.0 and "stage_us_per_sample.decode" not in row
    assert row["pairs"] == 4 and row["windows"] == 8
    assert "the ratio's 95% interval" in row["unstable_reason"] and "gain" not in row["unstable_reason"]
