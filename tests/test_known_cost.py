"""End-to-end trials on workloads of known cost: the expected samples/s is known in advance.

BurnDataset burns a set CPU time per sample; FixedStepModel's step takes a set time
without the CPU (like a GPU). Expected rates come from calibrate.expected_rate. At
most one worker runs, so on a 2-core machine the main process keeps a core of its
own and the expected figures hold.
"""

import pytest

import pipeprof
from pipeprof.checks.calibrate import BurnDataset, FixedStepModel, expected_rate

# measured rates and wait shares against known ones (conftest)

# ``pipeprof validate``'s test policy (test_validate.FAST): 0.4-s windows hold 5 or more batches of every case
# here, windows are added while the 95% interval is wider than +-10% (the 15% tolerance's noise), up to 6
MEASURE = {
    "warmup_batches": 3,
    "warmup_s": 0.3,
    "warmup_max_s": 1.5,
    "redraws": 10,
    "window_s": 0.4,
    "window_batches": 3,
    "windows": 3,
    "ci_target": 0.1,
    "cpu_reference_s": 0,
}  # the known costs are the reference: no CPU probe


def e2e(tmp_path, workers, step_s, cost_s=0.01, batch=8):
    run = pipeprof.profile(
        BurnDataset(256, cost_s),
        model=FixedStepModel(step_s),
        batch_size=batch,
        num_workers=workers,
        trials=["end_to_end"],
        measure=MEASURE,
        out_dir=str(tmp_path),
        threads=1,
        device="cpu",
        log=lambda *a: None,
    )
    return run.trials.set_index("num_workers")


@pytest.mark.one_core  # loading in the training process at 0 workers, one worker at 1, a 5 ms sleeping step
def test_cpu_bound_case_runs_at_the_workers_rate(tmp_path):
    rows = e2e(tmp_path, [0, 1], step_s=0.005)
    for w in (0, 1):
        expected, _ = expected_rate(0.01, w, 8, 0.005)
        assert rows.loc[w, "status"] == "ok"
        assert rows.loc[w, "samples_per_s"] == pytest.approx(expected, rel=0.15)
    # waiting for data is most of the step when the workers are the bottleneck
    assert rows.loc[1, "data_wait_frac"] > 0.6 and rows.loc[0, "data_wait_frac"] > 0.8


@pytest.mark.one_core  # one worker with 4 ms a sample beside an 80 ms sleeping step
def test_slow_step_makes_it_step_bound_with_little_data_wait(tmp_path):
    rows = e2e(tmp_path, [1], step_s=0.08, cost_s=0.004)
    expected, side = expected_rate(0.004, 1, 8, 0.08)
    assert side == "gpu" and expected == pytest.approx(100.0)
    assert rows.loc[1, "samples_per_s"] == pytest.approx(expected, rel=0.1)
    assert rows.loc[1, "data_wait_frac"] < 0.15
    assert rows.loc[1, "compute_ms_p50"] == pytest.approx(80, rel=0.1)
