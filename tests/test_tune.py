"""The pause's arithmetic (``watch.tune``) on figures of known content: the curve's check and its reason, the
search's second look, an action read against the baseline before and after it, and its end-to-end prediction."""

import math
import statistics

import pytest
import torch
from torch.utils.data import IterableDataset

from pipeprof.watch import tune


def _pt(rate: float, half: float = 0.03) -> dict:
    return {
        "samples_per_s": rate,
        "samples_per_s_ci95_low": rate * (1 - half),
        "samples_per_s_ci95_high": rate * (1 + half),
    }


def test_the_end_of_a_pass_keeps_workers_idle_by_its_last_round():
    assert tune.pass_efficiency(16, 16) == 1.0 and tune.pass_efficiency(16, 8) == 1.0
    assert tune.pass_efficiency(16, 14) == pytest.approx(16 / 28)
    assert tune.pass_efficiency(None, 14) == 1.0  # an unsized dataset: nothing known


def test_a_per_worker_rise_is_explained_by_the_pass_or_named_as_the_machines():
    # a curve of the shape: per worker about 237 at 4, 94 at 14, 154 at 16; 16 batches a pass
    seen = {4: _pt(948), 14: _pt(1310), 16: _pt(2461)}
    assert [a for a, _ in tune._rises(seen)] == [14]
    note = tune.curve_note(seen, 16)
    assert "a pass of 16 batches keeps 14 workers busy in 57%" in note and "against 100% at 16" in note
    assert "machine's load" in tune.curve_note(seen, None)
    assert tune.curve_note({4: _pt(900), 8: _pt(1700), 16: _pt(3000)}, 16) is None  # falls per worker: no note


def test_the_search_measures_an_unexplained_rise_again_once_and_an_explained_one_not():
    calls: list[int] = []
    rates = {4: 900.0, 14: 1100.0, 16: 3000.0}  # the search visits 4, 16, 14; 14 reads low (per worker 79 vs 188)

    def measure(w: int) -> dict:
        calls.append(w)
        return _pt(rates.get(w, 200.0 * w))

    tune.search(measure, step_rate=5000.0, start=4, cores=16, batches_per_pass=None)
    assert calls == [4, 16, 14, 14]
    calls.clear()
    tune.search(measure, step_rate=5000.0, start=4, cores=16, batches_per_pass=16)  # 14 workers: 16 of 28 slots
    assert calls == [4, 16, 14]


def _side(rates: list[float], us: float | None = None) -> dict:
    return {"samples_per_s": sorted(rates)[len(rates) // 2], "window_rates": rates, "device_us_per_sample": us}


def test_an_action_is_read_against_both_baseline_readings_pooled():
    before, after = _side([990.0, 1000.0, 1010.0], 5.0), _side([1090.0, 1100.0, 1110.0], 7.0)
    row = tune.bracketed(before, _side([1480.0, 1500.0, 1520.0], 40.0), after)
    pooled = [990.0, 1000.0, 1010.0, 1090.0, 1100.0, 1110.0]
    assert row["baseline_windows"] == 6 and row["baseline_drift_frac"] == pytest.approx(0.1)
    assert row["action_gain_frac"] == pytest.approx(1500 / statistics.fmean(pooled) - 1)
    # the log ratio's standard error: each side's CV over the root of its windows; t at the fewer windows (3)
    se = math.sqrt((statistics.stdev(pooled) / 1050) ** 2 / 6 + (20 / 1500) ** 2 / 3)
    assert row["action_gain_ci95_low"] == pytest.approx(1500 / 1050 * math.exp(-4.303 * se) - 1, rel=1e-3)
    assert row["baseline_device_us_per_sample"] == 6.0
    # a variant within the baseline's spread: its interval straddles zero, not verified
    close = tune.with_step(tune.bracketed(before, _side([1030.0, 1060.0, 1090.0]), after), step_rate=1e6)
    assert close["measured"] and close["action_gain_ci95_low"] < 0 < close["action_gain_ci95_high"]
    assert not close["verified"]
    assert "error" in tune.bracketed(before, {"error": "no rate"}, after)


def test_the_training_process_work_adds_to_the_step_end_to_end():
    before = after = _side([999.0, 1000.0, 1001.0], 10.0)
    # a variant whose loader alone runs at 4,000/s but adds 210 us a sample of device work before a 2,000/s step:
    # fed at 1 / (500 us + 200 us) = 1,428.6/s; the baseline reached min(1,000, 2,000)
    variant = _side([3996.0, 4000.0, 4004.0], 210.0)
    row = tune.with_step(tune.bracketed(before, variant, after), 2000.0)
    assert row["extra_device_us_per_sample"] == pytest.approx(200.0)
    assert row["predicted_e2e_samples_per_s"] == pytest.approx(1 / (1 / 2000 + 200e-6))
    assert row["predicted_e2e_gain_frac"] == pytest.approx(1 / (1 / 2000 + 200e-6) / 1000 - 1)
    assert row["action_gain_frac"] == pytest.approx(3.0)  # the loader alone quadruples: not what the loop gets
    # step-bound already: any device work only costs
    slow = tune.with_step(tune.bracketed(before, variant, after), 500.0)
    assert slow["predicted_e2e_gain_frac"] < 0
    assert tune.best_action([row, slow | {"verified": False}]) is row
    assert math.isfinite(row["predicted_e2e_gain_ci95_high"])
    # a loader made faster (verified) behind a step that binds it already: the loop gains nothing, no change named
    bound = tune.with_step(tune.bracketed(before, _side([3996.0, 4000.0, 4004.0], 10.0), after), 900.0)
    assert bound["verified"] and bound["predicted_e2e_gain_ci95_low"] == bound["predicted_e2e_gain_frac"] == 0.0
    assert tune.best_action([bound]) is None


def test_a_variant_bound_by_the_step_carries_the_loader_bound_baselines_spread():
    # the baseline's loader reads 900-1,100/s (a noisy machine), the variant's loader 8,000/s behind a 2,000/s step:
    # the loop's gain is step / baseline, known only as well as the baseline is
    before, after = _side([900.0, 1000.0, 1100.0]), _side([950.0, 1000.0, 1050.0])
    row = tune.with_step(tune.bracketed(before, _side([7900.0, 8000.0, 8100.0]), after), 2000.0)
    assert row["predicted_e2e_gain_frac"] == pytest.approx(1.0)
    pooled = [900.0, 1000.0, 1100.0, 950.0, 1000.0, 1050.0]  # the baseline's mean's interval, at 95% (one action)
    half = 2.571 * statistics.stdev(pooled) / math.sqrt(6)
    assert row["predicted_e2e_gain_ci95_low"] == pytest.approx(2000 / (1000 + half) - 1, rel=1e-3)
    assert row["predicted_e2e_gain_ci95_high"] == pytest.approx(2000 / (1000 - half) - 1, rel=1e-3)
    # three actions read in the pause: the baseline's interval at their simultaneous level is wider
    three = tune.with_step(tune.bracketed(before, _side([7900.0, 8000.0, 8100.0]), after, comparisons=3), 2000.0)
    assert three["predicted_e2e_gain_ci95_low"] < row["predicted_e2e_gain_ci95_low"]
    assert row["predicted_e2e_gain_ci95_low"] < 0.95 and row["predicted_e2e_gain_ci95_high"] > 1.05
    # both sides on the loader: the paired gain's interval whatever the baseline's spread
    paired = tune.with_step(tune.bracketed(before, _side([1400.0, 1500.0, 1600.0]), after), 1e6)
    assert paired["predicted_e2e_gain_ci95_low"] == pytest.approx(paired["action_gain_ci95_low"])
    assert paired["predicted_e2e_gain_ci95_high"] == pytest.approx(paired["action_gain_ci95_high"])


def test_a_window_holds_whole_passes_where_a_pass_is_short():
    from pipeprof.watch.pause import window_batches

    assert window_batches(16, 14) == 16  # a pass of 16 on 14 workers: its idle tail in every window, once
    assert window_batches(16, 16) == 16 and window_batches(16, 8) == 8  # passes of whole rounds: rounds
    assert window_batches(100, 14) == 14 and window_batches(None, 4) == 4  # long or unsized passes: rounds
    assert window_batches(24, 0) == 1  # no workers: batch by batch


def test_with_no_verified_action_the_answer_names_the_likeliest_with_both_readings():
    from pipeprof.watch import tune as tune_mod
    from pipeprof.watch.live import action_lines

    def entry(i: str, gain: float, low: float, high: float) -> dict:
        return {"id": i, "action": i, "measured": True, "verified": low > 0, "action_gain_frac": gain,
                "action_gain_ci95_low": low, "action_gain_ci95_high": high, "predicted_e2e_gain_frac": gain,
                "predicted_e2e_gain_ci95_low": low, "predicted_e2e_gain_ci95_high": high}  # fmt: skip

    tune = {
        "actions_at_workers": 2,
        "actions": [entry("uint8", 0.069, -0.01, 0.154), entry("decoder", 0.02, -0.05, 0.09)],
    }
    assert action_lines(tune)[-1] == (
        "  → no action tried was shown to help; the likeliest: uint8, end to end +6.9% (-1.0% … +15.4%): it may help "
        "by that much, or not at all"
    )
    tune["actions"] = [entry("uint8", -0.02, -0.08, 0.04)]
    assert action_lines(tune)[-1] == "  → no action tried was shown to help"
    tune |= {"actions": [entry("uint8", 0.09, 0.02, 0.16)], "best_action": "uint8"}
    assert "best measured change: uint8, end to end +9.0% (+2.0% … +16.0%)" in action_lines(tune)[-1]
    # two helpful changes whose intervals overlap: the best is named, and the other as not separable from it; one
    # whose interval ends below the best's low end, or that is not verified, is not
    tried = [
        entry("uint8", 0.09, 0.02, 0.16),
        entry("persistent", 0.088, 0.027, 0.153),
        entry("prefetch", 0.015, 0.005, 0.019),
        entry("decoder", 0.05, -0.01, 0.12),
    ]
    best = tune_mod.best_action(tried)
    assert best["id"] == "uint8" and tune_mod.as_good(best, tried) == ["persistent"]
    tune |= {"actions": tried, "best_as_good": tune_mod.as_good(best, tried)}
    assert action_lines(tune)[-1] == (
        "  → as good within the intervals (not separable from it): persistent, end to end +8.8% (+2.7% … +15.3%)"
    )
    assert tune_mod.as_good(None, tried) == []


def test_the_changes_not_tried_are_folded_by_their_reason():
    """Two changes held back by one reason are one line naming both; a change with a reason of its own keeps
    its line; the reason is printed once."""
    from pipeprof.watch.live import action_lines

    own = "a user's own dataset: its storage and decoding are its own"
    tune = {
        "actions_at_workers": 4,
        "actions": [
            {"id": "memory", "action": "cache the dataset in RAM", "why_not": own},
            {"id": "in_order", "action": "in_order=False", "why_not": "--tune-max-s 120 s ran out"},
            {"id": "shards", "action": "pack the files into tar shards", "why_not": own},
        ],
    }
    lines = action_lines(tune)
    assert f"    2 changes not tried (memory, shards): {own}" in lines
    assert "    in_order=False: not tried: --tune-max-s 120 s ran out" in lines
    assert sum(own in line for line in lines) == 1


def test_the_model_is_checked_against_the_loop_at_its_own_count():
    """Predicted 788 (760-815) where the loop, at that count, ran 692 (673-710): +14%, apart beyond both intervals
    and the 10% bound; at 2 workers, not measured at the loop's own count, there is nothing to check."""
    predicted = [
        {"num_workers": 1, "samples_per_s": 788.0, "samples_per_s_ci95_low": 760.0, "samples_per_s_ci95_high": 815.0}
    ]
    watched = {
        "num_workers": 1,
        "samples_per_s": 692.0,
        "samples_per_s_ci95_low": 673.0,
        "samples_per_s_ci95_high": 710.0,
    }
    check = tune.own_count_check(predicted, watched)
    assert check["error_frac"] == pytest.approx(788 / 692 - 1) and check["disagrees"]
    close = dict(watched, samples_per_s=760.0, samples_per_s_ci95_high=800.0)
    assert not tune.own_count_check(predicted, close)["disagrees"]  # +3.7%, the intervals overlap
    assert tune.own_count_check(predicted, dict(watched, num_workers=2)) is None


def test_each_pass_start_is_added_to_the_step_that_cannot_hide_it():
    """A pass of 2,048 samples behind a 10,000/s step: 204.8 ms of steps plus the 50 ms before its first batch;
    a loader slower than that binds as before; unseen passes leave the steady-state rate as it is."""
    passes = {"pass_start_s": 0.05, "samples_per_pass": 2048}
    assert tune.in_passes(10_000.0, 10_000.0, passes) == pytest.approx(2048 / (0.05 + 0.2048))
    assert tune.in_passes(5_000.0, 10_000.0, passes) == 5_000.0  # 409.6 ms of loading holds its own starts
    assert tune.in_passes(10_000.0, 10_000.0, {"pass_start_s": None, "samples_per_pass": 2048}) == 10_000.0


def test_persistent_workers_gain_the_loop_its_pass_starts_even_behind_a_step_that_binds():
    """Both loaders alone outrun a 2,000/s step; the user's (non-persistent) spends 60 ms starting each pass of
    1,000 samples, the variant 5 ms: 1000 / (0.005 + 0.5) over 1000 / (0.06 + 0.5), +10.9%, where the
    steady-state model alone predicted nothing."""
    before = after = _side([2999.0, 3000.0, 3001.0]) | {"pass_start_s": 0.06, "samples_per_pass": 1000}
    variant = _side([3996.0, 4000.0, 4004.0]) | {"pass_start_s": 0.005, "samples_per_pass": 1000}
    row = tune.with_step(tune.bracketed(before, variant, after), 2000.0)
    assert row["predicted_e2e_gain_frac"] == pytest.approx((0.06 + 0.5) / (0.005 + 0.5) - 1)
    assert row["predicted_e2e_samples_per_s"] == pytest.approx(1000 / 0.505)
    steady = tune.with_step(tune.bracketed(before, variant | {"pass_start_s": None}, after), 2000.0)
    assert steady["predicted_e2e_gain_frac"] == 0.0  # one side's passes unseen: neither side counts them
    # the step binds both sides: the interval is the step's (1,900-2,100/s), not a point
    ends = tune.with_step(tune.bracketed(before, variant, after), 2000.0, (1900.0, 2100.0))
    assert ends["predicted_e2e_gain_frac"] == row["predicted_e2e_gain_frac"]
    assert ends["predicted_e2e_gain_ci95_low"] == pytest.approx((0.06 + 1000 / 1900) / (0.005 + 1000 / 1900) - 1)
    assert ends["predicted_e2e_gain_ci95_high"] == pytest.approx((0.06 + 1000 / 2100) / (0.005 + 1000 / 2100) - 1)


def _slow_start(worker_id: int) -> None:
    import time

    time.sleep(0.25)  # a worker's start of known cost, paid at each pass by a loader without persistent workers


@pytest.mark.parametrize("persistent", [False, True])
def test_the_pause_times_each_pass_start_of_the_users_loader(persistent):
    """Real workers: 24 samples in batches of 4 (6 a pass) behind a worker start of 250 ms. Without persistent
    workers every pass pays it before its first batch; with them no pass after the first does."""
    from torch.utils.data import DataLoader, TensorDataset

    from pipeprof.watch.pause import measure

    ds = TensorDataset(torch.zeros(24, 3), torch.zeros(24))
    kwargs = {"batch_size": 4, "num_workers": 1, "worker_init_fn": _slow_start, "persistent_workers": persistent}
    loader = DataLoader(ds, **kwargs)
    loader._pipeprof_args = ((ds,), kwargs)  # as the hook keeps them
    stats = measure(loader, 1, tune.policy(0.3, 8.0), lambda pids: None, lambda b: len(b[0]))
    assert stats["samples_per_pass"] == 24 and stats["loader_restarts"] >= 2
    if persistent:
        assert stats["pass_start_s"] < 0.25
    else:
        assert stats["pass_start_s"] >= 0.25


class _Stream(IterableDataset):
    """An IterableDataset of 64 float samples, as a user streams one (it has no ``__getitem__``)."""

    def __iter__(self):
        return iter([(torch.full((3, 8, 8), float(i)), i) for i in range(64)])


class _Sent(list):
    """The pause's messages to the parent, kept in order (the socket's other end)."""

    def send(self, msg: dict) -> None:
        self.append(msg)

    def flush(self) -> None:
        pass


def test_the_hand_off_of_an_iterable_dataset_repeats_its_first_item():
    from torch.utils.data import DataLoader

    from pipeprof.watch.pause import _handoff

    ds = _Stream()
    kwargs = {"batch_size": 8, "num_workers": 1}
    loader = DataLoader(ds, **kwargs)
    loader._pipeprof_args = ((ds,), kwargs)
    sent = _Sent()
    _handoff(loader, sent, {"workers": 1, "policy": tune.policy(0.3, 4.0)}, lambda b: len(b[0]))
    assert sent[0]["k"] == "tune_handoff" and "error" not in sent[0], sent[0]
    assert sent[0]["stats"]["samples_per_s"] > 0 and sent[0]["stats"]["loader_restarts"] == 0  # it never ends


def test_a_pause_command_whose_worker_died_is_asked_again_and_its_own_failures_stand():
    """A worker of a copy can die of a transient fault (PyTorch's spawned workers abort now and then at a loader's
    shut-down): asked again. A copy that fails on its own (memory, a variant that cannot be built) or a process
    that does not answer is not asked twice."""
    died = {"error": "RuntimeError: DataLoader worker (pid 1) is killed by signal: Aborted."}
    answers = [{"stats": _pt(900.0)}, died]
    assert tune.once_more(answers.pop)["stats"]["samples_per_s"] == 900.0 and not answers
    answers = [died, died]
    assert tune.once_more(answers.pop) == died and not answers  # a second death stands
    for own in ({"error": "MemoryError: the copy"}, {"error": tune.NO_ANSWER}):
        answers = [{"stats": _pt(900.0)}, own]
        assert tune.once_more(answers.pop) == own and len(answers) == 1  # not asked again
    answers = [{"stats": _pt(700.0)}]
    assert tune.once_more(answers.pop)["stats"]["samples_per_s"] == 700.0 and not answers


def test_the_batchs_receiving_on_the_loops_thread_adds_to_the_step():
    """92 us of step and 9 us of receiving a sample: 1 / 101 us; unmeasured, the step as watched. A variant whose
    batches are a quarter of the bytes receives them faster, and gains that even where the step binds."""
    assert tune.receive_bound(1e6 / 92, 9.0) == pytest.approx(1e6 / 101)
    assert tune.receive_bound(1e6 / 92, None) == pytest.approx(1e6 / 92)
    before = after = _side([2999.0, 3000.0, 3001.0]) | {"receive_us_per_sample": 40.0}
    variant = _side([3996.0, 4000.0, 4004.0]) | {"receive_us_per_sample": 10.0}
    row = tune.with_step(tune.bracketed(before, variant, after), 2000.0)
    assert row["predicted_e2e_gain_frac"] == pytest.approx((500 + 40) / (500 + 10) - 1)


def _slow_item(i: int):
    import time

    time.sleep(0.005)  # 5 ms a sample: a batch of 8 is 40 ms of a worker's time
    return torch.zeros(3, 32, 32)


@pytest.mark.one_core
def test_the_pause_reads_the_loops_cpu_in_receiving_a_batch_not_its_wait_for_one():
    """One worker makes each sample in 5 ms of sleep: the loop waits about 5 ms a sample in next(), but its own
    thread spends a small part of that receiving the batch."""
    from torch.utils.data import DataLoader

    from pipeprof.watch.pause import measure

    class Slow(torch.utils.data.Dataset):
        def __len__(self):
            return 10_000

        def __getitem__(self, i):
            return _slow_item(i)

    ds, kwargs = Slow(), {"batch_size": 8, "num_workers": 1}
    loader = DataLoader(ds, **kwargs)
    loader._pipeprof_args = ((ds,), kwargs)
    stats = measure(loader, 1, tune.policy(0.3, 4.0), lambda pids: None, len)
    assert stats["samples_per_s"] < 1 / 0.005  # the loader makes them no faster than its sleep
    assert 0 < stats["receive_us_per_sample"] < 500  # a tenth of the 5,000 us a sample the loop waited
    alone = DataLoader(ds, batch_size=8)
    alone._pipeprof_args = ((ds,), {"batch_size": 8})
    assert measure(alone, 0, tune.policy(0.3, 2.0), lambda pids: None, len)["receive_us_per_sample"] is None


_FULL = None  # a shared counter of the workers' full collections (set before they fork)


def _count_full_collections(worker_id):
    import gc

    def seen(phase, info):
        if phase == "start" and info["generation"] == 2:
            with _FULL.get_lock():
                _FULL.value += 1

    gc.callbacks.append(seen)


class _Allocating(torch.utils.data.Dataset):
    """Items that make 5,000 short-lived lists each: the garbage collector runs in the worker as it would for an
    image's decode and augment."""

    def __len__(self):
        return 32

    def __getitem__(self, i):
        return torch.tensor(float(len([[j] for j in range(5000)])))


def test_the_pause_forks_its_loaders_workers_from_a_collected_process():
    """What the pause made before a measure (300,000 objects, as an import makes) must not leave each forked
    worker a full collection over the inherited heap to run: the loop's workers do not pay it."""
    import gc
    import multiprocessing

    from torch.utils.data import DataLoader

    from pipeprof.watch.pause import measure

    global _FULL
    _FULL = multiprocessing.get_context("fork").Value("i", 0)
    ds = _Allocating()
    kwargs = {"batch_size": 4, "num_workers": 1, "worker_init_fn": _count_full_collections}
    loader = DataLoader(ds, **kwargs)
    loader._pipeprof_args = ((ds,), kwargs)
    gc.collect()
    gc.disable()
    made = [[i] for i in range(300_000)]  # the pause's own objects, no collection since
    gc.enable()
    stats = measure(loader, 1, tune.policy(0.3, 3.0), lambda pids: None, lambda b: len(b))
    assert stats["loader_restarts"] >= 2 and len(made) == 300_000
    assert _FULL.value == 0


def test_a_cpu_step_is_predicted_with_the_threads_the_workers_leave_it_and_the_line_says_so():
    """A CPU step of 4 threads at 1,200 samples/s on 4 cores, its loop's training process 4 cores busy; the loader
    alone 300 a worker. Beside w workers it is given max(1, 4 - w) threads (as pipeprof's own sweep gives its CPU
    step; more spin on taken cores) and its rate scaled to them: at 3 workers 300/s, so 2 workers (600 each side)
    is the pick, with the line to write. A step that kept one core busy (it waits, or sleeps) loses nothing at 3
    workers; a GPU job's step (no CPU threads) is left as watched: 3 workers, 900."""
    points = [_pt(300.0 * w) | {"num_workers": w} for w in (1, 2, 3)]
    watched = _pt(280.0) | {"num_workers": 1, "main_cpu_pct_mean": 400.0}
    step = _pt(1200.0) | {"main_cpu_pct_mean": 100.0}
    found = tune.recommend(points, watched, step, 4.0, cpu_threads=4)
    assert [p["step_threads"] for p in found["predicted"]] == [3, 2, 1]
    assert found["predicted"][2]["samples_per_s"] <= 300.0 + 1e-9  # the step with one thread of four
    assert found["recommended_workers"] == 2
    line = tune.threads_line(4, 4.0, 2)
    assert line.startswith("and in the training process: torch.set_num_threads(2)")
    assert tune.threads_line(2, 4.0, 2) is None and tune.threads_line(None, 4.0, 2) is None
    waits = tune.recommend(points, watched | {"main_cpu_pct_mean": 100.0}, step, 4.0, cpu_threads=4)
    assert [p["samples_per_s"] for p in waits["predicted"]] == pytest.approx([300.0, 600.0, 900.0])
    gpu = tune.recommend(points, watched, step, 4.0)
    assert all(p["step_threads"] is None for p in gpu["predicted"])
    assert gpu["predicted"][2]["samples_per_s"] == pytest.approx(900.0) and gpu["recommended_workers"] == 3


def test_the_step_measured_at_fewer_threads_replaces_the_scaled_one_at_that_count():
    """The same loop, its step also measured at 1 thread after the pause: 700 samples/s, where scaling its 4
    threads' 1,200 read 300. At 3 workers (1 thread left) the prediction is the loader's 900 against that step:
    700; the counts given other threads keep the scaled step. 3 workers is now the pick."""
    points = [_pt(300.0 * w) | {"num_workers": w} for w in (1, 2, 3)]
    watched = _pt(280.0) | {"num_workers": 1, "main_cpu_pct_mean": 400.0}
    step = _pt(1200.0) | {"main_cpu_pct_mean": 100.0}
    at = _pt(700.0) | {"threads": 1, "steps": 40}
    found = tune.recommend(points, watched, step, 4.0, cpu_threads=4, step_at=at)
    scaled = tune.recommend(points, watched, step, 4.0, cpu_threads=4)
    assert found["predicted"][2]["samples_per_s"] == pytest.approx(700.0)
    assert [p["samples_per_s"] for p in found["predicted"][:2]] == [p["samples_per_s"] for p in scaled["predicted"][:2]]
    assert found["recommended_workers"] == 3 and scaled["recommended_workers"] == 2


def test_the_steps_after_the_pause_run_at_the_threads_asked_and_the_users_count_comes_back():
    """The hook's ThreadsTrial on real torch: the loop's steps after it run at the threads asked, the first three
    (the new pool's start) left out, and the user's count is set back after the steps asked for."""
    import torch

    from pipeprof.watch.hook import ThreadsTrial

    before = torch.get_num_threads()
    trial = ThreadsTrial(torch, "train.py:9", 1, 5)
    seen = []
    for i in range(8):
        seen.append(torch.get_num_threads())
        done = trial.step(0.01 * (i + 1), 16)
    assert seen == [1] * 8 and done and torch.get_num_threads() == before
    msg = trial.message()
    assert msg["step_s"] == pytest.approx([0.04, 0.05, 0.06, 0.07, 0.08]) and msg["samples"] == [16] * 5
    assert msg["threads"] == 1 and msg["label"] == "train.py:9"


def test_a_thread_count_that_measured_slower_is_not_advised_and_an_unmeasured_one_is_said_unmeasured():
    """A Lightning-style job on 2 cores with 2 intra-op threads: at 1 worker the prediction gives its step 1 thread,
    but the loop's steps at 1 thread measured 64.7 samples/s against 82.2 at its own 2: keep the 2 threads, both
    figures said; where the steps at 1 thread were not measured, no set_num_threads(1) is advised either."""
    step = _pt(82.2)
    slower = tune.threads_line(2, 2.0, 1, step, {"threads": 1, "steps": 40} | _pt(64.7))
    assert "set_num_threads(1)" not in slower and slower.startswith("keep the training process's 2 intra-op threads")
    assert "64.7" in slower and "82.2" in slower
    unmeasured = tune.threads_line(2, 2.0, 1, step, {"threads": 1, "error": "the loop ran too few steps after"})
    assert unmeasured.startswith("torch.set_num_threads(1) is not advised") and "too few steps" in unmeasured
    faster = tune.threads_line(2, 2.0, 1, step, {"threads": 1, "steps": 40} | _pt(90.0))
    assert faster.startswith("and in the training process: torch.set_num_threads(1)")
