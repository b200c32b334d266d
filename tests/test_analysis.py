"""Analysis on trial tables of known content: verdicts, predictions and advice are exact."""

import math

import numpy as np
import pandas as pd
import pytest

from pipeprof.analysis import analyse, cores_needed, curves, recommend_workers, stage_overhead, verdicts, what_if

GROUP = dict(
    model="m",
    precision="bf16",
    mode="train",
    preset="p",
    decoder="pil",
    source="files",
    batch_size=8,
    pin_memory=True,
    image_size=224,
)


def trial(kind, rate, w=None, **extra):
    keys = {
        "gpu_ceiling": ["model", "precision", "mode", "batch_size", "image_size"],
        "storage_fetch": ["source", "batch_size"],
    }.get(kind, list(GROUP))
    row = {k: GROUP[k] for k in keys} | {
        "kind": kind,
        "status": "ok",
        "samples_per_s": rate,
        "samples_per_s_cv": 0.01,
        "num_workers": w,
    }
    row["trial_id"] = f"{kind}/w{w}/{rate}"
    return row | extra


def table(gpu=1000.0, cpu=None, e2e=None, io=None, main_cpu_pct=100.0, **e2e_extra):
    rows = [trial("gpu_ceiling", gpu, main_cpu_pct_mean=main_cpu_pct)]
    rows += [trial("cpu_pipeline", r, w) for w, r in (cpu or {}).items()]
    rows += [trial("storage_fetch", r, w, mean_sample_kb=100.0) for w, r in (io or {}).items()]
    rows += [trial("end_to_end", r, w, **e2e_extra) for w, r in (e2e or {}).items()]
    return pd.DataFrame(rows)


def by_workers(df, cores=8):
    return verdicts(df, cores).set_index("num_workers")


def test_bounds_join_at_the_same_settings():
    df = table(cpu={1: 100, 2: 200}, e2e={1: 99, 2: 190}, io={1: 5000, 2: 9000})
    c = curves(df).set_index("num_workers")
    assert c.loc[2, "cpu_bound_samples_per_s"] == 200 and c.loc[2, "io_bound_samples_per_s"] == 9000
    assert c.loc[1, "step_bound_samples_per_s"] == 1000 and c.loc[1, "main_cores_step"] == 1.0


def test_the_what_if_reads_the_storage_the_run_measured():
    """The storage bound in MB/s is storage_fetch's samples/s times its mean sample size (100 KB here): 9,000
    samples/s are 900 MB/s as measured; assumed storage of 125 MB/s passes 1,250 samples/s, under the step's
    5,000 on one GPU, so it binds there."""
    df = table(gpu=5000.0, cpu={1: 1000, 2: 2000}, e2e={1: 990, 2: 1980}, io={1: 5000, 2: 9000})
    assert "mean_sample_kb" in curves(df)
    (group,) = analyse(df, cores=32, device="cuda", draws=0)["groups"]
    rows = {(r["gpus"], r["cores"], r["storage_mb_s"] if r["storage"] == "assumed" else None): r for r in group.what_if}
    measured = rows[(1, 64, None)]
    assert measured["binding"] != "io" and measured["storage_mb_s"] == pytest.approx(900.0)
    slow = rows[(1, 64, 125.0)]
    assert slow["binding"] == "io" and slow["predicted_samples_per_s"] == pytest.approx(1250.0)


def test_cpu_bound_curve_predicts_the_measured_rate():
    v = by_workers(table(cpu={1: 100, 2: 200, 4: 400}, e2e={1: 98, 2: 196, 4: 380}, io={1: 1e5, 2: 1e5, 4: 1e5}))
    assert (v["verdict"] == "cpu-bound").all()
    assert v.loc[4, "predicted_samples_per_s"] == 400
    assert v.loc[4, "prediction_error_frac"] == pytest.approx(400 / 380 - 1)
    assert v.loc[2, "of_binding_bound_frac"] == pytest.approx(196 / 200)


def test_gpu_bound_and_balanced():
    v = by_workers(table(cpu={4: 2000, 8: 1020}, e2e={4: 990, 8: 980}), cores=16)
    assert v.loc[4, "verdict"] == "gpu-bound" and v.loc[4, "predicted_samples_per_s"] == 1000
    assert v.loc[8, "verdict"] == "balanced"  # 1020 vs 1000: within 5%


def test_io_bound_when_the_pipeline_runs_at_the_fetch_rate():
    v = by_workers(table(cpu={2: 205}, io={2: 210}, e2e={2: 200}))
    assert v.loc[2, "verdict"] == "io-bound" and v.loc[2, "io_bound_samples_per_s"] == 210


def test_loader_bound_only_where_the_hand_off_limit_was_measured():
    # stage clocks say each sample costs 1 ms of worker time: 4 workers could give 4000/s, the loader gives 600
    df = table(cpu={4: 600}, e2e={4: 590}, **{"stage_us_per_sample.decode": 1000.0})
    assert by_workers(df).loc[4, "verdict"] == "cpu-bound"  # a limit inferred from CPU time is not a hand-off
    v = by_workers(pd.concat([df, pd.DataFrame([trial("handoff", 620.0, 4)])], ignore_index=True))
    assert v.loc[4, "verdict"] == "loader-bound" and v.loc[4, "handoff_samples_per_s"] == 620
    assert v.loc[4, "worker_capacity_samples_per_s"] == pytest.approx(4000)


def test_zero_workers_load_and_step_add_up():
    v = by_workers(table(gpu=500, cpu={0: 500}, e2e={0: 240}))
    assert v.loc[0, "predicted_samples_per_s"] == pytest.approx(250)


def test_shared_cores_cap_the_cpu_bound_on_a_small_machine():
    # 4 workers measured alone reach 400/s, but the step itself needs 2 of the 4 cores
    v = by_workers(table(gpu=300, cpu={1: 100, 2: 200, 4: 400}, e2e={4: 150}, main_cpu_pct=200.0), cores=4)
    assert v.loc[4, "cpu_bound_samples_per_s"] == pytest.approx(200)  # interpolated at 2 workers
    assert v.loc[4, "verdict"] == "cpu-bound"


def test_recommend_workers_is_the_smallest_within_5_percent():
    curve = pd.DataFrame({"num_workers": [0, 2, 4, 8], "samples_per_s": [100, 500, 960, 1000]})
    r = recommend_workers(curve)
    assert (r["recommended_workers"], r["best_workers"]) == (4, 8)


# a CPU curve that flattens past 16 workers, as on a 32-CPU box of 16 cores with SMT
WS, RATES = np.array([1.0, 2.0, 4.0, 8.0, 16.0, 32.0]), np.array([100.0, 200.0, 400.0, 800.0, 1500.0, 1800.0])


def test_what_if_reads_the_measured_curve_at_the_workers_c_cores_allow():
    rows = {
        (r["gpus"], r["cores"]): r
        for r in what_if(
            5000.0,
            WS,
            RATES,
            0.0,
            32,
            io_mb_s=None,
            sample_mb=None,
            core_counts=(7, 16, 64),
            gpus=(1, 2),
            storage_mb_s=(None,),
        )
    }
    # 7 cores: 7 workers, interpolated between 4 (400/s) and 8 (800/s). One efficiency taken at
    # 32 workers (56%) would have said 100 x 7 x 0.56 = 394: the 2x error the sizing check found
    assert rows[(1, 7)]["predicted_samples_per_s"] == pytest.approx(700) and not rows[(1, 7)]["extrapolated"]
    assert rows[(1, 16)]["predicted_samples_per_s"] == pytest.approx(1500)
    assert rows[(1, 64)]["extrapolated"] and rows[(1, 64)]["predicted_samples_per_s"] == pytest.approx(64 * 1800 / 32)
    assert rows[(1, 7)]["binding"] == "cpu"


def test_the_training_process_takes_cpu_in_proportion_to_its_rate():
    # 1 ms of main-process CPU per sample: with 8 cores r = 100 x (8 - 0.001 r), so r = 800 / 1.1
    r = what_if(5000.0, WS, RATES, 1e-3, 32, None, None, core_counts=(8,), gpus=(1,), storage_mb_s=(None,))[0]
    assert r["predicted_samples_per_s"] == pytest.approx(800 / 1.1, rel=1e-6)


def test_the_curve_gives_the_same_answer_from_a_smaller_machine():
    # the same CPUs measured on 16 cores: the what-if at 8 cores must not change with where it was measured
    big = what_if(5000.0, WS, RATES, 1e-3, 32, None, None, core_counts=(8,), gpus=(1,), storage_mb_s=(None,))
    small = what_if(5000.0, WS[:5], RATES[:5], 1e-3, 16, None, None, core_counts=(8,), gpus=(1,), storage_mb_s=(None,))
    assert small[0]["predicted_samples_per_s"] == pytest.approx(big[0]["predicted_samples_per_s"])


def test_cores_needed_interpolates_then_extrapolates():
    need = cores_needed(1000.0, WS, RATES, main_s=1e-3, cores=32)
    assert need["workers_needed"] == pytest.approx(8 + 200 / 700 * 8) and need["cores_needed"] == 12
    assert not need["extrapolated"]
    far = cores_needed(2700.0, WS, RATES, main_s=1e-3, cores=32)
    assert far["extrapolated"] and far["workers_needed"] == pytest.approx(2700 / (1800 / 32))
    assert far["cores_needed"] == math.ceil(48 + 2.7) and "per core at its 32" in far["basis"]
    # counts past the machine's cores measured oversubscription: extrapolate from the last one that fitted
    over = cores_needed(2000.0, np.append(WS[:5], 32.0), np.append(RATES[:5], 1550.0), 0.0, cores=16)
    assert over["workers_needed"] == pytest.approx(2000 / (1500 / 16))


def e2e_row(w, rate, wait, *, busy=None, run=None, workers_cpu=None, ci=0.02, **extra):
    row = trial(
        "end_to_end",
        rate,
        w,
        data_wait_frac=wait,
        samples_per_s_ci95_low=rate * (1 - ci),
        samples_per_s_ci95_high=rate * (1 + ci),
    )
    if busy is not None:
        row |= {"usable_busy_cores_mean": busy, "run_cores_mean": run if run is not None else busy}
    if workers_cpu is not None:
        row["workers_cpu_pct_mean"] = workers_cpu
    return row | extra


def frame(*rows):
    return pd.DataFrame(list(rows))


def test_missing_ceiling_the_trial_evidence_decides_not_a_guess():
    # case 2: the ceiling trial failed; the step takes 62 ms a batch (wait 2%), the loader alone gives 147/s
    df = frame(
        trial("gpu_ceiling", None) | {"status": "error"}, trial("cpu_pipeline", 147.0, 2), e2e_row(2, 60.0, 0.02)
    )
    v = verdicts(df, 2, "cpu").iloc[0]
    assert v["verdict"] == "step-bound" and v["bounds_verdict"] == "unknown"
    assert v["predicted_samples_per_s"] != v["predicted_samples_per_s"]  # NaN: no prediction without the step
    assert verdicts(df, 2, "cuda").iloc[0]["verdict"] == "gpu-bound"


def test_a_figure_no_row_measured_reads_as_missing_not_a_type_error():
    """A watched validation loop (0 workers) whose short window the CPU sampler missed: its step row's
    main_cpu_pct_mean and its own are None, so ``results.frame`` (as the watch builds its table) keeps the columns
    as objects. The analysis reads them as NaN: the answer a table with NaN there gets (a TypeError ended the
    watch's analysis, and the run folder with it)."""
    from pipeprof.results import frame as rows_frame

    def rows(missing):
        return [
            trial("gpu_ceiling", 175.0, 0, main_cpu_pct_mean=missing),
            e2e_row(0, 160.0, 0.05, main_cpu_pct_mean=missing, workers_cpu_pct_mean=missing),
        ]

    none, nan = rows_frame(rows(None)), rows_frame(rows(float("nan")))
    assert none["main_cpu_pct_mean"].dtype == object  # what the analysis is given
    got, want = analyse(none, cores=2, device="cpu", draws=10), analyse(nan, cores=2, device="cpu", draws=10)
    assert got["verdicts"][0]["verdict"] == want["verdicts"][0]["verdict"] == "step-bound"
    assert [g.workers for g in got["groups"]] == [g.workers for g in want["groups"]]
    assert math.isnan(curves(none)["main_cores_step"].iloc[0])


def test_cpu_only_machine_says_step_and_skips_gpu_sizing():
    # case 3: 2 cores, 1 worker, 1% wait, measured above the step "ceiling": noise, not another bottleneck
    df = frame(trial("gpu_ceiling", 64.5), trial("cpu_pipeline", 150.0, 1), e2e_row(1, 69.7, 0.01, busy=1.3))
    a = analyse(df, cores=2, device="cpu")
    assert a["verdicts"][0]["verdict"] == "step-bound"
    # the data wait said once (the side's lead and the resource's text both said it)
    assert a["verdicts"][0]["verdict_basis"].count("waits for data") == 1, a["verdicts"][0]["verdict_basis"]
    group = a["groups"][0]
    assert group.cores_needed is None and "no GPU" in group.cpu_figures_skipped
    assert "cores_needed" not in group.to_dict()  # stored only where it was computed
    assert not any("the GPU is" in x["action"] for x in group.actions)
    assert any("CPU step" in x["action"] for x in group.actions)


def test_all_cores_busy_is_cores_bound_even_above_the_isolated_loader():
    # case 5: 32 workers + the training process on 32 cores, end-to-end above the loader alone
    df = frame(
        trial("gpu_ceiling", 4700.0),
        trial("cpu_pipeline", 3500.0, 32),
        trial("storage_fetch", 9e4, 32),
        e2e_row(32, 3900.0, 0.30, busy=31.6, workers_cpu=3000.0, ci=0.06),
    )
    v = verdicts(df, 32).iloc[0]
    assert v["verdict"] == "cores-bound" and "31.6 of 32" in v["verdict_basis"]


@pytest.mark.parametrize(
    "workers_cpu, io, handoff, verdict",
    [
        (380.0, 9e4, None, "cpu-bound"),  # 4 workers computing 95% of the time on a 16-core box: more workers help
        (100.0, 9e4, 415.0, "loader-bound"),  # workers idle 75%, the storage keeps up, the hand-off measured at 415/s
        (100.0, 9e4, None, "input-bound"),  # ... the hand-off not measured: no limit is claimed that was not measured
        (100.0, None, 415.0, "loader-bound"),  # the storage unmeasured, but the measured hand-off binds
        (100.0, 410.0, None, "io-bound"),  # the pipeline runs at the storage's rate
    ],
)
def test_input_bound_trials_name_the_input_side_from_their_evidence(workers_cpu, io, handoff, verdict):
    rows = [
        trial("gpu_ceiling", 4700.0),
        trial("cpu_pipeline", 420.0, 4),
        e2e_row(4, 400.0, 0.6, busy=5.0, workers_cpu=workers_cpu),
    ]
    if io:
        rows.append(trial("storage_fetch", io, 4))
    if handoff:
        rows.append(trial("handoff", handoff, 4))
    v = verdicts(frame(*rows), 16).iloc[0]
    assert v["verdict"] == verdict and v["side"] == "input"


def test_evidence_against_the_bounds_is_said_with_both_figures():
    # the loader alone looked slower than the step, yet the step hardly waited: trust the trial, say so
    df = frame(trial("gpu_ceiling", 1000.0), trial("cpu_pipeline", 500.0, 2), e2e_row(2, 900.0, 0.01))
    v = verdicts(df, 8).iloc[0]
    assert v["verdict"] == "gpu-bound" and v["bounds_verdict"] == "cpu-bound"
    assert "cpu 500/s" in v["disagreement"] and "step 1,000/s" in v["disagreement"]


def test_recommended_workers_are_tied_when_intervals_overlap():
    curve = pd.DataFrame(
        {
            "num_workers": [4, 8, 16],
            "samples_per_s": [500.0, 920.0, 1000.0],
            "samples_per_s_ci95_low": [480.0, 850.0, 900.0],
            "samples_per_s_ci95_high": [520.0, 990.0, 1100.0],
        }
    )
    r = recommend_workers(curve)
    assert r["recommended_workers"] == 8 and r["tied_with_best"] == [8, 16]
    narrow = curve.assign(
        samples_per_s=[500.0, 900.0, 1000.0],
        samples_per_s_ci95_low=[495.0, 890.0, 990.0],
        samples_per_s_ci95_high=[505.0, 910.0, 1010.0],
    )
    assert recommend_workers(narrow)["recommended_workers"] == 16  # 10% below, intervals apart: not tied


def test_actions_rank_the_costliest_transform_first():
    extra = {
        "stage_share.decode": 0.2,
        "stage_share.Affine": 0.5,
        "stage_share.Normalize": 0.1,
        "stage_share.collate": 0.0,
        "stage_us_per_sample.decode": 200.0,
        "stage_us_per_sample.Affine": 500.0,
    }
    a = analyse(table(gpu=5000, cpu={1: 100, 2: 200}, e2e={1: 100, 2: 200}, **extra), cores=3)
    top = a["groups"][0].actions[0]
    assert top["action"].startswith("drop or cheapen Affine")
    assert top["gain_frac"] == pytest.approx(1.0)  # half the worker time gone: CPU bound doubles, GPU far away


def test_stage_overhead_reads_the_alternating_trial_and_its_interval():
    df = table(cpu={4: 380}, e2e={4: 370})
    twin = trial(
        "cpu_pipeline",
        400.0,
        4,
        stage_timing=False,
        clocked_samples_per_s=380.0,
        stage_clock_overhead_frac=0.05,
        stage_clock_overhead_ci95_low=0.02,
        stage_clock_overhead_ci95_high=0.08,
    )
    noisy = twin | {"preset": "q", "stage_clock_overhead_ci95_low": -0.01}
    out = stage_overhead(pd.DataFrame([*df.to_dict("records"), twin, noisy]))
    assert [(o["overhead_frac"], o["resolved"]) for o in out] == [(0.05, True), (0.05, False)]
    assert out[0]["on_samples_per_s"] == 380 and out[0]["off_samples_per_s"] == 400


def test_failed_and_unstable_trials_are_counted_not_used():
    df = table(cpu={2: 200}, e2e={2: 190})
    bad = trial("end_to_end", None, 4) | {"status": "error", "error": "OutOfMemoryError: CUDA out of memory"}
    a = analyse(pd.concat([df, pd.DataFrame([bad])], ignore_index=True), cores=8)
    assert a["failed_trials"] == 1 and len(a["verdicts"]) == 1


def test_a_run_with_no_end_to_end_trial_still_analyses():
    # e.g. interrupted during its first end-to-end trial: the bounds it has stay in trials.parquet
    a = analyse(table(cpu={2: 200}), cores=8)
    assert a["groups"] == [] and a["verdicts"] == [] and a["trials"] == 2
    assert analyse(pd.DataFrame(), cores=8)["trials"] == 0


def test_a_saturated_hand_off_caps_the_sizing_and_makes_the_trial_loader_bound():
    # the 32-core H200 box: the loader alone gave 3,483 and 3,488 samples/s at 16 and 32 workers with its
    # main process at 101% of a core both times; workers idle 40%: no core count feeds a 4,688/s GPU
    rows = [trial("gpu_ceiling", 4688.0, main_cpu_pct_mean=101.0)]
    for w, rate, main in ((4, 1096.0, 27.8), (8, 1688.0, 48.3), (16, 3483.0, 101.0), (32, 3488.0, 101.5)):
        rows.append(trial("cpu_pipeline", rate, w, main_cpu_pct_mean=main))
    rows.append(e2e_row(32, 3695.0, 0.30, busy=20.8, workers_cpu=1916.0, main_cpu_pct_mean=154.0, ci=0.07))
    # the hand-off measured alone (pre-built samples through the same loader): 3,900 ± 100 samples/s
    rows.append(trial("handoff", 3900.0, 32, samples_per_s_ci95_low=3800.0, samples_per_s_ci95_high=4000.0))
    df = frame(*rows)
    assert verdicts(df, 32).iloc[0]["verdict"] == "loader-bound"
    need = analyse(df, cores=32)["groups"][0].cores_needed
    # the limit is the measured one, at the upper end of its interval: a limit is never below what was done
    assert need.cores is None and need.handoff_limit == pytest.approx(4000.0)
    # the curve flattened below 95% of that limit, so reaching it lies past the 32 cores measured
    assert need.cores_to_handoff_limit > 32 and "not reachable by adding cores" in need.basis
    # the limit's interval straddling the step: a count, and the caveat that the hand-off may stop it short
    split = cores_needed(
        4688.0, np.array([4.0, 8, 16, 32]), np.array([1096.0, 1688, 3483, 3488]), 0.0, 32, cap=4900.0, cap_low=4400.0
    )
    assert split["cores_needed"] is not None and split["handoff_straddles"]
    assert "4,400-4,900" in split["basis"] and "may stop the rate short" in split["basis"]
    assert "straddles the step's rate" in split["basis"]
    # wholly below the step but within the margin: said as such, not as straddling it
    below = cores_needed(
        4688.0, np.array([4.0, 8, 16, 32]), np.array([1096.0, 1688, 3483, 3488]), 0.0, 32, cap=4500.0, cap_low=4400.0
    )
    assert below["handoff_straddles"] and "below the step's rate: it may stop" in below["basis"]
    assert "straddles" not in below["basis"]
    # the H200 repeat runs: limits of 3,950-4,583 and 4,477-4,970 beside a 4,680 step read the same way
    for low, high in ((3950.0, 4583.0), (4477.0, 4970.0)):
        assert cores_needed(
            4680.0, np.array([4.0, 8, 16]), np.array([1000.0, 1900, 3000]), 0.0, 16, cap=high, cap_low=low
        )["handoff_straddles"]
    caps = what_if(
        4688.0,
        np.array([4.0, 8, 16, 32]),
        np.array([1096.0, 1688, 3483, 3488]),
        0.0,
        32,
        None,
        None,
        core_counts=(64,),
        gpus=(1, 2),
        storage_mb_s=(None,),
        cap=3450.0,
    )
    assert [r["predicted_samples_per_s"] for r in caps] == [pytest.approx(3450), pytest.approx(6900)]  # a loader each


def test_bounds_within_their_noise_are_balanced_not_ranked():
    # the loader alone 1,000/s and the step alone 1,070/s: 7% apart, but each measured to ±4%
    rows = [
        trial("gpu_ceiling", 1070.0, samples_per_s_ci95_low=1027.0, samples_per_s_ci95_high=1113.0),
        trial("cpu_pipeline", 1000.0, 4, samples_per_s_ci95_low=960.0, samples_per_s_ci95_high=1040.0),
        e2e_row(4, 990.0, 0.10),
    ]
    assert verdicts(frame(*rows), 16).iloc[0]["verdict"] == "balanced"
    tight = [
        r
        | {"samples_per_s_ci95_low": r["samples_per_s"] * 0.995, "samples_per_s_ci95_high": r["samples_per_s"] * 1.005}
        for r in rows[:2]
    ]
    assert verdicts(frame(*tight, rows[2]), 16).iloc[0]["verdict"] == "cpu-bound"


@pytest.mark.parametrize(
    "rate, busy, verdict",
    [
        (6247.0, 28.7, "cores-bound"),  # 70% of the 2-GPU ceiling with 90% of the cores busy (2xH200, DDP)
        (6247.0, 20.0, "gpu-bound"),  # as slow, but cores to spare: nothing says the host is starved
        (8700.0, 28.7, "gpu-bound"),  # at its ceiling: busy cores alone do not make the cores bind
    ],
)
def test_a_gpu_step_slowed_below_its_ceiling_on_busy_cores_is_cores_bound(rate, busy, verdict):
    from pipeprof.analysis.verdict import Evidence, decide

    ev = Evidence(
        wait=0.02,
        busy_cores=busy,
        run_cores=busy,
        foreign_cores=0.0,
        cores=32,
        workers=15,
        worker_busy=0.87,
        device_busy=0.94,
    )
    row = pd.Series({"samples_per_s": rate, "num_workers": 15})
    got, basis = decide(ev, {"step": 8892.0, "cpu": 6624.0, "io": None}, row, "cuda", "gpu-bound")
    assert got == verdict and basis.count("waits for data") == 1, basis
    if verdict == "gpu-bound":
        assert basis.endswith("device busy 94%"), basis
    if verdict == "cores-bound":
        assert f"{rate / 8892:.0%} of its rate alone" in basis
