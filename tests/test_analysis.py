"""Analysis on trial tables of known content: verdicts, predictions and advice are exact."""
import pandas as pd
import pytest

from pipeprof.analysis import (analyse, cores_needed, curves, recommend_workers, scaling, stage_overhead,
                               verdicts, what_if)

GROUP = dict(model="m", precision="bf16", mode="train", preset="p", decoder="pil", source="files",
             batch_size=8, pin_memory=True, image_size=224)


def trial(kind, rate, w=None, **extra):
    keys = {"gpu_ceiling": ["model", "precision", "mode", "batch_size", "image_size"],
            "storage_fetch": ["source", "batch_size"]}.get(kind, list(GROUP))
    row = {k: GROUP[k] for k in keys} | {"kind": kind, "status": "ok", "samples_per_s": rate,
                                         "samples_per_s_cv": 0.01, "num_workers": w}
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
    assert c.loc[1, "gpu_bound_samples_per_s"] == 1000 and c.loc[1, "main_cores_step"] == 1.0


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


def test_loader_bound_when_workers_could_do_far_more():
    # stage clocks say each sample costs 1 ms of worker time: 4 workers could give 4000/s, the loader gives 600
    v = by_workers(table(cpu={4: 600}, e2e={4: 590}, **{"stage_us_per_sample.decode": 1000.0}))
    assert v.loc[4, "verdict"] == "loader-bound"
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


def test_cores_needed_and_what_if_follow_the_measured_scaling():
    import numpy as np

    sc = scaling(np.array([1.0, 2.0, 4.0]), np.array([100.0, 190.0, 320.0]))
    assert sc["per_worker_samples_per_s"] == 100 and sc["efficiency_at_max"] == pytest.approx(0.8)
    need = cores_needed(1000.0, sc, main_cores=1.0)
    assert need["workers_needed"] == pytest.approx(12.5) and need["cores_needed"] == 14 and need["extrapolated"]
    rows = {(r["gpus"], r["cores"], r["storage"]): r for r in
            what_if(1000.0, sc, 1.0, io_mb_s=80.0, sample_mb=0.1, cores=(8, 64), gpus=(1, 2), storage_mb_s=(None,))}
    assert rows[(1, 8, "as measured")]["predicted_samples_per_s"] == pytest.approx(100 * 7 * 0.8)
    assert rows[(1, 8, "as measured")]["binding"] == "cpu"
    assert rows[(1, 64, "as measured")]["binding"] == "io"  # 80 MB/s / 0.1 MB = 800/s
    assert rows[(2, 64, "as measured")]["predicted_samples_per_s"] == pytest.approx(800)


def test_actions_rank_the_costliest_transform_first():
    extra = {"stage_share.decode": 0.2, "stage_share.Affine": 0.5, "stage_share.Normalize": 0.1,
             "stage_share.collate": 0.0, "stage_us_per_sample.decode": 200.0, "stage_us_per_sample.Affine": 500.0}
    a = analyse(table(gpu=5000, cpu={1: 100, 2: 200}, e2e={1: 100, 2: 200}, **extra), cores=3)
    top = a["groups"][0]["actions"][0]
    assert top["action"].startswith("drop or cheapen Affine")
    assert top["gain_frac"] == pytest.approx(1.0)  # half the worker time gone: CPU bound doubles, GPU far away


def test_stage_overhead_pairs_timed_and_untimed_pipelines():
    df = table(cpu={4: 380}, e2e={4: 370})
    twin = trial("cpu_pipeline", 400.0, 4, stage_timing=False)
    out = stage_overhead(pd.concat([df, pd.DataFrame([twin])], ignore_index=True))
    assert out[0]["overhead_frac"] == pytest.approx(0.05) and out[0]["resolved"]


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
