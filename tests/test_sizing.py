"""The sizing check: masks of whole physical cores, and a real re-run inside a 1-core mask."""

import json
import math
import os
from pathlib import Path

import pandas as pd
import pytest
import yaml

import pipeprof
from conftest import measured_once
from pipeprof.checks import sizing
from pipeprof.env import confine, cpu_groups, parse_cpu_list
from pipeprof.results import load_run


def test_masks_take_one_cpu_per_physical_core_before_siblings():
    groups = [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert sizing.mask_for(4, groups) == [0, 1, 2, 3]
    assert sizing.mask_for(6, groups) == [0, 1, 2, 3, 4, 5]
    assert sizing.mask_for(2, [[0], [1]]) == [0, 1]
    assert parse_cpu_list("0-3,8,10-11") == [0, 1, 2, 3, 8, 10, 11] and parse_cpu_list("x") == []


@pytest.mark.parametrize("usable, counts", [(32, [8, 16]), (16, [4, 8]), (2, [1]), (1, [])])
def test_default_core_counts_are_a_quarter_and_a_half(usable, counts):
    assert sizing.default_core_counts(usable) == counts


def test_masked_runs_sweep_half_all_but_one_and_all():
    assert sizing.masked_workers(8) == [4, 7, 8] and sizing.masked_workers(1) == [1]


# the check's own trials with shorter windows and warm-up: 0.4-s windows still hold 5 batches at 100 samples/s;
# windows are added while the rate's 95% interval is wider than ±10% (the default's ±5% took every trial to its
# 5th window here, 0.8 s a trial more, for rates these tests hold to ±20%)
QUICK = [
    "measure.warmup_s=0.3",
    "measure.warmup_max_s=2",
    "measure.redraws=10",
    "measure.window_s=0.4",
    "measure.windows=3",
    "measure.max_windows=5",
    "measure.ci_target=0.1",
]


@pytest.fixture(scope="module")
def full_run(tmp_path_factory) -> str:
    """The all-cores run of the known workload, made here, in this process, and handed to the check as
    `validate --sizing --full-run` does (its unmasked child would be the same run after one more interpreter
    start): measured once, alone (every core is what it measures)."""

    def make(out: Path) -> str:
        config = out / "known.yaml"
        config.write_text(yaml.safe_dump(sizing.KNOWN))
        return str(pipeprof.run(config, [f"out_dir={out}", "name=sizing-all", *QUICK], log=lambda *a: None).path)

    return measured_once("sizing_full_run", make, tmp_path_factory)


@pytest.mark.alone  # the all-cores run's own rates, measured on every core (and it is measured here, in the alone
# tests, not in the middle of the lanes, where both would stop for it)
def test_the_all_cores_run_reads_the_known_workload(full_run):
    """10 ms of CPU a sample is 100 samples/s a core: the loader alone at each worker count, up to the usable
    cores, and the cores a 1,600 samples/s step needs, read off that curve."""
    run = load_run(full_run)
    cores = run.meta["machine"]["cores"]["usable"]
    loader = run.trials[(run.trials["kind"] == "cpu_pipeline") & (run.trials["status"] == "ok")]
    assert len(loader) >= 1
    for w, rate, foreign in zip(loader["num_workers"], loader["samples_per_s"], loader["foreign_cores_mean"]):
        # other processes' CPU beside the trial (the monitor's foreign cores) is CPU the workers did not get: the
        # rate may fall short by that many cores' worth (a fresh clone's run read 79/s at one worker beside 0.33)
        busy = min(w, cores) - (foreign if foreign == foreign else 0.0)
        assert 0.8 * 100 * busy <= rate <= 1.2 * 100 * min(w, cores), (w, rate, foreign)
    assert 13 <= sizing.cores_per_gpu(run, sizing.step_rate(run)).cores <= 21


@pytest.mark.one_core  # the 1-core run, the check's own child inside the mask: this lane's CPU
@pytest.mark.slow
def test_a_one_core_mask_measures_what_the_full_run_predicts(full_run, tmp_path):
    # 10 ms of CPU per sample feeding a 5 ms step that uses no CPU: 100 samples/s per core. The masks come from
    # the CPUs this process may use (a lane's one CPU under xdist)
    df, size = sizing.check(sizing.KNOWN, [1], tmp_path, overrides=QUICK, full_run=full_run)
    df = df.set_index("cores")
    assert df.loc[df.index.max(), "run"] == full_run
    one = df.loc[1]
    assert one["cpus"] == str(sizing.mask_for(1, cpu_groups())[0])
    meta = json.loads((Path(one["run"]) / "run.json").read_text())
    assert meta["machine"]["cores"]["affinity"] == 1  # the child and its workers ran inside the mask
    assert one["measured_samples_per_s"] == pytest.approx(100, rel=0.2)
    assert one["predicted_samples_per_s"] == pytest.approx(one["measured_samples_per_s"], rel=0.2)
    # both runs' own curves say a 1,600 samples/s step needs about 16 cores of this pipeline
    assert df["cores_per_gpu"].between(13, 21).all()
    assert sizing.summary(df)["max_rate_error_frac"] == pytest.approx(abs(one["rate_error_frac"]))
    # the bracket: the same workload on all cores at the full run's nearest count (1 worker), right before the mask;
    # the known workload's rate does not depend on the hour, so the move is small and the error after it too
    assert (Path(tmp_path) / "sizing-bracket-1.log").exists()
    assert one["move_frac"] == pytest.approx(0.0, abs=0.25)
    assert one["error_after_move_frac"] == pytest.approx(
        one["predicted_samples_per_s"] * (1 + one["move_frac"]) / one["measured_samples_per_s"] - 1
    )
    # the size table's 1-core candidate beside the same masked run: 100 samples/s a core, predicted and measured
    (row,) = size.to_dict("records")
    assert row["cores"] == 1 and row["measured_samples_per_s"] == one["measured_samples_per_s"]
    assert row["predicted_samples_per_s"] == pytest.approx(100, rel=0.2)
    assert row["move_frac"] == pytest.approx(one["move_frac"])  # one workload: the same bracket read
    # its error's two factors, read off the masked run: workers inside one CPU got at most that CPU, and the model
    # gave them what the 5 ms step's training process leaves of it; each sample cost its known 10 ms of CPU on
    # both sides (the workers' measured CPU over the rate in the mask, the curve's in the model)
    assert 0.5 <= row["worker_cores_got"] <= 1.05 and 0.5 <= row["worker_cores_model"] <= 1.0
    assert row["cpu_ms_got"] == pytest.approx(10, rel=0.2) and row["cpu_ms_model"] == pytest.approx(10, rel=0.2)


def test_the_machines_move_between_the_runs_is_read_from_their_cpu_references():
    from types import SimpleNamespace

    def run(one_process, cores=4):
        points = [{"processes": 1, "decodes_per_s": one_process}, {"processes": cores, "decodes_per_s": 9.0}]
        return SimpleNamespace(meta={"cpu_reference": {"start": {"points": points}}})

    assert sizing.core_speed_move(run(566.0, 16), run(629.0)) == pytest.approx(629 / 566 - 1)
    assert sizing.core_speed_move(run(566.0), SimpleNamespace(meta={})) is None  # a run without a reference


def test_the_bracket_reads_the_same_workload_at_the_full_runs_nearest_count():
    """A bracket of known content: the stored run's own trials, its end-to-end rates 10% higher, is a +10% move for
    its workload at the count both measured; the prediction scaled by it is the error the model owns."""
    from dataclasses import replace

    from pipeprof.analysis import workstation as ws

    full = load_run(Path(__file__).parent / "data" / "run-cpu-files")
    assert sizing.bracket_count(full, 4) == 1 and sizing.bracket_count(full, 1) == 1  # it measured 0 and 1 workers
    t = full.trials.copy()
    e2e = t["kind"] == "end_to_end"
    t.loc[e2e, "samples_per_s"] *= 1.1
    bracket = replace(full, trials=t)
    (label,) = {ws.label(r) for _, r in sizing.curves(full.trials).iterrows()}
    assert sizing.moves(full, bracket, 1) == {label: pytest.approx(0.1)}
    assert sizing.moves(full, bracket, 3) == {}  # a count neither measured: no move is read
    # predicted 1,000 on a machine that then ran the workload 10% faster, measured 1,100: the model owns none of it
    assert sizing._after_move(1000.0, 0.1, 1100.0) == pytest.approx(0.0)
    assert sizing._after_move(1000.0, None, 1100.0) != sizing._after_move(1000.0, None, 1100.0)  # NaN: no bracket


def test_a_size_rows_error_splits_into_the_models_cores_and_each_samples_cpu():
    """Predicted 1,000/s on 4 cores with 0.5 ms of the training process a sample: the model gave the workers
    4 - 0.5 = 3.5 cores at 3.5 ms a sample. A mask whose workers got 3.6 cores and ran 800/s: 4.5 ms a sample.
    1,000 / 800 = (3.5 / 3.6) x (4.5 / 3.5): the model's cores -2.8%, each sample's CPU +28.6%."""
    got = pd.Series({"samples_per_s": 800.0, "workers_cpu_pct_mean": 360.0})
    row = sizing.split({"samples_per_s": 1000.0, "cores": 4, "binding": "cpu"}, 0.5e-3, got)
    assert row["worker_cores_model"] == pytest.approx(3.5) and row["worker_cores_got"] == pytest.approx(3.6)
    assert row["cpu_ms_model"] == pytest.approx(3.5) and row["cpu_ms_got"] == pytest.approx(4.5)
    assert row["cores_error_frac"] == pytest.approx(3.5 / 3.6 - 1)
    assert row["cost_move_frac"] == pytest.approx(4.5 / 3.5 - 1)
    # the summary names each factor at its largest magnitude over the rows, with its sign
    other = {"cores_error_frac": 0.05, "cost_move_frac": -0.1}
    assert sizing.split_summary(pd.DataFrame([row, other])) == {
        "cores_error_frac": pytest.approx(0.05),
        "cost_move_frac": pytest.approx(4.5 / 3.5 - 1),
    }
    assert sizing.split_summary(pd.DataFrame([{"cores_error_frac": float("nan"), "cost_move_frac": 0.1}])) is None
    # a row the GPU binds, or a mask whose workers' CPU was not read: no split
    assert math.isnan(sizing.split({"samples_per_s": 1000.0, "cores": 4, "binding": "gpu"}, 0.5e-3, got)["cpu_ms_got"])
    blind = sizing.split(
        {"samples_per_s": 1000.0, "cores": 4, "binding": "cpu"}, 0.5e-3, got.drop("workers_cpu_pct_mean")
    )
    assert math.isnan(blind["cores_error_frac"])


# the masked pair's workload: one 10 ms worker and a 40 ms CPU step at batch 8
PAIR = sizing.KNOWN | {
    "trials": ["gpu_ceiling", "cpu_pipeline", "end_to_end", "cores_pair"],
    "model": {"name": ["pipeprof.checks.calibrate:burn_step_model_40ms"], "threads": 1},
    "loader": {"batch_size": [8], "num_workers": [0, 1, 2]},
    "actions": "predict",
}


@pytest.mark.alone  # the pair takes the machine's CPUs from the job in turns: every CPU is what it measures
@pytest.mark.slow
@pytest.mark.skipif(len(cpu_groups()) < 2, reason="a mask of fewer CPUs than the job's needs two")
def test_a_masked_pair_measures_the_models_ratio_in_the_same_minutes(tmp_path):
    """On two CPUs the worker and the step each have one (100 samples/s, the worker binds); masked to one they
    share it: 8 / (80 + 40 ms) = 66.7/s, a ratio of 2/3. The model gives it from the training process's
    measured CPU a sample in the all-CPU windows (r = 100 x (1 - 0.005 r)), without the masked windows."""
    from pipeprof.analysis import ok
    from pipeprof.analysis.workstation import masked_pairs
    from pipeprof.report.workstation import render_pairs

    config = tmp_path / "pair.yaml"
    config.write_text(yaml.safe_dump(PAIR))
    quick = [*QUICK, "measure.windows=6", "measure.max_windows=8"]  # 3-4 pairs: an interval to read
    run = pipeprof.run(config, [f"out_dir={tmp_path}", "name=pair", *quick], log=lambda *a: None)
    pair = ok(run.trials, "cores_pair")
    assert list(pair["num_workers"]) == [1]  # none at 0 workers, nor at the job's every CPU (2 of 2)
    row = pair.iloc[0]
    assert row["mask_cpus"] == str(sizing.mask_for(1, cpu_groups())[0]) == row["mask_cpus_seen"]
    assert row["samples_per_s"] == pytest.approx(100, rel=0.2)
    assert row["masked_samples_per_s"] == pytest.approx(200 / 3, rel=0.2)
    # the all-CPU windows' own CPU: the worker busy at 10 ms a sample, the training process at 5 (40 ms / 8)
    assert row["all_cpus_workers_cpu_pct_mean"] / 100 / row["samples_per_s"] == pytest.approx(0.010, rel=0.25)
    assert row["all_cpus_main_cpu_pct_mean"] / 100 / row["samples_per_s"] == pytest.approx(0.005, rel=0.25)
    (check,) = masked_pairs(load_run(run.path)).to_dict("records")
    assert check["basis"] == "pair" and check["worker_cpu_ms"] == pytest.approx(10, rel=0.25)
    assert check["model_ratio"] == pytest.approx(2 / 3, rel=0.1)
    assert check["measured_ratio"] == pytest.approx(2 / 3, rel=0.15)
    assert abs(check["error_frac"]) <= 0.15 and check["error_low"] <= check["error_frac"] <= check["error_high"]
    assert f"| 1 | {row['mask_cpus']} |" in render_pairs(masked_pairs(load_run(run.path)))
    assert sorted(os.sched_getaffinity(0)) == sorted(c for g in cpu_groups() for c in g)  # the job given back


def test_confine_sets_every_thread_of_a_process(tmp_path):
    """A child with a second thread made before the call: both threads move to the mask (sched_setaffinity on
    the process's id alone would move its main thread only), and back."""
    import subprocess
    import sys

    child = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import threading, time; threading.Thread(target=time.sleep, args=(30,)).start(); "
            "print('ready', flush=True); time.sleep(30)",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout.readline().strip() == "ready"
        tids = os.listdir(f"/proc/{child.pid}/task")
        assert len(tids) == 2
        allowed = sorted(os.sched_getaffinity(0))
        if len(allowed) < 2:
            pytest.skip("one CPU allowed: a mask of one would change nothing")
        confine([child.pid], allowed[:1])
        assert {tuple(sorted(os.sched_getaffinity(int(t)))) for t in tids} == {tuple(allowed[:1])}
        confine([child.pid, 10**7], allowed)  # a process that is gone is passed over
        assert {tuple(sorted(os.sched_getaffinity(int(t)))) for t in tids} == {tuple(allowed)}
    finally:
        child.kill()
        child.wait()


def test_masked_pairs_are_planned_only_where_named_and_below_the_jobs_cpus():
    from pipeprof import config as C
    from pipeprof.env import usable_cores
    from pipeprof.orchestrate.sweep import expand

    raw = {"trials": ["end_to_end", "cores_pair"], "loader": {"num_workers": [0, 1, 2, 3]}}
    specs = expand(C.resolve(C.build(raw), cuda=False, bf16_ok=False, usable_cores=4))
    usable = int(usable_cores()["usable"])  # the planner reads the CPUs this process may use
    assert sorted(s.num_workers for s in specs if s.kind == "cores_pair") == [w for w in (1, 2, 3) if w < usable]
    assert sorted(s.num_workers for s in specs if s.kind == "end_to_end") == [0, 1, 2, 3]
    assert "cores_pair" not in C.build({}).trials  # a default run plans none
    with pytest.raises(C.ConfigError, match="cores_pair .* loader.num_workers"):
        C.build({"trials": ["cores_pair"]})  # the adaptive search plans no counts of its own to pair


def test_the_pairs_table_reads_each_pairs_figures():
    from pipeprof.report.html import _pairs
    from pipeprof.report.workstation import render_pairs

    row = {
        "workload": "resnet50 bf16 standard bs256",
        "cores": 4,
        "cpus": "0,1,2,3",
        "all_cpus_samples_per_s": 1200.0,
        "masked_samples_per_s": 1000.0,
        "measured_ratio": 1000 / 1200,
        "model_ratio": 0.85,
        "predicted_samples_per_s": 1020.0,
        "error_frac": 0.02,
        "error_low": -0.01,
        "error_high": 0.05,
        "pairs": 3,
        "basis": "pair",
        "worker_cpu_ms": 3.18,
        "curve_worker_cpu_ms": 3.35,
        "curve_ratio": 0.9,
    }
    html, text = _pairs(pd.DataFrame([row])), render_pairs(pd.DataFrame([row]))
    assert "table-pairs" in html and "+2.0% (-1.0% … +5.0%)" in html and ">1,020<" in html
    assert ">+8.0%<" in html  # the curve's ratio against the measured: 0.9 / 0.8333 - 1
    assert "| resnet50 bf16 standard bs256 | 4 | 0,1,2,3 | 1,200.0 | 1,000.0 | 1,020.0 | 0.850 / 0.833 |" in text
    assert "| 3.18 / 3.35 | 0.900 (+8.0%) |" in text
    # a pair without CPU columns: the curve's ratio is the model's, no cost of its own
    old = render_pairs(pd.DataFrame([row | {"basis": "curve", "worker_cpu_ms": None}]))
    assert "| – / 3.35 |" in old
    assert _pairs(pd.DataFrame()) == "" and render_pairs(pd.DataFrame()) == ""
