"""steady_state() on workloads of known cost, driven by a fake clock: exact answers."""

import math

import pytest

from pipeprof.config import MeasureConfig
from pipeprof.measure.windows import alternating, instability, rotating, steady_state, summarize_rates, window


class FakeClock:
    def __init__(self):
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def policy(**kw):
    base = dict(
        warmup_batches=5, warmup_s=0.0, window_s=1.0, window_batches=5, windows=5, max_trial_s=1e9, ci_target=0.05
    )
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
    naive = window(step, clock, lambda: None, clock(), 0.1)  # a timer with no warm-up
    assert naive.rate > 4 * 800
    clock2 = FakeClock()
    step2, _ = steady_step(clock2, prefetched=40)
    m = steady_state(step2, policy(), min_warmup_batches=40 + 2, clock=clock2)
    assert m.warmup_batches >= 42 and m.warmup_settled
    assert m.stats()["samples_per_s"] == pytest.approx(800.0, rel=1e-9)


def test_warm_up_ends_when_the_rate_settles():
    # a start-up transient (autotuning, workers starting, caches filling): the first batches take 5x
    # as long, decaying with a 0.5 s time constant. Warm-up must outlast it, and end soon after
    # (not after a fixed count): the measured rate is then within settle_tol's reach of the steady 800/s
    clock = FakeClock()

    def step():
        clock.t += 0.01 * (1 + 4 * math.exp(-clock.t / 0.5))
        return 8

    m = steady_state(step, policy(warmup_batches=0, window_s=1.0), clock=clock)
    assert m.warmup_settled and 1.0 <= m.warmup_s <= 4.0
    assert m.stats()["samples_per_s"] == pytest.approx(800.0, rel=0.03)


def test_warm_up_that_never_settles_stops_at_its_cap_and_says_so():
    clock, n = FakeClock(), {"i": 0}

    def step():  # each half-window chunk twice as fast as the one before: never settled
        n["i"] += 1
        clock.t += 0.5 / 2 ** int(clock.t / 0.5) / 10
        return 8

    m = steady_state(
        step, policy(warmup_batches=0, warmup_max_s=2.0, max_trial_s=1e9, windows=2, max_windows=2), clock=clock
    )
    assert m.warmup_settled is False and 2.0 <= m.warmup_s < 2.6


def test_slow_batches_make_time_windows_not_batch_counts():
    # one batch per 1.2 s: with the default policy a window is one batch, not five
    clock = FakeClock()
    step, _ = steady_step(clock, cost_s=1.2, batch=256)
    m = steady_state(step, MeasureConfig(max_trial_s=1e9), clock=clock)
    assert all(w.batches == 1 for w in m.windows) and len(m.windows) == MeasureConfig().windows
    assert m.stats()["samples_per_s"] == pytest.approx(256 / 1.2, rel=1e-9)


def test_sync_closes_each_window_and_phases_are_reported():
    clock, syncs, phases = FakeClock(), [], []
    step, _ = steady_step(clock)
    m = steady_state(step, policy(windows=3), clock=clock, sync=lambda: syncs.append(clock.t), on_phase=phases.append)
    # the queue drained, two settling chunks (steady at once), the warm-up's end, then one per window
    assert len(syncs) == 1 + 2 + 1 + 3
    assert m.t_measure_start == syncs[3] and [w.t_end for w in m.windows] == syncs[4:]
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

    m = steady_state(
        step,
        policy(window_batches=100, window_s=1e-9, warmup_batches=0, windows=3, max_windows=40, ci_target=0.10),
        clock=clock,
    )
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
    rel = 4.303 * 10 / 3**0.5 / 100  # the t interval's half-width, relative to the mean
    # a rate's interval is multiplicative (stats.rate_bounds): mean / e^rel to mean * e^rel, never below 0
    assert s["samples_per_s_ci95_low"] == pytest.approx(100 * math.exp(-rel))
    assert s["samples_per_s_ci95_high"] == pytest.approx(100 * math.exp(rel))
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

    p = alternating(step, set_mode, policy(windows=8, max_windows=8), drain_batches=3, clock=clock)
    c = p.cost()
    assert c["pairs"] == 4 and c["cost_frac"] == pytest.approx(1 - 1 / 1.1)
    assert c["cost_ci95_high"] - c["cost_ci95_low"] == pytest.approx(0, abs=1e-9)
    assert modes_seen[1:9] == [True, False, False, True, True, False, False, True]  # ABBA cancels drift


def drifting_step(clock):
    """A step of 10 ms that slows 1% every 100 batches (a window of 100 batches in these tests), whatever the side."""
    n = {"i": 0}

    def step():
        n["i"] += 1
        clock.t += 0.01 * (1 + 0.01 * (n["i"] // 100))
        return 8

    return step


def test_alternating_cancels_a_steady_drift():
    # the machine slows 1% per window whatever the mode; the modes cost the same: ABBA reads ~0, not a bias
    clock = FakeClock()
    pol = policy(windows=12, max_windows=12, window_batches=100, window_s=1e-9)
    p = alternating(drifting_step(clock), lambda on: None, pol, drain_batches=0, clock=clock)
    c = p.cost()
    assert abs(c["cost_frac"]) < 0.002 and c["cost_ci95_low"] < 0 < c["cost_ci95_high"]


def test_two_variants_rotate_around_a_shared_baseline_window_and_each_reads_its_own_cost():
    # the baseline costs 10 ms a batch, variant 1 11 ms, variant 2 8 ms: each variant's cost against the
    # baseline window of its own cycle is exact, the cycles run A1 B A2 | A2 B A1 (a variant before the
    # baseline in one cycle, after it in the next), and a drain follows each switch, not a window on the same side
    clock, side, seen, drained = FakeClock(), {"k": None}, [], []
    cost = {0: 0.010, 1: 0.011, 2: 0.008}

    def step():
        clock.t += cost[side["k"]]
        return 8

    def set_side(k):
        drained.append(k != side["k"])
        side["k"] = k
        seen.append(k)

    r = rotating(step, set_side, 2, policy(windows=8, max_windows=8), drain_batches=3, clock=clock)
    assert len(r.cycles) == 4 and seen[1:] == [1, 0, 2, 2, 0, 1, 1, 0, 2, 2, 0, 1]
    assert drained[1:] == [False, True, True, False, True, True] * 2
    for k in (1, 2):
        c = r.paired(k).cost()
        assert c["pairs"] == 4 and c["cost_frac"] == pytest.approx(1 - cost[0] / cost[k])
    assert r.paired(1).b == r.paired(2).b  # the baseline's windows are shared, one a cycle


def test_a_rotation_of_two_variants_cancels_a_steady_drift_for_both():
    clock = FakeClock()
    pol = policy(windows=12, max_windows=12, window_batches=100, window_s=1e-9)
    r = rotating(drifting_step(clock), lambda k: None, 2, pol, drain_batches=0, clock=clock)
    for k in (1, 2):
        c = r.paired(k).cost()
        assert c["pairs"] == 6 and abs(c["cost_frac"]) < 0.002 and c["cost_ci95_low"] < 0 < c["cost_ci95_high"]


def test_a_rotation_adds_cycles_until_every_variant_is_narrow():
    # variant 1 is steady (+10% every cycle: no spread), variant 2's cost moves from cycle to cycle: the cycles go
    # on to the most for variant 2's sake though variant 1 was narrow after the planned two
    clock, state = FakeClock(), {"k": 1, "windows2": 0}
    moves = [1.10, 1.02, 1.08, 1.04, 1.06, 1.06, 1.05, 1.07]  # variant 2's factor in cycle i (its i-th window)

    def step():
        factor = {0: 1.0, 1: 1.1, 2: moves[max(state["windows2"] - 1, 0)]}[state["k"]]
        clock.t += 0.010 * factor
        return 8

    def set_side(k):  # called once before each window
        state["windows2"] += k == 2
        state["k"] = k

    r = rotating(
        step,
        set_side,
        2,
        policy(windows=4, max_windows=12, window_batches=100, window_s=1e-9, ci_target=0.05),
        drain_batches=0,
        clock=clock,
    )
    one, two = r.paired(1).cost(), r.paired(2).cost()
    assert len(r.cycles) == 6 and one["cost_ci95_high"] == pytest.approx(one["cost_frac"])  # 1 narrow from the start
    assert two["cost_frac"] == pytest.approx(sum(1 - 1 / f for f in moves[:6]) / 6, rel=1e-6)


def test_a_rotation_whose_baseline_rate_is_a_bound_adds_cycles_until_that_rate_is_narrow():
    # the machine runs every side 30% slower in every other cycle: the variants' costs against their own cycle's
    # baseline stay exact (narrow after the planned two), the baseline's rate does not. Read as a bound
    # (``rate_half``), the cycles go on to max_windows (its windows as many as a trial's); without it they stop
    # at the planned two
    def run(rate_half, slower=1.3):
        clock, state = FakeClock(), {"k": 1, "calls": 0}
        cost = {0: 0.010, 1: 0.011, 2: 0.008}

        def step():
            cycle = max(state["calls"] - 2, 0) // 3  # one set_side before the warm-up, then one a window
            clock.t += cost[state["k"]] * (slower if cycle % 2 else 1.0)
            return 8

        def set_side(k):
            state["calls"] += 1
            state["k"] = k

        pol = policy(windows=4, max_windows=12, window_batches=100, window_s=1e-9, ci_target=0.05)
        return rotating(step, set_side, 2, pol, drain_batches=0, clock=clock, rate_half=rate_half)

    costs_only, as_bound = run(None), run(0.05)
    assert len(costs_only.cycles) == 2 and len(as_bound.cycles) == 12
    assert len(run(0.05, slower=1.0).cycles) == 2  # a steady machine: the planned two already narrow
    for r in (costs_only, as_bound):
        for k in (1, 2):
            c = r.paired(k).cost()
            assert c["cost_frac"] == pytest.approx(1 - 0.010 / {1: 0.011, 2: 0.008}[k])
    rates = [c[0].rate for c in as_bound.cycles]
    assert rates[0] == pytest.approx(8 / 0.010) and rates[1] == pytest.approx(8 / 0.013)


def slow_modes(clock, cost_s=0.5):
    """A step of ``cost_s`` whatever the mode, and a set_mode that records the modes asked for."""
    modes = []

    def step():
        clock.t += cost_s
        return 8

    return step, modes.append, modes


def test_alternating_stops_within_max_trial_s_with_the_pairs_that_fit():
    # warm-up 3 batches (1.5 s); a pair is 5 timed batches in the mode the last window ran in (no drain) and 1
    # drained + 5 timed after the switch: 5.5 s. Pairs end at 7.0, 12.5 and 18.0 s; a fourth is not started
    # (1 s left < 5.5 s the last pair took). Draining before every window would have fitted two (6 s a pair).
    clock = FakeClock()
    step, set_mode, _ = slow_modes(clock)
    pol = policy(warmup_batches=2, windows=8, max_windows=8, max_trial_s=19.0)
    p = alternating(step, set_mode, pol, drain_batches=1, clock=clock)
    assert len(p.a) == len(p.b) == 3 and p.planned_pairs == 4 and p.time_capped
    assert [w.t_start for w in p.a] == [1.5, 10.0, 12.5] and [w.t_start for w in p.b] == [4.5, 7.0, 15.5]
    assert clock.t == 18.0 and p.warmup_batches == p.warmup_wanted == 3
    assert p.cost()["pairs"] == 3 and p.cost()["cost_ci95_low"] is not None


def test_max_trial_s_counts_from_the_trial_start_the_caller_gives():
    # the same steps as above, after a start of the caller's that took 8 s (an action trial opening a loader per
    # side): the cap ends 11 s into the windows' clock, so the first pair (1.5-7.0 s) is the only one; counted
    # from the warm-up instead, three pairs ran to 18.0 s, 26 s after the trial began
    clock = FakeClock()
    step, set_mode, _ = slow_modes(clock)
    pol = policy(warmup_batches=2, windows=8, max_windows=8, max_trial_s=19.0)
    r = rotating(step, lambda side: set_mode(side == 1), 1, pol, drain_batches=1, clock=clock, started=-8.0)
    assert len(r.cycles) == 1 and r.time_capped and clock.t == 7.0 and r.warmup_batches == 3


def test_alternating_bounds_warm_up_and_drops_an_unfinished_pair():
    # each step takes 3 s: warm-up stops past half the 10 s cap (2 of 4 batches, at 6 s); the first A window
    # (drain + 5 batches) ends at 24 s, past the cap, so its B window is never started and no pair is kept
    clock = FakeClock()
    step, set_mode, modes = slow_modes(clock, cost_s=3.0)
    p = alternating(step, set_mode, policy(warmup_batches=3, max_trial_s=10.0), drain_batches=1, clock=clock)
    assert p.warmup_batches == 2 < p.warmup_wanted == 4
    assert p.a == p.b == [] and p.time_capped and modes == [True, True]
    assert clock.t <= 10.0 + 3.0 * 6  # past the cap by one window (and its drain) at most
    assert p.cost() == {"cost_frac": None, "cost_ci95_low": None, "cost_ci95_high": None, "pairs": 0}


def test_one_pair_gives_a_cost_without_an_interval():
    # warm-up 1.5 s, one pair of 6 s ends at 7.5 s; 2.5 s left < 6 s: no second pair
    clock = FakeClock()
    step, set_mode, _ = slow_modes(clock)
    p = alternating(step, set_mode, policy(warmup_batches=2, max_trial_s=10.0), drain_batches=1, clock=clock)
    c = p.cost()
    assert c["pairs"] == 1 and c["cost_frac"] == pytest.approx(0.0, abs=1e-9)
    assert c["cost_ci95_low"] is None and c["cost_ci95_high"] is None


def noisy_pairs(clock, factors):
    """Mode B costs 10 ms a batch, mode A ``factors[i]`` times that in pair i: pair costs 1 - 1/factor."""
    state = {"on": True, "calls": 0}

    def step():
        pair = max(0, (state["calls"] - 2) // 2)
        clock.t += 0.010 * (factors[pair] if state["on"] else 1.0)
        return 8

    def set_mode(on):
        state["on"] = on
        state["calls"] += 1

    return step, set_mode


@pytest.mark.parametrize("ci_target, pairs", [(0.08, 5), (0.05, 6)])
def test_pairs_are_added_beyond_the_plan_until_narrow_or_at_the_most(ci_target, pairs):
    # half-widths of the cost after 2..6 pairs: 0.45, 0.093, 0.052, 0.035, 0.026. Planned: max(2, 4 // 2) = 2;
    # most: 12 // 2 = 6. ci_target 0.08 stops at 5 (0.035 <= 0.04); 0.05 runs to the most (0.026 > 0.025).
    factors = [1.10, 1.02, 1.08, 1.04, 1.06, 1.06, 1.05, 1.07]
    clock = FakeClock()
    step, set_mode = noisy_pairs(clock, factors)
    pol = policy(windows=4, max_windows=12, window_batches=100, window_s=1e-9, ci_target=ci_target)
    p = alternating(step, set_mode, pol, drain_batches=0, clock=clock)
    c = p.cost()
    assert p.planned_pairs == 2 and c["pairs"] == pairs and not p.time_capped
    assert c["cost_frac"] == pytest.approx(sum(1 - 1 / f for f in factors[:pairs]) / pairs, rel=1e-6)
    half = (c["cost_ci95_high"] - c["cost_ci95_low"]) / 2
    assert (half <= ci_target / 2) == (pairs < 6)


def test_default_policy_plans_fewer_pairs_than_it_may_add():
    from pipeprof.measure.windows import Paired

    assert Paired.plan(MeasureConfig()) == (2, MeasureConfig().max_windows // 2)


def fake_clock_overhead(monkeypatch, cost_s, max_trial_s):
    """trials.clock_overhead on a fake loader (``cost_s`` a batch) and the fake clock: its row and the closes."""
    from types import SimpleNamespace

    from pipeprof.measure import windows as measure
    from pipeprof.trials import kinds as trials

    clock, closed = FakeClock(), []

    def batches():
        while True:
            clock.t += cost_s
            yield {"image": SimpleNamespace(shape=(8,))}

    monkeypatch.setattr(trials, "load_preset", lambda *a: None)
    monkeypatch.setattr(trials, "PipelineDataset", lambda *a: None)
    monkeypatch.setattr(trials, "open_loader", lambda *a: batches())
    monkeypatch.setattr(trials, "close_loader", lambda ctx, it: closed.append(it))
    monkeypatch.setattr(trials, "alternating", lambda *a, **kw: measure.alternating(*a, clock=clock, **kw))
    bench = SimpleNamespace(
        source_for=lambda spec: None,
        prefetch_factor=2,
        user_loader=None,
        sample_policy=None,
        measure=policy(warmup_batches=2, max_trial_s=max_trial_s),
        monitor=SimpleNamespace(set_trial=lambda *a: None),
    )
    spec = SimpleNamespace(decoder=None, preset="p", image_size=8, num_workers=0, trial_id="t")
    return trials.clock_overhead(bench, spec), closed


def test_clock_overhead_row_says_why_with_too_few_pairs(monkeypatch):
    # 0 workers: drain 1 batch; warm-up 3 batches (1.5 s), the first window at once (warm-up ran its mode), a
    # drained batch before the second: a pair 5.5 s
    none, closed = fake_clock_overhead(monkeypatch, cost_s=0.5, max_trial_s=4.0)
    assert none["samples_per_s"] is None and none["stage_clock_overhead_frac"] is None and len(closed) == 1
    assert none["windows"] == 0 and none["t_measure_start_s"] is None and none["t_measure_end_s"] is None
    assert none["unstable"] and "only 0 pairs of clocked/unclocked windows" in none["unstable_reason"]
    one, _ = fake_clock_overhead(monkeypatch, cost_s=0.5, max_trial_s=10.0)
    assert one["unstable"]
    assert "only 1 pair of clocked/unclocked windows fitted in max_trial_s" in one["unstable_reason"]
    assert one["stage_clock_overhead_frac"] == pytest.approx(0.0, abs=1e-9)
    assert one["stage_clock_overhead_ci95_low"] is None and one["t_measure_start_s"] == pytest.approx(1.5)
    two, _ = fake_clock_overhead(monkeypatch, cost_s=0.5, max_trial_s=1e9)
    assert not two["unstable"] and two["unstable_reason"] is None and two["windows"] == 4
