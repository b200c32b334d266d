"""A user's own dataset factory and model factory, named in a config by import path."""

import pytest

import pipeprof

# its assertion is a measured rate, of one worker burning 10 ms a sample beside a sleeping step (conftest)
pytestmark = pytest.mark.one_core


def test_config_names_user_dataset_and_model_by_import_path(tmp_path):
    overrides = [
        "data.kind=factory",
        "data.factory=pipeprof.checks.calibrate:BurnDataset",
        "model.name=pipeprof.checks.calibrate:FixedStepModel",
        "loader.num_workers=[1]",
        "loader.batch_size=8",
        "trials=[end_to_end]",
        f"out_dir={tmp_path}",
        "device=cpu",
        "measure.warmup_s=0.2",
        "measure.warmup_max_s=1",
        "measure.redraws=10",
        "measure.window_s=0.3",
        "measure.windows=3",
        "measure.window_batches=3",
        "measure.cpu_reference_s=0",
        "model.threads=1",
    ]
    run = pipeprof.run(None, overrides, log=lambda *a: None)
    row = run.trials.iloc[0]
    assert row["status"] == "ok" and row["model"] == "pipeprof.checks.calibrate:FixedStepModel"
    # BurnDataset's default: 10 ms of CPU per sample, one worker → 100 samples/s
    assert 85 < row["samples_per_s"] < 110
    assert run.meta["dataset"] == {"kind": "user"} and run.meta["status"] == "complete"
