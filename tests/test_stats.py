"""The intervals every figure carries (``pipeprof.stats``): Student's t at any level, and the level at which the best
of several changes read beside each other is named (``simultaneous``), on readings of known spread."""

import random

import pytest

from pipeprof import actions
from pipeprof.stats import _T95, simultaneous, t_quantile
from pipeprof.watch import tune


def test_t_quantile_is_students_t_at_any_level():
    assert [round(t_quantile(df, 0.95), 3) for df in range(1, 11)] == list(_T95)
    # the tables' values (two-sided 99%, 98% and 95% at other degrees of freedom)
    for df, level, want in [
        (5, 0.99, 4.032),
        (3, 0.99, 5.841),
        (10, 0.98, 2.764),
        (30, 0.95, 2.042),
        (1, 0.99, 63.657),
    ]:
        assert t_quantile(df, level) == pytest.approx(want, abs=5e-4)
    assert t_quantile(5000, 0.95) == pytest.approx(1.960, abs=5e-4)
    assert simultaneous(1) == 0.95 and simultaneous(4) == pytest.approx(0.9875)


def _side(rng: random.Random, mean: float, windows: int = 4, spread: float = 0.03, offset: float = 0.02) -> dict:
    """One reading of a loader: a level of its own (each side is a new loader, new workers; docs/measured.md has
    how far two baseline readings of one pause stood apart) and windows spread about it."""
    level = mean * (1 + rng.gauss(0, offset))
    rates = [level * (1 + rng.gauss(0, spread)) for _ in range(windows)]
    return {"window_rates": rates, "samples_per_s": sum(rates) / len(rates)}


def _named(rng: random.Random, gains: list[float], comparisons: int) -> list[bool]:
    """One pause: the baseline read before and after ``len(gains)`` variants, each verified or not."""
    before, sides, after = _side(rng, 100.0), [_side(rng, 100.0 * (1 + g)) for g in gains], _side(rng, 100.0)
    return [tune.bracketed(before, s, after, comparisons)["action_gain_ci95_low"] > 0 for s in sides]


def test_the_best_of_several_changes_that_do_nothing_is_named_at_most_at_the_levels_share():
    """Four changes that do nothing, read in one pause 2,000 times: with each interval at 95%, one of them reads
    verified in about one pause in seven and the pause names it the best change; with the four intervals holding
    together, in fewer than one in 25. A change of +20% is still verified in nearly every pause."""
    rng = random.Random(0)
    alone = sum(any(_named(rng, [0.0] * 4, 1)) for _ in range(2000)) / 2000
    together = sum(any(_named(rng, [0.0] * 4, 4)) for _ in range(2000)) / 2000
    assert alone > 0.1 and together < 0.04, (alone, together)
    real = sum(_named(rng, [0.2, 0.0, 0.0, 0.0], 4)[0] for _ in range(500)) / 500
    assert real > 0.95, real


def test_a_sweeps_action_trials_are_read_at_the_level_of_their_group():
    """A trial's pairs whose gain clears zero at 95% but not at the level of four trials together: verified alone,
    not in a group of four; the interval is re-drawn from the pairs the trial stored."""
    row = {
        "status": "ok",
        "samples_per_s": 104.0,
        "baseline_samples_per_s": 100.0,
        "action_gain_frac": 0.04,
        "action_gain_ci95_low": 0.004,
        "action_gain_ci95_high": 0.076,
        "window_rates": [103.0, 107.0, 101.0, 105.0],
        "baseline_window_rates": [100.0, 100.0, 100.0, 100.0],
    }
    alone, grouped = actions.measured(row), actions.measured(row, comparisons=4)
    assert alone["verified"] and alone["ci_level"] == 0.95
    assert not grouped["verified"] and grouped["ci_level"] == pytest.approx(0.9875)
    assert grouped["measured_gain_ci95_low"] < 0 < 0.04 < grouped["measured_gain_ci95_high"]
