"""The adaptive worker search on workloads of known cost: it finds the known best count and says what it skipped."""

import json

import pytest

from pipeprof.answer import Answer
from pipeprof.orchestrate.search import Point, first_guess, next_workers


def search(rate_of, step, per_worker, cores, noise=0.01):
    """Run the planner against a known curve; returns the counts in the order it measured them."""
    points, order = {}, []
    w = next_workers(points, step, per_worker, cores)
    while w is not None:
        assert w not in points, f"measured {w} twice"
        r = rate_of(w)
        points[w] = Point(w, r, r * (1 - noise), r * (1 + noise))
        order.append(w)
        w = next_workers(points, step, per_worker, cores)
    best = max(p.rate for p in points.values())
    return order, min(w for w, p in points.items() if p.rate >= 0.95 * best)


def test_first_guess_is_what_feeds_the_step_at_the_one_worker_rate():
    assert first_guess(1000, 100, 32) == 10 and first_guess(1000, 100, 4) == 4 and first_guess(50, 100, 8) == 1


def test_a_step_bound_curve_is_found_by_bisecting_below_the_guess():
    # 100 samples/s per worker, a 1,000/s step: 10 workers feed it
    order, pick = search(lambda w: min(1000.0, 100.0 * w), 1000, 100, 32)
    assert pick == 10 and order[0] == 10 and len(order) <= 5


def test_a_curve_that_flattens_stops_at_the_knee():
    # the workers stop scaling at 16 (half of 32 CPUs, the other half SMT-like), the GPU wants 5,000/s
    # the knee is found to within an eighth of the count (search.RESOLUTION): 17 runs as fast as 16
    order, pick = search(lambda w: 100.0 * min(w, 16), 5000, 100, 32)
    assert 16 <= pick <= 16 + 16 // 8 and order[0] == 32 and len(order) <= 6


def test_bisection_stops_where_the_bracket_cannot_be_separated():
    # 16 workers tie 14 (within 5%); 7 cannot reach 90% of the best at 300/s a worker (7 x 300 x 1.15 = 2,415 <
    # 2,700), so bisection starts above it: 10 is 5% below 14 but its interval (±6% of a noisy shared box) reaches
    # 14's: the bracket 10..14 cannot be told apart, so no 12, 11 chasing the noise (the H200 run that did)
    curve = {16: 3000.0, 14: 2950.0, 10: 2800.0, 12: 2900.0, 11: 2850.0}
    order, pick = search(lambda w: curve[w], 4700, 300, 16, noise=0.06)
    assert order == [16, 14, 10] and pick == 14


def test_a_tied_probe_below_the_top_that_may_still_be_rising_ends_the_search():
    # the H200 default run: 16 workers 3,268 (2,905-3,651), 14 workers 3,143 (2,765-3,494): 14 ties 16, but
    # its interval also holds 16's rate scaled to 14 workers (2,860): no bisection of 1..14 after it
    curve = {16: (3268.0, 2905.0, 3651.0), 14: (3143.0, 2765.0, 3494.0)}
    points = {w: Point(w, *curve[w]) for w in curve}
    assert next_workers(points, 4678, 304, 16) is None
    # the same probe on a curve that has flattened (14 at 16's rate, to ±1%) goes on looking lower
    flat = {16: Point(16, 3268.0, 3235.0, 3300.0), 14: Point(14, 3260.0, 3227.0, 3293.0)}
    # from above the counts that cannot reach 90% of the best at 304/s a worker (8 x 304 x 1.15 = 2,797 < 2,941)
    assert next_workers(flat, 4678, 304, 16) == (8 + 14) // 2
    assert next_workers(flat, 4678, 0.0, 16) == 7  # the one-worker rate unknown: from 0


def test_a_loader_bound_at_all_cores_needs_one_probe_below():
    # every worker adds 250/s up to the 16 cores and the GPU wants 4,700/s: the loader binds at 16;
    # one probe at 14 shows 16 is needed (14 is 12% slower), so no bisection of 1..16
    order, pick = search(lambda w: 250.0 * w, 4700, 250, 16)
    assert order == [16, 14] and pick == 16


def test_a_rising_curve_doubles_toward_the_ceiling():
    # the one-worker rate promised 10 workers, but workers contend (60/s each): the search goes up while it gains
    order, pick = search(lambda w: 60.0 * w, 1000, 100, 16)
    assert order[:2] == [10, 16] and pick == 16


def test_noise_wider_than_the_gain_stops_the_climb():
    # past 8 workers the rate gains 3% with intervals of +-5%: not shown to help, so it stops climbing
    order, pick = search(lambda w: 100.0 * min(w, 8) * (1 + 0.03 * (w >= 16)), 5000, 600, 64, noise=0.05)
    assert order[:2] == [9, 18] and 36 not in order and pick == 8


@pytest.mark.alone
def test_an_adaptive_run_measures_less_and_lists_what_it_skipped(tmp_path):
    # 4 ms of CPU a sample (250/s a worker) feeding an 80 ms step of batch 8 (100/s): 1 worker feeds it
    import pipeprof
    from pipeprof.checks.calibrate import BurnDataset, FixedStepModel

    run = pipeprof.profile(
        BurnDataset(256, 0.004),
        model=FixedStepModel(0.08, num_classes=10),
        batch_size=8,
        threads=1,
        sweep="adaptive",
        overhead_checks=True,
        device="cpu",
        out_dir=str(tmp_path),
        log=lambda *a: None,
        measure={
            "warmup_batches": 2,
            "warmup_s": 0.2,
            "warmup_max_s": 1,
            "redraws": 10,
            "window_s": 0.4,
            "window_batches": 2,
            "windows": 3,
            "max_windows": 4,
            "cpu_reference_s": 0,
        },
    )
    kinds = run.trials.groupby("kind")["num_workers"].apply(lambda s: sorted(s.dropna().astype(int)))
    # it starts at 1 worker (100/250 rounds up); 2 only when noise kept 1 below 95% of the ceiling
    assert kinds["end_to_end"][0] == 1 and kinds["end_to_end"] in ([1], [1, 2])
    assert kinds["cpu_pipeline"] == kinds["end_to_end"]
    meta = json.loads((run.path / "run.json").read_text())
    skipped = {s["trial"].split(" (")[0]: s["reason"] for s in meta["search"]["skipped"]}
    assert "0 workers" in skipped["end_to_end at 0 workers"]
    assert ("end_to_end at 2 workers" in skipped) == (kinds["end_to_end"] == [1])
    (v,) = [v for v in meta["analysis"]["verdicts"] if v["num_workers"] == 1]  # one per end-to-end count measured
    assert v["verdict"] == "step-bound" and v["samples_per_s"] == pytest.approx(100, rel=0.15)
    assert Answer.from_dict(meta["analysis"]["groups"][0]).workers == 1  # as run.json stores it
    # 0 workers is inferred, not measured: loading (250/s) and the 100/s step take turns, 1/(1/250 + 1/100)
    (zero,) = meta["search"]["inferred"]
    one = run.trials[run.trials["kind"] == "cpu_pipeline"]["samples_per_s"].iloc[0]
    step = run.trials[run.trials["kind"] == "gpu_ceiling"]["samples_per_s"].iloc[0]
    assert zero["num_workers"] == 0 and zero["samples_per_s"] == pytest.approx(1 / (1 / one + 1 / step))
    assert zero["samples_per_s"] == pytest.approx(1 / (1 / 250 + 1 / 100), rel=0.2)
    # the once-per-pipeline overhead check runs at the most workers the search measured
    assert kinds["monitor_overhead"] == [max(kinds["end_to_end"])]


def _group_search(e2e_rate, r1, step):
    """search._search_group on rows of known rate: end-to-end by worker count, the loader's r1 a worker."""
    from pipeprof.orchestrate.search import _search_group
    from pipeprof.trials import TrialSpec

    specs = {
        "end_to_end": TrialSpec("end_to_end", num_workers=1),
        "cpu_pipeline": TrialSpec("cpu_pipeline", num_workers=1),
    }
    measured = []

    def run(spec):
        measured.append((spec.kind, spec.num_workers))
        rate = e2e_rate(spec.num_workers) if spec.kind == "end_to_end" else r1 * max(spec.num_workers, 1)
        return {"status": "ok", "samples_per_s": rate, "num_workers": spec.num_workers, "gpus": 1}

    return _search_group(run, specs, step, 2, [])[0], measured


def test_the_bisection_stops_where_its_next_step_would_pass_the_answers_time_budget():
    """The H200 default run's curve (step 4,686/s, 262/s a worker, 16 cores; rates with their intervals):
    the search measures 16 (the first guess), 14 (the probe below) and bisects to 12, then 13. Each trial
    takes 10 s of a fake clock, so a step (the loader alone and end to end at a count) 20 s. With 30 s
    left after 16 and 14, 12 still starts; with 10 s it does not, and the step left out is returned. A
    budget already spent still measures the guess and the probe: only the fine end is ever cut."""
    from pipeprof.orchestrate.search import _search_group
    from pipeprof.trials import TrialSpec

    curve = {16: (3196, 0.078), 14: (3487, 0.133), 12: (2629, 0.008), 13: (2869, 0.106)}

    def search(ends_at):
        now, measured = [0.0], []

        def run(spec):
            now[0] += 10.0
            measured.append((spec.kind, spec.num_workers))
            if spec.kind == "cpu_pipeline":
                return {"status": "ok", "samples_per_s": 262.0 * spec.num_workers, "num_workers": spec.num_workers}
            rate, half = curve[spec.num_workers]
            return {
                "status": "ok",
                "samples_per_s": rate,
                "samples_per_s_ci95_low": rate * (1 - half),
                "samples_per_s_ci95_high": rate * (1 + half),
                "num_workers": spec.num_workers,
                "gpus": 1,
            }

        specs = {k: TrialSpec(k, num_workers=1) for k in ("end_to_end", "cpu_pipeline")}
        points, cut = _search_group(run, specs, 4686.0, 16, [], ends_at, clock=lambda: now[0])
        return sorted(points), cut, [w for k, w in measured if k == "end_to_end"]

    assert search(None) == ([12, 13, 14, 16], None, [16, 14, 12, 13])
    # 10 s (cpu_pipeline at 1) + 20 s (16) + 20 s (14): 50 s in; a step takes 20 s
    assert search(80.0)[:2] == ([12, 14, 16], {"workers": 13, "step_s": 20.0, "left_s": 10.0})
    assert search(60.0) == ([14, 16], {"workers": 12, "step_s": 20.0, "left_s": 10.0}, [16, 14])
    assert search(0.0)[0] == [14, 16]


def test_a_stopped_bisection_is_recorded_with_its_budget_and_the_counts_it_left():
    from pipeprof.orchestrate.search import _record_group
    from pipeprof.trials import TrialSpec

    record = {"measured_workers": {}, "skipped": [], "inferred": []}
    points = {16: Point(16, 3196.0, 2947.0, 3445.0), 14: Point(14, 3487.0, 3023.0, 3951.0)}
    _record_group(
        record,
        TrialSpec("end_to_end", num_workers=1),
        points,
        {"samples_per_s": 262.0},
        4686.0,
        16,
        {"workers": 12, "step_s": 31.0, "left_s": 4.0, "budget_s": 150.0},
    )
    (stopped,) = record["stopped"]
    assert stopped["next_workers"] == 12 and "measure.answer_max_s: 150 s" in stopped["reason"]
    reasons = {r["trial"].split(" workers")[0].split()[-1]: r["reason"] for r in record["skipped"]}
    # between the floor (ceil(0.9 x 3,487 / (1.15 x 262)) - 1 = 10) and 14: left by the budget; below: out of reach
    assert reasons["12"] == stopped["reason"] and reasons["8"].startswith("cannot be the answer")


def test_zero_workers_is_measured_when_its_inferred_rate_rivals_the_best():
    # a 2-core CPU machine (the default CPU run): loading 330/s a worker, the step alone 57/s; without
    # workers the step gets both cores back and runs 60/s, with one worker 48/s. Inferred, 0 workers
    # would be 1/(1/330 + 1/57) = 48.6/s, a tie with the best measured: so it is measured, and wins
    points, measured = _group_search(lambda w: {0: 60.0, 1: 48.0, 2: 40.0}[w], 330.0, 57.0)
    assert ("end_to_end", 0) in measured and max(points.values(), key=lambda p: p.rate).workers == 0


def test_zero_workers_stays_inferred_when_clearly_slower():
    # 250/s a worker feeding a 100/s step: 1 worker gives 95/s; 0 workers would give 71/s: not measured
    points, measured = _group_search(lambda w: {1: 95.0, 2: 97.0}[w], 250.0, 100.0)
    assert 0 not in points and all(w != 0 for _, w in measured)


def test_sweep_speed_pairs_compare_the_two_sweeps_of_each_pair():
    import pandas as pd

    from pipeprof.checks.bench import pairs, render_sweep_speed

    base = {
        "group": "g",
        "trials": 10,
        "verdict": "cpu-bound",
        "run": "r",
        "monitor_cost": None,
        "monitor_low": None,
        "monitor_high": None,
        "clocks_cost": 0.01,
        "clocks_low": -0.02,
        "clocks_high": 0.04,
    }
    df = pd.DataFrame(
        [
            base | {"pair": 1, "sweep": "adaptive", "wall_s": 60.0, "num_workers": 14, "samples_per_s": 2108.0},
            base | {"pair": 1, "sweep": "exhaustive", "wall_s": 240.0, "num_workers": 16, "samples_per_s": 2254.0},
        ]
    )
    (p,) = pairs(df).to_dict("records")
    assert p["time_ratio"] == 4.0 and p["rate_diff"] == pytest.approx(2108 / 2254 - 1)
    assert (p["adaptive_workers"], p["exhaustive_workers"]) == (14, 16)
    assert "240 s / 60 s = 4.0x" in render_sweep_speed(df) and "+1.0% (-2.0%…+4.0%)" in render_sweep_speed(df)


def test_the_first_guess_below_a_doubled_top_is_probed_just_below_not_bisected_from_zero():
    # the H200 default run: S / r1 = 4,715 / 323 gave 15 workers, doubling reached the 16 cores, 16 tied 15;
    # 14 just below 15 says whether 15 are needed (it measured 3,277: no), instead of 7, 11 and 13
    points = {15: Point(15, 3680.0, 3250.0, 4110.0), 16: Point(16, 3579.0, 3300.0, 3850.0)}
    assert next_workers(points, 4715, 323, 16) == 14
    assert next_workers(points | {14: Point(14, 3277.0, 3050.0, 3500.0)}, 4715, 323, 16) is None
    # a probe below that ties leads to bisection below it, not a walk down an eighth at a time, from the most
    # workers that cannot reach 90% of the best (8: 8 x 323 x 1.15 = 2,972 < 3,312)
    assert next_workers(points | {14: Point(14, 3650.0, 3400.0, 3900.0)}, 4715, 323, 16) == 11


def test_the_floor_is_the_most_workers_that_cannot_reach_the_answer():
    from pipeprof.orchestrate.search import floor_of

    points = {16: Point(16, 2974.0, 2800.0, 3150.0), 14: Point(14, 2909.0, 2692.0, 3126.0)}
    # the H200 default run of this session: 229/s a worker; 10 x 229 x 1.15 = 2,638 < 0.9 x 2,974 = 2,677 <= 2,902 (11)
    assert floor_of(points, 229.4) == 10
    assert floor_of(points, 0.0) == 0 and floor_of({}, 229.4) == 0
    assert floor_of(points, 1e6) == 0  # one worker alone could reach it: nothing is ruled out
