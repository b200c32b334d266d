"""One rule for every interval a user reads: rates and shares never carry a negative bound, "-0%" never appears,
advice is checked against its own measurement, and a watched window counts its whole wall time."""

from __future__ import annotations

import math
import re
import statistics

import pytest

from pipeprof import stats
from pipeprof.analysis.verdict import Interval
from pipeprof.measure.windows import summarize_rates
from pipeprof.watch.records import Batch, windows


def test_a_rate_of_noisy_windows_has_a_multiplicative_interval_where_the_symmetric_one_went_negative():
    """Three windows 2, 2 and 29 samples/s: mean 11, sd 15.59, t(3) 4.303: the symmetric interval was
    11 +- 38.7 (-27.7 to 49.7). The log-scale one keeps the relative error: 11 * exp(-+38.7 / 11)."""
    rates = [2.0, 2.0, 29.0]
    mean, half = 11.0, 4.303 * statistics.stdev(rates) / math.sqrt(3)
    assert mean - half < 0  # what was printed before
    low, high = stats.rate_ci95(rates)
    assert low == pytest.approx(11 * math.exp(-half / 11)) and high == pytest.approx(11 * math.exp(half / 11))
    assert 0 < low < mean < high
    s = summarize_rates(rates)
    assert s["samples_per_s_ci95_low"] == pytest.approx(low) and s["samples_per_s_ci95_low"] > 0


def test_a_pooled_rate_keeps_a_positive_low_end():
    """Windows of 1 s with 0, 0 and 30 samples: pooled 10/s, ratio-estimator se 10/s, t(3) 4.303: symmetric
    10 +- 43 went to -33; the rule gives 10 * exp(-+4.303)."""
    rate, low, high = stats.pooled_rate_ci95([0.0, 0.0, 30.0], [1.0, 1.0, 1.0])
    se = math.sqrt(3 / 2 * (100 + 100 + 400)) / 3
    assert rate == 10.0 and se == pytest.approx(10.0)
    assert low == pytest.approx(10 * math.exp(-4.303)) and high == pytest.approx(10 * math.exp(4.303))


def test_a_share_stays_within_0_and_1_and_a_low_end_at_0_is_said_as_a_ceiling():
    """Data-wait shares 0, 0 and 0.03: mean 1%, symmetric 1% +- 4.3% (-3.3% to 5.3%): clipped to 0-5.3% and
    said "≤ 5%"; "-0%" (a low end of -0.2% at no digits) never."""
    low, high = stats.share_ci95([0.0, 0.0, 0.03])
    half = 4.303 * statistics.stdev([0.0, 0.0, 0.03]) / math.sqrt(3)
    assert low == 0.0 and high == pytest.approx(0.01 + half)
    assert stats.share_text(low, high) == "≤ 5%"
    assert stats.share_text(-0.002, 0.05) == "≤ 5%"
    assert stats.share_text(0.03, 0.06) == "3%-6%"
    assert stats.share_bounds(0.99, 0.05) == (pytest.approx(0.94), 1.0)
    assert Interval(0.001, -0.004, 0.05).text() == "≤ 5%"
    assert Interval(0.0, -0.001, 0.001).text() == "0%"
    assert Interval(0.04, 0.03, 0.06).text() == "3%-6%"


def test_a_window_that_ends_in_a_stall_counts_its_whole_wall_time():
    """10 batches of 16 in the first 2 s of a 10 s window, none in the next 8 s, the watch ending at 10 s: the
    loop got 160 samples in 10 s, 16/s; first to last batch read 160 / 2.2 = 73."""
    batches = [Batch(1, 0.2 * i, 0.2 * i + 0.2, 16, True, None) for i in range(10)]
    before = windows(batches, 2.0, 1, 0, 16)  # no end known: first to last batch, as before
    assert before[-1].t_end == pytest.approx(2.0)
    wins = windows(batches, 10.0, 1, 0, 16, end=10.0)
    assert len(wins) == 1 and wins[0].span_s == pytest.approx(10.0) and wins[0].rate == pytest.approx(16.0)
    assert wins[0].segments == [(0.0, 10.0)]
    # a window that runs past the watch's end stops there; a job ending at 6 s gives 160 / 6
    assert windows(batches, 10.0, 1, 0, 16, end=6.0)[0].rate == pytest.approx(160 / 6)
    # a steady loop is unchanged: its last batch is at the watch's end
    steady = [Batch(1, 0.1 * i, 0.1 * i + 0.1, 16, True, None) for i in range(100)]
    assert windows(steady, 5.0, 1, 0, 16, end=10.0)[-1].rate == pytest.approx(160.0)


# a range whose low end is negative ("(-83.5–105)", "-5%-6%"), a negative zero, a negative floor; a signed change
# on its own ("(-5%, not tried)", an err column's "-21%") is a gain, not an interval's bound
NEGATIVE = re.compile(r"-0%|(?<![\w+])-\d[\d.,]*%?\s*[–-]\s*\d|≥ -|interval -\d")


@pytest.fixture(scope="module")
def measured_texts(cpu_run_dir):
    """The console and report.html of the suite's measured CPU run (tests/conftest.py)."""
    from pipeprof.report.console import render_text
    from pipeprof.report.html import render_html
    from pipeprof.results import load_run

    run = load_run(cpu_run_dir)
    page = re.sub(r"<svg.*?</svg>", "", render_html(run), flags=re.S)  # the figures' own markup: rotate(-0 ...)
    return render_text(run), re.sub(r"<[^>]+>", " ", page)


def test_no_printed_interval_of_the_measured_run_has_a_negative_rate_or_share(measured_texts):
    """Grep the measured run's console and report for a negative bound: "(-", "-0%", "-5%-6%"."""
    for text in measured_texts:
        bad = [m.group(0) for m in NEGATIVE.finditer(re.sub(r"[+-]\d[\d.]*% to [+-]\d", "", text))]
        assert not bad, bad


def test_a_rate_whose_whole_interval_is_above_its_bound_contradicts_it():
    from pipeprof.report.summary import above_bound

    assert above_bound(44.0, 18.5)  # the loop's low end above the step alone: the bound did not hold
    assert not above_bound(18.0, 18.5)  # the interval reaches the bound: no contradiction
    assert not above_bound(None, 18.5) and not above_bound(44.0, float("nan"))


def _paired(new: list[float], old: list[float]):
    """A real ``Paired`` of 1-s windows at these rates (samples/s), A the ``new`` side, B the ``old``."""
    from pipeprof.measure.windows import Paired, Window

    wins = [Window(float(i), float(i + 1), int(r), 1) for i, r in enumerate(new + old)]
    return Paired(a=wins[: len(new)], b=wins[len(new) :], planned_pairs=len(new))


def test_an_action_trials_gain_is_said_by_the_rule_of_ratios_never_below_minus_100_percent():
    """Pairs 10 against 100 and 90 against 100 samples/s: gains -90% and -10%, mean -50%, sd 0.566, t(2) 12.706:
    the trial stores -50% +- 508% (-558% to +458%), a new rate below 0. Said as the ratio 0.5's interval, less 1:
    0.5 exp(-+5.08 / 0.5) - 1."""
    from types import SimpleNamespace

    from pipeprof.orchestrate.action_trials import _said
    from pipeprof.stats import gain_bounds
    from pipeprof.trials.action_trial import paired_columns

    row = paired_columns(_paired([10.0, 90.0], [100.0, 100.0]), 60.0) | {"status": "ok"}
    half = 12.706 * statistics.stdev([-0.9, -0.1]) / math.sqrt(2)
    assert row["action_gain_frac"] == pytest.approx(-0.5) and row["action_gain_ci95_low"] == pytest.approx(-0.5 - half)
    assert row["action_gain_ci95_low"] < -1  # what was printed before: "-558.2%"
    lo, hi = 0.5 * math.exp(-half / 0.5) - 1, 0.5 * math.exp(half / 0.5) - 1
    said = _said(SimpleNamespace(action="decode with pil"), row)
    assert f"(95% interval {lo:+.1%} to {hi:+.1%})" in said and lo > -1
    stored = (row["action_gain_frac"], row["action_gain_ci95_low"], row["action_gain_ci95_high"])
    assert gain_bounds(*stored) == (pytest.approx(lo), pytest.approx(hi))


def test_a_measured_overhead_never_reaches_100_percent():
    """The stage clocks' cost per pair 90% and 10% (clocked 10 and 90 samples/s against 100): mean 50%, stored
    50% +- 508% (-458% to +558%: a clocked rate below 0). The overhead check says it by the ratio clocked / off,
    0.5 exp(-+5.08 / 0.5): 1 - 0.5 exp(5.08 / 0.5) to 1 - 0.5 exp(-5.08 / 0.5), below 100%; not resolved."""
    import pandas as pd

    from pipeprof.analysis.advice import stage_overhead

    cost = _paired([10.0, 90.0], [100.0, 100.0]).cost()
    half = 12.706 * statistics.stdev([0.9, 0.1]) / math.sqrt(2)
    assert cost["cost_ci95_high"] == pytest.approx(0.5 + half) and cost["cost_ci95_high"] > 1  # as stored
    twin = {
        "kind": "cpu_pipeline",
        "status": "ok",
        "preset": "light",
        "num_workers": 2,
        "stage_timing": False,
        "samples_per_s": 100.0,
        "clocked_samples_per_s": 50.0,
        "stage_clock_overhead_frac": cost["cost_frac"],
        "stage_clock_overhead_ci95_low": cost["cost_ci95_low"],
        "stage_clock_overhead_ci95_high": cost["cost_ci95_high"],
    }
    (o,) = stage_overhead(pd.DataFrame([twin]))
    assert o["overhead_ci95_low"] == pytest.approx(1 - 0.5 * math.exp(half / 0.5))
    assert o["overhead_ci95_high"] == pytest.approx(1 - 0.5 * math.exp(-half / 0.5)) and o["overhead_ci95_high"] < 1
    assert o["overhead_frac"] == pytest.approx(0.5) and not o["resolved"]


def test_a_masked_pairs_ratio_stays_above_0_and_the_models_error_keeps_its_interval():
    """A masked pair's cost 50%, stored 50% +- 110% (-60% to +160%): its ratio, masked over all CPUs, read as
    -60% to 160% before, and the model's error against it had no high end. By the rule of ratios the ratio is
    0.5 exp(-+1.1 / 0.5), and the model's 0.4 errs by 0.4 / 0.5 exp(2.2) - 1 to 0.4 / 0.5 exp(-2.2) - 1."""
    from pipeprof.analysis.workstation import error_bounds, masked_ratio_bounds

    row = {"mask_cost_frac": 0.5, "mask_cost_ci95_low": -0.6, "mask_cost_ci95_high": 1.6}
    assert 1 - row["mask_cost_ci95_high"] < 0  # the ratio's low end as it was read
    low, high = masked_ratio_bounds(row)
    assert low == pytest.approx(0.5 * math.exp(-2.2)) and high == pytest.approx(0.5 * math.exp(2.2)) and low > 0
    err = error_bounds(0.4, low, high)
    assert err["error_low"] == pytest.approx(0.4 / (0.5 * math.exp(2.2)) - 1) and err["error_low"] > -1
    assert err["error_high"] == pytest.approx(0.4 / (0.5 * math.exp(-2.2)) - 1)
    assert math.isnan(error_bounds(0.4, *masked_ratio_bounds({"mask_cost_frac": 0.5}))["error_low"])  # no interval
