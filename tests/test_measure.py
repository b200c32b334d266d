"""steady_state() on workloads of known cost, driven by a fake clock: exact answers."""
import pytest

from pipeprof.config import MeasureConfig
from pipeprof.measure import alternating, instability, steady_state, summarize_rates


class FakeClock:
    def __init__(self):
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def policy(**kw):
    base = dict(warmup_batches=5, warmup_s=0.0, window_s=1.0, window_batches=5, windows=5, max_trial_s=1e9,
                ci_target=0.05)
    return MeasureConfig(**(base | kw))


def steady_step(clock, cost_s=0.01, batch=8, prefetched=0):
    """A step of known cost; the first ``prefetched`` batches are free (already queued)."""
    calls = {"n": 0}

    def step():
        calls["n"] += 1
        clock.t += 1e-5 if calls["n"] <= prefetched else cost_s
        return batch
    return step, calls


def test_known_cost_gives_exact_rate():
    clock = FakeClock()
    step, _ = steady_step(clock, cost_s=0.01, batch=8)
    m = steady_state(step, policy(), clock=clock)
    stats = m.stats()
    assert stats["samples_per_s"] == pytest.approx(800.0, rel=1e-9)
    assert stats["samples_per_s_cv"] == pytest.approx(0.0, abs=1e-9)
    assert stats["windows"] == 5 and not m.unstable
    assert all(w.batches >= 5 and w.t_end - w.t_start >= 1.0 for w in m.windows)


def test_prefetched_batches_are_excluded_as_warmup():
    # 40 batches were queued before the clock started: a naive timer reports far above the real rate
    clock = FakeClock()
    step, _ = steady_step(clock, prefetched=40)
    naive = steady_state(step, policy(warmup_batches=0, window_s=0.1, window_batches=1, windows=2), clock=clock)
    assert naive.rates()[0] > 4 * 800
    clock2 = FakeClock()
    step2, _ = steady_step(clock2, prefetched=40)
    m = steady_state(step2, policy(), min_warmup_batches=40 + 2, clock=clock2)
    assert m.warmup_batches == 42
    assert m.stats()["samples_per_s"] == pytest.approx(800.0, rel=1e-9)


def test_sync_closes_each_window_and_phases_are_reported():
    clock, syncs, phases = FakeClock(), [], []
    step, _ = steady_step(clock)
    steady_state(step, policy(windows=3), clock=clock, sync=lambda: syncs.append(clock.t), on_phase=phases.append)
    assert len(syncs) == 1 + 3  # end of warm-up, then one per window
    assert phases == ["warmup", "measure", "done"]


def test_alternating_costs_are_flagged_unstable():
    clock = FakeClock()
    costs = iter([0.01] * 5 + ([0.01] * 100 + [0.02] * 50) * 10)

    def step():
        clock.t += next(costs)
        return 8
    m = steady_state(step, policy(max_windows=5), clock=clock)
    assert m.unstable and "95% interval" in m.reason and "after 5 windows" in m.reason


def test_windows_are_added_until_the_interval_is_narrow():
    # window rates 800, 400, 800, 400...: the interval narrows as windows accumulate, slowly
    clock = FakeClock()
    n = {"i": 0}

    def step():
        n["i"] += 1
        clock.t += 0.01 if (n["i"] // 100) % 2 == 0 else 0.02
        return 8
    m = steady_state(step, policy(window_batches=100, window_s=1e-9, warmup_batches=0, windows=3, max_windows=40,
                                  ci_target=0.10), clock=clock)
    assert 3 < len(m.windows) < 40  # it stopped adding once the interval was within ±10%
    half = (m.stats()["samples_per_s_ci95_high"] - m.stats()["samples_per_s_ci95_low"]) / 2
    assert half / m.stats()["samples_per_s"] <= 0.10 and not m.unstable
    steady = FakeClock()
    s, _ = steady_step(steady)
    assert len(steady_state(s, policy(windows=3, max_windows=40), clock=steady).windows) == 3  # nothing to add


def test_time_limit_leaves_fewer_windows_and_says_so():
    clock = FakeClock()
    step, _ = steady_step(clock, cost_s=0.5)
    m = steady_state(step, policy(max_trial_s=6.0, warmup_batches=2), clock=clock)
    assert len(m.windows) < 5
    assert m.unstable and f"only {len(m.windows)} of 5 windows" in m.reason


def test_summarize_rates_matches_hand_computation():
    s = summarize_rates([90.0, 100.0, 110.0])
    assert s["samples_per_s"] == 100.0 and s["samples_per_s_mean"] == 100.0
    assert s["samples_per_s_cv"] == pytest.approx(0.1)
    assert s["samples_per_s_ci95_low"] == pytest.approx(100 - 4.303 * 10 / 3 ** 0.5)
    assert (s["samples_per_s_min"], s["samples_per_s_max"]) == (90.0, 110.0)


def test_drift_is_reported_even_with_small_cv():
    rates = [100, 101, 102, 103, 104, 105, 106, 107, 108, 109, 110, 111]
    assert "drifts" in instability(rates, 12, ci_limit=0.04)
    assert instability([100, 101, 100, 101], 4, ci_limit=0.05) is None


def test_windows_of_whole_worker_rounds_are_stable_under_bursts():
    # 4 workers finish their batches together: one slow gap, then 3 batches at once
    def bursty(clock):
        n = {"i": 0}

        def step():
            n["i"] += 1
            clock.t += 0.04 if n["i"] % 4 == 0 else 0.001
            return 8
        return step

    loose = policy(window_s=1e-9, window_batches=3, windows=6)
    c1 = FakeClock()
    ragged = steady_state(bursty(c1), loose, clock=c1)
    c2 = FakeClock()
    rounds = steady_state(bursty(c2), loose, clock=c2, batch_multiple=4)
    assert ragged.stats()["samples_per_s_cv"] > 0.2
    assert rounds.stats()["samples_per_s_cv"] == pytest.approx(0.0, abs=1e-9)
    assert rounds.stats()["samples_per_s"] == pytest.approx(32 / 0.043)
    assert all(w.batches % 4 == 0 for w in rounds.windows)


def test_alternating_windows_measure_the_cost_of_a_mode_exactly():
    # mode A costs 10% more per batch than mode B: 1 - rate A / rate B = 1 - 1/1.1
    clock, mode, modes_seen = FakeClock(), {"on": True}, []

    def step():
        clock.t += 0.011 if mode["on"] else 0.010
        return 8

    def set_mode(on):
        mode["on"] = on
        modes_seen.append(on)
    p = alternating(step, set_mode, policy(windows=4, max_windows=8), drain_batches=3, clock=clock)
    c = p.cost()
    assert c["pairs"] == 4 and c["cost_frac"] == pytest.approx(1 - 1 / 1.1)
    assert c["cost_ci95_high"] - c["cost_ci95_low"] == pytest.approx(0, abs=1e-9)
    assert modes_seen[1:9] == [True, False, False, True, True, False, False, True]  # ABBA cancels drift


def test_alternating_cancels_a_steady_drift():
    # the machine slows 1% per window whatever the mode; the modes cost the same: ABBA reads ~0, not a bias
    clock, n = FakeClock(), {"i": 0}

    def step():
        n["i"] += 1
        clock.t += 0.01 * (1 + 0.01 * (n["i"] // 100))
        return 8
    p = alternating(step, lambda on: None, policy(windows=6, max_windows=6, window_batches=100, window_s=1e-9),
                    drain_batches=0, clock=clock)
    c = p.cost()
    assert abs(c["cost_frac"]) < 0.002 and c["cost_ci95_low"] < 0 < c["cost_ci95_high"]
