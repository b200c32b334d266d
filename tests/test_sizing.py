"""The sizing check: masks of whole physical cores, and a real re-run inside a 1-core mask."""

import json
import math
from pathlib import Path

import pandas as pd
import pytest
import yaml

import pipeprof
from conftest import measured_once
from pipeprof.checks import sizing
from pipeprof.env import cpu_groups, parse_cpu_list
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
    # gave them what the 5 ms step's training process leaves of it
    assert 0.5 <= row["worker_cores_got"] <= 1.05 and 0.5 <= row["worker_cores_model"] <= 1.0
    assert (1 + row["cores_error_frac"]) * (1 + row["cost_move_frac"]) == pytest.approx(1 + row["error_frac"])
    assert sizing.split_summary(size) == {k: pytest.approx(row[k]) for k in ("cores_error_frac", "cost_move_frac")}


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
    assert (1 + row["cores_error_frac"]) * (1 + row["cost_move_frac"]) == pytest.approx(1000 / 800)
    # a row the GPU binds, or a mask whose workers' CPU was not read: no split
    assert math.isnan(sizing.split({"samples_per_s": 1000.0, "cores": 4, "binding": "gpu"}, 0.5e-3, got)["cpu_ms_got"])
    blind = sizing.split(
        {"samples_per_s": 1000.0, "cores": 4, "binding": "cpu"}, 0.5e-3, got.drop("workers_cpu_pct_mean")
    )
    assert math.isnan(blind["cores_error_frac"])
